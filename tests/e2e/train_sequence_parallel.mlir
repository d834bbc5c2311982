//===- train_sequence_parallel.mlir - tp ranks on their rows train like one rank -===//
//
// dp=2, tp=2 with --sequence-parallel (between the split regions each tp rank holds only its
// rows of the hidden states; each scores the loss on its rows of the shifted labels) as four
// CPU thread ranks takes the steps one rank takes on the global batch: the same losses and
// gradient norms, from a written model and from random weights; the expert loads count every
// routed token once; the exported adapter scores the data as one rank's does; so with expert
// adapters, and with the experts kept whole by --tp-replicate. A step whose
// tokens do not split over tp is refused at compile time.
//
// RUN: rm -rf %t && mkdir -p %t && cp %inputs/tiny_qwen3_moe_4_layers.json %t/config.json
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh dp=2,tp=2 \
// RUN:     --sequence-parallel -o %t/sp.moeplan 2>&1 | FileCheck %s --check-prefix=COMPILE
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 4 --lora-rank 4 -o %t/single.moeplan
// RUN: moe-run init %t/config.json --seed 0 --plan %t/single.moeplan -o %t/model
// RUN: moe-run train --plan %t/sp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/sp --steps 4 --log-every 2 --nproc 4 2>&1 | FileCheck %s --check-prefix=TRAIN
// RUN: moe-run train --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 4 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/sp/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: python3 %inputs/check_metrics.py %t/sp/metrics.jsonl 4 128 2 | FileCheck %s --check-prefix=METRICS
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/sp/adapter > %t/sp_forward
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/single/adapter > %t/single_forward
// RUN: diff %t/sp_forward %t/single_forward
// RUN: moe-run train --plan %t/sp.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/sp_random --steps 3 --nproc 4 2>/dev/null
// RUN: moe-run train --plan %t/single.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/single_random --steps 3 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/sp_random/metrics.jsonl %t/single_random/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME-RANDOM
// Expert adapters keep the experts whole on every tp rank: each rank runs them on its rows, so
// their gradients are partial sums over tp (moe.tp_partial_grad); so are routed experts kept
// whole by --tp-replicate.
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 2 --lora-rank 4 --expert-lora \
// RUN:     --lora-targets q_proj,gate_proj,up_proj,down_proj --mesh dp=2,tp=2 --sequence-parallel \
// RUN:     -o %t/experts_sp.moeplan 2>/dev/null
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 4 --lora-rank 4 --expert-lora \
// RUN:     --lora-targets q_proj,gate_proj,up_proj,down_proj -o %t/experts_single.moeplan 2>/dev/null
// RUN: moe-run train --plan %t/experts_sp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/experts_sp --steps 3 --nproc 4 2>/dev/null
// RUN: moe-run train --plan %t/experts_single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/experts_single --steps 3 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/experts_sp/metrics.jsonl %t/experts_single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME-EXPERTS
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh dp=2,tp=2 \
// RUN:     --sequence-parallel --tp-replicate experts -o %t/replicated.moeplan 2>/dev/null
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh dp=2,tp=2 \
// RUN:     --sequence-parallel --tp-replicate experts --emit=mlir 2>/dev/null | FileCheck %s --check-prefix=REPLICATED
// RUN: moe-run train --plan %t/replicated.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/replicated --steps 4 --nproc 4 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/replicated/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: python3 %inputs/check_metrics.py %t/replicated/metrics.jsonl 4 128 2 | FileCheck %s --check-prefix=METRICS
// With ep, each tp rank sends its own rows to the experts' ranks; expert adapters (split over
// ep) then get partial gradients on each tp rank, summed over dp+tp.
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 --expert-lora \
// RUN:     --lora-targets q_proj,gate_proj,up_proj,down_proj --mesh tp=2,ep=2 --sequence-parallel \
// RUN:     -o %t/experts_ep.moeplan 2>/dev/null
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 --expert-lora \
// RUN:     --lora-targets q_proj,gate_proj,up_proj,down_proj --mesh tp=2,ep=2 --sequence-parallel \
// RUN:     --emit=mlir 2>/dev/null | FileCheck %s --check-prefix=EP-IR
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 2 --lora-rank 4 --expert-lora \
// RUN:     --lora-targets q_proj,gate_proj,up_proj,down_proj -o %t/experts_single2.moeplan 2>/dev/null
// RUN: moe-run train --plan %t/experts_ep.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/experts_ep --steps 3 --nproc 4 2>/dev/null
// RUN: moe-run train --plan %t/experts_single2.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/experts_single2 --steps 3 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/experts_ep/metrics.jsonl %t/experts_single2/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME-EXPERTS
// RUN: python3 %inputs/check_metrics.py %t/experts_ep/metrics.jsonl 3 64 2 | FileCheck %s --check-prefix=METRICS-EP
// RUN: moec compile %t/config.json --seq-len 32 --lora-rank 4 --mesh tp=2 --sequence-parallel \
// RUN:     --emit=report 2>/dev/null | FileCheck %s --check-prefix=REPORT
// RUN: not moec compile %t/config.json --seq-len 32 --sequence-parallel -o %t/none.moeplan 2>&1 \
// RUN:   | FileCheck %s --check-prefix=NO-MESH
// RUN: not moec compile %t/config.json --seq-len 31 --lora-rank 4 --mesh tp=2 --sequence-parallel \
// RUN:     -o %t/odd.moeplan 2>&1 | FileCheck %s --check-prefix=ODD

// COMPILE: moec: wrote {{.*}}sp.moeplan ({{[0-9]+}} steps, {{[0-9]+}} buffers per rank, 4 ranks)
// TRAIN: step 1/4  loss
// TRAIN: moe-run: trained 4 steps
// SAME: 4 steps agree within 1e-05
// METRICS: 4 steps
// METRICS: expert_load: layers 0 1 2 3, experts 8, 256 routed tokens per layer
// SAME-RANDOM: 3 steps agree within 1e-05
// SAME-EXPERTS: 3 steps agree within 1e-05
// METRICS-EP: 3 steps
// METRICS-EP: expert_load: layers 0 1 2 3, experts 8, 128 routed tokens per layer
// EP-IR-NOT: moe.tp_gather %{{.*}} : tensor<?x96xf32>
// EP-IR: moe.ep_route
// EP-IR: moe.all_reduce_grads {axis = "dp+tp", experts, layer = 3 : i64, tp_partial}
// REPLICATED: moe.param @self_attn_q_proj "{{[^"]*}}" : tensor<96x96xf32> sharding #moe.sharding<[tp, _]>
// REPLICATED: moe.param @mlp_experts_gate_proj "{{[^"]*}}" : tensor<8x48x96xf32>{{$}}
// REPLICATED-NOT: tp_replicated
// REPORT: all_gather       tp       forward {{.*}} sequence parallel: a tp rank's rows gathered
// REPORT: reduce_scatter   tp       forward {{.*}} sequence parallel: the partial sums of a split region
// REPORT-NOT: all_reduce       tp
// NO-MESH: moec: error: --sequence-parallel works on tensor-parallel regions: it needs tp > 1 in --mesh (got '')
// ODD: 'moe.tp_slice' op takes a tp rank's rows of 31 token rows, which do not split over tp = 2
