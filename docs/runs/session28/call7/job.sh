#!/bin/bash
# session 28, call 7: on an H200, the unseen stacked q/k/v on its own table; on an H100, the unseen gated MLPs
# against torch's two Linears on the session's final code
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
B="python3 scripts/bench_dispatch.py --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98"
mkdir -p /tmp/o
if [[ $name == *H200* ]]; then
  timeout 150 $B --db sqlite:////tmp/uq.db --corpus unseen --qkv --json /tmp/o/unseen_qkv.json > /tmp/o/unseen_qkv.txt 2>&1 || echo "stopped" >> /tmp/o/unseen_qkv.txt
else
  timeout 150 $B --db sqlite:////tmp/g.db --corpus unseen --kernel gated_matmul --json /tmp/o/unseen_gated.json > /tmp/o/unseen_gated.txt 2>&1 || echo "stopped" >> /tmp/o/unseen_gated.txt
fi
grep -h "geomean\|measured again\|stopped" /tmp/o/*.txt | cut -c1-400
tar czf $OUT/call.tgz -C /tmp/o .
echo "took $(( $(date +%s) - t0 )) s"
