#!/bin/bash
# session 30, call 4 (one H100): every GPU-marked test of kernels/ on this session's committed code (db/ and
# tests/ from git archive HEAD in .clean/: a helper edits db/ meanwhile; call 3's checkout restored stale tests)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
rm -rf db tests && cp -r .clean/db .clean/tests . || exit
{ nvidia-smi --query-gpu=name --format=csv,noheader; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; md5sum tests/kernels_tests/test_native.py kernels/gemm.py; } | tee $OUT/gpu.txt
t0=$(date +%s)
timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu -rfs tests/kernels_tests > $OUT/pytest_gpu.txt 2>&1; tail -4 $OUT/pytest_gpu.txt
echo "took $(( $(date +%s) - t0 )) s"
