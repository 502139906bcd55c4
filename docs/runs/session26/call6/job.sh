#!/bin/bash
# session 26, call 6: the re-stamped table in a fresh process on another machine; GPU tests of the timing and the stamp
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
{ nvidia-smi --query-gpu=name --format=csv,noheader; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/gpu.txt
python3 -m pytest -q -m gpu -p no:cacheprovider tests/tuner_tests/test_timing.py tests/tuner_tests/test_stamp.py tests/tuner_tests/test_host_speed.py > $OUT/gpu_tests.txt 2>&1; tail -2 $OUT/gpu_tests.txt
python3 scripts/bench_dispatch.py --keys docs/runs/session26/call5/m32_keys_a.txt --db sqlite:////tmp/f.db --stored-table kernels/tables/h100.json --modes eager --rounds 2 --json $OUT/fresh_m32a.json > $OUT/fresh_m32a.txt 2>&1
python3 scripts/bench_dispatch.py --kernel matmul_bias --corpus tuned --db sqlite:////tmp/f.db --stored-table kernels/tables/h100.json --modes eager --rounds 2 --json $OUT/fresh_bias.json > $OUT/fresh_bias.txt 2>&1
grep -h "geomean\|measured/stored\|as run" $OUT/fresh_m32a.txt $OUT/fresh_bias.txt | cut -c1-500
