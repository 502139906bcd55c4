#!/bin/bash
# session 30, call 2 (one H100): host time per cached call of the session-28 code (59f4e92, before the
# review fixes) against this code (review fixes, the test fixes of call 1, TMA's reused launch arguments),
# interleaved A B A B on one host; then the GPU tests call 1 found wrong, and the tuner's GPU tests
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
{ nvidia-smi --query-gpu=name --format=csv,noheader; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log --oneline -1 | cut -c1-80; nproc; } | tee $OUT/gpu.txt
t0=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - t0) )); }
mkdir -p $OUT/host
for turn in 1 2; do
  for code in old new; do
    dir=$PWD; [ $code = old ] && dir=$PWD/.old
    (cd $dir && PYTHONPATH=$dir:/tmp/site timeout 100 python3 $PWD/scripts/host_cost.py --rounds 11 --json $OUT/host/$code-$turn.json > $OUT/host/$code-$turn.txt 2>&1)
    echo "== $code turn $turn ($(( $(date +%s) - t0 )) s)"; grep -E "^(torch.matmul|tiled|tma|repack|gemv|splitk|  .*Python path|kernels.matmul_bias|kernels.gated|cublas)" $OUT/host/$code-$turn.txt | cut -c1-100
  done
done
export PYTHONPATH=$PWD:/tmp/site
timeout $(( $(left) - 150 )) python3 -m pytest -q -p no:cacheprovider -m gpu -rfs tests/kernels_tests/test_native.py tests/kernels_tests/test_direct_launch.py > $OUT/pytest_kernels.txt 2>&1; tail -3 $OUT/pytest_kernels.txt
timeout $(( $(left) - 10 )) python3 -m pytest -q -p no:cacheprovider -m gpu -rfs tests/tuner_tests --ignore tests/tuner_tests/test_fleet.py > $OUT/pytest_tuner.txt 2>&1; tail -3 $OUT/pytest_tuner.txt
tar czf $OUT/host.tgz -C $OUT host && rm -rf $OUT/host
echo "took $(( $(date +%s) - t0 )) s"
