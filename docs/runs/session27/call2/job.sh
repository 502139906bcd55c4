#!/bin/bash
# session 27, call 2: dispatch out of the box (the shipped table, a fresh database) on the unseen models' problems
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 570 - ($(date +%s) - t0) )); }
B="python3 scripts/bench_dispatch.py --db sqlite:////tmp/u.db --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98"
for d in bf16 fp16; do
  timeout $(( $(left) - 20 )) $B --corpus unseen --dtype $d --json $OUT/unseen_$d.json > $OUT/unseen_$d.txt 2>&1 || echo "unseen $d: stopped" >> $OUT/unseen_$d.txt
  echo "after $d: $(( $(date +%s) - t0 )) s"
done
grep -h "geomean\|measured again\|stopped" $OUT/unseen_*.txt | cut -c1-400
echo "took $(( $(date +%s) - t0 )) s"
