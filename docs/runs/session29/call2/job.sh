#!/bin/bash
# session 29, call 2: on an H200, every out-of-the-box check on the H200 table (held-out and unseen); on an H100,
# the rest of call 1's out-of-box stage on the final code (unseen gated MLPs and biased q/k/v), then the shipped
# one- to 32-row eager records against a fresh process (stored within 3%)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log --oneline -1; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - t0) )); }
B="python3 scripts/bench_dispatch.py --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98"
mkdir -p /tmp/o
if [[ $name == *H200* ]]; then
  OOB_BUDGET=$(( $(left) - 15 )) bash scripts/gpu_session.sh out-of-box > /dev/null 2>&1; cat $OUT/out-of-box.log; rm -rf $OUT/out-of-box
else
  timeout 170 $B --db sqlite:////tmp/g.db --corpus unseen --kernel gated_matmul --json /tmp/o/unseen_gated.json > /tmp/o/unseen_gated.txt 2>&1 || echo "stopped" >> /tmp/o/unseen_gated.txt
  timeout 170 $B --db sqlite:////tmp/b.db --corpus unseen --kernel matmul_bias --json /tmp/o/unseen_bias.json > /tmp/o/unseen_bias.txt 2>&1 || echo "stopped" >> /tmp/o/unseen_bias.txt
  timeout $(( $(left) - 10 )) python3 scripts/bench_dispatch.py --keys docs/runs/session26/call5/m32_keys_a.txt --db sqlite:////tmp/f.db --stored-table kernels/tables/h100.json --modes eager --rounds 2 --json /tmp/o/fresh_m32a.json > /tmp/o/fresh_m32a.txt 2>&1 || echo "stopped" >> /tmp/o/fresh_m32a.txt
  grep -h "geomean\|measured again\|measured/stored\|stopped" /tmp/o/*.txt | cut -c1-400
  tar czf $OUT/call.tgz -C /tmp/o .
fi
echo "took $(( $(date +%s) - t0 )) s"
