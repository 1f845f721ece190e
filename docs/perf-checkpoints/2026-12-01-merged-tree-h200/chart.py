#!/usr/bin/env python3
"""Tables (and, with matplotlib, decode_vs_depth.svg) from this record's raw files.

  python3 chart.py            # prints the tables of README.md from bench.jsonl, llama-*.json,
                              # offload-bench.json
"""
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent


def hipfire():
    out = {}
    for line in (HERE / "bench.jsonl").read_text().splitlines():
        d = json.loads(line)
        out[d["label"]] = d["res"]["modes"][0]["decode_tok_s"]["median"]
    return out


def llama():
    rows = json.loads((HERE / "llama-depth.json").read_text())
    depth = {(r["flash_attn"], r["n_depth"]): r["avg_ts"] for r in rows}
    spill = json.loads((HERE / "llama-b24-d4096.json").read_text())[0]["avg_ts"]
    return depth, spill


def main():
    h = hipfire()
    print("A/B, decode tok/s (16 prompt + 64 generated), before 0e1d8cb / after 7ab4450")
    for b, mode in ((32, "pcie (all resident)"), (16, "passback"), (8, "passback")):
        old, new = h[f"old-b{b}"], h[f"new-b{b}"]
        print(f"  {b:2} of 32 resident, {mode:20} {old:7.1f} {new:7.1f}  {new / old:.3f}")
    depth, spill = llama()
    print("decode at depth, all resident: hipfire / llama.cpp FA off / FA on / ratio to FA on")
    for d, label in ((16, "new-b32"), (1024, "new-d1024"), (4096, "new-d4096")):
        x = h[label]
        print(f"  {d:5} {x:7.1f} {depth[(0, d)]:7.1f} {depth[(1, d)]:7.1f}  {x / depth[(1, d)]:.2f}")
    x = h["new-b24-d4096"]
    print(f"24 of 32 resident, depth 4096: hipfire passback {x:.1f}, llama.cpp -ngl 24 FA on "
          f"{spill:.1f}, ratio {x / spill:.2f}")
    ob = json.loads((HERE / "offload-bench.json").read_text())
    print("offload-bench (k 5120, 15 CPU threads): format, CPU GB/s, CPU read GB/s, GPU "
          "host-mapped GB/s, both, share")
    for f in ob["formats"]:
        print(f"  {f['format']:9} {f['cpu_bytes_per_s'] / 1e9:6.1f} {f['cpu_read_bytes_per_s'] / 1e9:6.1f}"
              f" {f['gpu_bytes_per_s'] / 1e9:6.1f} {f['both_bytes_per_s'] / 1e9:6.1f} {f['share']:.3f}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no chart)")
        return
    ds = [16, 1024, 4096]
    plt.plot(ds, [h["new-b32"], h["new-d1024"], h["new-d4096"]], "o-", label="hipfire (split-KV)")
    plt.plot(ds, [depth[(0, d)] for d in ds], "s--", label="llama.cpp FA off")
    plt.plot(ds, [depth[(1, d)] for d in ds], "^--", label="llama.cpp FA on")
    plt.xscale("log")
    plt.xlabel("tokens already in context")
    plt.ylabel("decode tok/s")
    plt.title("Synthetic Llama-3-8B Q4_K, all resident, H200")
    plt.legend()
    plt.savefig(HERE / "decode_vs_depth.svg")
    print("wrote decode_vs_depth.svg")


if __name__ == "__main__":
    main()
