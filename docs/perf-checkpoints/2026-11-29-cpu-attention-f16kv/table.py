#!/usr/bin/env python3
"""Table of this record from its raw `hipfire bench --json` files (rN-BUILD-pPROMPT.json).

    python3 docs/perf-checkpoints/2026-11-29-cpu-attention-f16kv/table.py
"""
import glob
import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
rows = {}
for path in sorted(glob.glob(os.path.join(HERE, "r*-*-p*.json"))):
    rnd, build, prompt = re.match(r"r(\d+)-(\w+)-p(\d+)\.json", os.path.basename(path)).groups()
    d = json.load(open(path))
    m = d["modes"][0]
    key = (int(prompt), build, d["commit"][:7])
    rows.setdefault(key, {"decode": [], "prefill": []})
    rows[key]["decode"] += m["decode_tok_s"]["samples"]
    rows[key]["prefill"] += m["prefill_tok_s"]["samples"]
print("| prompt tokens | build | commit | decode tok/s (6 samples) | mean | prefill tok/s | mean |")
print("|---|---|---|---|---|---|---|")
for (prompt, build, commit), r in sorted(rows.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
    dec, pre = r["decode"], r["prefill"]
    print(f"| {prompt} | {build} | {commit} | {min(dec):.1f}–{max(dec):.1f} | {sum(dec) / len(dec):.1f} | "
          f"{min(pre):.1f}–{max(pre):.1f} | {sum(pre) / len(pre):.1f} |")
