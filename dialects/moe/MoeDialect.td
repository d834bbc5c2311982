//===- MoeDialect.td - the moe dialect ---------------------*- tablegen -*-===//
//
// The `moe` dialect describes a sparse Mixture-of-Experts language model as
// coarse ops that match how its kernels are written.
//
//===----------------------------------------------------------------------===//

#ifndef DIALECTS_MOE_MOEDIALECT_TD_
#define DIALECTS_MOE_MOEDIALECT_TD_

include "mlir/IR/DialectBase.td"

def Moe_Dialect : Dialect {
  let name = "moe";
  let summary = "Coarse ops for sparse Mixture-of-Experts language models.";
  let description = [{
    A model is a `moe.model` holding its parameters (`moe.param`, symbols
    that carry the checkpoint tensor name, shape, dtype, trainable flag and
    sharding), one `moe.layer` template per distinct layer structure, and a
    `func.func @forward` that instantiates the templates with
    `moe.apply_layer`, once per layer. Ops describe math, not loops: each
    one corresponds to a kernel (or a kernel pair, forward and backward) of
    the runtime. Activations are `[tokens, features]` tensors; per-head
    tensors keep heads folded into the feature dimension and carry the head
    counts as attributes.
  }];
  let cppNamespace = "::moec::moe";
  let useDefaultAttributePrinterParser = 1;
  let dependentDialects = ["::mlir::func::FuncDialect"];
  let extraClassDeclaration = [{
    /// Defined next to the attribute storage classes, which must be complete.
    void registerAttributes();
  }];
}

#endif // DIALECTS_MOE_MOEDIALECT_TD_
