#!/bin/bash
# session 27, call 6: on an H200, the unseen models with its own table and the held-out fallback check; on an
# H100, host time per call on the session's final code and the GPU tests of kernels/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 570 - ($(date +%s) - t0) )); }
B="python3 scripts/bench_dispatch.py --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98"
if [[ $name == *H200* ]]; then
  $B --db sqlite:////tmp/q.db --corpus held_out --qkv --json $OUT/held_qkv.json > $OUT/held_qkv.txt 2>&1
  for d in bf16 fp16; do
    timeout $(( $(left) - 10 )) $B --db sqlite:////tmp/u.db --corpus unseen --dtype $d --json $OUT/unseen_$d.json > $OUT/unseen_$d.txt 2>&1 || echo "$d: stopped" >> $OUT/unseen_$d.txt
  done
  grep -h "geomean\|measured again\|part:\|stopped" $OUT/*.txt | cut -c1-400
else
  python3 scripts/host_cost.py --rounds 15 > $OUT/host_cost.txt 2>&1; head -40 $OUT/host_cost.txt | cut -c1-120
  timeout $(( $(left) - 10 )) python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels_tests > $OUT/pytest.txt 2>&1; tail -4 $OUT/pytest.txt
fi
echo "took $(( $(date +%s) - t0 )) s"
