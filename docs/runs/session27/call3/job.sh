#!/bin/bash
# session 27, call 3: dispatch out of the box on the unseen models' problems, after the wave and K-fill guards:
# every Linear, the stacked q/k/v, the biased q/k/v and the gated MLPs (on whichever GPU came: gpu.txt names it)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 570 - ($(date +%s) - t0) )); }
B="python3 scripts/bench_dispatch.py --db sqlite:////tmp/u.db --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98 --corpus unseen"
run() { local tag=$1; shift; timeout $(( $(left) - 10 )) $B "$@" --json $OUT/$tag.json > $OUT/$tag.txt 2>&1 || echo "$tag: stopped" >> $OUT/$tag.txt; echo "after $tag: $(( $(date +%s) - t0 )) s"; }
run gated --kernel gated_matmul
run bias --kernel matmul_bias
run qkv --qkv
run bf16 --dtype bf16
run fp16 --dtype fp16
for f in gated bias qkv bf16 fp16; do echo "== $f"; grep -h "geomean\|measured again\|stopped" $OUT/$f.txt | cut -c1-400; done
echo "took $(( $(date +%s) - t0 )) s"
