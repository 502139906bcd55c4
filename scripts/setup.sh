#!/usr/bin/env bash
# Create .venv with everything the project needs, on a machine with or without a GPU.
# Without a GPU: CPU torch and triton 3.6 (the GPU's version, so the interpreter runs the code the GPU
# runs) with numpy < 2.4 (triton 3.6's interpreter fails with numpy >= 2.4).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "${pip[@]}" -e ".[test]"
else
    "${pip[@]}" "torch==2.13.0" "triton==3.6.0" "numpy<2.4"
    "${pip[@]}" -e ".[test]"
fi
