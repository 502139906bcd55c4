#!/bin/bash
# session 27, call 4: the biased Linear's cuBLAS kernel (ours against torch.addmm), the unseen biased q/k/v with the
# kept cublasLt plan switched off, and the unseen Linears in fp16 (call 3 ran out of time before them)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 570 - ($(date +%s) - t0) )); }
K="--key bf16:nt:8x10240x8192 --key bf16:nt:32x10240x8192 --key bf16:nt:128x10240x8192 --key fp16:nt:32x10240x8192 --key bf16:nt:8x4608x3584 --key bf16:nt:32x7168x5120"
python3 scripts/probes/addmm_plan_probe.py $K > $OUT/probe_lt.txt 2>&1
KERNELS_NATIVE_LT=0 python3 scripts/probes/addmm_plan_probe.py $K > $OUT/probe_nolt.txt 2>&1
cut -c1-420 $OUT/probe_lt.txt $OUT/probe_nolt.txt
echo "after probes: $(( $(date +%s) - t0 )) s"
B="python3 scripts/bench_dispatch.py --db sqlite:////tmp/u.db --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98 --corpus unseen"
KERNELS_NATIVE_LT=0 timeout $(( $(left) - 10 )) $B --kernel matmul_bias --modes eager --json $OUT/bias_nolt.json > $OUT/bias_nolt.txt 2>&1
grep -h "geomean\|measured again" $OUT/bias_nolt.txt | cut -c1-400
echo "after bias: $(( $(date +%s) - t0 )) s"
timeout $(( $(left) - 10 )) $B --dtype fp16 --json $OUT/fp16.json > $OUT/fp16.txt 2>&1 || echo "fp16: stopped" >> $OUT/fp16.txt
grep -h "geomean\|measured again\|stopped\|nominal spin" $OUT/fp16.txt | cut -c1-400
echo "took $(( $(date +%s) - t0 )) s"
