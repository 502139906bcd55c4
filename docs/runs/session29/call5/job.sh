#!/bin/bash
# session 29, call 5 (call 4's machine): the other 63 of the 95 shipped one- to 32-row eager records in a fresh process
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
timeout 560 python3 scripts/bench_dispatch.py --keys docs/runs/session29/call5/keys_rest.txt --db sqlite:////tmp/f5.db --stored-table kernels/tables/h100.json --modes eager --rounds 2 --json $OUT/fresh_m32a_rest.json > $OUT/fresh_m32a_rest.txt 2>&1 || echo "stopped" >> $OUT/fresh_m32a_rest.txt
grep -h "geomean\|measured/stored\|as run\|stopped" $OUT/fresh_m32a_rest.txt | cut -c1-600
[ -f $OUT/fresh_m32a_rest.json ] && python3 scripts/stored_drift.py $OUT/fresh_m32a_rest.json --table kernels/tables/h100.json | tee $OUT/drift.txt
echo "took $(( $(date +%s) - t0 )) s"
