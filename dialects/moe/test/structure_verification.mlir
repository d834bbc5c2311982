// RUN: moe-opt %s -split-input-file -verify-diagnostics

// Tests that a parameter inside a layer template must name its checkpoint tensor per layer.
moe.model @m {
  moe.layer @block(%x: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> {
    // expected-error @+1 {{'moe.param' op parameter 'norm' is in a layer template, so its tensor name must contain '{layer}', got 'model.layers.0.input_layernorm.weight'}}
    moe.param @norm "model.layers.0.input_layernorm.weight" : tensor<2048xbf16>
    moe.yield %x : tensor<?x2048xbf16>
  }
}

// -----

// Tests that a model-level parameter cannot be per layer.
moe.model @m {
  // expected-error @+1 {{'moe.param' op parameter 'norm' is outside any layer template, so its tensor name must not contain '{layer}'}}
  moe.param @norm "model.layers.{layer}.input_layernorm.weight" : tensor<2048xbf16>
}

// -----

// Tests that a parameter has a static shape.
moe.model @m {
  // expected-error @+1 {{'moe.param' op parameter 'embed' must have a static shape, got 'tensor<?x2048xbf16>'}}
  moe.param @embed "model.embed_tokens.weight" : tensor<?x2048xbf16>
}

// -----

// Tests that a per-expert parameter stacks the experts in a leading dimension.
moe.model @m {
  moe.layer @block(%x: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> {
    // expected-error @+1 {{'moe.param' op per-expert parameter 'expert_bias' must have the experts as a leading dimension, got 'tensor<128xbf16>'}}
    moe.param @expert_bias "model.layers.{layer}.mlp.experts.{expert}.bias" : tensor<128xbf16>
    moe.yield %x : tensor<?x2048xbf16>
  }
}

// -----

// Tests that a sharding names one mesh axis (or _) per parameter dimension.
moe.model @m {
  // expected-error @+1 {{'moe.param' op sharding of 'lm_head' names 3 dimensions but the parameter has rank 2}}
  moe.param @lm_head "lm_head.weight" : tensor<151936x2048xbf16> sharding #moe.sharding<[tp, _, _]>
}

// -----

// Tests that an explicit sharding list of the wrong length is rejected even when it splits nothing (it used to pass as replicated).
moe.model @m {
  // expected-error @+1 {{'moe.param' op sharding of 'norm' names 2 dimensions but the parameter has rank 1}}
  moe.param @norm "model.norm.weight" : tensor<2048xbf16> sharding #moe.sharding<[_, _]>
}

// -----

// Tests that a weight must refer to an existing parameter.
moe.model @m {
  moe.layer @block(%x: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> {
    moe.param @norm "model.layers.{layer}.input_layernorm.weight" : tensor<2048xbf16>
    // expected-error @+1 {{'moe.weight' op 'post_norm' does not name a moe.param in the enclosing moe.layer}}
    %w = moe.weight @post_norm : tensor<2048xbf16>
    moe.yield %x : tensor<?x2048xbf16>
  }
}

// -----

// Tests that a layer template cannot read a model-level parameter (its symbol table is the layer).
moe.model @m {
  moe.param @embed "model.embed_tokens.weight" : tensor<151936x2048xbf16>
  moe.layer @block(%x: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> {
    // expected-error @+1 {{'moe.weight' op 'embed' does not name a moe.param in the enclosing moe.layer}}
    %w = moe.weight @embed : tensor<151936x2048xbf16>
    moe.yield %x : tensor<?x2048xbf16>
  }
}

// -----

// Tests that a weight must refer to a parameter, not to another kind of symbol.
moe.model @m {
  moe.layer @block(%x: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> {
    moe.yield %x : tensor<?x2048xbf16>
  }
  func.func @forward(%x: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> {
    // expected-error @+1 {{'moe.weight' op 'block' does not name a moe.param in the enclosing moe.model}}
    %w = moe.weight @block : tensor<2048xbf16>
    return %x : tensor<?x2048xbf16>
  }
}

// -----

// Tests that a weight has exactly the parameter's type.
moe.model @m {
  moe.param @embed "model.embed_tokens.weight" : tensor<151936x2048xbf16>
  func.func @forward(%ids: tensor<?xi64>) -> tensor<?x2048xf32> {
    // expected-error @+1 {{'moe.weight' op type 'tensor<151936x2048xf32>' differs from parameter 'embed' of type 'tensor<151936x2048xbf16>'}}
    %t = moe.weight @embed : tensor<151936x2048xf32>
    %e = moe.embedding %ids, %t : (tensor<?xi64>, tensor<151936x2048xf32>) -> tensor<?x2048xf32>
    return %e : tensor<?x2048xf32>
  }
}

// -----

// Tests that a layer yields as many values as it returns.
moe.model @m {
  moe.layer @block(%x: tensor<?x2048xbf16>, %pos: tensor<?xi64>) -> tensor<?x2048xbf16> {
    // expected-error @+1 {{'moe.yield' op yields 2 values but layer 'block' returns 1}}
    moe.yield %x, %pos : tensor<?x2048xbf16>, tensor<?xi64>
  }
}

// -----

// Tests that a layer yields values of its result types.
moe.model @m {
  moe.layer @block(%x: tensor<?x2048xbf16>) -> tensor<?x2048xf32> {
    // expected-error @+1 {{'moe.yield' op value #0 has type 'tensor<?x2048xbf16>' but layer 'block' returns 'tensor<?x2048xf32>'}}
    moe.yield %x : tensor<?x2048xbf16>
  }
}

// -----

// Tests that moe.yield only terminates layer templates.
func.func @forward(%x: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.yield' op expects parent op 'moe.layer'}}
  moe.yield %x : tensor<?x2048xbf16>
}

// -----

// Tests that a layer template must have a body (the ODS region constraint reports it before LayerOp::verify can).
moe.model @m {
  // expected-error @+1 {{'moe.layer' op region #0 ('body') failed to verify constraint: region with 1 blocks}}
  moe.layer @block(tensor<?x2048xbf16>) -> tensor<?x2048xbf16>
}

// -----

// Tests that apply_layer's operand and result types must match the template's signature.
moe.model @m {
  moe.layer @block(%x: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> {
    moe.yield %x : tensor<?x2048xbf16>
  }
  func.func @forward(%h: tensor<?x2048xf32>) -> tensor<?x2048xbf16> {
    // expected-error @+1 {{'moe.apply_layer' op type '(tensor<?x2048xf32>) -> tensor<?x2048xbf16>' does not match layer 'block' of type '(tensor<?x2048xbf16>) -> tensor<?x2048xbf16>'}}
    %o = moe.apply_layer @block[0](%h) : (tensor<?x2048xf32>) -> tensor<?x2048xbf16>
    return %o : tensor<?x2048xbf16>
  }
}

// -----

// Tests that apply_layer passes every template operand (a missing positions operand is rejected).
moe.model @m {
  moe.layer @block(%x: tensor<?x2048xbf16>, %pos: tensor<?xi64>) -> tensor<?x2048xbf16> {
    moe.yield %x : tensor<?x2048xbf16>
  }
  func.func @forward(%h: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> {
    // expected-error @+1 {{'moe.apply_layer' op type '(tensor<?x2048xbf16>) -> tensor<?x2048xbf16>' does not match layer 'block' of type '(tensor<?x2048xbf16>, tensor<?xi64>) -> tensor<?x2048xbf16>'}}
    %o = moe.apply_layer @block[0](%h) : (tensor<?x2048xbf16>) -> tensor<?x2048xbf16>
    return %o : tensor<?x2048xbf16>
  }
}

// -----

// Tests that apply_layer must name a layer template.
moe.model @m {
  moe.param @embed "model.embed_tokens.weight" : tensor<151936x2048xbf16>
  func.func @forward(%h: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> {
    // expected-error @+1 {{'moe.apply_layer' op 'embed' does not name a moe.layer}}
    %o = moe.apply_layer @embed[0](%h) : (tensor<?x2048xbf16>) -> tensor<?x2048xbf16>
    return %o : tensor<?x2048xbf16>
  }
}

// -----

// Tests that a layer index is non-negative.
moe.model @m {
  moe.layer @block(%x: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> {
    moe.yield %x : tensor<?x2048xbf16>
  }
  func.func @forward(%h: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> {
    // expected-error @+1 {{'moe.apply_layer' op layer index must be non-negative, got -1}}
    %o = moe.apply_layer @block[-1](%h) : (tensor<?x2048xbf16>) -> tensor<?x2048xbf16>
    return %o : tensor<?x2048xbf16>
  }
}

// -----

// Tests that a model body holds only parameters, layer templates and functions.
moe.model @m {
  moe.param @embed "model.embed_tokens.weight" : tensor<151936x2048xbf16>
  // expected-error @+1 {{'moe.weight' op is not allowed directly in a moe.model (expected moe.param, moe.layer, moe.optimizer or func.func)}}
  %t = moe.weight @embed : tensor<151936x2048xbf16>
}
