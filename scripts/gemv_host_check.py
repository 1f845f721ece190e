#!/usr/bin/env python3
"""gemv_host_check.py — check kernels/gemv.cu's per-format GEMV arithmetic on the CPU (no GPU).

Builds scripts/gemv_host_check.cpp with g++ (gemv.cu's traits structs on the host, device builtins
emulated) and, for every quantised GGUF format the GPU multiplies, random valid blocks (every byte
random, the f16 scales in realistic ranges) and a random activation: the kernel's row dots against
gguf-py's dequantiser (an independent implementation, ggml's numpy port) times the activation the
kernel actually multiplies (quantised per 32 as quantize_x_q8 does), in f64.

Usage: python3 scripts/gemv_host_check.py [--seed N] [FORMAT...]
Needs: g++ (C++17), pip install gguf numpy. Exit 0 only if every format and shape agrees.
This checks the dot arithmetic and byte layout only; the GPU tier (crates/hipfire-gpu/tests/
gpu_gemv.rs) checks the kernels as launched (tiles, row ranges, load widths, both memories).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf.quants import GGMLQuantizationType as T, dequantize

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name -> (gguf type, block bytes, block elements, f16 scale fields as (byte offset, low, high)):
# scale ranges as the GPU tier's random_weights (crates/hipfire-gpu/tests/common/mod.rs).
FORMATS = {
    "q8_0": (T.Q8_0, 34, 32, [(0, 0.001, 0.02)]),
    "q4_0": (T.Q4_0, 18, 32, [(0, 0.001, 0.02)]),
    "q4_1": (T.Q4_1, 20, 32, [(0, 0.001, 0.02), (2, -0.1, 0.1)]),
    "q5_0": (T.Q5_0, 22, 32, [(0, 0.001, 0.02)]),
    "q5_1": (T.Q5_1, 24, 32, [(0, 0.001, 0.02), (2, -0.1, 0.1)]),
    "iq4_nl": (T.IQ4_NL, 18, 32, [(0, 0.001, 0.02)]),
    "q4_k": (T.Q4_K, 144, 256, [(0, 0.0005, 0.005), (2, 0.0005, 0.005)]),
    "q5_k": (T.Q5_K, 176, 256, [(0, 0.0005, 0.005), (2, 0.0005, 0.005)]),
    "q6_k": (T.Q6_K, 210, 256, [(208, 0.0005, 0.005)]),
    "q3_k": (T.Q3_K, 110, 256, [(108, 0.0005, 0.005)]),
    "q2_k": (T.Q2_K, 84, 256, [(80, 0.0005, 0.005), (82, 0.0005, 0.005)]),
    "iq4_xs": (T.IQ4_XS, 136, 256, [(0, 0.0005, 0.005)]),
}
# (rows, k): one super-block row, and the widths of real models' projections.
SHAPES = [(7, 256), (5, 2048), (3, 4096)]
# |kernel - f64| / Σ|w·x̂|: the kernel's f32 rounding measured ≤ 2e-8 on these shapes (2026-12-01),
# while one misplaced bit of a layout measured ≥ 4e-2 (a Q5_0 high bit taken one position off).
REL_BOUND = 1e-5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("formats", nargs="*", default=list(FORMATS))
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "gemv_host_check")
        subprocess.run(["g++", "-std=c++17", "-O1", "-w", "-I", os.path.join(REPO, "kernels"),
                        os.path.join(REPO, "scripts", "gemv_host_check.cpp"), "-o", exe], check=True)
        wpath, xpath, opath = (os.path.join(tmp, n) for n in ("w.bin", "x.bin", "o.bin"))
        fails = 0
        for name in args.formats:
            qtype, bb, elems, scales = FORMATS[name]
            for m, k in SHAPES:
                nb = m * k // elems
                blocks = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
                for off, lo, hi in scales:
                    v = rng.uniform(lo, hi, size=nb).astype(np.float16)
                    blocks[:, off:off + 2] = v.view(np.uint8).reshape(nb, 2)
                blocks.tofile(wpath)
                x = rng.uniform(-1, 1, size=k).astype(np.float32)
                x.tofile(xpath)
                subprocess.run([exe, name, str(m), str(k), wpath, xpath, opath], check=True)
                out = np.fromfile(opath, dtype=np.float64)
                y, xhat = out[:m], out[m:]
                w = dequantize(blocks.reshape(-1), qtype).astype(np.float64).reshape(m, k)
                err = (np.abs(y - w @ xhat) / (np.abs(w) @ np.abs(xhat))).max()
                ok = err <= REL_BOUND
                fails += not ok
                print(f"{name:7} m={m} k={k:<5} max |kernel - f64| / sum|w x| = {err:.2e} "
                      f"{'ok' if ok else 'FAIL'}")
        print(f"{'all agree' if not fails else f'{fails} disagree'}")
        return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
