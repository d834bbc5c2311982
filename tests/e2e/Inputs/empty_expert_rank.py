"""Prints each (step, layer) of a metrics.jsonl where an expert-parallel rank received no
token copies (its entry of expert_load's ep_ranks is 0), then how many there were."""
import json
import sys

found = 0
for line in open(sys.argv[1]):
    record = json.loads(line)
    for layer, load in sorted(record.get("expert_load", {}).items(), key=lambda kv: int(kv[0])):
        if 0 in load.get("ep_ranks", []):
            print(f"step {record['step']} layer {layer}: ep ranks {load['ep_ranks']}")
            found += 1
print(f"{found} layer steps with an expert-parallel rank that received nothing")
