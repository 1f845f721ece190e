#!/usr/bin/env python3
"""Tables of README.md and cpu_prefill.svg from this record's raw folders.

  python3 chart.py

raw/cpu-prefill.jsonl: rounds 1-2 of `hipfire bench --device cpu --threads 16 -p 512` and of
llama-bench (CPU-only build) on the same file; raw-rerun/hb3.json and lb3.json: round 3.
raw/formats.log, raw-rerun/formats-k4096-again.log: `gemv_gbs` tables (format, threads, GEMV
GB/s, read GB/s, ratio). raw/serve-raw.jsonl: scripts/serve_load.py objects, "<server> c<N>".
The SVG is written by hand (no plotting dependency).
"""
import json
import pathlib
import re

HERE = pathlib.Path(__file__).resolve().parent


def prefill_rounds():
    rounds = {}
    for line in (HERE / "raw/cpu-prefill.jsonl").read_text().splitlines():
        d = json.loads(line)
        rounds.setdefault(d["round"], {})[d["engine"]] = d["avg_ts"]
    r3 = {}
    for name, eng in (("hb3.json", "hipfire"), ("lb3.json", "llama.cpp")):
        rows = json.loads((HERE / "raw-rerun" / name).read_text())
        r3[eng] = [r for r in rows if r.get("n_prompt") == 512][0]["avg_ts"]
    rounds[3] = r3
    return rounds


def formats():
    """[(source, k, binary, format, gemv, read, ratio)]"""
    out = []
    binary, k = None, None
    for line in (HERE / "raw/formats.log").read_text().splitlines():
        m = re.match(r"== (\S+) k (\d+)", line)
        if m:
            binary, k = m.group(1), int(m.group(2))
            continue
        f = line.split()
        if len(f) >= 5 and f[1] == "16":
            out.append(("call", k, binary, f[0], float(f[2]), float(f[3]), float(f[4])))
    for i, line in enumerate((HERE / "raw-rerun/formats-k4096-again.log").read_text().splitlines()):
        f = line.split()
        if len(f) >= 5 and f[1] == "16":
            out.append((f"rerun {1 + i // 4}", 4096, "gemv_gbs", f[0], float(f[2]), float(f[3]), float(f[4])))
    return out


def serve():
    rows = {}
    for line in (HERE / "raw/serve-raw.jsonl").read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            rows[d["label"]] = d
    return rows


def svg(rounds, path):
    w, h, pad = 420, 260, 40
    top = max(v for r in rounds.values() for v in r.values()) * 1.15
    bars = [(r, e, v) for r in sorted(rounds) for e, v in sorted(rounds[r].items())]
    bw = (w - 2 * pad) / (len(bars) + len(rounds))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<text x="{pad}" y="16">CPU prefill pp512, 16 threads, H200 box (tok/s)</text>']
    x = pad
    for i, (r, e, v) in enumerate(bars):
        if i and bars[i - 1][0] != r:
            x += bw
        y = h - pad - (h - 2 * pad) * v / top
        color = "#d9541e" if e == "hipfire" else "#3b6ea8"
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw * 0.9:.1f}" height="{h - pad - y:.1f}" fill="{color}"/>')
        parts.append(f'<text x="{x:.1f}" y="{y - 3:.1f}">{v:.0f}</text>')
        parts.append(f'<text x="{x:.1f}" y="{h - pad + 14}">r{r}</text>')
        x += bw
    parts.append(f'<text x="{pad}" y="{h - 8}" fill="#d9541e">hipfire (AMX)</text>')
    parts.append(f'<text x="{pad + 110}" y="{h - 8}" fill="#3b6ea8">llama.cpp (CPU build, AMX)</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


def main():
    rounds = prefill_rounds()
    print("| round | hipfire tok/s | llama.cpp tok/s | ratio |\n|---|---|---|---|")
    for r in sorted(rounds):
        a, b = rounds[r]["hipfire"], rounds[r]["llama.cpp"]
        print(f"| {r} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    print("\n| source | k | binary | format | GEMV GB/s | read GB/s | ratio |\n|---|---|---|---|---|---|---|")
    for row in formats():
        print("| {} | {} | {} | {} | {:.1f} | {:.1f} | {:.2f} |".format(*row))
    print("\n| server | streams | tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms |\n|---|---|---|---|---|")
    for label, d in serve().items():
        print(f"| {label.rsplit(' c', 1)[0]} | {d['concurrency']} | {d['aggregate_tok_per_s']:.1f} | "
              f"{d['ttft_ms_p50']:.0f} / {d['ttft_ms_p99']:.0f} | {d['itl_ms_p50']:.1f} / {d['itl_ms_p99']:.1f} |")
    svg(rounds, HERE / "cpu_prefill.svg")


if __name__ == "__main__":
    main()
