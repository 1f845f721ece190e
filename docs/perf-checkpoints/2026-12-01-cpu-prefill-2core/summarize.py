"""Pool every raw-*.jsonl batch of run.sh: per-arm median and max of prefill tok/s, and the
per-round ratios of each hipfire arm to the llama.cpp run beside it (same round, same model)."""
import glob, json, statistics
batches = sorted(glob.glob("raw-*.jsonl"))
rows = []
for f in batches:
    for l in open(f):
        r = json.loads(l)
        r["batch"] = f
        rows.append(r)
for model in ("l8b", "smollm2"):
    print(f"== {model} ({len(batches)} batches × 3 rounds)")
    for who in ("hipfire-new", "llama.cpp", "hipfire-base"):
        v = [r["prefill_tok_s"] for r in rows if r["label"] == f"{who} {model}"]
        print(f"{who:13s} median {statistics.median(v):7.2f}  max {max(v):7.2f}  samples "
              + ", ".join(f"{x:.2f}" for x in v))
    for who in ("hipfire-new", "hipfire-base"):
        ratios = []
        for b in batches:
            for rd in sorted({r["round"] for r in rows if r["batch"] == b}):
                get = lambda lab: next(r["prefill_tok_s"] for r in rows
                                       if r["batch"] == b and r["round"] == rd and r["label"] == lab)
                ratios.append(get(f"{who} {model}") / get(f"llama.cpp {model}"))
        print(f"{who}/llama.cpp per-round ratios: " + ", ".join(f"{x:.2f}" for x in ratios)
              + f"; median {statistics.median(ratios):.2f}")
