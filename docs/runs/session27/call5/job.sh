#!/bin/bash
# session 27, call 5: after the bias-plan fix: its GPU tests, the probe, the biased q/k/v (unseen, and the corpus
# against its stored figures), then the unseen Linears in bf16 with this session's dispatch
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 570 - ($(date +%s) - t0) )); }
python3 -m pytest -q -p no:cacheprovider tests/kernels_tests/test_native.py tests/kernels_tests/test_epilogue.py -k "addmm or bias or cublas" > $OUT/pytest.txt 2>&1; tail -3 $OUT/pytest.txt
python3 scripts/probes/addmm_plan_probe.py --key bf16:nt:8x10240x8192 --key bf16:nt:32x10240x8192 --key fp16:nt:32x10240x8192 --key bf16:nt:8x4608x3584 --key bf16:nt:32x7168x5120 > $OUT/probe.txt 2>&1; grep -v Warn $OUT/probe.txt | cut -c1-300
echo "after tests and probe: $(( $(date +%s) - t0 )) s"
B="python3 scripts/bench_dispatch.py --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98"
$B --db sqlite:////tmp/u.db --corpus unseen --kernel matmul_bias --modes eager --json $OUT/bias_unseen.json > $OUT/bias_unseen.txt 2>&1
$B --db sqlite:////tmp/s.db --corpus all --kernel matmul_bias --modes eager --stored-table kernels/tables/h100.json --json $OUT/bias_all.json > $OUT/bias_all.txt 2>&1
grep -h "geomean\|measured again\|part:\|stored" $OUT/bias_unseen.txt $OUT/bias_all.txt | cut -c1-400
echo "after bias: $(( $(date +%s) - t0 )) s"
timeout $(( $(left) - 10 )) $B --db sqlite:////tmp/u.db --corpus unseen --dtype bf16 --json $OUT/bf16.json > $OUT/bf16.txt 2>&1 || echo "bf16: stopped" >> $OUT/bf16.txt
grep -h "geomean\|measured again\|stopped\|nominal spin" $OUT/bf16.txt | cut -c1-400
echo "took $(( $(date +%s) - t0 )) s"
