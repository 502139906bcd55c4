#!/bin/bash
# session 30, call 3 (one H100): every GPU-marked test of kernels/ (scripts/ and db/ have none) on this session's code; then host time per cached call
# (call 1's six failures fixed in the tests, TMA's reused launch arguments)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
{ nvidia-smi --query-gpu=name --format=csv,noheader; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log --oneline -1 | cut -c1-80; } | tee $OUT/gpu.txt
git checkout -q HEAD -- db tests && git clean -fdq db tests  # a helper edits db/ here meanwhile: run the committed code
t0=$(date +%s)
timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu -rfs tests/kernels_tests > $OUT/pytest_gpu.txt 2>&1; tail -4 $OUT/pytest_gpu.txt
timeout 120 python3 scripts/host_cost.py --rounds 15 --json $OUT/host_cost.json > $OUT/host_cost.txt 2>&1; cut -c1-110 $OUT/host_cost.txt
echo "took $(( $(date +%s) - t0 )) s"
