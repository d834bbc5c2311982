//===- MoeEnums.td - moe dialect enums ---------------------*- tablegen -*-===//

#ifndef DIALECTS_MOE_MOEENUMS_TD_
#define DIALECTS_MOE_MOEENUMS_TD_

include "MoeDialect.td"
include "mlir/IR/EnumAttr.td"

def Moe_RopeStyle : I32EnumAttr<"RopeStyle", "how rotary pairs are formed", [
    I32EnumAttrCase<"half", 0>,
    I32EnumAttrCase<"interleaved", 1>
  ]> {
  let cppNamespace = "::moec::moe";
  let genSpecializedAttr = 0;
}
def Moe_RopeStyleAttr : EnumAttr<Moe_Dialect, Moe_RopeStyle, "rope_style">;

def Moe_Activation : I32EnumAttr<"Activation", "elementwise activation", [
    I32EnumAttrCase<"silu", 0>,
    I32EnumAttrCase<"gelu_tanh", 1>,
    I32EnumAttrCase<"relu2", 2>,
    I32EnumAttrCase<"sigmoid", 3>,
    // gpt-oss: gate clamped above, up clamped both sides, gate * sigmoid(1.702 gate) * (up + 1).
    I32EnumAttrCase<"clamped_swiglu", 4>
  ]> {
  let cppNamespace = "::moec::moe";
  let genSpecializedAttr = 0;
}
def Moe_ActivationAttr : EnumAttr<Moe_Dialect, Moe_Activation, "activation">;

def Moe_RouterScoring : I32EnumAttr<"RouterScoring", "how router logits become scores", [
    // softmax over all experts, then top-k (Qwen3, Mixtral, OLMoE).
    I32EnumAttrCase<"softmax", 0>,
    // sigmoid per expert, top-k on biased scores (DeepSeek-V3, Kimi, Nemotron-H).
    I32EnumAttrCase<"sigmoid", 1>,
    // top-k on raw logits, then softmax over the k selected (gpt-oss).
    I32EnumAttrCase<"topk_softmax", 2>
  ]> {
  let cppNamespace = "::moec::moe";
  let genSpecializedAttr = 0;
}
def Moe_RouterScoringAttr : EnumAttr<Moe_Dialect, Moe_RouterScoring, "scoring">;

#endif // DIALECTS_MOE_MOEENUMS_TD_
