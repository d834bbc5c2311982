#!/usr/bin/env python3
"""Speed only counts when the numbers are right: moe-run's loss curve against transformers + PEFT.

  python3 bench/loss_agreement.py prepare CONFIG.json DIR [--steps 20] [--seq 4096] [--lr 1e-3]
  python3 bench/loss_agreement.py compare DIR OUR_METRICS.jsonl [--tolerance 2e-2]

prepare (GPU machine): random bf16 weights from CONFIG (seed 0), saved to DIR/model; a PEFT LoRA
adapter (r=32, alpha=64, q/k/v/o projections, PEFT's initialisation) saved before any step to
DIR/adapter0; 4 windows of SEQ random tokens (seed 1) in DIR/data.jsonl; then STEPS steps of
transformers + PEFT on those windows in file order, cycling (AdamW lr LR constant, betas 0.9/0.999,
eps 1e-8, no weight decay, gradient norm clipped to 1.0: the plan bench.sh compiles for this), the
loss before each step in DIR/reference_losses.json.

compare: moe-run trained from DIR/model + DIR/adapter0 on DIR/data.jsonl with --in-order; every
step's loss must be within TOLERANCE (relative) of the reference's. Prints both curves.
"""
import argparse
import json
import os
import sys


def prepare(args):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    os.makedirs(os.path.join(args.dir, "config"), exist_ok=True)
    with open(args.config) as src, open(os.path.join(args.dir, "config", "config.json"), "w") as dst:
        dst.write(src.read())  # from_pretrained wants a directory holding config.json
    config = AutoConfig.from_pretrained(os.path.join(args.dir, "config"))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(os.path.join(args.dir, "model"))
    model = get_peft_model(model, LoraConfig(r=32, lora_alpha=64,
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    model.save_pretrained(os.path.join(args.dir, "adapter0"))

    generator = torch.Generator().manual_seed(1)
    windows = torch.randint(0, config.vocab_size, (4, args.seq), generator=generator)
    with open(os.path.join(args.dir, "data.jsonl"), "w") as f:
        for w in windows:
            f.write(json.dumps({"input_ids": w.tolist()}) + "\n")

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    losses = []
    for step in range(args.steps):
        ids = windows[step % len(windows)].view(1, -1).cuda()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    with open(os.path.join(args.dir, "reference_losses.json"), "w") as f:
        json.dump(losses, f)
    print(f"prepared {args.dir}: reference losses {losses[0]:.4f} -> {losses[-1]:.4f} over {args.steps} steps")


def compare(args):
    with open(os.path.join(args.dir, "reference_losses.json")) as f:
        reference = json.load(f)
    ours = []
    with open(args.metrics) as f:
        for line in f:
            record = json.loads(line)
            if "loss" in record:
                ours.append(record["loss"])
    if len(ours) < len(reference):
        print(f"moe-run logged {len(ours)} losses, the reference {len(reference)}")
        return 1
    worst, bad = 0.0, 0
    print("step  transformers+PEFT  moe-run   relative difference")
    for step, (r, o) in enumerate(zip(reference, ours)):
        rel = abs(o - r) / max(abs(r), 1e-12)
        worst = max(worst, rel)
        bad += rel > args.tolerance
        print(f"{step + 1:4d}  {r:17.4f}  {o:8.4f}  {rel:.2e}{'  FAIL' if rel > args.tolerance else ''}")
    verdict = "agree" if bad == 0 else "DISAGREE"
    print(f"loss curves {verdict}: {len(reference)} steps, worst relative difference {worst:.2e} "
          f"(tolerance {args.tolerance:g}); reference {reference[0]:.4f} -> {reference[-1]:.4f}, "
          f"moe-run {ours[0]:.4f} -> {ours[len(reference) - 1]:.4f}")
    return 0 if bad == 0 else 1


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("config")
    p.add_argument("dir")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--lr", type=float, default=1e-3)
    c = sub.add_parser("compare")
    c.add_argument("dir")
    c.add_argument("metrics")
    c.add_argument("--tolerance", type=float, default=2e-2)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args)
        return 0
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
