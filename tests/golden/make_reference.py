#!/usr/bin/env python3
"""Recomputes a golden family's Hugging Face reference, optionally on bf16-rounded weights.

Developer tooling (needs torch, transformers 5.17 and PEFT 0.21; the build and the tests do not):

  python3 tests/golden/make_reference.py GOLDEN_DIR OUT.safetensors [--round-weights bf16]
      [--check GOLDEN.safetensors]
  python3 tests/golden/make_reference.py GOLDEN_DIR OUT.safetensors --compute bf16

The recipe of ../shared/golden/README.md from the step after save_pretrained: the saved model in
float32, the golden input_ids and labels, forward with output_hidden_states (hidden_states.i,
logits, loss), the saved PEFT adapter (lora.loss and lora.grad.<PEFT parameter name>), then 3
steps of AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, no decay) with the loss before each step
(lora.adamw_losses) and the parameters after them (lora.after3.<name>).

--round-weights bf16 rounds every base weight to bf16 (and back to f32) after loading: the model a
bf16 checkpoint is. Arithmetic stays float32 and the adapter stays float32 (as PEFT keeps it). A
bf16 run of MoEC compares with this reference: rounding the weights alone moves some LoRA
gradients of the tiny golden models by 2-10% from the float32 reference (more than bf16's
tolerance), which says nothing about the kernels.

--compute bf16 runs the same recipe the way transformers runs a bf16 model: weights and
activations in bf16 (the model loaded with dtype=torch.bfloat16), the adapter float32 (PEFT's
autocast_adapter_dtype). Its distance from the --round-weights bf16 reference is how far
transformers' own bf16 arithmetic moves each tensor from the exact function of the bf16 weights:
moe-align's --bf16-spread takes that file (docs/alignment.md).

--check compares every tensor written with a golden file (a run without rounding must reproduce
the shared golden.safetensors) and exits 1 if one differs by more than 1e-4 relative.
"""
import argparse
import os
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def rel(a, b):
    return ((a.double() - b.double()).norm() / max(b.double().norm().item(), 1e-30)).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("golden_dir")
    parser.add_argument("out")
    parser.add_argument("--round-weights", choices=["bf16"])
    parser.add_argument("--compute", choices=["bf16"])
    parser.add_argument("--check")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    golden = load_file(os.path.join(args.golden_dir, "golden.safetensors"))
    ids, labels = golden["input_ids"], golden["labels"]

    dtype = torch.bfloat16 if args.compute == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.golden_dir, dtype=dtype)
    if args.round_weights == "bf16":
        with torch.no_grad():
            for tensor in model.state_dict().values():
                if tensor.is_floating_point():
                    tensor.copy_(tensor.to(torch.bfloat16).to(torch.float32))

    out = {"input_ids": ids, "labels": labels}
    with torch.no_grad():
        base = model(input_ids=ids, labels=labels, output_hidden_states=True)
    for i, h in enumerate(base.hidden_states):
        out[f"hidden_states.{i}"] = h.float().contiguous()
    out["logits"] = base.logits.float().contiguous()
    out["loss"] = base.loss.float().reshape(1)

    model = PeftModel.from_pretrained(model, os.path.join(args.golden_dir, "adapter"), is_trainable=True)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    out["lora.loss"] = loss.detach().float().reshape(1)
    for n, p in params.items():
        out[f"lora.grad.{n}"] = p.grad.detach().float().contiguous()

    optimizer = torch.optim.AdamW(list(params.values()), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.0)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(input_ids=ids, labels=labels).loss
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
    out["lora.adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    for n, p in params.items():
        out[f"lora.after3.{n}"] = p.detach().float().contiguous()

    metadata = {"recipe": "../shared/golden/README.md",
                "weights": "rounded to bf16" if args.round_weights or args.compute else "as saved (float32)",
                "arithmetic": "bf16 (transformers' bf16 model)" if args.compute else "float32"}
    save_file(out, args.out, metadata=metadata)
    print(f"{args.golden_dir}: {len(out)} tensors -> {args.out} ({metadata['weights']})")

    if args.check:
        ref = load_file(args.check)
        worst, bad = 0.0, []
        for name, value in ref.items():
            if name not in out:
                bad.append(f"{name} missing")
                continue
            if value.is_floating_point():
                r = rel(out[name], value)
                worst = max(worst, r)
                if r > 1e-4:
                    bad.append(f"{name} rel {r:.2e}")
            elif not torch.equal(out[name], value):
                bad.append(f"{name} differs")
        print(f"check against {args.check}: worst rel {worst:.2e}, {len(bad)} bad"
              + "".join(f"\n  {b}" for b in bad[:10]))
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
