#!/usr/bin/env python3
"""Tables and charts of this checkpoint, from the raw files in this folder only.

    python3 docs/perf-checkpoints/2026-11-30-auto-per-shape-h200/chart.py            # tables + SVGs
    python3 docs/perf-checkpoints/2026-11-30-auto-per-shape-h200/chart.py --tables   # tables only

Each NN-<commit>/ folder is one or more device calls (NN in time order) with the bundle's commit
in its name. The charts are drawn by the repository's `chart_targets` and `chart_per_shape`
examples; set CARGO_TARGET_DIR to keep their build apart. Every ratio printed here is computed from two numbers
of the same run (the target rounds: of the same round).
"""
import glob
import json
import os
import subprocess
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def load(path):
    with open(path) as f:
        return json.load(f)


def median(v):
    v = sorted(v)
    return v[len(v) // 2]


def targets_table():
    print("## The layer targets in interleaved rounds (single_layer --target-rounds 9)\n")
    print("| record | layers per timed rep | flags / both-at-once | flags / cpu | flags / pcie"
          " | sync | ceiling GB/s | flags GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(HERE, "*", "targets-*chain*.json"))):
        d = load(path)
        rounds = d["targets"]["rounds"]
        figs = {
            "ceil": [r["flags_gbs"] / (r["both_cpu_gbs"] + r["both_gpu_gbs"]) for r in rounds],
            "cpu": [r["flags_gbs"] / r["cpu_gbs"] for r in rounds],
            "pcie": [r["flags_gbs"] / r["pcie_gbs"] for r in rounds],
            "sync": [r["flags_sync"] for r in rounds],
        }
        met = {
            "ceil": sum(v >= 0.90 for v in figs["ceil"]),
            "cpu": sum(v >= 1.15 for v in figs["cpu"]),
            "pcie": sum(v >= 2.0 for v in figs["pcie"]),
            "sync": sum(v <= 0.05 for v in figs["sync"]),
        }
        cell = lambda k, f="{:.3f}": (f.format(median(figs[k])) +
                                      f" [{f.format(min(figs[k]))}, {f.format(max(figs[k]))}]"
                                      f" {met[k]}/{len(rounds)}")
        pct = "{:.1%}"
        ceil = [r["both_cpu_gbs"] + r["both_gpu_gbs"] for r in rounds]
        flags = [r["flags_gbs"] for r in rounds]
        rec = os.path.basename(os.path.dirname(path))
        print(f"| {rec} | {d['chain']} | {cell('ceil')} | {cell('cpu')} | {cell('pcie')} |"
              f" {cell('sync', pct)} | {median(ceil):.1f} | {median(flags):.1f} |")
    print("\nEach cell: median [min, max] over the rounds, then the rounds that met the target.\n")


def ab_table():
    print("## flags knobs A/B (single_layer --ab-rounds 13 or 15, ratio to the first variant)\n")
    print("| record | variant | us/layer (median) | ratio (median) | rounds above 1 |")
    print("|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(HERE, "*", "ab.json"))):
        d = load(path)
        rec = os.path.basename(os.path.dirname(path))
        for v in d["variants"][1:]:
            above = sum(r > 1.0 for r in v["ratio_to_first_rounds"])
            print(f"| {rec} | {v['variant']} | {v['median_us']:.1f} |"
                  f" {v['median_ratio_to_first']:.3f} | {above} of {len(v['ratio_to_first_rounds'])} |")
    print()


def per_shape_table():
    for path in sorted(glob.glob(os.path.join(HERE, "*", "per_shape.json"))):
        d = load(path)
        rec = os.path.basename(os.path.dirname(path))
        print(f"## Per shape, auto against the sweep's 3 fastest shares ({rec}, chain {d['chain']})\n")
        rounds = len(d["per_shape"][0]["a_a_rounds"])
        print(f"({rounds} interleaved rounds)\n")
        print("| proj | strategy | auto share | h2h ratio (rival share) | A/A control |")
        print("|---|---|---|---|---|")
        ok = {}
        for r in d["per_shape"]:
            h = r["auto_over_best_interleaved"]
            name = r["strategy"]
            variant = r.get("flags_variant") or r.get("two_stream_variant")
            if variant not in (None, "default"):
                name += "/" + variant
            ok.setdefault(name, []).append(h >= 0.97)
            print(f"| {r['proj']} | {name} | {r['auto_share']:.3f} |"
                  f" {h:.3f} ({r['interleaved_best_share']:.2f}) | {r['a_a_control']:.3f} |")
        aa = [r["a_a_control"] for r in d["per_shape"]]
        print("\nwithin 3 %: " + ", ".join(f"{k} {sum(v)} of {len(v)}" for k, v in ok.items()) +
              f"; A/A control {min(aa):.3f}-{max(aa):.3f}\n")


def decode_table():
    print("## Decode, synthetic Llama-3-8B Q4_K, with llama.cpp in the same run (tok/s)\n")
    print("| round | resident / spilled | cpu | pcie | passback | llama.cpp |"
          " passback / max(cpu, pcie) | passback / llama.cpp |")
    print("|---|---|---|---|---|---|---|---|")
    # The box keeps one run folder, so round 2's archive holds round 1's files too: merge.
    files = {}
    for tgz in sorted(glob.glob(os.path.join(HERE, "*", "llama-run*.tar.gz"))):
        with tarfile.open(tgz) as t:
            files.update({os.path.basename(m.name): t.extractfile(m).read()
                          for m in t.getmembers() if m.isfile()})
    if True:
        for rnd in sorted({n.split("-")[0] for n in files}):

            def get(name):
                return json.loads(files[f"{rnd}-{name}.json"])

            def hip(b, mode):
                return get(f"hipfire-b{b}-{mode}")["modes"][0]["decode_tok_s"]["median"]

            def llama(n):
                d = get(f"llama-ngl{n}")
                return (d[0] if isinstance(d, list) else d)["avg_ts"]

            r = rnd.lstrip("r")
            print(f"| {r} | 32 / 0 | - | {hip(32, 'pcie'):.1f} | - | {llama(99):.1f} | - |"
                  f" {hip(32, 'pcie') / llama(99):.3f} (all resident) |")
            for b in (24, 16, 8):
                c, p, pb, l = hip(b, "cpu"), hip(b, "pcie"), hip(b, "passback"), llama(b)
                print(f"| {r} | {b} / {32 - b} | {c:.1f} | {p:.1f} | {pb:.1f} | {l:.1f} |"
                      f" {pb / max(c, p):.3f} | {pb / l:.3f} |")
    print()


def charts():
    env = dict(os.environ)
    inputs = [os.path.join(HERE, "06-4541588", "targets-chain1.json"),
              os.path.join(HERE, "05-724b07a", "targets-chain8.json"),
              os.path.join(HERE, "05-724b07a", "targets-chain32.json")]
    out = os.path.join(HERE, "targets_rounds.svg")
    subprocess.run(["cargo", "run", "--quiet", "--release", "--example", "chart_targets", "--",
                    out, *inputs], cwd=ROOT, env=env, check=True)
    subprocess.run(["cargo", "run", "--quiet", "--release", "--example", "chart_per_shape", "--",
                    os.path.join(HERE, "05-724b07a", "per_shape.json"),
                    os.path.join(HERE, "per_shape_share.svg")], cwd=ROOT, env=env, check=True)


if __name__ == "__main__":
    targets_table()
    ab_table()
    per_shape_table()
    decode_table()
    if "--tables" not in sys.argv:
        charts()
