#!/bin/bash
# session 29, call 6 (call 4's machine): the other 95 shipped one- to 32-row eager records (stamped in session 26,
# call 7) and the 14 matmul_bias eager records, each in a fresh process against the shipped table
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
timeout 420 python3 scripts/bench_dispatch.py --keys docs/runs/session26/call5/m32_keys_b.txt --db sqlite:////tmp/f6.db --stored-table kernels/tables/h100.json --modes eager --rounds 2 --json $OUT/fresh_m32b.json > $OUT/fresh_m32b.txt 2>&1 || echo "stopped" >> $OUT/fresh_m32b.txt
timeout $(( 570 - ($(date +%s) - t0) )) python3 scripts/bench_dispatch.py --kernel matmul_bias --corpus tuned --db sqlite:////tmp/f7.db --stored-table kernels/tables/h100.json --modes eager --rounds 2 --json $OUT/fresh_bias.json > $OUT/fresh_bias.txt 2>&1 || echo "stopped" >> $OUT/fresh_bias.txt
grep -h "geomean\|measured/stored\|as run\|stopped" $OUT/fresh_m32b.txt $OUT/fresh_bias.txt | cut -c1-600
for f in m32b:matmul bias:matmul_bias; do [ -f $OUT/fresh_${f%%:*}.json ] && python3 scripts/stored_drift.py $OUT/fresh_${f%%:*}.json --table kernels/tables/h100.json --kernel ${f#*:}; done | tee $OUT/drift.txt
echo "took $(( $(date +%s) - t0 )) s"
