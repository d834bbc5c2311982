//===- MoeAttributes.cpp - moe dialect attributes and enums ---------------===//

#include "dialects/moe/MoeAttributes.h"

#include "dialects/moe/MoeDialect.h"
#include "llvm/ADT/TypeSwitch.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"

#include "dialects/moe/MoeEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/moe/MoeAttributes.cpp.inc"

using namespace mlir;

namespace moec::moe {

FailureOr<APFloat> parseF64(AsmParser &parser) {
  double value;
  if (parser.parseFloat(value))
    return failure();
  return APFloat(value);
}

//===----------------------------------------------------------------------===//
// ShardingAttr: `replicated` or one mesh axis (or `_`) per dimension.
//===----------------------------------------------------------------------===//

void MoeDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/moe/MoeAttributes.cpp.inc"
      >();
}

bool ShardingAttr::isReplicated() const {
  return llvm::all_of(getDims(), [](StringAttr axis) { return axis.getValue().empty(); });
}

ShardingAttr ShardingAttr::getReplicated(MLIRContext *ctx) { return get(ctx, {}); }

Attribute ShardingAttr::parse(AsmParser &parser, Type) {
  if (parser.parseLess())
    return {};
  SmallVector<StringAttr> dims;
  if (succeeded(parser.parseOptionalKeyword("replicated"))) {
    if (parser.parseGreater())
      return {};
    return get(parser.getContext(), dims);
  }
  auto parseAxis = [&]() -> ParseResult {
    if (succeeded(parser.parseOptionalKeyword("_"))) {
      dims.push_back(parser.getBuilder().getStringAttr(""));
      return success();
    }
    StringRef axis;
    if (parser.parseKeyword(&axis))
      return failure();
    dims.push_back(parser.getBuilder().getStringAttr(axis));
    return success();
  };
  if (parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, parseAxis) ||
      parser.parseGreater())
    return {};
  return get(parser.getContext(), dims);
}

void ShardingAttr::print(AsmPrinter &printer) const {
  printer << "<";
  // Only the empty list prints as `replicated`, so `[_, _]` round-trips unchanged.
  if (getDims().empty()) {
    printer << "replicated>";
    return;
  }
  printer << "[";
  llvm::interleaveComma(getDims(), printer, [&](StringAttr axis) {
    printer << (axis.getValue().empty() ? StringRef("_") : axis.getValue());
  });
  printer << "]>";
}

} // namespace moec::moe
