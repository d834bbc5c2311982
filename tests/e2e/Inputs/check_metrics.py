#!/usr/bin/env python3
"""Checks a moe-run metrics.jsonl and prints a summary for FileCheck.

usage: check_metrics.py METRICS.jsonl STEPS TOKENS_PER_STEP TOP_K

Every line must be one JSON object, for steps 1..STEPS in order, with exactly the keys step,
loss, lr, grad_norm, tokens_per_s and expert_load (layer -> {tokens: [per expert], imbalance}),
where each layer's tokens add up to TOKENS_PER_STEP * TOP_K and imbalance = max / mean (with
experts split over ep also ep_ranks, the rows each rank's experts get, and their ep_imbalance).
Exits 1 with a message naming the line on the first problem. Last, it says whether the loss of
the last step is more than 1 (nat) below the loss of step 1.
"""
import json
import math
import sys

KEYS = ["expert_load", "grad_norm", "loss", "lr", "step", "tokens_per_s"]


def main():
    path, steps, tokens, top_k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            where = "%s:%d" % (path, number)
            row = json.loads(line)  # raises (exit 1) on a malformed line
            if not isinstance(row, dict) or sorted(row) != KEYS:
                sys.exit("%s: keys %s, expected %s" % (where, sorted(row), KEYS))
            if row["step"] != number:
                sys.exit("%s: step %s, expected %d" % (where, row["step"], number))
            for key in ["loss", "lr", "grad_norm", "tokens_per_s"]:
                if not isinstance(row[key], (int, float)) or not math.isfinite(row[key]) or row[key] < 0:
                    sys.exit("%s: %s is %r" % (where, key, row[key]))
            for layer, load in row["expert_load"].items():
                counts = load["tokens"]
                if sum(counts) != tokens * top_k:
                    sys.exit("%s: layer %s routes %d tokens, expected %d" % (where, layer, sum(counts), tokens * top_k))
                if abs(load["imbalance"] - max(counts) * len(counts) / sum(counts)) > 1e-4:
                    sys.exit("%s: layer %s imbalance %r, expected max/mean" % (where, layer, load["imbalance"]))
                if "ep_ranks" in load:  # experts split over ep: rows per expert-parallel rank
                    ranks = load["ep_ranks"]
                    per = len(counts) // len(ranks)
                    if ranks != [sum(counts[r * per:(r + 1) * per]) for r in range(len(ranks))]:
                        sys.exit("%s: layer %s ep_ranks %r are not the sums of %d experts each" % (where, layer, ranks, per))
                    if abs(load["ep_imbalance"] - max(ranks) * len(ranks) / sum(counts)) > 1e-4:
                        sys.exit("%s: layer %s ep_imbalance %r, expected max/mean" % (where, layer, load["ep_imbalance"]))
            rows.append(row)
    if len(rows) != steps:
        sys.exit("%s: %d lines, expected %d" % (path, len(rows), steps))
    layers = sorted(rows[0]["expert_load"])
    experts = sorted({len(load["tokens"]) for row in rows for load in row["expert_load"].values()})
    print("%d steps, keys %s" % (len(rows), " ".join(KEYS)))
    print("expert_load: layers %s, experts %s, %d routed tokens per layer" % (
        " ".join(layers), " ".join(map(str, experts)), tokens * top_k))
    first, last = rows[0]["loss"], rows[-1]["loss"]
    verdict = "fell by more than 1" if last < first - 1.0 else "did not fall by more than 1"
    print("loss %s: step 1 %.4f, step %d %.4f" % (verdict, first, steps, last))


if __name__ == "__main__":
    main()
