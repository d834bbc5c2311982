//===- MoeAttributes.h - moe dialect attributes and enums -------*- C++ -*-===//

#ifndef DIALECTS_MOE_MOEATTRIBUTES_H_
#define DIALECTS_MOE_MOEATTRIBUTES_H_

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"

#include "dialects/moe/MoeEnums.h.inc"

namespace moec::moe {
/// Parses a float attribute parameter (printed with `printFloat`).
mlir::FailureOr<llvm::APFloat> parseF64(mlir::AsmParser &parser);
} // namespace moec::moe

#define GET_ATTRDEF_CLASSES
#include "dialects/moe/MoeAttributes.h.inc"

#endif // DIALECTS_MOE_MOEATTRIBUTES_H_
