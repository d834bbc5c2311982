#!/usr/bin/env python3
"""Fills every bias and attention sink of an F32 safetensors model with nonzero values, in place.

usage: nonzero_biases.py MODEL.safetensors

Random models start their biases and sinks at zero (as transformers initialises them), where a
bias added once or twice, or sinks given to the wrong heads, compute the same thing; tests of
how those tensors split over ranks need them nonzero. Element i of a tensor becomes
0.05 * sin(i + 7 * k) for the k-th such tensor (sorted by name): deterministic, no numpy.
"""
import json
import math
import struct
import sys


def main():
    path = sys.argv[1]
    with open(path, "rb") as f:
        blob = bytearray(f.read())
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    base = 8 + size
    names = sorted(n for n in header if n != "__metadata__" and
                   (n.endswith("bias") or n.endswith("sinks")))
    for k, name in enumerate(names):
        info = header[name]
        if info["dtype"] != "F32":
            sys.exit("%s: %s is %s, expected F32" % (path, name, info["dtype"]))
        begin, end = info["data_offsets"]
        count = (end - begin) // 4
        values = [0.05 * math.sin(i + 7 * k) for i in range(count)]
        blob[base + begin:base + end] = struct.pack("<%df" % count, *values)
    with open(path, "wb") as f:
        f.write(blob)
    print("%d biases and sinks set" % len(names))


if __name__ == "__main__":
    main()
