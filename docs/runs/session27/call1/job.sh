#!/bin/bash
# session 27, call 1: on an H200, the held-out fallback check and the gated eager stamps; on an H100, host time on the final code and the GPU tests of the C++ hand-over
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 560 - ($(date +%s) - t0) )); }
if [[ $name == *H200* ]]; then
  python3 scripts/bench_dispatch.py --corpus held_out --qkv --db sqlite:////tmp/f2.db --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98 --json $OUT/held_qkv.json > $OUT/held_qkv.txt 2>&1
  timeout $(( $(left) - 150 )) python3 scripts/bench_dispatch.py --corpus held_out --db sqlite:////tmp/f.db --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98 --json $OUT/held.json > $OUT/held.txt 2>&1
  grep -h "geomean\|part:\|measured again" $OUT/held_qkv.txt $OUT/held.txt | cut -c1-300
  python3 -m tuner import kernels/tables/h200.json --db sqlite:////tmp/t.db > /dev/null
  timeout $(( $(left) - 20 )) python3 -m tuner stamp --db sqlite:////tmp/t.db --kernel gated_matmul > $OUT/stamp.txt 2>&1 || echo "stamp stopped" >> $OUT/stamp.txt
  python3 scripts/ship_table.py --device h200 --base kernels/tables/h200.json --db sqlite:////tmp/t.db -o $OUT/h200.json > $OUT/ship.txt 2>&1
  grep -h "stamped\|stopped" $OUT/stamp.txt; tail -1 $OUT/ship.txt
else
  python3 scripts/host_cost.py --rounds 15 > $OUT/host_cost.txt 2>&1; tail -30 $OUT/host_cost.txt
  timeout $(( $(left) - 10 )) python3 -m pytest -q -p no:cacheprovider tests/kernels_tests/test_native.py tests/kernels_tests/test_epilogue.py tests/kernels_tests/test_nn.py > $OUT/pytest.txt 2>&1; tail -5 $OUT/pytest.txt
fi
echo "took $(( $(date +%s) - t0 )) s"
