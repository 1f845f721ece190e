#!/usr/bin/env bash
# CPU prefill tok/s on 2 threads: hipfire (this tree, and a baseline binary) against llama.cpp's
# llama-bench (built on this box from the llama-cpp-python 0.3.36 sdist's vendored source, CPU
# only), same GGUF, 200-token prompt, rounds interleaved (new, llama.cpp, baseline, ...).
# Usage: run.sh L8B.gguf SMOLLM2.gguf LLAMA_BENCH BASELINE_HIPFIRE [ROUNDS] [BATCH]
#   Writes env-BATCH.txt, raw-BATCH.jsonl, summary-BATCH.txt (and the tools' stderr logs).
#   L8B.gguf: `hipfire synth --arch llama3-8b --format q4_k --out L8B.gguf`
#   SMOLLM2.gguf: `scripts/smollm2-path.sh`; needs target/release/hipfire (this tree).
set -euo pipefail
cd "$(dirname "$0")/../../.."
L8B="$1"; SMOL="$2"; LB="$3"; BASE="$4"; ROUNDS="${5:-3}"; B="${6:-1}"
# hipfire's --json: llama-bench-style rows (the pp row's avg_ts), or the older object of modes.
# RECORD_DIR: where the files go (a later record reruns this script into its own folder).
OUT="${RECORD_DIR:-docs/perf-checkpoints/2026-12-01-cpu-prefill-2core}"
NEW=target/release/hipfire
PROMPT=200
{
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
  echo "flags: $(grep -m1 -o 'avx512_vnni\|avx512bw' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "baseline: $BASE ($("$BASE" --version 2>&1 | head -1))"
  echo "llama-bench: $LB"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/env-$B.txt"
: > "$OUT/raw-$B.jsonl"
hf() { # label binary model
  local j; j=$("$2" bench "$3" --device cpu --threads 2 --prompt-tokens "$PROMPT" --gen-tokens 1 \
      --rounds 1 --json 2>>"$OUT/hipfire-$B.log")
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(json.dumps({"label":sys.argv[2],"round":int(sys.argv[3]),"load":sys.argv[4],"prefill_tok_s":(next(x["avg_ts"] for x in d if x["test"].startswith("pp")) if isinstance(d,list) else d["modes"][0]["prefill_tok_s"]["median"]),"raw":d}))' \
      "$j" "$1" "$r" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$OUT/raw-$B.jsonl" | cut -c1-120
}
lc() { # label model
  local j; j=$("$LB" -m "$2" -p "$PROMPT" -n 0 -t 2 -r 1 -o json 2>>"$OUT/llama-bench-$B.log")
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(json.dumps({"label":sys.argv[2],"round":int(sys.argv[3]),"load":sys.argv[4],"prefill_tok_s":d[0]["avg_ts"],"raw":d}))' \
      "$j" "$1" "$r" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$OUT/raw-$B.jsonl" | cut -c1-120
}
for r in $(seq "$ROUNDS"); do
  hf "hipfire-new l8b" "$NEW" "$L8B"
  lc "llama.cpp l8b" "$L8B"
  hf "hipfire-base l8b" "$BASE" "$L8B"
  hf "hipfire-new smollm2" "$NEW" "$SMOL"
  lc "llama.cpp smollm2" "$SMOL"
  hf "hipfire-base smollm2" "$BASE" "$SMOL"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/env-$B.txt"
python3 - "$OUT/raw-$B.jsonl" <<'PY' | tee "$OUT/summary-$B.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
labels = list(dict.fromkeys(r["label"] for r in rows))
med = {}
for lab in labels:
    v = [r["prefill_tok_s"] for r in rows if r["label"] == lab]
    med[lab] = statistics.median(v)
    print(f"{lab:24s} median {med[lab]:8.2f} tok/s  samples {', '.join(f'{x:.2f}' for x in v)}")
for m in ("l8b", "smollm2"):
    for who in ("new", "base"):
        print(f"ratio hipfire-{who}/llama.cpp {m}: {med[f'hipfire-{who} {m}'] / med[f'llama.cpp {m}']:.3f}")
PY
