//===- MoeInterfaces.td - moe op interfaces ----------------*- tablegen -*-===//

#ifndef DIALECTS_MOE_MOEINTERFACES_TD_
#define DIALECTS_MOE_MOEINTERFACES_TD_

include "mlir/IR/OpBase.td"

def Moe_DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let cppNamespace = "::moec::moe";
  let description = [{
    An op's own differentiation rule, used by `--moe-build-training-step`.

    Given the gradients arriving at its results (a null value where none
    arrives) and which operands need a gradient, `buildBackward` emits the
    backward computation at the builder's insertion point and returns one
    gradient per operand (null where not wanted). The default rule emits
    one `moe.backward` naming the op: its kernel is `<op>.backward` and
    computes exactly the requested input gradients. Ops whose backward is
    plain data flow (`moe.add`), a parameter gradient (`moe.weight`) or a
    layer template (`moe.apply_layer`) override it.
  }];
  let methods = [
    InterfaceMethod<"Whether operand `index` can carry a gradient (float tensors do; ids, "
                    "positions and routing indices do not).",
      "bool", "isDifferentiableOperand", (ins "unsigned":$index), "",
      [{ return ::moec::moe::isFloatTensor($_op->getOperand(index).getType()); }]>,
    InterfaceMethod<"Whether a result depends on trainable parameters even when no operand "
                    "does (a trainable moe.weight, a layer with adapters).",
      "bool", "isGradientSource", (ins), "", [{ return false; }]>,
    InterfaceMethod<"Whether the default rule passes the op's results to its backward too "
                    "(the router's backward needs the experts it chose, never re-choosing them).",
      "bool", "backwardUsesResults", (ins), "", [{ return false; }]>,
    InterfaceMethod<"Emits the backward computation; see the interface description.",
      "::mlir::LogicalResult", "buildBackward",
      (ins "::mlir::OpBuilder &":$builder, "::mlir::ValueRange":$resultGrads,
           "::llvm::ArrayRef<bool>":$wanted,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads), "",
      [{ return ::moec::moe::buildGenericBackward($_op, builder, resultGrads, wanted,
                                                  operandGrads); }]>,
  ];
}

#endif // DIALECTS_MOE_MOEINTERFACES_TD_
