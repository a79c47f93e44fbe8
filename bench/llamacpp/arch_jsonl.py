#!/usr/bin/env python3
"""arch_jsonl.py: arch_greedy's text output as the JSON lines tests/vectors/*-llamacpp.jsonl hold.
   arch_jsonl.py SHAPE TYPE N_VOCAB N_CTX < SHAPE.llama.txt >> VECTORS.jsonl
Prompt p has 5 + p ids, id i = 3 + (p * 131 + i * 37) % (V - 3) (arch_greedy.c's prompts)."""
import json
import sys

shape, typ, vocab, n_ctx = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ids, tops = {}, {}
for line in sys.stdin:
    head, _, rest = line.partition(": ")
    words = head.split()
    if words[0] == "prompt":
        ids[int(words[1])] = [int(x) for x in rest.split(",")]
    elif words[0] == "top":
        pairs = [w.split(":") for w in rest.split()]
        tops.setdefault(int(words[1]), []).append(
            {"step": int(words[3]), "ids": [int(a) for a, _ in pairs], "logits": [float(b) for _, b in pairs]})
for p in sorted(ids):
    prompt = [3 + (p * 131 + i * 37) % (vocab - 3) for i in range(5 + p)]
    print(json.dumps({"shape": shape, "type": typ, "seed": 1, "n_ctx": n_ctx, "prompt_tokens": prompt,
                      "completion_tokens": ids[p], "top_logits": tops[p]}))
