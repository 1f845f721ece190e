#!/usr/bin/env python3
"""Render a gpu_bench JSON (crates/hipfire-gpu/examples/gpu_bench.rs --json) as markdown tables.

usage: table.py gpu_bench.json            # one row per (config, format, shape)
       table.py --pivot run.json          # device ratio, formats x shapes by config
"""
import json
import sys


def main(argv):
    pivot = "--pivot" in argv
    path = [a for a in argv[1:] if not a.startswith("--")][0]
    doc = json.load(open(path))
    rows = doc["rows"]
    print(f"device: {doc['device']} ({doc['arch']}, {doc['sms']} SMs), median of {doc['reps']} passes\n")
    if pivot:
        cfgs = list(dict.fromkeys(r["config"] for r in rows))
        print("| format | m x k | " + " | ".join(cfgs) + " |")
        print("|---|---|" + "---|" * len(cfgs))
        keys = list(dict.fromkeys((r["format"], r["m"], r["k"]) for r in rows))
        for f, m, k in keys:
            cells = []
            for c in cfgs:
                x = [r for r in rows if (r["config"], r["format"], r["m"], r["k"]) == (c, f, m, k)]
                cells.append(f"{x[0]['device_ratio']:.3f}" if x else "")
            print(f"| {f} | {m}x{k} | " + " | ".join(cells) + " |")
        return
    print("| format | m | k | MiB | HBM read GB/s | HBM GEMV GB/s | GEMV/read | host read GB/s | host GEMV GB/s | GEMV/read |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['format']} | {r['m']} | {r['k']} | {r['bytes'] / 2**20:.1f} | {r['device_read_gbps']:.0f} | "
            f"{r['device_gemv_gbps']:.0f} | {r['device_ratio']:.3f} | {r['host_read_gbps']:.1f} | "
            f"{r['host_gemv_gbps']:.1f} | {r['host_ratio']:.3f} |"
        )


if __name__ == "__main__":
    main(sys.argv)
