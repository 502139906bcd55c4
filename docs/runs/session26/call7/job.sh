#!/bin/bash
# session 26, call 7: on an H200, the held-out fallback check; on an H100, the rest of the table's one- to 32-row eager stamps
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
if [[ $name == *H200* ]]; then
  python3 scripts/bench_dispatch.py --corpus held_out --qkv --db sqlite:////tmp/f2.db --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98 --json $OUT/held_qkv.json > $OUT/held_qkv.txt 2>&1
  timeout $(( 270 - ($(date +%s) - t0) )) python3 scripts/bench_dispatch.py --corpus held_out --db sqlite:////tmp/f.db --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98 --json $OUT/held.json > $OUT/held.txt 2>&1
  grep -h "geomean\|part:\|measured again" $OUT/held_qkv.txt $OUT/held.txt | cut -c1-300
else
  python3 -m tuner import kernels/tables/h100.json --db sqlite:////tmp/t.db > /dev/null
  for i in 0 1 2; do
    left=$(( 270 - ($(date +%s) - t0) ))
    P=$(sed 's/^/--problem /' docs/runs/session26/call7/m32_keys_b$i.txt | tr '\n' ' ')
    timeout $left python3 -m tuner stamp --db sqlite:////tmp/t.db --kernel matmul $P >> $OUT/stamp.txt 2>&1 || echo "chunk $i: stopped after $left s" >> $OUT/stamp.txt
  done
  python3 scripts/ship_table.py --device h100 --base kernels/tables/h100.json --db sqlite:////tmp/t.db -o $OUT/h100.json > $OUT/ship.txt 2>&1
  grep -h "stamped\|stopped" $OUT/stamp.txt; tail -1 $OUT/ship.txt
fi
