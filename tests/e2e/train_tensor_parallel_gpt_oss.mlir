//===- train_tensor_parallel_gpt_oss.mlir - gpt-oss attention over tp ------===//
//
// gpt-oss's attention (biases on q/k/v/o, a learned sink logit per head, sliding windows in
// alternate layers) splits its heads over tp = 2: q/k/v and their biases by rows, the sinks
// with their heads, o by columns; o's bias is held by tp rank 0 alone (the others bind zeros),
// so the sum over tp adds it once. Its experts split their intermediate features the same way:
// each rank a window of whole (gate, up) column pairs of gate_up_proj and of its bias, and
// down_proj's rows; down's bias, like o's, is held by tp rank 0 alone. With the biases and
// sinks made nonzero (a random model starts them at zero, where a bias added twice or sinks on
// the wrong heads would go unseen), two thread ranks train like one, with and without
// sequence parallel, and the exported adapter scores the data as one rank's does.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %inputs/tiny_gpt_oss.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh tp=2 \
// RUN:     -o %t/tp.moeplan 2>&1 | FileCheck %s --check-prefix=COMPILE
// RUN: moec compile %inputs/tiny_gpt_oss.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh tp=2 \
// RUN:     --sequence-parallel -o %t/sp.moeplan 2>/dev/null
// RUN: moec compile %inputs/tiny_gpt_oss.json --seq-len 32 --micro-batch 2 --lora-rank 4 -o %t/single.moeplan
// RUN: moec compile %inputs/tiny_gpt_oss.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh tp=2 \
// RUN:     --emit=plan-text 2>/dev/null | FileCheck %s --check-prefix=BIND
// RUN: moe-run init %inputs/tiny_gpt_oss.json --seed 0 --plan %t/single.moeplan -o %t/model
// RUN: python3 %inputs/nonzero_biases.py %t/model/model.safetensors | FileCheck %s --check-prefix=NONZERO
// RUN: moe-run train --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 4 2>/dev/null
// RUN: moe-run train --plan %t/tp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/tp --steps 4 --nproc 2 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/tp/metrics.jsonl %t/single/metrics.jsonl 1e-5 | FileCheck %s --check-prefix=SAME
// RUN: moe-run train --plan %t/sp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/sp --steps 4 --nproc 2 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/sp/metrics.jsonl %t/single/metrics.jsonl 1e-5 | FileCheck %s --check-prefix=SAME
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/tp/adapter > %t/tp_forward
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/single/adapter > %t/single_forward
// RUN: diff %t/tp_forward %t/single_forward

// COMPILE-NOT: warning
// COMPILE: moec: wrote {{.*}}tp.moeplan ({{[0-9]+}} steps, {{[0-9]+}} buffers per rank, 2 ranks)
// BIND: rank 0
// BIND: bind %{{[0-9]+}} "model.layers.0.self_attn.q_proj.bias" slice [0+32]
// BIND: bind %{{[0-9]+}} "model.layers.0.self_attn.sinks" slice [0+2]
// BIND: bind %{{[0-9]+}} "model.layers.0.self_attn.o_proj.bias"{{$}}
// BIND: bind %{{[0-9]+}} "model.layers.0.mlp.experts.gate_up_proj" slice [0+4,0+64,0+32]
// BIND: bind %{{[0-9]+}} "model.layers.0.mlp.experts.gate_up_proj_bias" slice [0+4,0+32]
// BIND: bind %{{[0-9]+}} "model.layers.0.mlp.experts.down_proj" slice [0+4,0+16,0+64]
// BIND: bind %{{[0-9]+}} "model.layers.0.mlp.experts.down_proj_bias"{{$}}
// BIND: rank 1
// BIND: bind %{{[0-9]+}} "model.layers.0.self_attn.q_proj.bias" slice [32+32]
// BIND: bind %{{[0-9]+}} "model.layers.0.self_attn.sinks" slice [2+2]
// BIND: bind %{{[0-9]+}} "model.layers.0.self_attn.o_proj.bias" zeros
// BIND: bind %{{[0-9]+}} "model.layers.0.mlp.experts.gate_up_proj" slice [0+4,0+64,32+32]
// BIND: bind %{{[0-9]+}} "model.layers.0.mlp.experts.gate_up_proj_bias" slice [0+4,32+32]
// BIND: bind %{{[0-9]+}} "model.layers.0.mlp.experts.down_proj" slice [0+4,16+16,0+64]
// BIND: bind %{{[0-9]+}} "model.layers.0.mlp.experts.down_proj_bias" zeros
// NONZERO: 16 biases and sinks set
// SAME: 4 steps agree within 1e-05
