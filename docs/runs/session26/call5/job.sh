#!/bin/bash
# session 26, call 5: stamp the H100 table's host-bound eager records (matmul M <= 32, every gated and biased one) waiting for the host's nominal speed, and ship
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
{ nvidia-smi --query-gpu=name --format=csv,noheader; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
python3 -m tuner import kernels/tables/h100.json --db sqlite:////tmp/t.db > /dev/null
t0=$(date +%s)
python3 -m tuner stamp --db sqlite:////tmp/t.db --kernel gated_matmul > $OUT/stamp.txt 2>&1
python3 -m tuner stamp --db sqlite:////tmp/t.db --kernel matmul_bias >> $OUT/stamp.txt 2>&1
for part in a b; do
  left=$(( 560 - ($(date +%s) - t0) ))
  P=$(sed 's/^/--problem /' docs/runs/session26/call5/m32_keys_$part.txt | tr '\n' ' ')
  timeout $left python3 -m tuner stamp --db sqlite:////tmp/t.db --kernel matmul $P >> $OUT/stamp.txt 2>&1 || echo "part $part: stopped after $left s" >> $OUT/stamp.txt
done
echo "stamps: $(( $(date +%s) - t0 )) s" >> $OUT/stamp.txt
python3 scripts/ship_table.py --device h100 --base kernels/tables/h100.json --db sqlite:////tmp/t.db -o $OUT/h100.json > $OUT/ship.txt 2>&1
grep -h "stamped\|stopped\|stamps:" $OUT/stamp.txt; tail -2 $OUT/ship.txt
