//===- MoeOps.cpp - moe structure ops: model, params, layer templates -----===//
//
// Compute-op verifiers live in MoeVerifiers.cpp.
//
//===----------------------------------------------------------------------===//

#include "dialects/moe/MoeOps.h"

#include "dialects/moe/MeshShape.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/FunctionImplementation.h"

using namespace mlir;

namespace moec::moe {

//===----------------------------------------------------------------------===//
// ModelOp
//===----------------------------------------------------------------------===//

LogicalResult ModelOp::verify() {
  for (Operation &op : getBody().front()) {
    if (!isa<ParamOp, LayerOp, func::FuncOp, OptimizerOp>(op))
      return op.emitOpError("is not allowed directly in a moe.model (expected moe.param, "
                            "moe.layer, moe.optimizer or func.func)");
  }
  return success();
}

//===----------------------------------------------------------------------===//
// ParamOp
//===----------------------------------------------------------------------===//

ShardingAttr ParamOp::getShardingOrReplicated() {
  if (auto sharding = getShardingAttr())
    return sharding;
  return ShardingAttr::getReplicated(getContext());
}

RankedTensorType ParamOp::getLocalType() {
  RankedTensorType type = getTensorType();
  ShardingAttr sharding = getShardingAttr();
  auto model = (*this)->getParentOfType<ModelOp>();
  auto meshText = model ? model->getAttrOfType<StringAttr>("mesh") : StringAttr();
  if (!sharding || sharding.isReplicated() || !meshText)
    return type;
  MeshShape mesh;
  std::string error;
  if (!MeshShape::parse(meshText.str(), mesh, error))
    return {};
  SmallVector<int64_t> shape(type.getShape());
  for (auto [d, axis] : llvm::enumerate(sharding.getDims())) {
    int64_t parts = mesh.axisSize(axis.str());
    if (shape[d] % parts != 0)
      return {};
    shape[d] /= parts;
  }
  // Replicated experts: every ep rank holds more than its share.
  if (auto rows = (*this)->getAttrOfType<IntegerAttr>(kEpRowsAttr);
      rows && !shape.empty() && sharding.getDims()[0].getValue() == "ep")
    shape[0] = rows.getInt();
  return RankedTensorType::get(shape, type.getElementType());
}

LogicalResult ParamOp::verify() {
  RankedTensorType type = getTensorType();
  if (!type.hasStaticShape())
    return emitOpError("parameter '") << getSymName() << "' must have a static shape, got " << type;
  bool inLayer = isa<LayerOp>((*this)->getParentOp());
  bool hasLayer = getTensorName().contains("{layer}");
  if (inLayer && !hasLayer)
    return emitOpError("parameter '") << getSymName()
                                      << "' is in a layer template, so its tensor name must "
                                         "contain '{layer}', got '"
                                      << getTensorName() << "'";
  if (!inLayer && hasLayer)
    return emitOpError("parameter '") << getSymName()
                                      << "' is outside any layer template, so its tensor name "
                                         "must not contain '{layer}'";
  if (isPerExpert() && type.getRank() < 2)
    return emitOpError("per-expert parameter '")
           << getSymName() << "' must have the experts as a leading dimension, got " << type;
  if (auto sharding = getShardingAttr()) {
    // An explicit list must cover every dimension, even when it splits none of them.
    if (!sharding.getDims().empty() &&
        static_cast<int64_t>(sharding.getDims().size()) != type.getRank())
      return emitOpError("sharding of '")
             << getSymName() << "' names " << sharding.getDims().size()
             << " dimensions but the parameter has rank " << type.getRank();
  }
  return success();
}

//===----------------------------------------------------------------------===//
// WeightOp
//===----------------------------------------------------------------------===//

LogicalResult WeightOp::verifySymbolUses(SymbolTableCollection &symbols) {
  // The nearest symbol table is the enclosing layer template, else the model.
  Operation *table = SymbolTable::getNearestSymbolTable((*this)->getParentOp());
  auto param = symbols.lookupSymbolIn<ParamOp>(table, getParamAttr());
  if (!param)
    return emitOpError("'") << getParam() << "' does not name a moe.param in the enclosing "
                            << table->getName();
  RankedTensorType local = param.getLocalType();
  if (!local)
    return emitOpError("parameter '") << getParam() << "' of type " << param.getType()
                                      << " does not split evenly over the model's mesh";
  if (local != getType())
    return emitOpError("type ") << getType() << " differs from parameter '" << getParam()
                                << "' of type " << local
                                << (local == param.getType() ? "" : " (this rank's part)");
  return success();
}

//===----------------------------------------------------------------------===//
// LayerOp
//===----------------------------------------------------------------------===//

ParseResult LayerOp::parse(OpAsmParser &parser, OperationState &result) {
  auto buildFuncType = [](Builder &builder, ArrayRef<Type> argTypes, ArrayRef<Type> results,
                          function_interface_impl::VariadicFlag, std::string &) {
    return builder.getFunctionType(argTypes, results);
  };
  return function_interface_impl::parseFunctionOp(
      parser, result, /*allowVariadic=*/false, getFunctionTypeAttrName(result.name), buildFuncType,
      getArgAttrsAttrName(result.name), getResAttrsAttrName(result.name));
}

void LayerOp::print(OpAsmPrinter &p) {
  function_interface_impl::printFunctionOp(p, *this, /*isVariadic=*/false,
                                           getFunctionTypeAttrName(), getArgAttrsAttrName(),
                                           getResAttrsAttrName());
}

//===----------------------------------------------------------------------===//
// YieldOp
//===----------------------------------------------------------------------===//

LogicalResult YieldOp::verify() {
  auto layer = cast<LayerOp>((*this)->getParentOp());
  ArrayRef<Type> expected = layer.getResultTypes();
  if (getValues().size() != expected.size())
    return emitOpError("yields ") << getValues().size() << " values but layer '"
                                  << layer.getSymName() << "' returns " << expected.size();
  for (auto [i, value, type] : llvm::enumerate(getValues(), expected)) {
    if (value.getType() != type)
      return emitOpError("value #") << i << " has type " << value.getType() << " but layer '"
                                    << layer.getSymName() << "' returns " << type;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// ApplyLayerOp
//===----------------------------------------------------------------------===//

LogicalResult ApplyLayerOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto layer = symbols.lookupNearestSymbolFrom<LayerOp>(*this, getCalleeAttr());
  if (!layer)
    return emitOpError("'") << getCallee() << "' does not name a moe.layer";
  // getIndex() is unsigned (I64Attr), so read the signed value.
  int64_t index = getIndexAttr().getInt();
  if (index < 0)
    return emitOpError("layer index must be non-negative, got ") << index;
  if (TypeRange(getOperands()) != TypeRange(layer.getArgumentTypes()) ||
      TypeRange(getResults()) != TypeRange(layer.getResultTypes()))
    return emitOpError("type ")
           << FunctionType::get(getContext(), getOperandTypes(), getResultTypes())
           << " does not match layer '" << getCallee() << "' of type " << layer.getFunctionType();
  return success();
}

//===----------------------------------------------------------------------===//
// AddOp: `: T` or `: T, U` (an f32 rhs on a bf16 lhs)
//===----------------------------------------------------------------------===//

static ParseResult parseAddTypes(OpAsmParser &parser, Type &lhs, Type &rhs) {
  if (parser.parseType(lhs))
    return failure();
  rhs = lhs;
  if (succeeded(parser.parseOptionalComma()))
    return parser.parseType(rhs);
  return success();
}

static void printAddTypes(OpAsmPrinter &printer, Operation *, Type lhs, Type rhs) {
  printer << lhs;
  if (rhs != lhs)
    printer << ", " << rhs;
}

} // namespace moec::moe

#define GET_OP_CLASSES
#include "dialects/moe/MoeOps.cpp.inc"
