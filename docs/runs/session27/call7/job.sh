#!/bin/bash
# session 27, call 7: on an H200, the unseen Linears (bf16) and the held-out stacked q/k/v with the H200's table;
# on an H100, the GPU tests of tuner/ (not the fleet's)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 300 - ($(date +%s) - t0) )); }
B="python3 scripts/bench_dispatch.py --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98"
if [[ $name == *H200* ]]; then
  timeout $(( $(left) - 10 )) $B --db sqlite:////tmp/u.db --corpus unseen --dtype bf16 --json $OUT/unseen_bf16.json > $OUT/unseen_bf16.txt 2>&1 || echo "stopped" >> $OUT/unseen_bf16.txt
  timeout $(( $(left) - 5 )) $B --db sqlite:////tmp/q.db --corpus held_out --qkv --json $OUT/held_qkv.json > $OUT/held_qkv.txt 2>&1 || echo "stopped" >> $OUT/held_qkv.txt
  grep -h "geomean\|measured again\|stopped" $OUT/*.txt | cut -c1-400
else
  timeout $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider -m gpu tests/tuner_tests --ignore tests/tuner_tests/test_fleet.py > $OUT/pytest.txt 2>&1; tail -4 $OUT/pytest.txt
fi
echo "took $(( $(date +%s) - t0 )) s"
