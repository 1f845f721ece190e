#!/usr/bin/env python3
"""The table of README.md from raw/: `hipfire bench --json` rows of each round."""
import json
import pathlib
import statistics

RAW = pathlib.Path(__file__).resolve().parent / "raw"
means = {}
for tag in ("add40d5", "new"):
    for r in range(1, 5):
        row = json.loads((RAW / f"{tag}-round{r}.json").read_text())[0]
        means.setdefault(tag, []).append(row["avg_ts"])
        print(f"| {tag} | {r} | {row['avg_ts']:.1f} | {', '.join(f'{s:.0f}' for s in row['samples_ts'])} |")
for tag, v in means.items():
    print(f"{tag}: mean of round means {statistics.mean(v):.1f} tok/s")
