#!/usr/bin/env python3
"""Tables and charts of this checkpoint, from the raw files in this folder only.

    python3 docs/perf-checkpoints/2026-11-29-done-words-dram-layers-h200/chart.py            # tables + SVGs
    python3 docs/perf-checkpoints/2026-11-29-done-words-dram-layers-h200/chart.py --tables   # tables only

Each NN-<commit>/ folder is one or more device calls (NN in time order) with the bundle's commit
in its name. Charts are drawn by the repository's examples (`chart_decode`, `chart_single_layer`);
set CARGO_TARGET_DIR to keep their build apart. Every ratio printed here is computed from two
numbers of the same run.
"""
import glob
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
BUDGETS = [(32, 99), (24, 24), (16, 16), (8, 8)]  # hipfire --gpu-layer-budget, llama-bench -ngl
N_LAYERS = 32


def load(path):
    with open(path) as f:
        return json.load(f)


def single_layer_table():
    print("## Whole layer, passback auto per join (single_layer)\n")
    print("| record | copies | cpu read | gpu read | both | cpu mode | pcie | ordering | two-stream | flags | flags/last | flags / both | flags / cpu | flags / pcie | flags sync | flags/last sync |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(HERE, "*", "sl-*.json"))):
        d = load(path)
        c = d["ceilings"]
        runs = {(r["mode"], r["strategy"]): r for r in d["runs"]
                if r["mode"] != "passback" or str(r.get("share", "")).startswith("auto")}
        g = lambda mode, st="-": runs.get((mode, st))
        fl, last = g("passback", "flags"), g("passback", "flags/last")
        if not fl:
            continue
        v = lambda r: f"{r['gbs']:.1f}" if r else "–"
        sync = lambda r: f"{100 * r['sync_overhead']:.1f}%" if r and r.get("sync_overhead") is not None else "–"
        print(f"| {os.path.relpath(path, HERE)} | {d.get('layer_copies', 4)} | {c['cpu_read_gbs']:.1f} | "
              f"{c['gpu_zero_copy_read_gbs']:.1f} | {c['both_total_gbs']:.1f} | {v(g('cpu'))} | {v(g('pcie'))} | "
              f"{v(g('passback', 'ordering'))} | {v(g('passback', 'two-stream'))} | {v(fl)} | {v(last)} | "
              f"{fl['gbs'] / c['both_total_gbs']:.3f} | {fl['gbs'] / g('cpu')['gbs']:.3f} | "
              f"{fl['gbs'] / g('pcie')['gbs']:.2f} | {sync(fl)} | {sync(last)} |")
    print("\n`copies`: layer copies the reps cycle through (4 ≈ 0.5 GB, partly in the 300 MiB L3; 16–18 ≈ 2 GB).\n")


def per_shape_table():
    for path in sorted(glob.glob(os.path.join(HERE, "*", "per_shape.json"))):
        d = load(path)
        rows = d.get("per_shape") or []
        print(f"## Per shape ({os.path.relpath(path, HERE)}): auto against the sweep's 3 fastest shares, "
              "7 interleaved rounds\n")
        print("| proj | m | k | strategy | auto share | sweep's best share | auto / sweep best | worst rival | auto / worst rival (median) | A/A control |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['proj']} | {r['m']} | {r['k']} | {r['strategy']} | {r['auto_share']:.3f} | "
                  f"{r['best_share']:.2f} | {r['auto_over_best_throughput']:.3f} | "
                  f"{r['interleaved_best_share']:.2f} | {r['auto_over_best_interleaved']:.3f} | "
                  + (f"{r['a_a_control']:.3f} |" if "a_a_control" in r else "– |"))
        for st in ("ordering", "two-stream", "flags", None):
            sel = [r for r in rows if st is None or r["strategy"] == st]
            ok = [r for r in sel if r["auto_over_best_interleaved"] >= 0.97]
            worst = min(sel, key=lambda r: r["auto_over_best_interleaved"])
            print(f"\n- {st or 'all'}: {len(ok)} of {len(sel)} within 3 %; worst "
                  f"{worst['auto_over_best_interleaved']:.3f} ({worst['proj']}, {worst['strategy']})", end="")
            aa = [abs(r["a_a_control"] - 1) for r in sel if "a_a_control" in r]
            if aa:
                print(f"; A/A control off by up to {100 * max(aa):.1f} %", end="")
        print("\n")


def decode_rounds(folder):
    lr = os.path.join(HERE, folder, "llama-run")
    if not os.path.isdir(lr):
        return
    print(f"## Decode, synthetic Llama-3-8B Q4_K, same run as llama.cpp ({folder}, join flags)\n")
    print("| round | resident / spilled | cpu | pcie | passback | llama.cpp | passback / max(cpu, pcie) | passback / llama.cpp |")
    print("|---|---|---|---|---|---|---|---|")
    for rnd in (1, 2):
        for budget, ngl in BUDGETS:
            tok = {}
            for mode in ("cpu", "pcie", "passback"):
                p = os.path.join(lr, f"r{rnd}-hipfire-b{budget}-{mode}.json")
                if os.path.exists(p):
                    tok[mode] = load(p)["modes"][0]["decode_tok_s"]["median"]
            lp = os.path.join(lr, f"r{rnd}-llama-ngl{ngl}.json")
            if not os.path.exists(lp):
                continue
            ll = [r for r in load(lp) if r.get("n_gen", 0) > 0][0]["avg_ts"]
            f = lambda k: f"{tok[k]:.1f}" if k in tok else "–"
            pb = tok.get("passback")
            r1 = f"{pb / max(tok['cpu'], tok['pcie']):.3f}" if pb else "–"
            r2 = f"{pb / ll:.3f}" if pb else f"{tok['pcie'] / ll:.3f} (all resident)"
            print(f"| {rnd} | {budget} / {N_LAYERS - budget} | {f('cpu')} | {f('pcie')} | {f('passback')} | {ll:.1f} | {r1} | {r2} |")
    print("\nhipfire: `bench` median of 2 rounds; llama.cpp: llama-bench `avg_ts`, mean of 3. "
          "Round 1 runs hipfire first at each budget, round 2 llama.cpp first.\n")


def charts():
    env = dict(os.environ)
    sweeps = sorted(glob.glob(os.path.join(HERE, "*", "sl-sweep.json")))
    if sweeps:
        subprocess.run(["cargo", "run", "--release", "-q", "--example", "chart_single_layer", "--",
                        sweeps[-1], os.path.join(HERE, "single_layer_share.svg")], cwd=ROOT, env=env, check=True)
    lr = os.path.join(HERE, "04-cedea6d", "llama-run")
    files = [os.path.join(lr, f"r1-hipfire-b{b}-{m}.json") for b, _ in BUDGETS
             for m in ("cpu", "pcie", "passback") if os.path.exists(os.path.join(lr, f"r1-hipfire-b{b}-{m}.json"))]
    def llama(n):
        return [r for r in load(os.path.join(lr, f"r1-llama-ngl{n}.json")) if r.get("n_gen", 0) > 0][0]["avg_ts"]
    refs = ",".join(f"{N_LAYERS - b}:{llama(n):.1f}" for b, n in BUDGETS)
    subprocess.run(["cargo", "run", "--release", "-q", "--example", "chart_decode", "--",
                    os.path.join(HERE, "decode_vs_spill.svg"), str(N_LAYERS), *files,
                    "--ref", f"llama.cpp (same run)={refs}"], cwd=ROOT, env=env, check=True)


def main(argv):
    single_layer_table()
    per_shape_table()
    decode_rounds("04-cedea6d")
    if "--tables" not in argv:
        charts()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
