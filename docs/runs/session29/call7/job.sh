#!/bin/bash
# session 29, call 7: a GPU with no table, on the final code: the held-out part with every shipped table left out
# and a fresh database (--no-shipped), both modes; then the unseen stacked q/k/v the same way while time is left
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( ${LIMIT:-380} - ($(date +%s) - t0) )); }
B="python3 scripts/bench_dispatch.py --no-shipped --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98"
timeout $(( $(left) - 10 )) $B --db sqlite:////tmp/n.db --corpus held_out --json $OUT/noship_held.json > $OUT/noship_held.txt 2>&1 || echo "stopped" >> $OUT/noship_held.txt
timeout $(( $(left) - 5 )) $B --db sqlite:////tmp/n2.db --corpus unseen --qkv --json $OUT/noship_unseen_qkv.json > $OUT/noship_unseen_qkv.txt 2>&1 || echo "stopped" >> $OUT/noship_unseen_qkv.txt
grep -h "geomean\|measured again\|stopped" $OUT/noship_*.txt | cut -c1-400
echo "took $(( $(date +%s) - t0 )) s"
