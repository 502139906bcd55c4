#!/bin/bash
# session 28, call 6: on an H200, the held-out and unseen stacked q/k/v on its own table; on an H100, the GPU tests
# of dispatch on the last commit
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 230 - ($(date +%s) - t0) )); }
B="python3 scripts/bench_dispatch.py --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98"
mkdir -p /tmp/o
if [[ $name == *H200* ]]; then
  timeout $(( $(left) - 100 )) $B --db sqlite:////tmp/q.db --corpus held_out --qkv --json /tmp/o/held_qkv.json > /tmp/o/held_qkv.txt 2>&1 || echo "stopped" >> /tmp/o/held_qkv.txt
  timeout $(( $(left) - 5 )) $B --db sqlite:////tmp/uq.db --corpus unseen --qkv --json /tmp/o/unseen_qkv.json > /tmp/o/unseen_qkv.txt 2>&1 || echo "stopped" >> /tmp/o/unseen_qkv.txt
  grep -h "geomean\|measured again\|part:\|stopped" /tmp/o/*.txt | cut -c1-400
else
  timeout $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider tests/kernels_tests/test_modes.py tests/kernels_tests/test_dispatch.py > /tmp/o/pytest.txt 2>&1; tail -3 /tmp/o/pytest.txt
fi
tar czf $OUT/call.tgz -C /tmp/o .
echo "took $(( $(date +%s) - t0 )) s"
