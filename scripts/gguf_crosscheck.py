#!/usr/bin/env python3
"""Cross-check hipfire-quant against gguf-py (an independent implementation of GGUF formats).

- Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, F32, F16, BF16: our quantiser's bytes must equal
  gguf.quants.quantize's byte for byte, and our dequantiser must equal gguf.quants.dequantize
  value for value.
- The K-quants and IQ4 formats (gguf-py has no quantiser for them): our dequantiser must equal
  gguf's value for value on (a) bytes from our quantiser and (b) random valid blocks, and our
  quantiser's error must be sane against gguf's decoding of its bytes.
- HFQ4G256 (not a GGUF type): our dequantiser against a numpy decoding of the layout.

Usage: python3 scripts/gguf_crosscheck.py [--seed N] [--rows N]
Needs: pip install gguf numpy; cargo on PATH (builds the quant_io example), or QUANT_IO=<path>.
Exits 0 only if every check agrees; prints one line per check and a summary.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf.quants import GGMLQuantizationType as T, dequantize, quantize

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Formats whose gguf-py quantiser is the ggml reference one: compared byte for byte.
QUANT_EXACT = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1,
               "q5_0": T.Q5_0, "q5_1": T.Q5_1, "mxfp4": T.MXFP4}
# MXFP4 also on every exponent byte (e = 0, 1 subnormal scales, 255 decoded as 2^127 by both):
# bytes per block.
MXFP4_BLOCK_BYTES = 17
# Formats compared on dequantisation only: (type, elements per block, bytes per block, offsets of
# the f16 scale fields (given finite random values), bound on the quantiser's relative RMS error on
# `random_rows` data: the 4- to 6-bit K-quants measured 0.02-0.07, so 0.12; Q3_K 0.148 and Q2_K
# 0.284, so 0.25 and 0.4).
DEQUANT_ONLY = {
    "q4_k": (T.Q4_K, 256, 144, [0, 2], 0.12),
    "q6_k": (T.Q6_K, 256, 210, [208], 0.12),
    "q5_k": (T.Q5_K, 256, 176, [0, 2], 0.12),
    "q3_k": (T.Q3_K, 256, 110, [108], 0.25),
    "q2_k": (T.Q2_K, 256, 84, [80, 82], 0.4),
    "iq4_nl": (T.IQ4_NL, 32, 18, [0], 0.12),
    "iq4_xs": (T.IQ4_XS, 256, 136, [0], 0.12),
}
HFQ_BLOCK_BYTES = 136
QK_K = 256


def quant_io_binary():
    if os.environ.get("QUANT_IO"):
        return os.environ["QUANT_IO"]
    subprocess.run(["cargo", "build", "-q", "-p", "hipfire-quant", "--example", "quant_io"], cwd=REPO, check=True)
    meta = json.loads(
        subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=REPO,
                       check=True, capture_output=True, text=True).stdout)
    return os.path.join(meta["target_directory"], "debug", "examples", "quant_io")


def random_rows(rng, rows, k):
    """Rows with a per-32 varying magnitude and offset, plus hard cases in row 0."""
    blocks = k // 32
    mag = rng.uniform(0.01, 3.0, size=(rows, blocks, 1)).astype(np.float32)
    shift = rng.uniform(-0.5, 0.5, size=(rows, blocks, 1)).astype(np.float32)
    x = (rng.standard_normal((rows, blocks, 32)).astype(np.float32) * mag + shift * mag).reshape(rows, k)
    x[0, :32] = 0.0  # all-zero block: d = 0 path
    if k >= 64:
        x[0, 32:64] = np.arange(32, dtype=np.float32) - 15.5  # exact halves: rounding ties
    if k >= 96:
        x[0, 64:96] = 1.0  # constant block: max == min
    return x


def run_io(binary, cmd, fmt, k, data: bytes, tmp):
    src, dst = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
    with open(src, "wb") as f:
        f.write(data)
    subprocess.run([binary, cmd, fmt, str(k), src, dst], check=True)
    with open(dst, "rb") as f:
        return f.read()


def same_f32(a, b):
    a, b = np.asarray(a, np.float32).ravel(), np.asarray(b, np.float32).ravel()
    if a.shape != b.shape:
        return False, f"shape {a.shape} vs {b.shape}"
    both_nan = np.isnan(a) & np.isnan(b)
    bad = ~(both_nan | (a.view(np.uint32) == b.view(np.uint32)))
    # +0.0 and -0.0 are the same value.
    bad &= ~((a == 0) & (b == 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return False, f"{int(bad.sum())} values differ, first at {i}: ours {a[i]!r} gguf {b[i]!r}"
    return True, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--k", type=int, default=1024)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    binary = quant_io_binary()
    results = []

    def record(name, ok, detail):
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f": {detail}" if detail else ""))

    with tempfile.TemporaryDirectory() as tmp:
        for fmt, qt in QUANT_EXACT.items():
            x = random_rows(rng, args.rows, args.k)
            ours = run_io(binary, "quantize", fmt, args.k, x.astype("<f4").tobytes(), tmp)
            theirs = np.ascontiguousarray(quantize(x, qt)).tobytes()
            if ours == theirs:
                record(f"{fmt} quantise bytes", True, f"{len(ours)} bytes identical")
            else:
                a, b = np.frombuffer(ours, np.uint8), np.frombuffer(theirs, np.uint8)
                n = min(a.size, b.size)
                diff = np.flatnonzero(a[:n] != b[:n])
                record(f"{fmt} quantise bytes", False,
                       f"len {a.size} vs {b.size}, {diff.size} bytes differ, first at {diff[:1]}")
            deq = np.frombuffer(run_io(binary, "dequantize", fmt, args.k, theirs, tmp), "<f4")
            ref = dequantize(np.frombuffer(theirs, np.uint8), qt)
            record(f"{fmt} dequantise values", *same_f32(deq, ref))

        # MXFP4: random blocks with every exponent byte, and a quantiser row whose block maxima sit
        # one ulp either side of powers of two (where floor(log2f(amax)) picks the scale).
        nblk = args.rows * args.k // 32
        rand_q = rng.integers(0, 256, size=(nblk, MXFP4_BLOCK_BYTES), dtype=np.uint8)
        rand_q[:, 0] = np.arange(nblk) % 256
        data = rand_q.tobytes()
        deq = np.frombuffer(run_io(binary, "dequantize", "mxfp4", args.k, data, tmp), "<f4")
        with np.errstate(over="ignore"):  # large exponents overflow f32 in both decoders alike
            ref = dequantize(rand_q, T.MXFP4)
        record("mxfp4 dequantise values (every exponent)", *same_f32(deq, ref))
        x = random_rows(rng, args.rows, args.k).reshape(-1, 32)
        p2 = np.float32(2.0) ** rng.integers(-100, 100, size=x.shape[0]).astype(np.float32)
        edge = np.where(np.arange(x.shape[0]) % 2 == 0, np.nextafter(p2, np.float32(0)), p2)
        amax = np.abs(x).max(axis=1, keepdims=True)
        x = np.where(amax > 0, x / np.where(amax > 0, amax, 1), 0) * edge[:, None]
        x = x.astype(np.float32).reshape(args.rows, args.k)
        ours = run_io(binary, "quantize", "mxfp4", args.k, x.astype("<f4").tobytes(), tmp)
        theirs = np.ascontiguousarray(quantize(x, T.MXFP4)).tobytes()
        record("mxfp4 quantise bytes (block maxima at powers of two)", ours == theirs,
               f"{len(ours)} bytes" if ours == theirs else
               f"{int((np.frombuffer(ours, np.uint8) != np.frombuffer(theirs, np.uint8)).sum())} bytes differ")

        for fmt, (qt, belems, bsize, f16_fields, rms_bound) in DEQUANT_ONLY.items():
            x = random_rows(rng, args.rows, args.k)
            ours_q = run_io(binary, "quantize", fmt, args.k, x.astype("<f4").tobytes(), tmp)
            nblk = args.rows * args.k // belems
            rand_q = rng.integers(0, 256, size=(nblk, bsize), dtype=np.uint8)
            for off in f16_fields:  # finite, varied super-block scales
                vals = (rng.uniform(-1, 1, nblk) * 10.0 ** rng.uniform(-4, 0, nblk)).astype(np.float16)
                rand_q[:, off:off + 2] = vals.view(np.uint8).reshape(nblk, 2)
            for label, data in (("our quantiser's blocks", ours_q), ("random blocks", rand_q.tobytes())):
                deq = np.frombuffer(run_io(binary, "dequantize", fmt, args.k, data, tmp), "<f4")
                ref = dequantize(np.frombuffer(data, np.uint8), qt)
                record(f"{fmt} dequantise values ({label})", *same_f32(deq, ref))
            # Our quantiser's error must be sane against gguf's decoding of our bytes.
            ref = dequantize(np.frombuffer(ours_q, np.uint8), qt).reshape(x.shape)
            rel = float(np.sqrt(np.mean((ref - x) ** 2) / np.mean(x ** 2)))
            record(f"{fmt} quantiser relative RMS error {rel:.4f} < {rms_bound}", rel < rms_bound, "")

        # HFQ4G256: numpy decoding of the layout (f32 scale, f32 zero, 128 B nibbles, low = even).
        x = random_rows(rng, args.rows, args.k)
        ours_q = run_io(binary, "quantize", "hfq4g256", args.k, x.astype("<f4").tobytes(), tmp)
        blocks = np.frombuffer(ours_q, np.uint8).reshape(-1, HFQ_BLOCK_BYTES)
        scale = blocks[:, 0:4].copy().view("<f4")
        zero = blocks[:, 4:8].copy().view("<f4")
        nib = blocks[:, 8:]
        q = np.stack([nib & 0x0F, nib >> 4], axis=-1).reshape(-1, QK_K).astype(np.float32)
        ref = (scale * q + zero).astype(np.float32)
        deq = np.frombuffer(run_io(binary, "dequantize", "hfq4g256", args.k, ours_q, tmp), "<f4")
        record("hfq4g256 dequantise values (numpy decoding)", *same_f32(deq, ref))
        rel = float(np.sqrt(np.mean((ref.reshape(x.shape) - x) ** 2) / np.mean(x ** 2)))
        # One min/max pair per 256 spans eight of the generator's differently scaled 32-blocks,
        # so this coarser format gets a looser sanity bound than the K-quants.
        record(f"hfq4g256 quantiser relative RMS error {rel:.4f} < 0.2", rel < 0.2, "")

    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
