#!/usr/bin/env python3
"""Checks what an expert placement changed in moe-run's metrics.jsonl, step by step.

usage: placed_load.py PLACED.jsonl CONSECUTIVE.jsonl [--equal-tokens-only]

The two runs train the same data from the same weights on the same mesh, one with the experts
placed (moec --expert-load), one with consecutive ranges. The tokens per expert (in global
expert order) must be equal: placement moves experts, not tokens. Prints the worst ep
imbalance (busiest rank over the mean, over steps and layers) of each and exits 1 if the
placed run's is higher.
"""
import json
import sys


def main():
    placed = [json.loads(line) for line in open(sys.argv[1])]
    consecutive = [json.loads(line) for line in open(sys.argv[2])]
    if len(placed) != len(consecutive) or not placed:
        sys.exit("the runs have %d and %d steps" % (len(placed), len(consecutive)))
    worst = [0.0, 0.0]
    for p, c in zip(placed, consecutive):
        if p["expert_load"].keys() != c["expert_load"].keys():
            sys.exit("step %d: MoE layers differ" % p["step"])
        for layer in p["expert_load"]:
            a, b = p["expert_load"][layer], c["expert_load"][layer]
            if a["tokens"] != b["tokens"]:
                sys.exit("step %d layer %s: tokens per expert differ: %s vs %s" % (p["step"], layer, a["tokens"], b["tokens"]))
            if sum(a["ep_ranks"]) != sum(a["tokens"]):
                sys.exit("step %d layer %s: the ranks' tokens %s do not add up" % (p["step"], layer, a["ep_ranks"]))
            worst[0] = max(worst[0], a["ep_imbalance"])
            worst[1] = max(worst[1], b["ep_imbalance"])
    print("tokens per expert equal over %d steps" % len(placed))
    if sys.argv[3:] == ["--equal-tokens-only"]:
        return
    print("worst ep imbalance: %.3f placed, %.3f consecutive" % (worst[0], worst[1]))
    if worst[0] > worst[1]:
        sys.exit("the placed run is less balanced")
    print("placed no worse")


if __name__ == "__main__":
    main()
