#!/bin/bash
# session 29, call 4: on an H200, every out-of-the-box check on the H200 table; on an H100, a third of the 95 shipped
# one- to 32-row eager records (every third key of docs/runs/session26/call5/m32_keys_a.txt) in a fresh process
# against the shipped table, for scripts/stored_drift.py
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - t0) )); }
if [[ $name == *H200* ]]; then
  OOB_BUDGET=$(( $(left) - 15 )) bash scripts/gpu_session.sh out-of-box > /dev/null 2>&1; cat $OUT/out-of-box.log; rm -rf $OUT/out-of-box
else
  timeout $(( $(left) - 10 )) python3 scripts/bench_dispatch.py --keys docs/runs/session26/call5/m32_keys_a.txt --every 3 --db sqlite:////tmp/f.db --stored-table kernels/tables/h100.json --modes eager --rounds 2 --json $OUT/fresh_m32a_every3.json > $OUT/fresh_m32a_every3.txt 2>&1 || echo "stopped" >> $OUT/fresh_m32a_every3.txt
  grep -h "geomean\|measured/stored\|as run\|stopped" $OUT/fresh_m32a_every3.txt | cut -c1-600
  [ -f $OUT/fresh_m32a_every3.json ] && python3 scripts/stored_drift.py $OUT/fresh_m32a_every3.json --table kernels/tables/h100.json | tee $OUT/drift.txt
fi
echo "took $(( $(date +%s) - t0 )) s"
