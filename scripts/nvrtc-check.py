#!/usr/bin/env python3
"""nvrtc-check.py — compile kernels/*.cu with NVRTC on a machine without a GPU.

    python3 scripts/nvrtc-check.py [--arch sm_90] [--lib PATH] [-DNAME[=V]]... [--expect NAME]...
                                   [--source kernels/gemv.cu] [--quiet]

Compiles the source the way the registry does (crates/hipfire-gpu/src/registry.rs and gemv.rs: the
headers it embeds, `--gpu-architecture=ARCH` and the GEMV shape defines), with `-Xptxas -v` so the
log shows registers, shared memory and spills per kernel, then checks that every kernel name the
launcher looks up is in the CUBIN. Exit 0 on success, 1 on a compile error or a missing kernel.

libnvrtc: `--lib`, else $NVRTC_LIB, else the first of a few pip wheel locations (e.g.
`pip install --target /tmp/nvrtc13 nvidia-cuda-nvrtc==13.0.88`), else the loader's search path.
"""
import argparse
import ctypes
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Formats and forms the launcher looks up (gemv.rs `LOAD_WIDTHS`, `Format::ALL`, `GemvForm`).
FORMATS = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "hfq4g256"]
FORMS = ["plain", "residual"]
WIDTHS = [16, 4, 2]
# Device-resident variants (gemv.rs `DEVICE_FORMATS`).
DEVICE_FORMATS = ["q4_k", "q6_k"]
DEFAULT_SHAPE = ["-DHF_WARPS=4", "-DHF_ROWS=2", "-DHF_KSPLIT=1", "-DHF_MINB=1"]


def find_lib(explicit):
    cands = [explicit, os.environ.get("NVRTC_LIB")]
    for base in ["/tmp/nvrtc13", "/tmp/nvrtc", os.path.join(ROOT, ".venv")]:
        cands += sorted(glob.glob(os.path.join(base, "**", "libnvrtc.so.*"), recursive=True))
    cands += ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]
    for c in cands:
        if not c:
            continue
        try:
            # NVRTC dlopens its builtins library by soname; loading it first from the same folder
            # makes that work without LD_LIBRARY_PATH.
            for b in glob.glob(os.path.join(os.path.dirname(c), "libnvrtc-builtins.so.*")):
                if ".alt." not in b:
                    ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(c), c
        except OSError:
            continue
    sys.exit("libnvrtc not found: pip install --target /tmp/nvrtc13 nvidia-cuda-nvrtc, or pass --lib")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--lib")
    ap.add_argument("--source", default=os.path.join(ROOT, "kernels", "gemv.cu"))
    ap.add_argument("--expect", action="append", default=None)
    ap.add_argument("--quiet", action="store_true", help="print only errors and the summary")
    ap.add_argument("--no-default-shape", action="store_true")
    ap.add_argument("--cubin", help="write the CUBIN here (for nvdisasm)")
    args, defines = ap.parse_known_args()
    for d in defines:
        if not d.startswith("-D"):
            sys.exit(f"unknown argument {d}")
    lib, path = find_lib(args.lib)
    src_path = args.source
    src = open(src_path, "rb").read()
    hdr_names, hdr_srcs = [], []
    for inc in sorted(set(re.findall(rb'#include "([^"]+)"', src))):
        hdr_names.append(inc)
        hdr_srcs.append(open(os.path.join(os.path.dirname(src_path), inc.decode()), "rb").read())

    opts = [f"--gpu-architecture={args.arch}".encode()]
    if os.path.basename(src_path) == "gemv.cu" and not args.no_default_shape:
        given = {d.split("=")[0] for d in defines}
        opts += [d.encode() for d in DEFAULT_SHAPE if d.split("=")[0] not in given]
    opts += [d.encode() for d in defines]
    opts += [b"-Xptxas", b"-v"]

    prog = ctypes.c_void_p()
    n = len(hdr_names)
    arr = ctypes.c_char_p * max(n, 1)
    rc = lib.nvrtcCreateProgram(
        ctypes.byref(prog), src, os.path.basename(src_path).encode(), n, arr(*hdr_srcs), arr(*hdr_names)
    )
    if rc != 0:
        sys.exit(f"nvrtcCreateProgram: {rc}")
    oarr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), oarr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace")
    print(f"# {path}\n# options: {' '.join(o.decode() for o in opts)}")
    if rc != 0:
        print(text)
        print(f"COMPILE FAILED (nvrtc rc {rc})")
        return 1
    if args.quiet:
        for line in text.splitlines():
            if "warning" in line.lower() or "spill" in line.lower() and not re.search(r"\b0 bytes spill stores, 0 bytes spill loads", line):
                print(line)
    else:
        print(text)
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    blob = cubin.raw
    if args.cubin:
        open(args.cubin, "wb").write(blob)
    expect = args.expect
    if expect is None and os.path.basename(src_path) == "gemv.cu":
        expect = [f"gemv_{f}_{m}_v{w}" for f in FORMATS for m in FORMS for w in WIDTHS]
        expect += [f"gemv_{f}_{m}_dev" for f in DEVICE_FORMATS for m in FORMS]
        expect += [f"gemv_{f}_plain_v{w}_ids" for f in FORMATS for w in WIDTHS]
        expect.append("quantize_x_q8")
    missing = [e for e in expect or [] if (e.encode() + b"\0") not in blob]
    # Spills in any kernel are worth knowing about.
    spills = re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes spill stores, (\d+) bytes spill loads", text, re.S)
    for name, st, ld in spills:
        if int(st) or int(ld):
            print(f"SPILL {name}: {st} B stores, {ld} B loads")
    if missing:
        print("MISSING KERNELS:", " ".join(missing))
        return 1
    print(f"OK: {len(blob)} bytes of CUBIN, {len(expect or [])} kernels present")
    return 0


if __name__ == "__main__":
    sys.exit(main())
