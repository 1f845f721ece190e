#!/usr/bin/env python3
"""Tables and charts of this checkpoint, from the raw files in this folder only.

    python3 docs/perf-checkpoints/2026-11-29-flags-step-cost-h200/chart.py            # tables + SVGs
    python3 docs/perf-checkpoints/2026-11-29-flags-step-cost-h200/chart.py --tables   # tables only

Each NN-<commit>/ folder is one device call (NN in time order) with the bundle's commit in its
name; 13-/14- are A/B calls of two bundles. Charts are drawn by the repository's examples
(`chart_decode`, `chart_single_layer`); set CARGO_TARGET_DIR to keep their build apart. Every
ratio printed here is computed from two numbers of the same run.
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
    print("| record | reps | cpu read | gpu read | both | cpu mode | ordering | two-stream | flags | flags / both | flags sync | two-stream sync |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(HERE, "*", "single_layer*.json"))):
        d = load(path)
        c = d["ceilings"]
        runs = {(r["mode"], r["strategy"]): r for r in d["runs"] if not str(r.get("share", "")).replace(".", "").isdigit()}
        def g(mode, st=None):
            r = runs.get((mode, st if st else "-"))
            return r
        fl, ts, od, cpu = g("passback", "flags"), g("passback", "two-stream"), g("passback", "ordering"), g("cpu")
        if not fl:
            continue
        rec = os.path.relpath(path, HERE)
        sync = lambda r: f"{100 * r['sync_overhead']:.1f}%" if r and r.get("sync_overhead") is not None else "–"
        print(f"| {rec} | {d['reps']} | {c['cpu_read_gbs']:.1f} | {c['gpu_zero_copy_read_gbs']:.1f} | "
              f"{c['both_total_gbs']:.1f} | {cpu['gbs']:.1f} | {od['gbs']:.1f} | {ts['gbs']:.1f} | "
              f"{fl['gbs']:.1f} | {fl['gbs'] / c['both_total_gbs']:.3f} | {sync(fl)} | {sync(ts)} |")
    print()


def per_shape_table():
    print("## Per shape: auto against the best pinned share (h2h = median of 7 interleaved rounds)\n")
    for path in sorted(glob.glob(os.path.join(HERE, "*", "per_shape.json"))):
        d = load(path)
        rows = d.get("per_shape") or []
        ok = [r for r in rows if r.get("auto_over_best_interleaved", 0) >= 0.97]
        worst = min(rows, key=lambda r: r["auto_over_best_interleaved"]) if rows else None
        print(f"- {os.path.relpath(path, HERE)}: {len(ok)} of {len(rows)} rows within 3 % head to head"
              + (f"; worst {worst['auto_over_best_interleaved']:.3f} ({worst['proj']}, {worst['strategy']})" if worst else ""))
    print()


def decode_round(folder):
    lr = os.path.join(HERE, folder, "llama-run")
    if not os.path.isdir(lr):
        return
    print(f"## Decode, synthetic Llama-3-8B Q4_K, same run as llama.cpp ({folder})\n")
    print("| resident / spilled | cpu | pcie | passback | llama.cpp | passback / max(cpu, pcie) | passback / llama.cpp | passback / cpu |")
    print("|---|---|---|---|---|---|---|---|")
    for budget, ngl in BUDGETS:
        tok = {}
        for mode in ("cpu", "pcie", "passback"):
            p = os.path.join(lr, f"r1-hipfire-b{budget}-{mode}.json")
            if os.path.exists(p):
                m = load(p)["modes"][0]["decode_tok_s"]
                tok[mode] = (m["median"], sum(m["samples"]) / len(m["samples"]))
        ll = load(os.path.join(lr, f"r1-llama-ngl{ngl}.json"))[0]["avg_ts"]
        f = lambda k: f"{tok[k][0]:.1f}" if k in tok else "–"
        pb = tok.get("passback", (None,))[0]
        best = max(tok.get("cpu", (0,))[0], tok.get("pcie", (0,))[0])
        r1 = f"{pb / best:.3f}" if pb else "–"
        r2 = f"{pb / ll:.3f}" if pb else f"{tok['pcie'][0] / ll:.3f} (resident)"
        r3 = f"{pb / tok['cpu'][0]:.3f}" if pb else "–"
        print(f"| {budget} / {N_LAYERS - budget} | {f('cpu')} | {f('pcie')} | {f('passback')} | {ll:.1f} | {r1} | {r2} | {r3} |")
    print("\nhipfire: `bench` median of 2 rounds (= their mean); llama.cpp: `avg_ts`, mean of 3.\n")


def ab(folder):
    d = os.path.join(HERE, folder)
    if not os.path.isdir(d):
        return
    print(f"## A/B decode, 16 of 32 layers resident, passback flags ({folder})\n")
    for b in ("old-bundle", "lead-bundle"):
        xs, commit = [], "?"
        for r in (1, 2, 3):
            j = load(os.path.join(d, f"ab-{b}-{r}.json"))
            commit = j["commit"][:7]
            xs.append(j["modes"][0]["decode_tok_s"]["samples"][0])
        print(f"- {commit}: " + ", ".join(f"{x:.1f}" for x in xs) + f" tok/s (mean {sum(xs) / len(xs):.1f})")
    print()


def paired(folder):
    d = os.path.join(HERE, folder)
    if not os.path.isdir(d):
        return
    print(f"## Paired cpu / passback rounds (`bench --offload-exec cpu,passback --rounds 3`, {folder})\n")
    print("| resident / spilled | cpu samples | passback samples | passback / cpu per round | median |")
    print("|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(d, "paired-b*.json")), reverse=True):
        j = load(path)
        modes = {m["offload_exec"]: m["decode_tok_s"]["samples"] for m in j["modes"]}
        ratios = [p / c for p, c in zip(modes["passback"], modes["cpu"])]
        b = int(os.path.basename(path)[len("paired-b"):-len(".json")])
        print(f"| {b} / {N_LAYERS - b} | " + ", ".join(f"{x:.1f}" for x in modes["cpu"]) + " | "
              + ", ".join(f"{x:.1f}" for x in modes["passback"]) + " | "
              + ", ".join(f"{x:.2f}" for x in ratios) + f" | {sorted(ratios)[1]:.2f} |")
    print()


def charts():
    env = dict(os.environ)
    sweep = os.path.join(HERE, "06-ed628fa", "single_layer.json")
    subprocess.run(["cargo", "run", "--release", "-q", "--example", "chart_single_layer", "--",
                    sweep, os.path.join(HERE, "single_layer_share.svg")], cwd=ROOT, env=env, check=True)
    lr = os.path.join(HERE, "12-80aca31", "llama-run")
    files = [os.path.join(lr, f"r1-hipfire-b{b}-{m}.json") for b, _ in BUDGETS
             for m in ("cpu", "pcie", "passback") if os.path.exists(os.path.join(lr, f"r1-hipfire-b{b}-{m}.json"))]
    refs = ",".join(f"{N_LAYERS - b}:{load(os.path.join(lr, f'r1-llama-ngl{n}.json'))[0]['avg_ts']:.1f}" for b, n in BUDGETS)
    subprocess.run(["cargo", "run", "--release", "-q", "--example", "chart_decode", "--",
                    os.path.join(HERE, "decode_vs_spill.svg"), str(N_LAYERS), *files,
                    "--ref", f"llama.cpp (same run)={refs}"], cwd=ROOT, env=env, check=True)


def main(argv):
    single_layer_table()
    per_shape_table()
    decode_round("12-80aca31")
    ab("13-ab-a63c7fa-vs-80aca31")
    ab("14-ab-a63c7fa-vs-d8a8bf7")
    paired("15-d8a8bf7")
    if "--tables" not in argv:
        charts()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
