#!/usr/bin/env python3
"""Tables of README.md and the two SVGs of this record, from raw-engine/ and raw-serve/.

  python3 chart.py

raw-engine/kernel-c<N>.json: `gpu_bench --cols N` (Q4_K in HBM; config 4x2x1x1 = the tensor-core
  kernel for N > 1, 4x2x1x1:notc = the dp4a multi-column kernel); GB/s counts the weight bytes
  once per pass.
raw-engine/bench.jsonl: `hipfire bench --batch 1,4,8,16 -p 0 -n 32 -r 2`, f6661a0 ("base") and
  this change ("new") interleaved, 32 and 16 of 32 layers on the GPU.
raw-q6k/kernel-q6-c<N>.json: the same bench for the Q6_K kernel (a later call).
raw-serve/serve-raw.jsonl and serve-rounds.jsonl: scripts/serve_load.py objects labelled
  "<server> c<streams>".
The SVGs are written by hand (no plotting dependency).
"""
import collections
import json
import pathlib
import statistics

HERE = pathlib.Path(__file__).resolve().parent
ENGINE, SERVE = HERE / "raw-engine", HERE / "raw-serve"


def kernel_table():
    shapes, rows = [], {}
    for n in (1, 2, 4, 8, 16):
        d = json.loads((ENGINE / f"kernel-c{n}.json").read_text())
        for r in d["rows"]:
            shape = (r["m"], r["k"])
            if shape not in shapes:
                shapes.append(shape)
            tc = not r["config"].endswith(":notc")
            rows[(n, shape, tc)] = r["device_gemv_gbps"]
    head = "| columns | " + " | ".join(f"{m}×{k} tensor cores / dp4a" for m, k in shapes) + " |"
    out = [head, "|---|" + "---|" * len(shapes)]
    for n in (1, 2, 4, 8, 16):
        cells = [f"{rows[(n, s, True)]:.0f} / {rows[(n, s, False)]:.0f}" for s in shapes]
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(out), rows, shapes


def q6k_table():
    q6 = HERE / "raw-q6k"
    shapes, rows = [], {}
    counts = (2, 3, 4, 5, 8, 16)
    for n in counts:
        for r in json.loads((q6 / f"kernel-q6-c{n}.json").read_text())["rows"]:
            if r["format"] != "q6_k":
                continue
            shape = (r["m"], r["k"])
            if shape not in shapes:
                shapes.append(shape)
            rows[(n, shape, not r["config"].endswith(":notc"))] = r["device_gemv_gbps"]
    head = "| columns | " + " | ".join(f"{m}×{k} tensor cores / dp4a" for m, k in shapes) + " |"
    out = [head, "|---|" + "---|" * len(shapes)]
    for n in counts:
        cells = [f"{rows[(n, s, True)]:.0f} / {rows[(n, s, False)]:.0f}" for s in shapes]
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def engine_table():
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for line in (ENGINE / "bench.jsonl").read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            runs[(d["budget"], d["test"])][d["bin"]].append(d["ts"])
    order = ["tg32", "tg32 x4", "tg32 x8", "tg32 x16"]
    out = ["| layers on the GPU | test | base (f6661a0) r1 / r2 | new r1 / r2 | new / base (mean) |",
           "|---|---|---|---|---|"]
    for budget in (32, 16):
        for test in order:
            v = runs[(budget, test)]
            b, n = v["base"], v["new"]
            out.append(f"| {budget} of 32 | {test} | {' / '.join(f'{x:.1f}' for x in b)} | "
                       f"{' / '.join(f'{x:.1f}' for x in n)} | {statistics.mean(n) / statistics.mean(b):.2f} |")
    return "\n".join(out), runs


def serve_rows():
    rows = {}
    for name in ("serve-raw.jsonl", "serve-rounds.jsonl"):
        for line in (SERVE / name).read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                server, c = d["label"].rsplit(" c", 1)
                rows[(server, int(c))] = d
    return rows


def serve_table(rows):
    out = ["| streams | hipfire tok/s | llama-server tok/s | ratio | hipfire TTFT p50 / p99 ms | "
           "llama-server TTFT p50 / p99 ms | hipfire ITL p50 / p99 ms | llama-server ITL p50 / p99 ms |",
           "|---|---|---|---|---|---|---|---|"]
    for c in (1, 4, 8, 16):
        h, l = rows[("hipfire", c)], rows[("llama-server", c)]
        out.append(
            f"| {c} | {h['aggregate_tok_per_s']:.1f} | {l['aggregate_tok_per_s']:.1f} | "
            f"{h['aggregate_tok_per_s'] / l['aggregate_tok_per_s']:.2f} | "
            f"{h['ttft_ms_p50']:.0f} / {h['ttft_ms_p99']:.0f} | {l['ttft_ms_p50']:.0f} / {l['ttft_ms_p99']:.0f} | "
            f"{h['itl_ms_p50']:.1f} / {h['itl_ms_p99']:.1f} | {l['itl_ms_p50']:.1f} / {l['itl_ms_p99']:.1f} |")
    return "\n".join(out)


def rounds_table(rows):
    rounds = [("new", "hipfire", "new-r2", "new-r3"), ("base (f6661a0)", "base", "base-r2", "base-r3")]
    out = ["| build | round 1 c1 / c8 (8 ÷ 1) | round 2 | round 3 | median of the ratios | median c8 ÷ median c1 |",
           "|---|---|---|---|---|---|"]
    for name, *tags in rounds:
        cells, ratios, c1s, c8s = [], [], [], []
        for t in tags:
            a, b = rows[(t, 1)]["aggregate_tok_per_s"], rows[(t, 8)]["aggregate_tok_per_s"]
            cells.append(f"{a:.1f} / {b:.1f} ({b / a:.2f})")
            ratios.append(b / a)
            c1s.append(a)
            c8s.append(b)
        out.append(f"| {name} | " + " | ".join(cells) +
                   f" | {statistics.median(ratios):.2f} | {statistics.median(c8s) / statistics.median(c1s):.2f} |")
    errors = sum(d["errors"] for d in rows.values())
    out.append(f"\nerrors over all serve runs: {errors}")
    return "\n".join(out)


def svg_lines(path, title, xlab, ylab, xs, series):
    w, h, pad = 520, 320, 56
    top = max(v for _, _, pts in series for v in pts.values()) * 1.1
    x = lambda c: pad + (w - 2 * pad) * xs.index(c) / max(1, len(xs) - 1)
    y = lambda v: h - pad - (h - 2 * pad) * v / top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<text x="{w / 2}" y="16" text-anchor="middle">{title}</text>',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
             f'<text x="{w / 2}" y="{h - 14}" text-anchor="middle">{xlab}</text>',
             f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">{ylab}</text>']
    for c in xs:
        parts.append(f'<text x="{x(c)}" y="{h - pad + 14}" text-anchor="middle">{c}</text>')
    for i in range(5):
        v = top * i / 4
        parts.append(f'<text x="{pad - 4}" y="{y(v) + 4}" text-anchor="end">{v:.0f}</text>')
    for k, (name, color, pts) in enumerate(series):
        line = " ".join(f"{x(c):.1f},{y(v):.1f}" for c, v in sorted(pts.items()))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{line}"/>')
        parts.append(f'<text x="{pad + 10}" y="{pad + 14 * k}" fill="{color}">{name}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


if __name__ == "__main__":
    kt, krows, shapes = kernel_table()
    print("## Kernel: HBM GEMV GB/s (Q4_K)\n\n" + kt + "\n")
    print("## Kernel: HBM GEMV GB/s (Q6_K)\n\n" + q6k_table() + "\n")
    et, runs = engine_table()
    print("## Engine: bench --batch tok/s\n\n" + et + "\n")
    rows = serve_rows()
    print("## Serve, same call as llama-server (round 1)\n\n" + serve_table(rows) + "\n")
    print("## Serve rounds: 1 and 8 streams\n\n" + rounds_table(rows) + "\n")
    cols = [1, 2, 4, 8, 16]
    s = (4096, 4096)
    svg_lines(HERE / "kernel_cols.svg", "Q4_K 4096×4096 in HBM: GEMV GB/s against columns",
              "activation columns", "GB/s (weight bytes once per pass)", cols,
              [("tensor cores", "#d62728", {c: krows[(c, s, True)] for c in cols}),
               ("dp4a multi-column", "#1f77b4", {c: krows[(c, s, False)] for c in cols})])
    bs = {"tg32": 1, "tg32 x4": 4, "tg32 x8": 8, "tg32 x16": 16}
    series = []
    for budget, (cb, cn) in ((32, ("#1f77b4", "#d62728")), (16, ("#9ecae1", "#ff9896"))):
        for tag, color in (("base", cb), ("new", cn)):
            series.append((f"{tag}, {budget} of 32 on the GPU", color,
                           {bs[t]: statistics.mean(runs[(budget, t)][tag]) for t in bs}))
    svg_lines(HERE / "engine_batch.svg", "Batched decode, synthetic Llama-3-8B Q4_K (engine time)",
              "sequences per step", "aggregate tok/s", [1, 4, 8, 16], series)
