#!/usr/bin/env python3
"""The reference a user would pick instead: Hugging Face transformers + PEFT, LoRA training steps.

  python3 bench/hf_reference.py CONFIG.json SEQ_LEN TARGETS [STEPS] [WARMUP]
      [--target-parameters NAMES]

Random bf16 weights on the GPU, LoRA r=32 alpha=64 on TARGETS (comma-separated), AdamW, gradient
checkpointing, batch 1 of random tokens; prints the median step time and tokens/s after WARMUP
steps, in the same format as `moe-run bench` so gpu_run.sh can divide one by the other.
--target-parameters puts LoRA on parameters too (PEFT `target_parameters`, e.g. the fused expert
weights mlp.experts.gate_up_proj,mlp.experts.down_proj).
"""
import argparse
import os
import statistics
import tempfile
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("config")
parser.add_argument("seq", type=int)
parser.add_argument("targets")
parser.add_argument("steps", type=int, nargs="?", default=4)
parser.add_argument("warmup", type=int, nargs="?", default=2)
parser.add_argument("--target-parameters", default="")
args = parser.parse_args()
config_path, seq, steps, warmup = args.config, args.seq, args.steps, args.warmup
targets = args.targets.split(",")
target_parameters = [t for t in args.target_parameters.split(",") if t]

with tempfile.TemporaryDirectory() as d:
    with open(config_path) as src, open(os.path.join(d, "config.json"), "w") as dst:
        dst.write(src.read())
    config = AutoConfig.from_pretrained(d)
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.gradient_checkpointing_enable()
model.enable_input_require_grads()
lora = LoraConfig(r=32, lora_alpha=64, target_modules=targets, target_parameters=target_parameters or None)
model = get_peft_model(model, lora)
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
ids = torch.randint(0, config.vocab_size, (1, seq), device="cuda")
times = []
for i in range(warmup + steps):
    torch.cuda.synchronize()
    start = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    if i >= warmup:
        times.append(time.perf_counter() - start)
median = statistics.median(times)
print(f"transformers+PEFT: {seq} tokens per step, median step {median * 1e3:.1f} ms over {steps} steps "
      f"(after {warmup} warm-up), {seq / median:.0f} tokens/s, peak memory "
      f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
