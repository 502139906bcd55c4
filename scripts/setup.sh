#!/usr/bin/env bash
# Create .venv with everything the project needs, on a machine with or without a GPU.
# With a GPU: a venv with --system-site-packages, so the system's CUDA torch is reused.
# Without a GPU: CPU torch and triton 3.6 (the GPU's version, so the interpreter runs the code the GPU
# runs) with numpy < 2.4 (triton 3.6's interpreter fails with numpy >= 2.4).
# The PostgreSQL tests need a server binary, and the C++ path of cuBLAS plans (kernels/_native.cpp) a
# C++ compiler and Python's headers: as root with apt-get, Debian's `postgresql`, `g++` and `python3-dev`
# packages are installed when missing
# (the tests start their own server in a temp dir; the package's own cluster is not used). Idempotent:
# a second run installs nothing new. The [hf] extra (transformers 5) is installed too: tests/kernels_tests/test_hf.py
# builds real transformers models, and fails in CI without it.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
    missing+=(postgresql)
fi
command -v c++ >/dev/null 2>&1 || missing+=(g++)
python3 -c 'import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    || missing+=(python3-dev)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q
        apt-get install -y -q --no-install-recommends "${missing[@]}"
    else
        echo "setup: missing ${missing[*]}; the PostgreSQL tests (postgresql) or the C++ path's tests (g++, python3-dev)" \
             "will be skipped (apt-get install ${missing[*]} as root to run them)" >&2
    fi
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    # With a GPU the venv sees the system's packages, so an installed CUDA torch (and its triton) is reused:
    # pip finds torch>=2.4 satisfied and installs only what is missing.
    python3 -m venv --system-site-packages .venv
    "${pip[@]}" -e ".[test,postgres,hf]"
else
    python3 -m venv .venv
    "${pip[@]}" "torch==2.13.0" "triton==3.6.0" "numpy<2.4"
    "${pip[@]}" -e ".[test,postgres,hf]"
fi
