#!/bin/bash
# session 29, call 1: on an H200, every out-of-the-box check (held-out and unseen, the H200 table); on an H100,
# the session-28 final code (row loop, shipped-table reader) on the GPU: GPU tests, host time per cached call,
# then the out-of-box stage with the time left
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log --oneline -1; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - t0) )); }
if [[ $name == *H200* ]]; then
  OOB_BUDGET=$(( $(left) - 15 )) bash scripts/gpu_session.sh out-of-box > $OUT/oob_stdout.txt 2>&1; cat $OUT/out-of-box.log
else
  timeout $(( $(left) - 300 )) python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels_tests > $OUT/pytest_kernels.txt 2>&1; tail -3 $OUT/pytest_kernels.txt
  timeout $(( $(left) - 250 )) python3 -m pytest -q -p no:cacheprovider -m gpu tests/tuner_tests --ignore tests/tuner_tests/test_fleet.py > $OUT/pytest_tuner.txt 2>&1; tail -3 $OUT/pytest_tuner.txt
  timeout $(( $(left) - 200 )) python3 scripts/host_cost.py --rounds 15 > $OUT/host_cost.txt 2>&1; head -40 $OUT/host_cost.txt | cut -c1-140
  OOB_BUDGET=$(( $(left) - 15 )) bash scripts/gpu_session.sh out-of-box > $OUT/oob_stdout.txt 2>&1; cat $OUT/out-of-box.log
fi
rm -rf $OUT/out-of-box
echo "took $(( $(date +%s) - t0 )) s"
