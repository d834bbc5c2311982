//===- MoeAttributes.td - moe dialect attributes -----------*- tablegen -*-===//

#ifndef DIALECTS_MOE_MOEATTRIBUTES_TD_
#define DIALECTS_MOE_MOEATTRIBUTES_TD_

include "MoeDialect.td"
include "MoeEnums.td"
include "mlir/IR/AttrTypeBase.td"

// A double that prints so that it parses back to the same bits.
def Moe_F64Param : AttrOrTypeParameter<"::llvm::APFloat", "64-bit float"> {
  let comparator = "$_lhs.bitwiseIsEqual($_rhs)";
  let printer = "$_printer.printFloat($_self)";
  let parser = "::moec::moe::parseF64($_parser)";
}

class Moe_Attr<string name, string attrMnemonic> : AttrDef<Moe_Dialect, name> {
  let mnemonic = attrMnemonic;
}

def Moe_ShardingAttr : Moe_Attr<"Sharding", "sharding"> {
  let summary = "How each dimension of a tensor is split over the device mesh.";
  let description = [{
    One entry per tensor dimension: the mesh axis (`dp`, `tp`, `pp`, `ep`)
    that splits it, or `_` when the dimension is not split. An empty list,
    printed `#moe.sharding<replicated>`, means every dimension is whole on
    every device.

    ```mlir
    #moe.sharding<replicated>
    #moe.sharding<[ep, _, _]>
    ```
  }];
  let parameters = (ins OptionalArrayRefParameter<"::mlir::StringAttr">:$dims);
  let hasCustomAssemblyFormat = 1;
  let extraClassDeclaration = [{
    bool isReplicated() const;
    static ShardingAttr getReplicated(::mlir::MLIRContext *ctx);
  }];
}

def Moe_YarnAttr : Moe_Attr<"Yarn", "yarn"> {
  let summary = "YaRN rotary-embedding frequency scaling.";
  let parameters = (ins
    Moe_F64Param:$factor,
    "int64_t":$original_max_position,
    Moe_F64Param:$beta_fast,
    Moe_F64Param:$beta_slow,
    Moe_F64Param:$mscale,
    Moe_F64Param:$mscale_all_dim
  );
  let assemblyFormat = "`<` struct(params) `>`";
}

def Moe_RopeAttr : Moe_Attr<"Rope", "rope"> {
  let summary = "Rotary position embedding of one head.";
  let description = [{
    `dim` leading (or, for MLA, trailing) features of each head rotate with
    base `theta`; `style` says whether pairs are the two halves of the
    rotated part (`half`, Llama/Qwen) or adjacent features (`interleaved`,
    DeepSeek's original layout). `yarn` is present when the model scales its
    frequencies with YaRN.

    ```mlir
    #moe.rope<theta = 1.000000e+06, dim = 128, style = half>
    ```
  }];
  let parameters = (ins
    Moe_F64Param:$theta,
    "int64_t":$dim,
    "::moec::moe::RopeStyle":$style,
    OptionalParameter<"YarnAttr">:$yarn
  );
  let assemblyFormat = "`<` struct(params) `>`";
}

#endif // DIALECTS_MOE_MOEATTRIBUTES_TD_
