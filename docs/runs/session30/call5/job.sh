#!/bin/bash
# session 30, call 5 (asked for an H200): a GPU with no table, out of the box (NO_SHIPPED=1: the H200 table set
# aside, a fresh database per run): the held-out part, then the unseen models, both modes, until OOB_BUDGET.
# db/ and tests/ from git archive HEAD in .clean/ (a helper edits db/ meanwhile)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
rm -rf db tests && cp -r .clean/db .clean/tests . || exit
{ nvidia-smi --query-gpu=name --format=csv,noheader; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
t0=$(date +%s)
NO_SHIPPED=1 OOB_BUDGET=400 bash scripts/gpu_session.sh out-of-box > $OUT/oob_stdout.txt 2>&1; cat $OUT/out-of-box.log
rm -rf $OUT/out-of-box
echo "took $(( $(date +%s) - t0 )) s"
