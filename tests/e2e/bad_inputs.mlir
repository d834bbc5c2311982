//===- bad_inputs.mlir - moe-run on malformed inputs ----------------------===//
//
// One run per kind of bad input: each fails (exit status 1, no crash: `not` fails on a signal)
// with one error that names the file, line, flag or tensor at fault.
//
// RUN: not moe-run train stray --plan x 2>&1 | FileCheck %s --check-prefix=STRAY
// STRAY: moe-run: error: unexpected argument 'stray' (flags start with --)
// RUN: not moe-run train --plan x --nproc 2 --ranks-on-one-gpu 2>&1 | FileCheck %s --check-prefix=ONE-GPU
// ONE-GPU: moe-run: error: --ranks-on-one-gpu runs --nproc N >= 2 thread ranks on GPU 0: it needs --backend cuda and a GPU
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 2 \
// RUN:     --lora-rank 4 -o %t/plan.moeplan
// RUN: moe-run init %root/models/tiny-qwen3-moe/config.json --plan %t/plan.moeplan -o %t/model
//
// Plans: garbage bytes, a truncated plan, a path that does not exist.
// RUN: echo garbage > %t/garbage.moeplan
// RUN: not moe-run train --plan %t/garbage.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/x 2>&1 | FileCheck %s --check-prefix=GARBAGE-PLAN
// RUN: head -c 1000 %t/plan.moeplan > %t/truncated.moeplan
// RUN: not moe-run train --plan %t/truncated.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/x 2>&1 | FileCheck %s --check-prefix=TRUNCATED-PLAN
// RUN: not moe-run train --plan %t/missing.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/x 2>&1 | FileCheck %s --check-prefix=MISSING-PLAN
//
// Models: a folder without weights; weights of another config (one layer: a tensor is missing;
// hidden size 48: a shape differs; `init` without --plan asks moec for one); truncated weights.
// RUN: mkdir -p %t/no-weights && cp %root/models/tiny-qwen3-moe/config.json %t/no-weights/
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/no-weights --data %inputs/train.jsonl \
// RUN:     --out %t/x 2>&1 | FileCheck %s --check-prefix=NO-WEIGHTS
// RUN: sed 's/"num_hidden_layers": 2,/"num_hidden_layers": 1,/' %root/models/tiny-qwen3-moe/config.json \
// RUN:     > %t/one-layer.json
// RUN: moec compile %t/one-layer.json --seq-len 8 -o %t/one-layer.moeplan
// RUN: moe-run init %t/one-layer.json --plan %t/one-layer.moeplan -o %t/one-layer
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/one-layer --data %inputs/train.jsonl \
// RUN:     --out %t/x 2>&1 | FileCheck %s --check-prefix=MISSING-TENSOR
// RUN: sed 's/"hidden_size": 96,/"hidden_size": 48,/' %root/models/tiny-qwen3-moe/config.json \
// RUN:     > %t/narrow.json
// RUN: moe-run init %t/narrow.json -o %t/narrow
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/narrow --data %inputs/train.jsonl \
// RUN:     --out %t/x 2>&1 | FileCheck %s --check-prefix=WRONG-SHAPE
// RUN: mkdir -p %t/truncated-model && head -c 100000 %t/model/model.safetensors \
// RUN:     > %t/truncated-model/model.safetensors
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/truncated-model --data %inputs/train.jsonl \
// RUN:     --out %t/x 2>&1 | FileCheck %s --check-prefix=TRUNCATED-MODEL
//
// Data: malformed JSON on line 3, a token id = vocab, an empty file, a file that does not exist,
// labels of the wrong length, too few tokens for one window.
// RUN: head -n 2 %inputs/train.jsonl > %t/malformed.jsonl
// RUN: echo '{"input_ids": [1, 2,' >> %t/malformed.jsonl
// RUN: head -n 1 %inputs/train.jsonl >> %t/malformed.jsonl
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %t/malformed.jsonl \
// RUN:     --out %t/x 2>&1 | FileCheck %s --check-prefix=MALFORMED
// RUN: echo '{"input_ids": [1, 2, 256, 3]}' > %t/vocab.jsonl
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %t/vocab.jsonl \
// RUN:     --out %t/x 2>&1 | FileCheck %s --check-prefix=VOCAB
// RUN: : > %t/empty.jsonl
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %t/empty.jsonl \
// RUN:     --out %t/x 2>&1 | FileCheck %s --check-prefix=EMPTY
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %t/missing.jsonl \
// RUN:     --out %t/x 2>&1 | FileCheck %s --check-prefix=MISSING-DATA
// RUN: echo '{"input_ids": [1, 2, 3], "labels": [2, 3]}' > %t/labels.jsonl
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %t/labels.jsonl \
// RUN:     --out %t/x 2>&1 | FileCheck %s --check-prefix=LABELS
// RUN: echo '{"input_ids": [1, 2, 3]}' > %t/short.jsonl
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %t/short.jsonl \
// RUN:     --out %t/x 2>&1 | FileCheck %s --check-prefix=SHORT-DATA
//
// Adapters (--adapter): DoRA; one trained on q/k/v only (tensors missing); rank 8 for a rank-4
// plan; a folder without an adapter.
// RUN: moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/rank4 --steps 1
// RUN: mkdir -p %t/dora && cp %t/rank4/adapter/* %t/dora/
// RUN: sed -i 's/"use_dora": false/"use_dora": true/' %t/dora/adapter_config.json
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/x --adapter %t/dora 2>&1 | FileCheck %s --check-prefix=DORA
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 2 \
// RUN:     --lora-rank 4 --lora-targets q_proj,k_proj,v_proj -o %t/qkv.moeplan
// RUN: moe-run train --plan %t/qkv.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/qkv --steps 0
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/x --adapter %t/qkv/adapter 2>&1 | FileCheck %s --check-prefix=ADAPTER-MISSING-TENSOR
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 2 \
// RUN:     --lora-rank 8 -o %t/rank8.moeplan
// RUN: not moe-run forward --plan %t/rank8.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/rank4/adapter 2>&1 | FileCheck %s --check-prefix=ADAPTER-RANK
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/x --adapter %t/model 2>&1 | FileCheck %s --check-prefix=NO-ADAPTER
//
// --resume: a checkpoint of another plan (rank 4, resumed with rank 8), a file that is not a
// training checkpoint, another data order (--seed). The failed resumes leave the checkpoint as it was.
// RUN: cp %t/rank4/checkpoint.safetensors %t/rank4.checkpoint
// RUN: not moe-run train --plan %t/rank8.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/rank4 --steps 2 --resume 2>&1 | FileCheck %s --check-prefix=RESUME-PLAN
// RUN: mkdir -p %t/not-checkpoint && cp %t/model/model.safetensors %t/not-checkpoint/checkpoint.safetensors
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/not-checkpoint --steps 2 --resume 2>&1 | FileCheck %s --check-prefix=NOT-CHECKPOINT
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/rank4 --steps 2 --resume --seed 5 2>&1 | FileCheck %s --check-prefix=RESUME-SEED
// RUN: cmp %t/rank4/checkpoint.safetensors %t/rank4.checkpoint
//
// Command line: unknown flag, bad integers, missing flags, unknown command, init without -o.
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/x --stepz 3 2>&1 | FileCheck %s --check-prefix=UNKNOWN-FLAG
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/x --steps -1 2>&1 | FileCheck %s --check-prefix=STEPS-NEGATIVE
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/x --steps abc 2>&1 | FileCheck %s --check-prefix=STEPS-TEXT
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/x --checkpoint-every 2x 2>&1 | FileCheck %s --check-prefix=CHECKPOINT-EVERY
// RUN: not moe-run train --model %t/model --data %inputs/train.jsonl 2>&1 \
// RUN:   | FileCheck %s --check-prefix=NO-PLAN
// RUN: not moe-run train --plan %t/plan.moeplan --model %t/model 2>&1 \
// RUN:   | FileCheck %s --check-prefix=NO-DATA
// RUN: not moe-run frobnicate 2>&1 | FileCheck %s --check-prefix=COMMAND
// RUN: not moe-run 2>&1 | FileCheck %s --check-prefix=USAGE
// RUN: not moe-run init %root/models/tiny-qwen3-moe/config.json --plan %t/plan.moeplan 2>&1 \
// RUN:   | FileCheck %s --check-prefix=INIT-NO-OUT
// RUN: not moe-run init 2>&1 | FileCheck %s --check-prefix=INIT-NO-CONFIG
//
//===----------------------------------------------------------------------===//

// GARBAGE-PLAN: moe-run: error: {{.*}}garbage.moeplan: not a plan (the bytes do not parse as a moec.plan.Plan protobuf)
// TRUNCATED-PLAN: moe-run: error: {{.*}}truncated.moeplan: not a plan
// MISSING-PLAN: moe-run: error: {{.*}}missing.moeplan: cannot open: No such file or directory

// NO-WEIGHTS: moe-run: error: {{.*}}no-weights: holds neither model.safetensors nor model.safetensors.index.json
// MISSING-TENSOR: moe-run: error: binding weight 'model.layers.1.[[NAME:[a-z_.]+]]' from {{.*}}one-layer/model.safetensors: {{.*}}one-layer/model.safetensors: no tensor 'model.layers.1.[[NAME]]'
// WRONG-SHAPE: moe-run: error: binding weight '[[NAME:[a-z_.0-9]+]]' from {{.*}}narrow/model.safetensors: {{.*}}narrow/model.safetensors: tensor '[[NAME]]' has shape [{{[0-9, ]*}}48{{[0-9, ]*}}], expected [{{[0-9, ]*}}96{{[0-9, ]*}}]
// TRUNCATED-MODEL: moe-run: error: {{.*}}truncated-model/model.safetensors: tensor '{{[a-z_.0-9]+}}': data_offsets [{{[0-9]+}}, {{[0-9]+}}] extend past the data section ({{[0-9]+}} bytes)

// MALFORMED: moe-run: error: {{.*}}malformed.jsonl:3: malformed JSON, at byte 20: {{.*}}(expected one object per line)
// VOCAB: moe-run: error: {{.*}}vocab.jsonl:1: input_ids[2] = 256 is outside the vocabulary [0, 256)
// EMPTY: moe-run: error: {{.*}}empty.jsonl: empty dataset: 0 lines and no tokens
// MISSING-DATA: moe-run: error: {{.*}}missing.jsonl: cannot open: No such file or directory
// LABELS: moe-run: error: {{.*}}labels.jsonl:1: "labels" has 2 entries but "input_ids" has 3; expected one label per token
// SHORT-DATA: moe-run: error: {{.*}}short.jsonl: the dataset has 3 tokens, fewer than one window of seq_len 32

// DORA: moe-run: error: {{.*}}dora/adapter_config.json: use_dora is true; DoRA adapters are not supported
// ADAPTER-MISSING-TENSOR: moe-run: error: {{.*}}qkv/adapter/adapter_model.safetensors: missing tensor 'base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight' (expected shape [4, 96])
// ADAPTER-RANK: moe-run: error: {{.*}}rank4/adapter/adapter_model.safetensors: shape mismatch: tensor '{{[a-z_.0-9]+}}.lora_A.weight' has shape [4, 96], expected [8, 96]
// NO-ADAPTER: moe-run: error: {{.*}}model/adapter_config.json: cannot open: No such file or directory

// RESUME-PLAN: moe-run: error: {{.*}}rank4/checkpoint.safetensors: tensor '{{[^']+}}' is missing or does not match the plan (f32, {{[0-9]+}} values); was the checkpoint written for another plan?
// NOT-CHECKPOINT: moe-run: error: {{.*}}not-checkpoint/checkpoint.safetensors: not a MoEC training checkpoint (no moec_checkpoint/step metadata)
// RESUME-SEED: moe-run: error: {{.*}}rank4/checkpoint.safetensors: {{.*}}train.jsonl: cannot restore the data position: the state has seed 0, this loader has 5

// UNKNOWN-FLAG: moe-run: error: unknown flag(s): --stepz{{$}}
// STEPS-NEGATIVE: moe-run: error: --steps expects a non-negative integer, got '-1'
// STEPS-TEXT: moe-run: error: --steps expects a non-negative integer, got 'abc'
// CHECKPOINT-EVERY: moe-run: error: --checkpoint-every expects a non-negative integer, got '2x'
// NO-PLAN: moe-run: error: --plan PLAN and either --model DIR or --random-weights SEED are required
// NO-DATA: moe-run: error: --data FILE is required
// COMMAND: usage: moe-run <command> [options]
// COMMAND: moe-run: error: unknown command 'frobnicate'
// USAGE: usage: moe-run <command> [options]
// USAGE-NOT: error
// INIT-NO-OUT: moe-run: error: -o DIR is required
// INIT-NO-CONFIG: moe-run: error: usage: moe-run init CONFIG.json [--seed S] -o DIR [--plan PLAN]
