#!/bin/bash
# session 26, call 2: stored vs fresh for host-bound eager records, stamp and bench with and without waiting for the host
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
{ nvidia-smi --query-gpu=name --format=csv,noheader; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > $OUT/gpu.txt
cat $OUT/gpu.txt
python3 -m tuner import kernels/tables/h100.json --db sqlite:////tmp/old.db > /dev/null
cp /tmp/old.db /tmp/new.db
P=$(sed 's/^/--problem /' docs/runs/session26/m1_tuned_keys.txt | tr '\n' ' ')
for method in old new; do
  S=""; [ $method = old ] && S="--settle-s 0"
  start=$(date +%s)
  python3 -m tuner stamp --db sqlite:////tmp/$method.db --kernel matmul $P $S > $OUT/stamp_$method.txt 2>&1
  python3 -m tuner stamp --db sqlite:////tmp/$method.db --kernel matmul_bias $S >> $OUT/stamp_$method.txt 2>&1
  mid=$(date +%s)
  python3 scripts/bench_dispatch.py --keys docs/runs/session26/m1_tuned_keys.txt --db sqlite:////tmp/$method.db --stored --modes eager --rounds 2 $S --json $OUT/fresh_$method.json > $OUT/fresh_$method.txt 2>&1
  python3 scripts/bench_dispatch.py --kernel matmul_bias --corpus tuned --db sqlite:////tmp/$method.db --stored --modes eager --rounds 2 $S --json $OUT/fresh_bias_$method.json > $OUT/fresh_bias_$method.txt 2>&1
  echo "$method: stamp $((mid-start)) s, bench $(( $(date +%s)-mid )) s"
  grep -h "stamped\|measured/stored\|as run" $OUT/stamp_$method.txt $OUT/fresh_$method.txt $OUT/fresh_bias_$method.txt | cut -c1-400
done
