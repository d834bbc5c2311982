#!/usr/bin/env python3
"""Compares the losses and gradient norms of two moe-run metrics.jsonl files, step by step.

usage: same_losses.py A.jsonl B.jsonl TOLERANCE

Prints one line per step and exits 1 when the files have different steps or when a loss or
gradient norm differs by more than TOLERANCE relative to B's.
"""
import json
import sys


def main():
    a_path, b_path, tolerance = sys.argv[1], sys.argv[2], float(sys.argv[3])
    a = [json.loads(line) for line in open(a_path)]
    b = [json.loads(line) for line in open(b_path)]
    if [r["step"] for r in a] != [r["step"] for r in b]:
        sys.exit("steps differ: %s vs %s" % ([r["step"] for r in a], [r["step"] for r in b]))
    worst = 0.0
    for x, y in zip(a, b):
        for key in ["loss", "grad_norm"]:
            worst = max(worst, abs(x[key] - y[key]) / max(abs(y[key]), 1e-12))
        print("step %d loss %.6f %.6f" % (x["step"], x["loss"], y["loss"]))
    if worst > tolerance:
        sys.exit("worst relative difference %.3g > %g" % (worst, tolerance))
    print("%d steps agree within %g" % (len(a), tolerance))


if __name__ == "__main__":
    main()
