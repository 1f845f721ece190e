#!/usr/bin/env python3
"""Prints this record's tables from the raw files: attention alone (attention.jsonl) and
`hipfire bench` decode (bench-*.json in run1, bench.json in run2/run3)."""
import json, os, re

HERE = os.path.dirname(os.path.abspath(__file__))
HBM = 4.4e12  # the H200's HBM ceiling the issue quotes, bytes/s


def attention(run):
    rows = [json.loads(l) for l in open(os.path.join(HERE, run, "attention.jsonl"))]
    print(f"\n{run}: attention alone, Llama-3-8B shape (32/8 heads of 128), 32 layers' caches rotated")
    print("| depth | split (plan) µs | GB/s | % of 4.4 TB/s | best swept plan | µs | replaced kernel µs | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    for d in sorted({r["depth"] for r in rows}):
        r = [x for x in rows if x["depth"] == d]
        pl = next(x for x in r if x["variant"] == "split planned")
        sw = min((x for x in r if x["variant"].startswith("split")), key=lambda x: x["us"])
        bl = [x for x in r if x["variant"].startswith("baseline")]
        b = f"{bl[0]['us']:.2f} | {bl[0]['us'] / pl['us']:.2f}×" if bl else "— (12288 max) | —"
        plan = f"{pl['n_chunks']}×{pl['chunk_len']}" + (f", {pl['heads_per_block']} heads" if "heads_per_block" in pl else "")
        swp = f"{sw['n_chunks']}×{sw['chunk_len']}" + (f", {sw['heads_per_block']} heads" if "heads_per_block" in sw else "")
        print(f"| {d} | {pl['us']:.2f} ({plan}) | {pl['gb_per_s']:.0f} | {100 * pl['gb_per_s'] * 1e9 / HBM:.0f} % | {swp} | {sw['us']:.2f} | {b} |")


def bench_objects(run):
    out = []
    p = os.path.join(HERE, run, "bench.json")
    if os.path.exists(p):
        text = open(p).read()
        for part in re.split(r"^== (.+)$", text, flags=re.M)[1:]:
            out.append(part)
        it = iter(out)
        return [(h.strip(), json.loads(b)) for h, b in zip(it, it) if b.strip()]
    res = []
    for f in sorted(os.listdir(os.path.join(HERE, run))):
        m = re.match(r"bench-(hipfire(?:-old)?)-(\d+)\.json", f)
        if m:
            res.append((f"{m.group(1)} {m.group(2)}", json.load(open(os.path.join(HERE, run, f)))))
    return res


def bench(run):
    print(f"\n{run}: hipfire bench, synthetic Llama-3-8B Q4_K, all resident, --gen-tokens 32 --rounds 1")
    print("| binary, depth | commit | decode tok/s | prefill tok/s |")
    print("|---|---|---|---|")
    for h, d in bench_objects(run):
        m = d["modes"][0]
        print(f"| {h} | {d['commit']} | {m['decode_tok_s']['median']:.1f} | {m['prefill_tok_s']['median']:.1f} |")


for run in ["run1", "run2", "run3"]:
    attention(run)
    bench(run)
