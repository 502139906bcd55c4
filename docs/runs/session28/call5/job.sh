#!/bin/bash
# session 28, call 5: on an H200, the held-out fallback check (stacked q/k/v, then Linears) and the unseen stacked
# q/k/v on its own table; on an H100, the MoE block's decode steps under CUDA graphs on the session's final code
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 420 - ($(date +%s) - t0) )); }
B="python3 scripts/bench_dispatch.py --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98"
mkdir -p /tmp/o
if [[ $name == *H200* ]]; then
  $B --db sqlite:////tmp/q.db --corpus held_out --qkv --json /tmp/o/held_qkv.json > /tmp/o/held_qkv.txt 2>&1
  $B --db sqlite:////tmp/uq.db --corpus unseen --qkv --json /tmp/o/unseen_qkv.json > /tmp/o/unseen_qkv.txt 2>&1
  timeout $(( $(left) - 10 )) $B --db sqlite:////tmp/h.db --corpus held_out --json /tmp/o/held.json > /tmp/o/held.txt 2>&1 || echo "held: stopped" >> /tmp/o/held.txt
  grep -h "geomean\|measured again\|part:\|stopped" /tmp/o/*.txt | cut -c1-400
else
  timeout $(( $(left) - 5 )) python3 scripts/bench_layers.py --layers moe --decode 1,8,32,64 --prefill '' \
    --columns torch_graph,ours_compile_graph,compile_max_autotune --tune quick --rounds 2 --out /tmp/o/moe > /tmp/o/moe.log 2>&1
  grep "^|" /tmp/o/moe.log; tail -3 /tmp/o/moe.log; rm -f /tmp/o/moe/*.db
fi
tar czf $OUT/call.tgz -C /tmp/o .
echo "took $(( $(date +%s) - t0 )) s"
