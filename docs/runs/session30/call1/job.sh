#!/bin/bash
# session 30, call 1 (2 GPUs): the session-29 review fixes on the GPU: the 2-GPU hot-path test, the GPU tests
# (kernels, tuner excl. fleet), host time per cached call (scripts/host_cost.py), then the out-of-box stage
# (held-out and unseen, both modes) with the time left; on H200s that stage reads the H200 table
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
{ nvidia-smi --query-gpu=name --format=csv,noheader; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())"; git log --oneline -1; nproc; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - t0) )); }
timeout 90 python3 -m pytest -q -p no:cacheprovider -rs tests/kernels_tests/test_hotpath_multigpu.py > $OUT/pytest_multigpu.txt 2>&1; tail -4 $OUT/pytest_multigpu.txt
export CUDA_VISIBLE_DEVICES=0
timeout $(( $(left) - 330 )) python3 -m pytest -q -p no:cacheprovider -m gpu -rfs tests/kernels_tests > $OUT/pytest_kernels.txt 2>&1; tail -3 $OUT/pytest_kernels.txt
timeout $(( $(left) - 280 )) python3 -m pytest -q -p no:cacheprovider -m gpu -rfs tests/tuner_tests --ignore tests/tuner_tests/test_fleet.py > $OUT/pytest_tuner.txt 2>&1; tail -3 $OUT/pytest_tuner.txt
timeout $(( $(left) - 220 )) python3 scripts/host_cost.py --rounds 15 --json $OUT/host_cost.json > $OUT/host_cost.txt 2>&1; head -40 $OUT/host_cost.txt | cut -c1-140
OOB_BUDGET=$(( $(left) - 15 )) bash scripts/gpu_session.sh out-of-box > $OUT/oob_stdout.txt 2>&1; cat $OUT/out-of-box.log
rm -rf $OUT/out-of-box
echo "took $(( $(date +%s) - t0 )) s"
