#!/usr/bin/env bash
# Everything a GPU run needs, in one script.
#
#   tests/gpu/gpu_run.sh pack   on a dev machine: builds the CUDA comparison tests, moe-run and
#                               moe-align, compiles the golden plans (f32 and bf16), and copies
#                               binaries, the libraries they need and the golden files to .gpu/
#   tests/gpu/gpu_run.sh bench  on the GPU machine: the kernel micro-benchmarks (*_bench) and
#                               the table of bench/bench.sh (KERNELS_ONLY=1: the former only)
#   tests/gpu/gpu_run.sh profile  on the GPU machine: a bench plan's step (PLAN=P4 by default) by
#                               op (MOEC_PROFILE=1), the SM clock and power under load, and one
#                               step's kernels under ncu ($OUT/ncu.csv)
#   tests/gpu/gpu_run.sh mesh   on a machine with 2 GPUs: the NCCL and expert MLP tests, every
#                               golden family on dp=2, ep=2 (and ep=2-all: --ep-exchange all), pp=2
#                               tp=2, tp=2-sp (--sequence-parallel), ep=2-overlap and dp=2-overlap
#                               (--overlap: two streams) (a GPU per rank) against one GPU
#                               (moe-mesh-check, f32 and bf16), and Qwen3-30B-A3B (48 layers, 4096 tokens per GPU) on one GPU,
#                               dp, ep (its default exchange, and ep=2-routed), pp, tp=2: tokens/s
#                               per GPU and exposed communication (moe-run bench --nproc 2), also
#                               ep=2 and dp=2 with --overlap (ep=2-overlap, dp=2-overlap); MESHES
#                               and SCALE_MESHES (e.g. "tp=2", "single tp=2") run fewer; HANG=0
#                               skips the stopped-rank check
#   tests/gpu/gpu_run.sh mesh1  on one GPU: the mesh checks of `mesh` with every rank on GPU 0
#                               (--ranks-on-one-gpu: the kernels of the mesh plans on the GPU,
#                               the collectives through host memory; no NCCL, no scale), then
#                               moe-run --nproc 2 --ranks-on-one-gpu against one rank: the tiny
#                               gpt-oss, OLMoE and Nemotron-H (f32, bf16) on tp=2 and tp=2-sp, Qwen3-30B-A3B
#                               and OLMoE-1B-7B shapes (4 layers, 4096 tokens) on tp=2-sp, the tiny
#                               Qwen3-MoE on ep=2 with --ep-capacity-factor 1.75 (ep=2-cap; the golden
#                               families' ep=2-cap plans are packed too: MESHES=ep=2-cap, and
#                               tp=2,ep=2: four ranks, so mesh1 only, sequence parallel as moec plans
#                               it by default where tp and ep combine); MESHES="" skips the mesh checks
#   tests/gpu/gpu_run.sh run    on the GPU machine (no Bazel, no MLIR there): runs every GPU
#                               test, moe-align --backend cuda for each golden family in f32
#                               and bf16 (and bf16 with --fuse-lora, three in f32 with
#                               --fused-expert-backward), and 6
#                               training steps of Qwen3-30B-A3B (48 and 4
#                               layers) and Qwen3-Next-80B-A3B (4 layers) at 4096 tokens on
#                               random weights; full logs go to $OUT (or .gpu/out), a table last.
set -euo pipefail
cd "$(dirname "$0")/../.."
pack=.gpu
families=(deepseek_v3 deepseek_v32 kimi_linear mixtral nemotron_h qwen3_moe qwen3_next)
# A mesh name with its expert exchange: "ep=2-all" is --mesh ep=2 --ep-exchange all; "ep=2-overlap"
# is --mesh ep=2 --overlap (token blocks, the exchange and gradient sums on a second stream);
# "tp=2-sp" is --mesh tp=2 --sequence-parallel, "tp=2-spx" that with the experts kept whole
# (--tp-replicate experts: each tp rank runs every expert on its rows).
meshFlags() {
  case "$1" in
    *-spx) echo "--mesh ${1%-spx} --sequence-parallel --tp-replicate experts" ;;
    *-cap) echo "--mesh ${1%-cap} --ep-exchange routed --ep-capacity-factor 1.75" ;;
    *-overlap) echo "--mesh ${1%-overlap} --overlap" ;;
    *-sp) echo "--mesh ${1%-sp} --sequence-parallel" ;;
    *-all | *-routed) echo "--mesh ${1%-*} --ep-exchange ${1##*-}" ;;
    *) echo "--mesh $1" ;;
  esac
}

if [ "${1:-}" = pack ]; then
  golden="${GOLDEN:-../shared/golden}"
  tests=$(bazel query 'attr(tags, "\bgpu\b", tests(//runtime/...))' 2>/dev/null)
  # Kernel micro-benchmarks: cc_binary targets named *_bench next to the CUDA kernels.
  benches=$(bazel query 'filter("_bench$", kind(cc_binary, //runtime/kernels/cuda/...))' 2>/dev/null)
  bazel build $tests $benches //runtime/backends/cuda:device_probe_test //runtime/tools:moe-run \
    //tests/golden:moe-align //tests/golden:moe-mesh-check //runtime/comm:exchange_bench //compiler/tools:moec
  bin="$(bazel info bazel-bin 2>/dev/null)"
  rm -rf "$pack" && mkdir -p "$pack/bin/tests" "$pack/bin/bench" "$pack/lib" "$pack/plans"
  for b in $benches; do
    path="${b#//}"; install -m 755 "$bin/${path/://}" "$pack/bin/bench/"
  done
  for t in $tests //runtime/backends/cuda:device_probe_test; do
    path="${t#//}"; path="${path/://}"
    install -m 755 "$bin/$path" "$pack/bin/tests/$(echo "${t#//}" | tr '/:' '__')"
  done
  install -m 755 "$bin/runtime/tools/moe-run" "$bin/tests/golden/moe-align" "$bin/tests/golden/moe-mesh-check" \
    "$bin/runtime/comm/exchange_bench" "$pack/bin/"
  strip "$pack"/bin/* "$pack"/bin/tests/* "$pack"/bin/bench/* 2>/dev/null || true
  # Libraries the binaries load that a bare GPU machine may lack (not glibc itself).
  for f in "$pack"/bin/* "$pack"/bin/tests/* "$pack"/bin/bench/*; do
    [ -f "$f" ] && ldd "$f" | awk '/=> \// {print $3}'
  done | sort -u | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libcublas|libcublasLt|libnccl|libcuda)\.so' |
    while read -r lib; do
    cp -L "$lib" "$pack/lib/"
  done
  cp -rL "$golden" "$pack/golden"
  # Two plans per family and dtype, as moe-align makes them itself: the default (LM head fused
  # with the loss) for training, an unfused one (--base-plan) for hidden states and logits.
  for f in "${families[@]}"; do
    for dtype in float32 bfloat16; do
      for fuse in fused unfused fuselora; do
        extra=(); [ "$fuse" = unfused ] && extra=(--no-fuse); [ "$fuse" = fuselora ] && extra=(--fuse-lora)
        "$bin/compiler/tools/moec" compile "$golden/$f/config.json" --adapter "$golden/$f/adapter" \
          --seq-len 96 --micro-batch 2 --lr 1e-3 --warmup-steps 0 --schedule constant --max-grad-norm 0 \
          --weight-decay 0 --dtype "$dtype" "${extra[@]}" -o "$pack/plans/$f.$dtype.$fuse.moeplan" 2>/dev/null
      done
    done
  done
  # The expert MLP and its combine differentiated as one in float32 too (their composed kernels;
  # the bf16 plans above take the one-pass form by default where it applies).
  for f in qwen3_moe mixtral deepseek_v3; do
    "$bin/compiler/tools/moec" compile "$golden/$f/config.json" --adapter "$golden/$f/adapter" \
      --seq-len 96 --micro-batch 2 --lr 1e-3 --warmup-steps 0 --schedule constant --max-grad-norm 0 \
      --weight-decay 0 --dtype float32 --fused-expert-backward -o "$pack/plans/$f.float32.fused-experts.moeplan" 2>/dev/null
  done
  # The router trained in full (a model.mlir marks it trainable): PEFT's modules_to_save.
  "$bin/compiler/tools/moec" import "$golden/qwen3_moe/config.json" -o /tmp/moec-gate.mlir
  sed -i -e 's|moe.param @mlp_gate "\([^"]*\)" :|moe.param @mlp_gate "\1" trainable :|' /tmp/moec-gate.mlir
  "$bin/compiler/tools/moec" compile /tmp/moec-gate.mlir --adapter "$golden/qwen3_moe/adapter" \
    --seq-len 96 --micro-batch 2 --lr 1e-3 --warmup-steps 0 --schedule constant --max-grad-norm 0 \
    --weight-decay 0 -o "$pack/plans/qwen3_moe.float32.gate.moeplan" 2>/dev/null
  # Meshes of two GPUs: each family on dp=2 and ep=2 (one of the golden batch's two sequences
  # per rank), and Qwen3-30B-A3B at 4096 tokens per GPU on one GPU, dp=2 and ep=2.
  # pp=2: two stages, four micro-batches of one sequence per step (against one rank on four).
  for f in "${families[@]}"; do
    for dtype in float32 bfloat16; do
      for mesh in dp=2 ep=2 ep=2-all ep=2-cap pp=2 tp=2 tp=2-sp tp=2,ep=2 ep=2-overlap dp=2-overlap; do
        # tp ranks share their sequences: both of the golden batch's, as on one GPU.
        batch=1; [ "${mesh%-sp}" = tp=2 ] && batch=2
        "$bin/compiler/tools/moec" compile "$golden/$f/config.json" --adapter "$golden/$f/adapter" \
          --seq-len 96 --micro-batch $batch --pipeline-micro-batches 4 --lr 1e-3 --warmup-steps 0 --schedule constant \
          --max-grad-norm 0 --weight-decay 0 --dtype "$dtype" $(meshFlags "$mesh") \
          -o "$pack/plans/$f.$dtype.$mesh.moeplan" 2>/dev/null
      done
      "$bin/compiler/tools/moec" compile "$golden/$f/config.json" --adapter "$golden/$f/adapter" \
        --seq-len 96 --micro-batch 4 --lr 1e-3 --warmup-steps 0 --schedule constant --max-grad-norm 0 \
        --weight-decay 0 --dtype "$dtype" -o "$pack/plans/$f.$dtype.batch4.moeplan" 2>/dev/null
    done
  done
  for mesh in "" dp=2 ep=2 ep=2-routed pp=2 tp=2 tp=2-sp tp=2-spx ep=2-overlap dp=2-overlap; do
    "$bin/compiler/tools/moec" compile models/qwen3-30b-a3b/config.json --lora-rank 32 --lora-alpha 64 \
      --lora-targets q_proj,k_proj,v_proj,o_proj --seq-len 4096 ${mesh:+$(meshFlags "$mesh")} \
      --pipeline-micro-batches 4 -o "$pack/plans/scale.qwen3-30b-a3b.${mesh:-single}.moeplan" 2>/dev/null
  done
  # Multi-rank runs on one GPU (mesh1: moe-run --nproc 2 --ranks-on-one-gpu) against one rank:
  # the tiny gpt-oss with nonzero biases and sinks (attention and experts split over tp), and
  # Qwen3-30B-A3B shapes (4 layers, 4096 tokens, random weights) on tp=2 with sequence parallel.
  oss=tests/e2e/Inputs/tiny_gpt_oss.json
  for mesh in single tp=2 tp=2-sp; do
    flags=""; [ "$mesh" = single ] || flags="$(meshFlags "$mesh")"
    "$bin/compiler/tools/moec" compile "$oss" --seq-len 32 --micro-batch 2 --lora-rank 4 $flags \
      -o "$pack/plans/oss.$mesh.moeplan" 2>/dev/null
  done
  "$bin/runtime/tools/moe-run" init "$oss" --seed 0 --plan "$pack/plans/oss.single.moeplan" -o "$pack/oss-model"
  python3 tests/e2e/Inputs/nonzero_biases.py "$pack/oss-model/model.safetensors"
  for mesh in single tp=2-sp; do
    flags=""; [ "$mesh" = single ] || flags="$(meshFlags "$mesh")"
    "$bin/compiler/tools/moec" compile tests/gpu/Inputs/qwen3-30b-a3b-4layers.json --lora-rank 32 --lora-alpha 64 \
      --lora-targets q_proj,k_proj,v_proj,o_proj --seq-len 4096 --lr 1e-4 --warmup-steps 0 $flags \
      -o "$pack/plans/q4.$mesh.moeplan" 2>/dev/null
  done
  # OLMoE, whose q/k norms span every head (moe.sharded_rms_norm over tp): the tiny one in f32
  # and bf16, and OLMoE-1B-7B shapes (4 layers, 4096 tokens, random weights) with sequence parallel.
  # The tiny Nemotron-H with all-linear adapters (Mamba-2's in_proj adapter over tp) likewise
  # (tiny_*: the golden families' plans have the families' names).
  for mesh in single tp=2 tp=2-sp; do
    flags=""; [ "$mesh" = single ] || flags="$(meshFlags "$mesh")"
    for dtype in float32 bfloat16; do
      for tiny in olmoe nemotron_h; do
        "$bin/compiler/tools/moec" compile tests/e2e/Inputs/tiny_$tiny.json --seq-len 32 --micro-batch 2 --lora-rank 4 \
          --dtype $dtype $flags -o "$pack/plans/tiny_$tiny.$dtype.$mesh.moeplan" 2>/dev/null
      done
    done
    [ "$mesh" = tp=2 ] || "$bin/compiler/tools/moec" compile tests/gpu/Inputs/olmoe-1b-7b-4layers.json --lora-rank 32 \
      --lora-alpha 64 --lora-targets q_proj,k_proj,v_proj,o_proj --seq-len 4096 --lr 1e-4 --warmup-steps 0 $flags \
      -o "$pack/plans/o4.$mesh.moeplan" 2>/dev/null
  done
  # The expert exchange with bounded room (--ep-capacity-factor 1.75: 224 expert copies of 256).
  for mesh in single ep=2-cap; do
    flags=""; [ "$mesh" = single ] || flags="$(meshFlags "$mesh")"
    mb=2; [ "$mesh" = single ] && mb=4
    "$bin/compiler/tools/moec" compile models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch $mb --lora-rank 4 \
      $flags -o "$pack/plans/cap.$mesh.moeplan" 2>/dev/null
  done
  for tiny in olmoe nemotron_h; do
    "$bin/runtime/tools/moe-run" init tests/e2e/Inputs/tiny_$tiny.json --seed 0 \
      --plan "$pack/plans/tiny_$tiny.float32.single.moeplan" -o "$pack/tiny_$tiny-model"
  done
  # Real-size training on random weights (made on the GPU): 4096 tokens, LoRA r=32 on attention.
  attention=q_proj,k_proj,v_proj,o_proj,in_proj_qkvz,in_proj_ba,out_proj
  for model in models/qwen3-30b-a3b/config.json tests/gpu/Inputs/qwen3-30b-a3b-4layers.json \
    tests/gpu/Inputs/qwen3-next-80b-a3b-4layers.json; do
    name="$(basename "$model" .json)"; [ "$name" = config ] && name=qwen3-30b-a3b
    targets=$attention; [[ "$name" == qwen3-30b* ]] && targets=q_proj,k_proj,v_proj,o_proj
    "$bin/compiler/tools/moec" compile "$model" --lora-rank 32 --lora-alpha 64 --lora-targets "$targets" \
      --seq-len 4096 --lr 1e-4 --warmup-steps 0 -o "$pack/plans/train.$name.moeplan" 2>/dev/null
  done
  MOEC="$bin/compiler/tools/moec" bash bench/bench.sh plans "$pack/plans/bench" 2>/dev/null
  cp models/tiny-qwen3-moe/train.jsonl "$pack/train.jsonl"
  # The tree that travels to the GPU machine is limited (64 MiB): ship one archive.
  tar -C "$pack" -cJf "/tmp/moec-pack.tar.xz" bin lib golden plans train.jsonl oss-model tiny_olmoe-model tiny_nemotron_h-model
  rm -rf "$pack" && mkdir -p "$pack" && mv /tmp/moec-pack.tar.xz "$pack/pack.tar.xz"
  du -sh "$pack"
  echo "packed $pack: run with carry=[\"$pack\"] and command: bash tests/gpu/gpu_run.sh run"
  exit 0
fi

case "${1:-}" in
  run | bench | mesh | mesh1 | profile) ;;
  *) echo "usage: $0 pack|run|bench|mesh|mesh1|profile" >&2; exit 2 ;;
esac
out="${OUT:-$pack/out}"
mkdir -p "$out"
[ -f "$pack/pack.tar.xz" ] && tar -C "$pack" -xJf "$pack/pack.tar.xz"
export LD_LIBRARY_PATH="$PWD/$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
if [ "$1" = profile ]; then # where a bench plan's step goes (PLAN: P1..P4, default P4)
  plan="$pack/plans/bench/${PLAN:-P4}.moeplan"
  run=(bench --backend cuda --plan "$plan" --random-weights 0)
  MOEC_PROFILE=1 "$pack/bin/moe-run" "${run[@]}" --steps 4 --warmup 2 >"$out/profile.log" 2>&1
  cat "$out/profile.log"
  # The SM clock and power through 20 steps: P4 runs at the 700 W cap (bench/NOTES.md v12).
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader \
    -lms 50 >"$out/clocks.csv" &
  sampler=$!
  "$pack/bin/moe-run" "${run[@]}" --steps 20 --warmup 2 2>&1 | tail -1
  kill "$sampler"
  awk -F', ' '$3 + 0 > 400 {n++; c += $2; p += $3} END {if (n) printf "under load: SM clock %.0f MHz, %.0f W (%d samples)\n", c / n, p / n, n}' \
    "$out/clocks.csv"
  # One step's kernels one at a time (ncu's clocks, caches flushed: ratios, not the step).
  timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv "$pack/bin/moe-run" "${run[@]}" \
    --steps 1 --warmup 0 >"$out/ncu.csv" 2>"$out/ncu.err" || echo "ncu: see $out/ncu.err"
  exit 0
fi
if [ "$1" = bench ]; then # the kernel micro-benchmarks and the single-GPU table (bench/bench.sh)
  for b in "$pack"/bin/bench/*; do
    [ -f "$b" ] && { echo "===== $(basename "$b")"; "$b" || echo "FAILED: $(basename "$b")"; } 2>&1 | tee -a "$out/kernel_bench.log"
  done
  [ "${KERNELS_ONLY:-0}" = 1 ] || PATH="$PWD/$pack/bin:$PATH" bash bench/bench.sh run "$pack/plans/bench"
  exit 0
fi
# Every golden family on the mesh plans against one GPU (moe-mesh-check, f32 and bf16); extra
# flags (--ranks-on-one-gpu) go to every check. Appends to summary.
meshChecks() {
  : >"$out/mesh_check.log"
  for f in "${families[@]}"; do
    for dtype in float32 bfloat16; do
      for mesh in ${MESHES:-dp=2 ep=2 ep=2-all pp=2 tp=2 tp=2-sp ep=2-overlap dp=2-overlap}; do
        single="$pack/plans/$f.$dtype.fused.moeplan"; [ "$mesh" = pp=2 ] && single="$pack/plans/$f.$dtype.batch4.moeplan"
        if "$pack/bin/moe-mesh-check" "$pack/golden/$f" --backend cuda --dtype "$dtype" --mesh "${mesh%-*}" \
          --plan "$single" --mesh-plan "$pack/plans/$f.$dtype.$mesh.moeplan" "$@" \
          $([ "$dtype" = bfloat16 ] && echo --f32-plan "${single/.bfloat16./.float32.}") \
          >"$out/one.log" 2>&1; then status=PASS; else status=FAIL; fi
        { echo "===== moe-mesh-check $f $dtype $mesh ($status)"; cat "$out/one.log"; } >>"$out/mesh_check.log"
        summary+=("$(printf '%-62s %-7s %s' "moe-mesh-check $f --dtype $dtype --mesh $mesh" "$status" "$(tail -1 "$out/one.log")")")
      done
    done
  done
  rm -f "$out/one.log"
}
if [ "$1" = mesh1 ]; then
  nvidia-smi -L || true
  summary=()
  [ -n "${MESHES+set}" ] && [ -z "$MESHES" ] || meshChecks --ranks-on-one-gpu
  # moe-run itself: two thread ranks on this GPU against one rank, step by step.
  : >"$out/train1.log"
  oneRun() { # name plan data steps tolerance model-flags...
    local name=$1 plan=$2 data=$3 steps=$4 tolerance=$5; shift 5
    "$pack/bin/moe-run" train --backend cuda --plan "$pack/plans/$plan.single.moeplan" "$@" --data "$data" \
      --out "$pack/runs/$plan.single" --steps "$steps" --log-every 1 --in-order >>"$out/train1.log" 2>&1
    for mesh in $name; do
      if "$pack/bin/moe-run" train --backend cuda --plan "$pack/plans/$plan.$mesh.moeplan" "$@" --data "$data" \
        --out "$pack/runs/$plan.$mesh" --steps "$steps" --log-every 1 --in-order --nproc 2 --ranks-on-one-gpu \
        >>"$out/train1.log" 2>&1 &&
        python3 tests/e2e/Inputs/same_losses.py "$pack/runs/$plan.$mesh/metrics.jsonl" \
          "$pack/runs/$plan.single/metrics.jsonl" "$tolerance" >"$out/one.log" 2>&1; then status=PASS; else status=FAIL; fi
      cat "$out/one.log" >>"$out/train1.log" 2>/dev/null
      summary+=("$(printf '%-62s %-7s %s' "moe-run train $plan $mesh (2 ranks, one GPU)" "$status" "$(tail -1 "$out/one.log" 2>/dev/null)")")
    done
  }
  oneRun "tp=2 tp=2-sp" oss tests/e2e/Inputs/train.jsonl 4 1e-4 --model "$pack/oss-model"
  oneRun "tp=2-sp" q4 "$pack/train.jsonl" 3 2e-2 --random-weights 0
  for tiny in olmoe nemotron_h; do
    oneRun "tp=2 tp=2-sp" tiny_$tiny.float32 tests/e2e/Inputs/train.jsonl 4 1e-4 --model "$pack/tiny_$tiny-model"
    oneRun "tp=2 tp=2-sp" tiny_$tiny.bfloat16 tests/e2e/Inputs/train.jsonl 4 2e-2 --model "$pack/tiny_$tiny-model"
  done
  oneRun "tp=2-sp" o4 "$pack/train.jsonl" 3 2e-2 --random-weights 0
  oneRun "ep=2-cap" cap tests/e2e/Inputs/train.jsonl 4 1e-4 --random-weights 0
  rm -f "$out/one.log"
  printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
  exit 0
fi
if [ "$1" = mesh ]; then
  nvidia-smi -L || true
  summary=()
  for t in runtime_comm_nccl_communicator_test runtime_kernels_cuda_routing_expert_mlp_test \
    runtime_backends_cuda_copy_blocks_test; do
    if "$pack/bin/tests/$t" >"$out/$t.log" 2>&1; then status=ok; else status=FAILED; fi
    summary+=("$(printf '%-62s %-7s %s' "$t" "$status" "$(grep -E '^\[  (PASSED|FAILED) ' "$out/$t.log" | tr '\n' ' ')")")
  done
  meshChecks
  : >"$out/scale.log"
  for mesh in ${SCALE_MESHES:-single dp=2 ep=2 ep=2-routed pp=2 tp=2 tp=2-sp tp=2-spx ep=2-overlap dp=2-overlap}; do
    nproc=2; [ "$mesh" = single ] && nproc=1
    { echo "===== Qwen3-30B-A3B 48 layers, 4096 tokens per GPU, $mesh (pp: 4 micro-batches of 4096 per step)"
      "$pack/bin/moe-run" bench --backend cuda --plan "$pack/plans/scale.qwen3-30b-a3b.$mesh.moeplan" \
        --random-weights 0 --steps 5 --warmup 2 --nproc $nproc 2>&1 || echo "FAILED: $mesh"
    } | tee -a "$out/scale.log"
  done
  # The expert exchange against a plain NCCL all-to-all, at Qwen3-30B-A3B's dispatch sizes.
  gpus=$(nvidia-smi -L | wc -l)
  for tokens in 4096 16384; do
    "$pack/bin/exchange_bench" --nproc "$gpus" --tokens $tokens 2>&1 | tee -a "$out/exchange_bench.log"
  done
  # A rank that hangs (stopped here) must not hang the run: rank 0's watchdog names its step
  # and exits, and --nproc stops the stopped rank.
  if [ "${HANG:-1}" != 0 ]; then
    { MOEC_RANK_TIMEOUT=20 "$pack/bin/moe-run" bench --backend cuda --plan "$pack/plans/scale.qwen3-30b-a3b.ep=2.moeplan" \
        --random-weights 0 --steps 200 --warmup 1 --nproc 2 & launcher=$!
      sleep 45; pkill -STOP -n -f "moe-run bench --backend cuda" || true
      code=0; wait $launcher || code=$?; echo "exit status $code"; } >"$out/hang.log" 2>&1
    grep -q "no progress for" "$out/hang.log" && status=PASS || status=FAIL
    summary+=("$(printf '%-62s %-7s %s' "a stopped rank ends the run (watchdog)" "$status" "$(grep -o 'rank 0: no progress.*' "$out/hang.log" | head -1)")")
  fi
  printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
  exit 0
fi
nvidia-smi -L || true
summary=()
: >"$out/gpu_tests.log"
for t in "$pack"/bin/tests/*; do
  name="$(basename "$t")"
  if "$t" >"$out/one.log" 2>&1; then status=ok; else status=FAILED; fi
  passed=$(grep -c '^\[       OK \]' "$out/one.log" || true)
  failed=$(grep -c '^\[  FAILED  \].*(' "$out/one.log" || true)
  skipped=$(grep -c '^\[  SKIPPED \]' "$out/one.log" || true)
  { echo "===== $name ($status)"; cat "$out/one.log"; } >>"$out/gpu_tests.log"
  summary+=("$(printf '%-62s %-7s %4s ok %4s failed %4s skipped' "$name" "$status" "$passed" "$failed" "$skipped")")
done
rm -f "$out/one.log"
: >"$out/align.log"
for f in "${families[@]}"; do
  for dtype in float32 bfloat16; do
    reference=(); [ "$dtype" = bfloat16 ] && reference=(--golden "tests/golden/bf16/$f.safetensors"
      --bf16-spread "tests/golden/bf16/$f.transformers_bf16.safetensors")
    if "$pack/bin/moe-align" "$pack/golden/$f" --backend cuda --dtype "$dtype" "${reference[@]}" \
      --plan "$pack/plans/$f.$dtype.fused.moeplan" --base-plan "$pack/plans/$f.$dtype.unfused.moeplan" \
      >"$out/one.log" 2>&1; then status=PASS; else status=FAIL; fi
    { echo "===== moe-align $f $dtype ($status)"; cat "$out/one.log"; } >>"$out/align.log"
    summary+=("$(printf '%-62s %-7s %s' "moe-align $f --dtype $dtype" "$status" "$(tail -1 "$out/one.log")")")
  done
done
# The projections fused with their LoRA updates (--fuse-lora, off by default until this agrees:
# docs/alignment.md), bf16 against the same references.
for f in "${families[@]}"; do
  if "$pack/bin/moe-align" "$pack/golden/$f" --backend cuda --dtype bfloat16 --golden "tests/golden/bf16/$f.safetensors" \
    --bf16-spread "tests/golden/bf16/$f.transformers_bf16.safetensors" --plan "$pack/plans/$f.bfloat16.fuselora.moeplan" \
    --base-plan "$pack/plans/$f.bfloat16.unfused.moeplan" >"$out/one.log" 2>&1; then status=PASS; else status=FAIL; fi
  { echo "===== moe-align $f bfloat16 --fuse-lora ($status)"; cat "$out/one.log"; } >>"$out/align.log"
  summary+=("$(printf '%-62s %-7s %s' "moe-align $f --dtype bfloat16 --fuse-lora" "$status" "$(tail -1 "$out/one.log")")")
done
for plan in "$pack"/plans/*.float32.fused-experts.moeplan; do
  f="$(basename "$plan" .float32.fused-experts.moeplan)"
  if "$pack/bin/moe-align" "$pack/golden/$f" --backend cuda --dtype float32 --plan "$plan" \
    --base-plan "$pack/plans/$f.float32.unfused.moeplan" >"$out/one.log" 2>&1; then status=PASS; else status=FAIL; fi
  { echo "===== moe-align $f float32 --fused-expert-backward ($status)"; cat "$out/one.log"; } >>"$out/align.log"
  summary+=("$(printf '%-62s %-7s %s' "moe-align $f --dtype float32 --fused-expert-backward" "$status" "$(tail -1 "$out/one.log")")")
done
rm -f "$out/one.log"
: >"$out/train.log"
for plan in "$pack"/plans/train.*.moeplan; do
  name="$(basename "$plan" .moeplan)"; name="${name#train.}"
  if "$pack/bin/moe-run" train --backend cuda --plan "$plan" --random-weights 0 --data "$pack/train.jsonl" \
    --out "$pack/runs/$name" --steps 6 --log-every 1 >"$out/one.log" 2>&1; then status=ok; else status=FAILED; fi
  { echo "===== moe-run train $name ($status)"; cat "$out/one.log"; } >>"$out/train.log"
  summary+=("$(printf '%-62s %-7s %s' "moe-run train $name (4096 tokens)" "$status" "$(grep '^step' "$out/one.log" | tail -1)")")
done
rm -f "$out/one.log"
# PEFT loads what moe-run writes: train the golden qwen3_moe 3 steps on the GPU, then compare
# transformers + PEFT's loss with moe-run's on the first batch; again with the router trained in
# full (PEFT's modules_to_save).
golden="$pack/golden/qwen3_moe"
peftCheck() { # plan-name run-name what
  local plan="$pack/plans/$1.moeplan" run="$pack/runs/$2"
  {
    "$pack/bin/moe-run" train --backend cuda --plan "$plan" --model "$golden" --data "$pack/train.jsonl" \
      --out "$run" --steps 3 &&
    ours=$("$pack/bin/moe-run" forward --backend cuda --plan "$plan" --model "$golden" \
      --adapter "$run/adapter" --data "$pack/train.jsonl" | awk '{print $NF}') &&
    python3 tests/gpu/peft_check.py "$golden" "$run/adapter" "$pack/train.jsonl" 96 2 "$ours"
  } >"$out/$2.log" 2>&1 && status=PASS || status=FAIL
  summary+=("$(printf '%-62s %-7s %s' "$3" "$status" "$(tail -1 "$out/$2.log")")")
}
peftCheck qwen3_moe.float32.fused peft "PEFT loads moe-run's adapter (qwen3_moe)"
peftCheck qwen3_moe.float32.gate peft-gate "PEFT loads an adapter with the router trained in full"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
