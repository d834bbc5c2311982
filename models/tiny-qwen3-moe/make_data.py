#!/usr/bin/env python3
"""Writes train.jsonl: the bundled synthetic task the demo fine-tunes on.

Every record walks a fixed cycle through 32 of the 256 token ids (token t is
followed by next[t]) from a random start, so the next token is a function of
the current one. A random model predicts it no better than chance (loss ~
ln 256 = 5.5); a LoRA adapter can learn the map, and the loss falls clearly.
Deterministic: python3 make_data.py > train.jsonl
"""
import json
import random

rng = random.Random(1234)
tokens = rng.sample(range(256), 32)
nxt = {a: b for a, b in zip(tokens, tokens[1:] + tokens[:1])}
for _ in range(256):
    t = rng.choice(tokens)
    ids = []
    for _ in range(64):
        ids.append(t)
        t = nxt[t]
    print(json.dumps({"input_ids": ids}))
