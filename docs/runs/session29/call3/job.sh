#!/bin/bash
# session 29, call 3: on an H200, every out-of-the-box check on the H200 table; on an H100, the unseen gated MLPs
# on the final code (call 2's run of them stopped at its time limit, 20 of 42 measured)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - t0) )); }
mkdir -p /tmp/o
if [[ $name == *H200* ]]; then
  OOB_BUDGET=$(( $(left) - 15 )) bash scripts/gpu_session.sh out-of-box > /dev/null 2>&1; cat $OUT/out-of-box.log; rm -rf $OUT/out-of-box
else
  timeout 480 python3 scripts/bench_dispatch.py --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98 --db sqlite:////tmp/g.db --corpus unseen --kernel gated_matmul --json /tmp/o/unseen_gated.json > /tmp/o/unseen_gated.txt 2>&1 || echo "stopped" >> /tmp/o/unseen_gated.txt
  grep -h "geomean\|measured again\|stopped" /tmp/o/*.txt | cut -c1-400
  tar czf $OUT/call.tgz -C /tmp/o .
fi
echo "took $(( $(date +%s) - t0 )) s"
