#!/usr/bin/env python3
"""Tables and charts of this checkpoint, from the raw files in this folder only.

    python3 docs/perf-checkpoints/2026-11-29-joins-vs-llamacpp-h200/chart.py            # tables + SVGs
    python3 docs/perf-checkpoints/2026-11-29-joins-vs-llamacpp-h200/chart.py --tables   # tables only

Charts are drawn by the repository's examples (`cargo run --release --example chart_decode` and
`chart_single_layer`); set CARGO_TARGET_DIR to keep their build apart. Every ratio printed here is
computed from two numbers of the same run (same round / same process). Second batch (records 7-9:
round 3, join strategies, 200-rep per-shape) is read from final/.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
LR = os.path.join(HERE, "llama-run")              # rounds 1-2 (bundle 14b4388)
FINAL = os.path.join(HERE, "final")               # second batch (bundles 1a5941a / 35a7a6a / 01e871d)
ROUNDS = (1, 2, 3)                                # round 3 lives in final/llama-run (1a5941a, JOIN=flags)


def lr_dir(rnd):
    return os.path.join(FINAL, "llama-run") if rnd >= 3 else LR
BUDGETS = [(32, 99), (24, 24), (16, 16), (8, 8)]  # hipfire --gpu-layer-budget, llama-bench -ngl
N_LAYERS = 32


def load(path):
    with open(path) as f:
        return json.load(f)


def hipfire(rnd, budget, mode):
    d = load(os.path.join(lr_dir(rnd), f"r{rnd}-hipfire-b{budget}-{mode}.json"))
    (m,) = d["modes"]
    return m["decode_tok_s"]["median"], m["decode_tok_s"]["samples"], d["commit"]


def llama(rnd, ngl):
    (d,) = load(os.path.join(lr_dir(rnd), f"r{rnd}-llama-ngl{ngl}.json"))
    return d["avg_ts"], d["samples_ts"]


def decode_tables():
    for rnd in ROUNDS:
        print(f"\n## round {rnd}, commit {hipfire(rnd, 32, 'pcie')[2]} (decode tok/s; hipfire: median of 2 rounds, llama.cpp: avg of 3)")
        print("| resident / spilled | cpu | pcie | passback | llama.cpp | passback/max(cpu,pcie) "
              "| passback/llama.cpp | resident/llama.cpp |")
        print("|---|---|---|---|---|---|---|---|")
        for budget, ngl in BUDGETS:
            lt, _ = llama(rnd, ngl)
            if budget == N_LAYERS:
                res, _, _ = hipfire(rnd, budget, "pcie")
                print(f"| {budget} / 0 | – | {res:.1f} (resident) | – | {lt:.1f} | – | – | {res / lt:.3f} |")
                continue
            cpu, _, _ = hipfire(rnd, budget, "cpu")
            pcie, _, _ = hipfire(rnd, budget, "pcie")
            pb, _, _ = hipfire(rnd, budget, "passback")
            print(f"| {budget} / {N_LAYERS - budget} | {cpu:.1f} | {pcie:.1f} | {pb:.1f} | {lt:.1f} "
                  f"| {pb / max(cpu, pcie):.3f} | {pb / lt:.3f} | – |")
        # bench's "median" of two rounds is the higher sample; the same ratios on sample means:
        mean = lambda xs: sum(xs) / len(xs)
        parts = []
        for budget, ngl in BUDGETS:
            lt = mean(llama(rnd, ngl)[1])
            if budget == N_LAYERS:
                parts.append(f"resident/llama {mean(hipfire(rnd, budget, 'pcie')[1]) / lt:.3f}")
                continue
            cpu, pcie, pb = (mean(hipfire(rnd, budget, m)[1]) for m in ("cpu", "pcie", "passback"))
            parts.append(f"b{budget}: passback/max {pb / max(cpu, pcie):.3f}, passback/llama {pb / lt:.3f}")
        print("on sample means: " + "; ".join(parts))
        print("samples (hipfire cpu / pcie / passback ; llama.cpp):")
        for budget, ngl in BUDGETS:
            modes = ["pcie"] if budget == N_LAYERS else ["cpu", "pcie", "passback"]
            s = " ; ".join(
                f"{m} {[round(x, 2) for x in hipfire(rnd, budget, m)[1]]}" for m in modes
            )
            print(f"  b{budget}: {s} ; llama {llama(rnd, ngl)[1]}")


def single_layer_table(path="single_layer.json"):
    d = load(os.path.join(HERE, path))
    c = d["ceilings"]
    runs = d["runs"]
    mode = lambda m: next(r for r in runs if r["mode"] == m)
    cpu, pcie = mode("cpu")["gbs"], mode("pcie")["gbs"]
    both = c["both_total_gbs"]
    print(f"\n## {path}: reps {d['reps']}, ceilings cpu {c['cpu_read_gbs']:.1f}, gpu zero-copy "
          f"{c['gpu_zero_copy_read_gbs']:.1f}, both {c['both_cpu_gbs']:.1f} + {c['both_gpu_gbs']:.1f} = {both:.1f} GB/s")
    print(f"resident {mode('resident')['gbs']:.1f} GB/s, pcie mode {pcie:.1f}, cpu mode {cpu:.1f}")
    print("| strategy | share | µs/layer | GB/s | / cpu mode | / pcie mode | / both-at-once "
          "| / cpu read ceiling | / gpu zero-copy ceiling |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in ("ordering", "two-stream", "flags"):
        rs = [r for r in runs if r["mode"] == "passback" and r["strategy"] == s]
        auto = [r for r in rs if r["share"].startswith("auto")]
        pinned = [r for r in rs if not r["share"].startswith("auto")]
        picks = [("auto", r) for r in auto]
        if pinned:
            picks.append(("best pinned", max(pinned, key=lambda r: r["gbs"])))
        for lab, r in picks:
            g = r["gbs"]
            print(f"| {s} | {lab} {r['share']} | {r['us_per_layer']:.1f} | {g:.1f} | {g / cpu:.3f} "
                  f"| {g / pcie:.3f} | {g / both:.3f} | {g / c['cpu_read_gbs']:.3f} "
                  f"| {g / c['gpu_zero_copy_read_gbs']:.3f} |")


def per_shape_table(path="per_shape.json"):
    d = load(os.path.join(HERE, path))
    print(f"\n## {path}: reps {d['reps']}; auto within 3 % of the best pinned share?")
    print("| proj | m × k | strategy | auto share | auto µs | best pinned share | best µs | auto/best | ≥ 0.97 |")
    print("|---|---|---|---|---|---|---|---|---|")
    met = 0
    for r in d["per_shape"]:
        a = r["auto_over_best_throughput"]
        met += a >= 0.97
        print(f"| {r['proj']} | {r['m']} × {r['k']} | {r['strategy']} | {r['auto_share']:.3f} "
              f"| {r['auto_us']:.1f} | {r['best_share']:.2f} | {r['best_us']:.1f} | {a:.3f} "
              f"| {'yes' if a >= 0.97 else 'no'} |")
    print(f"{met} of {len(d['per_shape'])} within 3 %")
    single_layer_table(path)


def per_shape_compare():
    """Same shape and strategy, reps 7 (bundle 14b4388) against reps 200 (final/, bundle 1a5941a).
    Different runs: only each run's own auto/best is compared, never µs across runs."""
    a = load(os.path.join(HERE, "per_shape.json"))
    b = load(os.path.join(FINAL, "per_shape.json"))
    key = lambda r: (r["proj"], r["strategy"])
    bb = {key(r): r for r in b["per_shape"]}
    print(f"\n## per-shape auto/best: reps {a['reps']} vs reps {b['reps']}")
    print("| proj | strategy | auto/best reps 7 | auto/best reps 200 |")
    print("|---|---|---|---|")
    for r in a["per_shape"]:
        print(f"| {r['proj']} | {r['strategy']} | {r['auto_over_best_throughput']:.3f} "
              f"| {bb[key(r)]['auto_over_best_throughput']:.3f} |")
    for d, lab in ((a, "reps 7"), (b, "reps 200")):
        xs = sorted(r["auto_over_best_throughput"] for r in d["per_shape"])
        print(f"{lab}: auto/best min {xs[0]:.3f}, median {(xs[8] + xs[9]) / 2:.3f}, max {xs[-1]:.3f}, "
              f"within 3 % {sum(x >= 0.97 for x in xs)} of {len(xs)}")


def strategies_table():
    """device-bench.sh strategies (HIPFIRE_CPU_EXEC_TRACE=1): passback decode per join strategy."""
    print("\n## join strategies (final/strat-b*-*.json; decode tok/s, median = upper of 2 samples)")
    print("| resident / spilled | strategy | commit | samples | median | mean |")
    print("|---|---|---|---|---|---|")
    for b in (24, 16):
        for st in ("ordering", "two-stream", "flags"):
            p = os.path.join(FINAL, f"strat-b{b}-{st}.json")
            if not os.path.exists(p):
                print(f"| {b} / {N_LAYERS - b} | {st} | – | (file not returned) | – | – |")
                continue
            d = load(p)
            (m,) = d["modes"]
            assert f"join {st}" in m["placement"], m["placement"]
            xs = m["decode_tok_s"]["samples"]
            print(f"| {b} / {N_LAYERS - b} | {st} | {d['commit'][:7]} | {' / '.join(f'{x:.2f}' for x in xs)} "
                  f"| {m['decode_tok_s']['median']:.2f} | {sum(xs) / len(xs):.2f} |")


def kq_table():
    d = load(os.path.join(HERE, "kq_bench.json"))
    rows = d["rows"]
    shapes = []
    for r in rows:
        key = (r["format"], r["m"], r["k"])
        if key not in shapes:
            shapes.append(key)
    print(f"\n## kq_bench.json: reps {d['reps']}; device-resident GEMV GB/s (ratio = GEMV / HBM read of the same row)")
    print("| format | m × k | nodev GB/s (ratio) | dev4x2s GB/s (ratio) | best dev config | its GB/s (ratio) "
          "| best dev / nodev | nodev host-mapped GB/s (ratio) |")
    print("|---|---|---|---|---|---|---|---|")
    for f, m, k in shapes:
        mine = [r for r in rows if (r["format"], r["m"], r["k"]) == (f, m, k)]
        cfg = lambda r: r["config"].split(":", 1)[1]
        nodev = next(r for r in mine if cfg(r) == "nodev")
        d4 = next(r for r in mine if cfg(r) == "dev4x2s")
        best = max((r for r in mine if cfg(r) != "nodev"), key=lambda r: r["device_gemv_gbps"])
        fmt = lambda r: f"{r['device_gemv_gbps']:.0f} ({r['device_ratio']:.3f})"
        print(f"| {f} | {m} × {k} | {fmt(nodev)} | {fmt(d4)} | {cfg(best)} | {fmt(best)} "
              f"| {best['device_gemv_gbps'] / nodev['device_gemv_gbps']:.3f} "
              f"| {nodev['host_gemv_gbps']:.1f} ({nodev['host_ratio']:.3f}) |")


def verify_table():
    d = load(os.path.join(HERE, "verify-rounds.json"))
    print(f"\n## verify-rounds.json ({d['method']})")
    for m in d["modes"]:
        print(f"  {m['offload_exec']}: median {m['decode_tok_s']['median']:.2f}, samples "
              f"{[round(x, 2) for x in m['decode_tok_s']['samples']]}")
    for p in d["paired_decode_ratios"]:
        print(f"  {p['num']}/{p['den']}: median {p['median']:.3f}, samples {[round(x, 3) for x in p['samples']]}")


def cargo_example(name, args):
    cmd = ["cargo", "run", "--quiet", "--release", "--example", name, "--"] + args
    subprocess.run(cmd, cwd=ROOT, check=True)


def charts():
    for rnd in ROUNDS:
        files = [os.path.join(lr_dir(rnd), f"r{rnd}-hipfire-b32-pcie.json")] + [
            os.path.join(lr_dir(rnd), f"r{rnd}-hipfire-b{b}-{m}.json")
            for b, _ in BUDGETS[1:]
            for m in ("cpu", "pcie", "passback")
        ]
        # llama.cpp at -ngl N has N_LAYERS - N layers on the CPU (x = layers spilled); -ngl 99 = all on GPU.
        pts = ",".join(
            f"{0 if ngl == 99 else N_LAYERS - ngl}:{llama(rnd, ngl)[0]:.3f}" for _, ngl in BUDGETS
        )
        ref = f"llama.cpp, same run (round {rnd})={pts}"
        cargo_example("chart_decode", [os.path.join(HERE, f"decode_vs_spill_r{rnd}.svg"), str(N_LAYERS)]
                      + files + ["--ref", ref])
    cargo_example("chart_single_layer", [os.path.join(HERE, "single_layer.json"),
                                         os.path.join(HERE, "single_layer_share.svg")])


if __name__ == "__main__":
    decode_tables()
    single_layer_table()
    per_shape_table()
    per_shape_table("final/per_shape.json")
    per_shape_compare()
    strategies_table()
    kq_table()
    verify_table()
    if "--tables" not in sys.argv:
        charts()
