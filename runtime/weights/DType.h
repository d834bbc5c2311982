//===- DType.h - safetensors element types and float conversions -*- C++ -*-===//
//
// The element types a safetensors file may declare, their sizes, and the
// F32/BF16/F16 conversions the loader applies when a checkpoint's dtype
// differs from a buffer's. Narrowing rounds to nearest, ties to even, as
// PyTorch's `.to(torch.bfloat16)` / `.half()` do; widening is exact.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_WEIGHTS_DTYPE_H_
#define RUNTIME_WEIGHTS_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/status.h"

namespace moec::runtime::weights {

/// The byte-sized safetensors dtypes. Sub-byte ones (F4, F6_*) are not supported.
enum class DType {
  Bool,
  U8,
  I8,
  F8E5M2,
  F8E4M3,
  F8E8M0,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  I64,
  U64,
  F64,
};

/// The spelling used in safetensors headers ("F32", "BF16", "F8_E4M3", ...).
std::string_view dtypeName(DType dtype);
/// Bytes per element.
size_t dtypeSize(DType dtype);
/// The dtype spelled `name` in a header, if it is one this reader supports.
std::optional<DType> parseDType(std::string_view name);

float bf16ToF32(uint16_t bits);
uint16_t f32ToBf16(float value);
float f16ToF32(uint16_t bits);
uint16_t f32ToF16(float value);

/// Whether `convertElements` can turn `from` into `to`: equal dtypes (a copy)
/// or any pair of F32, BF16 and F16.
bool canConvert(DType from, DType to);

/// Converts `count` elements at `src` (any alignment) into `dst`; fails only
/// when `canConvert(from, to)` is false.
absl::Status convertElements(const void *src, DType from, void *dst, DType to, size_t count);

} // namespace moec::runtime::weights

#endif // RUNTIME_WEIGHTS_DTYPE_H_
