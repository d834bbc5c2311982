//===- DType.cpp - safetensors element types and float conversions -------===//

#include "runtime/weights/DType.h"

#include <cstring>

#include "runtime/weights/Text.h"

// Safetensors stores little-endian data; the reader hands out the mapped bytes as they are.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the weights reader assumes a little-endian host");

namespace moec::runtime::weights {
namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::Bool, "BOOL", 1},      {DType::U8, "U8", 1},          {DType::I8, "I8", 1},
    {DType::F8E5M2, "F8_E5M2", 1}, {DType::F8E4M3, "F8_E4M3", 1}, {DType::F8E8M0, "F8_E8M0", 1},
    {DType::I16, "I16", 2},        {DType::U16, "U16", 2},        {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},      {DType::I32, "I32", 4},        {DType::U32, "U32", 4},
    {DType::F32, "F32", 4},        {DType::I64, "I64", 8},        {DType::U64, "U64", 8},
    {DType::F64, "F64", 8},
};

const DTypeEntry &entryOf(DType dtype) {
  for (const DTypeEntry &entry : kDTypes)
    if (entry.dtype == dtype)
      return entry;
  // Every enumerator has a row; reaching this means the table is out of date.
  __builtin_trap();
}

uint32_t bitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float floatOf(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

bool isFloat16Or32(DType dtype) {
  return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16;
}

// Mapped data need not be aligned for the element type, hence memcpy.
template <DType From> float load(const uint8_t *at) {
  if constexpr (From == DType::F32) {
    float value;
    std::memcpy(&value, at, sizeof value);
    return value;
  } else {
    uint16_t bits;
    std::memcpy(&bits, at, sizeof bits);
    return From == DType::BF16 ? bf16ToF32(bits) : f16ToF32(bits);
  }
}

template <DType To> void store(uint8_t *at, float value) {
  if constexpr (To == DType::F32) {
    std::memcpy(at, &value, sizeof value);
  } else {
    uint16_t bits = To == DType::BF16 ? f32ToBf16(value) : f32ToF16(value);
    std::memcpy(at, &bits, sizeof bits);
  }
}

template <DType From, DType To> void convertLoop(const uint8_t *src, uint8_t *dst, size_t count) {
  constexpr size_t fromSize = From == DType::F32 ? 4 : 2;
  constexpr size_t toSize = To == DType::F32 ? 4 : 2;
  for (size_t i = 0; i < count; ++i)
    store<To>(dst + i * toSize, load<From>(src + i * fromSize));
}

template <DType From> void convertFrom(const uint8_t *src, uint8_t *dst, DType to, size_t count) {
  switch (to) {
  case DType::F32:
    return convertLoop<From, DType::F32>(src, dst, count);
  case DType::BF16:
    return convertLoop<From, DType::BF16>(src, dst, count);
  default:
    return convertLoop<From, DType::F16>(src, dst, count);
  }
}

} // namespace

std::string_view dtypeName(DType dtype) { return entryOf(dtype).name; }

size_t dtypeSize(DType dtype) { return entryOf(dtype).size; }

std::optional<DType> parseDType(std::string_view name) {
  for (const DTypeEntry &entry : kDTypes)
    if (entry.name == name)
      return entry.dtype;
  return std::nullopt;
}

float bf16ToF32(uint16_t bits) { return floatOf(uint32_t(bits) << 16); }

uint16_t f32ToBf16(float value) {
  uint32_t bits = bitsOf(value);
  // Rounding could carry a NaN's payload into the exponent (or clear it): keep it a quiet NaN.
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return uint16_t((bits >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; overflow becomes inf.
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float f16ToF32(uint16_t bits) {
  uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    float magnitude = float(mantissa) * 0x1p-24f;
    return floatOf(sign | bitsOf(magnitude));
  }
  if (exponent == 0x1f)
    return floatOf(sign | 0x7f800000u | (mantissa << 13));
  // Rebias the exponent from 15 to 127.
  return floatOf(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t f32ToF16(float value) {
  uint32_t bits = bitsOf(value);
  uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u)
    return sign | 0x7e00u | uint16_t((magnitude >> 13) & 0x3ffu);
  // 65520 = 0x477ff000 is halfway between the largest half (65504) and 2^16; the tie goes to inf.
  if (magnitude >= 0x477ff000u)
    return sign | 0x7c00u;
  if (magnitude < 0x38800000u) {
    // Below 2^-14 the result is subnormal: round(value / 2^-24) by hand.
    uint32_t exponent = magnitude >> 23;
    uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exponent;
    if (shift > 24)
      return sign;
    uint32_t quotient = mantissa >> shift;
    uint32_t remainder = mantissa & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (remainder > half || (remainder == half && (quotient & 1u)))
      ++quotient;
    return sign | uint16_t(quotient);
  }
  // Normal: round the 13 dropped bits to nearest even, then rebias 127 -> 15; a carry
  // out of the mantissa correctly bumps the exponent.
  uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return sign | uint16_t((rounded >> 13) - (112u << 10));
}

bool canConvert(DType from, DType to) {
  return from == to || (isFloat16Or32(from) && isFloat16Or32(to));
}

absl::Status convertElements(const void *src, DType from, void *dst, DType to, size_t count) {
  if (!canConvert(from, to))
    return absl::InvalidArgumentError(
        concat("cannot convert ", dtypeName(from), " to ", dtypeName(to),
               " (only between F32, BF16 and F16, or to the same dtype)"));
  auto *in = static_cast<const uint8_t *>(src);
  auto *out = static_cast<uint8_t *>(dst);
  if (from == to) {
    if (count)
      std::memcpy(out, in, count * dtypeSize(from));
    return absl::OkStatus();
  }
  switch (from) {
  case DType::F32:
    convertFrom<DType::F32>(in, out, to, count);
    break;
  case DType::BF16:
    convertFrom<DType::BF16>(in, out, to, count);
    break;
  default:
    convertFrom<DType::F16>(in, out, to, count);
    break;
  }
  return absl::OkStatus();
}

} // namespace moec::runtime::weights
