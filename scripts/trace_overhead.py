#!/usr/bin/env python3
"""trace_overhead.py — per-step sync overhead from `HIPFIRE_CPU_EXEC_TRACE=1` logs.

    python3 scripts/trace_overhead.py TRACE.log [TRACE2.log ...] [--json]

Reads the `split: step gemv` lines the offload executor writes (target hipfire::cpu_exec), keeps
the last line of each shape (format, m, k, residual: its counters are cumulative means), and
prints per shape the mean host wall of a split step, the two arms' mean times and the overhead:
all wall time that is not the longer arm's multiply, as a fraction of the wall (issue 4's
"per-step sync overhead"). The host wall is the host's view: under two-stream and flags the host
may return before the GPU arm ends, so that overhead is a lower bound there; the `d2h` column is
the D2H of x under ordering/two-stream and the workers' wait for the published x under flags.
A weighted total over the shapes (by wall time) ends the table.

Under `flags` (lines with join=flags) the host queues a step and returns, so the trace's wall is
the host's queueing time, not the step's: those shapes are listed but left out of the total.
Their figure comes from the executor's arm account instead (`examples/single_layer`'s `sync`
column, with the flags breakdown under it).
"""
import json
import re
import sys

FIELD = re.compile(r"(\w+)=(\"[^\"]*\"|\S+)")


def parse(paths):
    last = {}
    for p in paths:
        with open(p, errors="replace") as f:
            for line in f:
                if "split: step gemv" not in line:
                    continue
                kv = {k: v.strip('"') for k, v in FIELD.findall(line)}
                try:
                    key = (kv["format"], int(kv["m"]), int(kv["k"]), kv["residual"])
                    rec = {
                        "calls": int(kv["calls"]),
                        "split_steps": int(kv["split_steps"]),
                        "share": float(kv["share"]),
                        "wall_us": float(kv["mean_wall_us"]),
                        "d2h_us": float(kv["mean_d2h_us"]),
                        "multiply_us": float(kv["mean_multiply_us"]),
                        "join_us": float(kv["mean_join_us"]),
                        "gpu_arm_us": float(kv["mean_gpu_arm_us"]),
                        "join": kv.get("join", ""),
                        "file": p,
                    }
                except (KeyError, ValueError):
                    continue
                if key not in last or rec["calls"] >= last[key]["calls"]:
                    last[key] = rec
    return last


def main(argv):
    as_json = "--json" in argv
    paths = [a for a in argv if a != "--json"]
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    rows = []
    for (fmt, m, k, res), r in sorted(parse(paths).items()):
        arm = max(r["multiply_us"], r["gpu_arm_us"])
        over = max(r["wall_us"] - arm, 0.0)
        rows.append({"format": fmt, "m": m, "k": k, "residual": res, **r,
                     "overhead_us": over, "overhead_frac": over / r["wall_us"] if r["wall_us"] > 0 else float("nan")})
    if not rows:
        print("no `split: step gemv` lines found", file=sys.stderr)
        return 1
    counted = [r for r in rows if r["join"] != "flags"]
    wall = sum(r["wall_us"] * r["split_steps"] for r in counted)
    total = sum(r["overhead_us"] * r["split_steps"] for r in counted) / wall if wall > 0 else float("nan")
    if as_json:
        print(json.dumps({"shapes": rows, "weighted_overhead_frac": total}, indent=1))
        return 0
    print(f"{'format':<8} {'m':>6} {'k':>6} {'res':<5} {'steps':>6} {'share':>6} {'wall us':>8} "
          f"{'d2h':>6} {'cpu':>7} {'gpu':>7} {'join':>6} {'overhead':>9}")
    for r in rows:
        print(f"{r['format']:<8} {r['m']:>6} {r['k']:>6} {r['residual']:<5} {r['split_steps']:>6} "
              f"{r['share']:>6.3f} {r['wall_us']:>8.1f} {r['d2h_us']:>6.1f} {r['multiply_us']:>7.1f} "
              f"{r['gpu_arm_us']:>7.1f} {r['join_us']:>6.1f} {100 * r['overhead_frac']:>8.1f}%")
    if len(counted) < len(rows):
        print("join=flags shapes: the wall is the host's queueing time, not counted (use single_layer's sync column)")
    print(f"weighted by wall: {100 * total:.1f}% of split-step time is not the longer arm's multiply")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
