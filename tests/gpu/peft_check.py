#!/usr/bin/env python3
"""Does Hugging Face PEFT load the adapter moe-run wrote, and compute our loss with it?

Run on the GPU machine (it has torch, transformers and PEFT; CI does not):
  python3 tests/gpu/peft_check.py BASE_DIR ADAPTER_DIR DATA.jsonl SEQ_LEN MICRO_BATCH OUR_LOSS
Loads the base model and the adapter with PeftModel.from_pretrained (any missing or unexpected
adapter key is an error), rebuilds moe-run's first batch (the data's token stream cut into
SEQ_LEN windows, MICRO_BATCH of them, labels = tokens) and compares transformers' loss with
OUR_LOSS (what `moe-run forward` printed). Exits 1 if they differ by more than 1e-4. With
modules_to_save (weights trained in full), each such module's copy in the PEFT model must hold
the file's values exactly.
"""
import json
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

base, adapter, data, seq, batch, ours = sys.argv[1:7]
seq, batch, ours = int(seq), int(batch), float(ours)
model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
model = PeftModel.from_pretrained(model, adapter)
state = model.state_dict()
lora_keys = [k for k in state if "lora_" in k]
print(f"PEFT loaded {adapter}: {len(lora_keys)} LoRA tensors")
saved = json.load(open(f"{adapter}/adapter_config.json"))["modules_to_save"] or []
if saved:
    tensors = load_file(f"{adapter}/adapter_model.safetensors")
    full = {k: v for k, v in tensors.items() if "lora_" not in k}
    for name, value in full.items():
        module, leaf = name.rsplit(".", 1)
        copy = state.get(f"{module}.modules_to_save.default.{leaf}")
        if copy is None or not torch.equal(copy.float(), value.float()):
            sys.exit(f"{name}: PEFT's modules_to_save copy is {'missing' if copy is None else 'different'}")
    print(f"{len(saved)} modules to save, {len(full)} tensors: PEFT holds the file's values")

tokens = []
with open(data) as f:
    for line in f:
        tokens += json.loads(line)["input_ids"]
ids = torch.tensor(tokens[: seq * batch]).view(batch, seq)
with torch.no_grad():
    loss = model(input_ids=ids, labels=ids).loss.item()
print(f"transformers + PEFT loss {loss:.6f}, moe-run {ours:.6f}, difference {abs(loss - ours):.2e}")
sys.exit(0 if abs(loss - ours) <= 1e-4 else 1)
