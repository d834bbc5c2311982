//===- train_mesh.mlir - moe-run train --nproc: ranks equal one rank ------===//
//
// A dp=2, ep=2 plan run as four CPU thread ranks (--nproc 4) trains the global batch of four
// sequences the way one rank does with --micro-batch 4: the same losses and gradient norms
// at every step. Rank 0 alone writes the outputs. A multi-rank plan without --nproc, or
// --nproc with a single-rank plan, is refused with the fix.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 \
// RUN:     --lora-rank 4 --mesh dp=2,ep=2 -o %t/mesh.moeplan 2>&1 | FileCheck %s --check-prefix=COMPILE
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 4 \
// RUN:     --lora-rank 4 -o %t/single.moeplan
// RUN: moe-run init %root/models/tiny-qwen3-moe/config.json --seed 0 --plan %t/single.moeplan -o %t/model
// RUN: moe-run train --plan %t/mesh.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/mesh --steps 4 --log-every 2 --nproc 4 2>&1 | FileCheck %s --check-prefix=MESH
// RUN: moe-run train --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 4 --log-every 2 2>&1 | FileCheck %s --check-prefix=SINGLE
// RUN: python3 %inputs/same_losses.py %t/mesh/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// The metrics speak of the global batch: 4 x 32 tokens per step, top-2 (expert loads summed
// over the ranks, and the rows of each expert-parallel rank).
// RUN: python3 %inputs/check_metrics.py %t/mesh/metrics.jsonl 4 128 2 | FileCheck %s --check-prefix=METRICS
// Random weights made on each rank are its part of the one-rank model (its experts' elements
// where the whole tensors have them): the same losses again.
// RUN: moe-run train --plan %t/mesh.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/mesh_random --steps 3 --nproc 4 2>/dev/null
// RUN: moe-run train --plan %t/single.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/single_random --steps 3 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/mesh_random/metrics.jsonl %t/single_random/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME-RANDOM
// RUN: not moe-run train --plan %t/mesh.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/x --steps 1 2>&1 | FileCheck %s --check-prefix=NOPROC
// RUN: not moe-run train --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/y --steps 1 --nproc 2 2>&1 | FileCheck %s --check-prefix=EXTRA
// RUN: not moe-run init %root/models/tiny-qwen3-moe/config.json --plan %t/mesh.moeplan -o %t/bad 2>&1 \
// RUN:   | FileCheck %s --check-prefix=INIT
// RUN: moe-run bench --plan %t/mesh.moeplan --model %t/model --steps 2 --warmup 1 --nproc 4 \
// RUN:   | FileCheck %s --check-prefix=BENCH
// Profiled, each collective is timed on its own, next to the kernels.
// RUN: env MOEC_PROFILE=1 moe-run bench --plan %t/mesh.moeplan --model %t/model --steps 2 --warmup 1 \
// RUN:   --nproc 4 2>&1 | FileCheck %s --check-prefix=PROFILE
// PROFILE: MOEC_PROFILE: {{[0-9.]+}} ms in kernels and collectives per run
// PROFILE-DAG: {{^}}  expert_send (collective) {{.*}} calls per run
// PROFILE-DAG: {{^}}  expert_route (collective) {{.*}} calls per run
// PROFILE-DAG: {{^}}  all_reduce (collective) (outside layers) {{.*}} calls per run

// COMPILE: moec: wrote {{.*}}mesh.moeplan ({{[0-9]+}} steps, {{[0-9]+}} buffers per rank, 4 ranks)
// One set of lines (rank 0's), four sequences per step.
// MESH: step 1/4  loss
// MESH-NOT: step 1/4
// MESH: step 4/4
// MESH: moe-run: trained 4 steps
// MESH-NOT: moe-run: trained
// SINGLE: moe-run: trained 4 steps
// SAME: 4 steps agree within 1e-05
// SAME-RANDOM: 3 steps agree within 1e-05
// METRICS: 4 steps
// RUN: grep -c '"ep_ranks":\[' %t/mesh/metrics.jsonl | FileCheck %s --check-prefix=EPRANKS
// EPRANKS: 4
// NOPROC: moe-run: error: {{.*}}mesh.moeplan is for 4 ranks (mesh 2x1x1x2), this run has 1: start it with --nproc 4 (or a launcher: torchrun, srun, mpirun)
// INIT: moe-run: error: {{.*}}mesh.moeplan is for 4 ranks; init writes the whole model: give it a plan compiled without --mesh
// EXTRA: moe-run: error: {{.*}}single.moeplan is for 1 ranks (mesh 1x1x1x1), this run has 2: run it without --nproc
// BENCH: Qwen3MoeForCausalLM on cpu ({{.*}}) (rank 0 of 4): 32 tokens per step per rank, {{.*}}, communication {{.*}} ms of a {{.*}} ms timed step
