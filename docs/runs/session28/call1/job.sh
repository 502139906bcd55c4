# This call ran this file (the job of session 28, call 1), with old_dispatch.py = `git show 668a69f:kernels/dispatch.py`
# and k3072_keys.txt (beside it) at the repository root.
#!/bin/bash
# session 28, call 1: on an H200, the held-out fallback check (Linears and stacked q/k/v) and the unseen models on
# its own table; on an H100, the eager K-fill rule for the one-row consensus (six unseen problems), old code
# against new, each against torch.matmul in its own process
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
{ echo "$name"; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 570 - ($(date +%s) - t0) )); }
B="python3 scripts/bench_dispatch.py --modes graph,eager --rounds 2 --graph-budget 10,40 --confirm 0.98"
if [[ $name == *H200* ]]; then
  $B --db sqlite:////tmp/h.db --corpus held_out --json $OUT/held.json > $OUT/held.txt 2>&1
  $B --db sqlite:////tmp/q.db --corpus held_out --qkv --json $OUT/held_qkv.json > $OUT/held_qkv.txt 2>&1
  $B --db sqlite:////tmp/uq.db --corpus unseen --qkv --json $OUT/unseen_qkv.json > $OUT/unseen_qkv.txt 2>&1
  for d in bf16 fp16; do
    timeout $(( $(left) - 10 )) $B --db sqlite:////tmp/u.db --corpus unseen --dtype $d --json $OUT/unseen_$d.json > $OUT/unseen_$d.txt 2>&1 || echo "$d: stopped" >> $OUT/unseen_$d.txt
  done
  grep -h "geomean\|measured again\|part:\|stopped" $OUT/*.txt | cut -c1-400
else
  mkdir -p /tmp/old && cp -r kernels tuner db scripts benchmarks /tmp/old/ && cp old_dispatch.py /tmp/old/kernels/dispatch.py
  for round in 1 2; do
    for side in new old; do
      root=$PWD; [[ $side == old ]] && root=/tmp/old
      (cd $root && PYTHONPATH=$root:/tmp/site $B --passes 3 --keys $OLDPWD/k3072_keys.txt --db sqlite:////tmp/k_$side$round.db \
        --json $OUT/k3072_${side}_$round.json > $OUT/k3072_${side}_$round.txt 2>&1)
      echo "== $side $round"; grep -h "geomean\|under" $OUT/k3072_${side}_$round.txt | cut -c1-300
    done
  done
  python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]
for f in sorted(glob.glob(f"{out}/k3072_*.json")):
    rows = json.load(open(f))["rows"]
    print(os.path.basename(f), " ".join(f"{r['problem'].split(':')[0]}:{r['problem'].split(':')[2]} e={r['eager']['speedup']:.3f} g={r['graph']['speedup']:.3f}" for r in rows))
PY
fi
echo "took $(( $(date +%s) - t0 )) s"
