#!/usr/bin/env bash
# One stage of GPU work per call, each under the device tool's 10-minute limit, logs under $OUT.
#
#   bash scripts/gpu_session.sh STAGE [DB]
#
# Stages, in the order a session with ~30 minutes of device time should run them:
#   check      the test suite compiled on the GPU (GPU-only tests included)
#   verify     after a change to the dispatch path: the kernel and tuner tests on the GPU (TESTS: which folders;
#              all three take more than one call), then host time per cached call against torch.matmul
#              (scripts/host_cost.py)
#   models     whole transformers models (scripts/bench_models.py --control) with the GPU's table and without
#   models-static  the static-cache columns (transformers compiles forward) of the dense models, with the table
#   record-tune  one model (MODEL) recorded, its problems tuned (search --recorded), then timed again
#   moe-model  Qwen3-30B-A3B with a tuned database: its experts' host time by piece, then the model, 9 rounds
#   modules    each patched module of the dense models against vanilla's at decode and prefill row counts, with the
#              path it takes there (scripts/module_cost.py; MODELS, ROWS), on the shipped table or DB
#   calibrate  the check's mutants (each in its own process) and valid configs on real shapes
#              (scripts/calibrate_check.py; CAL_BUDGET seconds, default 270; CAL_ARGS=--no-mutants to go on with
#              the valid configs a cut run left), then `tuner verify` of this GPU's shipped table, and of the shipped
#              tables of other GPUs of its compute capability
#   live       the two live dense searches of docs/SEARCH.md, timed end to end (the 30 s target);
#              fresh databases, no shipped table; SEED=N picks the sampler seed (default 0)
#   live-moe   live searches of the swept MoE group: two cold, one warm-started by the fp16 winner
#   live-grouped  live searches of the swept grouped_matmul groups (LIVE_GROUPS), seeds 0 and 1
#   tune-moe   tune moe_matmul on the MoE groups (fp16 and bf16, weights [E, N, K] transposed)
#   tune-grouped  tune grouped_matmul on the groups of GPU.md and the MoE groups (fp16 and bf16)
#   bench-moe  moe_matmul and grouped_matmul against torch._grouped_mm and the loop, 3 interleaved rounds
#   sweep-moe  the full space of one MoE group (SWEEP_GROUP, default "16 experts skewed"; resumable)
#   sweep-dense  the full space of one dense problem (SWEEP_PROBLEM, default fp16:nn:16x4096x4096)
#   sweep-grouped  the full space of one grouped_matmul group (SWEEP_GROUP, a name in tuner/suites.py)
#              Every sweep stage resumes from the committed benchmarks/sweeps file of the same name
#              and stops after SWEEP_BUDGET seconds (default 480).
#   retune-XY  re-tune the dense suite for one dtype/layout (XY: fp16-nn, fp16-nt, bf16-nn, bf16-nt)
#   out-of-box  what a user of this GPU gets from the shipped table alone (a fresh database per run; NO_SHIPPED=1:
#              no table either): the held-out part (Linears, stacked q/k/v), then the unseen models (stacked
#              q/k/v, Linears per dtype, gated MLPs, biased q/k/v), each against torch in both modes, until
#              OOB_BUDGET seconds (default 540) are spent; every run's files in $OUT/out-of-box.tgz as well
#   fleet-scale  scripts/fleet_bench.py's scale phase on PostgreSQL: one `search --gpus` run per GPU count of COUNTS
#              (default 1,2,4, in that order; run 4,2,1 in another call), TRIALS per problem (default 8), then its
#              report; NO_WARM_UP=1 skips the untimed warm-up run (a later call on a machine already warmed);
#              TOKENS=1,512: fewer row counts (fewer problems), for a look at the start-up alone
#   fleet-kill  scripts/fleet_bench.py's kill phase on GPUs 0,1 (PostgreSQL); TRIALS per problem (default 8)
#   fleet-tests  the fleet's GPU tests (2 GPUs or more): a faulting job, the pool's device-fault tests
#   one-row-layer  the epilogues' one-row loop on the GPU (its tests), then the decoder layer at one decode token
#              with the layer's untuned problems quick-tuned (the gated gate/up product among them), against
#              torch in a CUDA graph and max-autotune (docs/BENCHMARKS.md, 2026-11-26, "Still open")
#
# The database lives in $OUT so that the next stage (a fresh machine, maybe) can import its export;
# pass DB to use another. Each stage exports what it tuned to $OUT/<stage>.json.
set -uo pipefail

stage=${1:?usage: gpu_session.sh STAGE [DB]}
out=${OUT:-/tmp/out}
mkdir -p "$out"
db=${2:-sqlite:///$out/tuner.db}
py=python3
log="$out/$stage.log"

{
    echo "# $stage, $(date -u +%F), $($py -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)')"
    nvidia-smi --query-gpu=name --format=csv,noheader
} | tee "$log"

# sweep KERNEL PROBLEM FILE: go on with benchmarks/sweeps/FILE (if committed) into $out/FILE.
sweep() {
    [ -f "benchmarks/sweeps/$3" ] && cp "benchmarks/sweeps/$3" "$out/$3" && chmod u+w "$out/$3"
    $py scripts/sweep.py --kernel "$1" --problem "$2" --shuffle --budget-s "${SWEEP_BUDGET:-480}" \
        --out "$out/$3" 2>&1 | tee -a "$log"
}

# PostgreSQL for the fleet stages: PG_BIN, Debian's package, or the server binaries of a pgserver wheel carried in
# .whl-pg/ (docs/FLEET.md); as root the server runs as user postgres, made here if the image lacks it.
pg_setup() {
    if [ -z "${PG_BIN:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
        wheel=$(ls .whl-pg/pgserver-*.whl 2>/dev/null | head -1)
        [ -n "$wheel" ] || { echo "no PostgreSQL: set PG_BIN or carry a pgserver wheel in .whl-pg/" >&2; exit 2; }
        mkdir -p /tmp/pg && $py -m zipfile -e "$wheel" /tmp/pg && chmod -R a+rX /tmp/pg
        export PG_BIN=/tmp/pg/pgserver/pginstall/bin
        chmod a+x "$PG_BIN"/*
    fi
    if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then useradd --system postgres; fi
}

case "$stage" in
fleet-scale)
    pg_setup
    warm=(); [ "${NO_WARM_UP:-0}" = 1 ] && warm=(--no-warm-up)
    $py scripts/fleet_bench.py --phase scale --counts "${COUNTS:-1,2,4}" --trials "${TRIALS:-8}" --pg --out "$out/fleet" "${warm[@]}" \
        ${TOKENS:+--tokens "$TOKENS"} \
        2>&1 | tee -a "$log"
    $py scripts/fleet_bench.py --phase report --out "$out/fleet" 2>&1 | tee -a "$log" ;;
fleet-kill)
    pg_setup
    $py scripts/fleet_bench.py --phase kill --gpus 0,1 --pg --trials "${TRIALS:-8}" --out "$out/fleet" 2>&1 | tail -3 | cut -c1-3000 | tee -a "$log" ;;
fleet-tests)
    pg_setup
    $py -m pytest -q tests/tuner_tests/test_fleet_faults.py tests/tuner_tests/test_workers.py \
        tests/kernels_tests/test_hotpath_multigpu.py -m gpu -p no:cacheprovider -rfs 2>&1 | tail -30 | tee -a "$log" ;;
out-of-box)
    # One tarball beside the files: the device tool brings back a limited number of files from $OUT.
    mkdir -p "$out/out-of-box"
    started=$(date +%s)
    shipped=(); [ "${NO_SHIPPED:-0}" = 1 ] && shipped=(--no-shipped)
    for run in held_out: held_out:--qkv unseen:--qkv unseen:--dtype=bf16 unseen:--dtype=fp16 \
               unseen:--kernel=gated_matmul unseen:--kernel=matmul_bias; do
        part=${run%%:*}; extra=${run#*:}; name="$part${extra//[-=]/_}"
        left=$(( ${OOB_BUDGET:-540} - ($(date +%s) - started) ))
        if [ "$left" -lt 30 ]; then echo "$name: not run, the budget is spent" | tee -a "$log"; continue; fi
        rm -f "/tmp/out-of-box-$name.db"
        timeout "$left" $py scripts/bench_dispatch.py --corpus "$part" ${extra:+${extra/=/ }} "${shipped[@]}" \
            --db "sqlite:////tmp/out-of-box-$name.db" --modes graph,eager --rounds 2 --graph-budget 10,40 \
            --confirm 0.98 --json "$out/out-of-box/$name.json" > "$out/out-of-box/$name.txt" 2>&1 \
            || echo "$name: stopped (exit $?)" >> "$out/out-of-box/$name.txt"
        echo "== $name" | tee -a "$log"
        grep -h "geomean\|measured again\|stopped" "$out/out-of-box/$name.txt" | cut -c1-400 | tee -a "$log"
    done
    tar czf "$out/out-of-box.tgz" -C "$out" out-of-box ;;
one-row-layer)
    $py -m pytest -q tests/kernels_tests/test_epilogue.py tests/kernels_tests/test_capture.py -p no:cacheprovider \
        2>&1 | tail -20 | tee -a "$log"
    $py scripts/bench_layers.py --layers decoder --decode 1 --prefill '' \
        --columns torch_graph,ours_graph,compile_max_autotune --tune quick --rounds 2 --db "$db" \
        --out "$out/one-row-layer" 2>&1 | tee -a "$log" ;;
check)
    $py -m pytest -q tests -p no:cacheprovider 2>&1 | tail -40 | tee -a "$log" ;;
models)
    # Whole transformers models with this GPU's shipped table, then with none; each with the A/A column.
    $py scripts/bench_models.py --control --static '' --budget-s 240 --out "$out/models-table" 2>&1 | tail -40 | tee -a "$log"
    $py scripts/bench_models.py --control --no-shipped --quick --out "$out/models-no-table" 2>&1 | tail -25 | tee -a "$log" ;;
models-static)
    # generate with cache_implementation="static" at batch 1 and 16: the decode target's compiled half (the norms
    # and our GEMMs' operators traced; reduce-overhead's CUDA graphs), against vanilla compiled the same way.
    $py scripts/bench_models.py --control --prefill '' --batches '' --static 1,16 --budget-s 480 \
        --out "$out/models-static" 2>&1 | tail -25 | tee -a "$log" ;;
modules)
    $py scripts/module_cost.py --models "${MODELS:-Qwen2.5-7B,Llama-3.1-8B,DeepSeek-V2-Lite}" \
        --rows "${ROWS:-1,16,64,512}" ${2:+--db "$db"} --out "$out/modules" 2>&1 | tail -60 | tee -a "$log" ;;
moe-model)
    # Qwen3-30B-A3B with a tuned database: DB, or else the H200 one of docs/runs/2026-11-28-h200-x4-fleet-moe (its
    # records name the H200: on another GPU run `MODEL=Qwen3-30B-A3B ... record-tune` first and pass its database).
    # Where the experts' host time goes (scripts/moe_host_cost.py), then the model against vanilla, 9 rounds.
    if [ -z "${2:-}" ]; then
        gunzip -c docs/runs/2026-11-28-h200-x4-fleet-moe/moe-record-tune/moe-tuned.json.gz > "$out/moe-tuned.json"
        $py -m tuner import --db "$db" "$out/moe-tuned.json" 2>&1 | tail -1 | tee -a "$log"
    fi
    timeout 150 $py scripts/moe_host_cost.py --db "$db" --out "$out/moe-host" > "$out/moe_host_cost.txt" 2>&1
    tail -8 "$out/moe_host_cost.txt" | tee -a "$log"
    TUNER_DB="$db" $py scripts/bench_models.py --models Qwen3-30B-A3B --control --rounds 9 --batches 1,16,64 \
        --static '' --budget-s 240 --out "$out/moe-model" 2>&1 | tail -16 | tee -a "$log" ;;
record-tune)
    # One model recorded as bench_models runs it (MODEL, default Qwen2.5-7B: every setting but the static cache),
    # every recorded problem tuned on this GPU (or on GPUS, e.g. 0,1, through the fleet's workers; TUNE_BUDGET per
    # problem, default 12 trials), then the model timed (PROFILE=1: profiled too)
    # again against vanilla with the database: the issue's "record and tune one model in 10 minutes" and its
    # tuned decode rows. The database is $out's (or DB), so that a later call can carry it.
    model=${MODEL:-Qwen2.5-7B}
    started=$(date +%s)
    TUNER_DB="$db" TUNER_RECORD=1 TUNER_RECORD_FLUSH_S=5 $py scripts/bench_models.py --models "$model" --static '' \
        --rounds 1 --out "$out/record" > "$out/record.log" 2>&1
    recorded=$(date +%s)
    $py -m tuner list --untuned --db "$db" 2>&1 | tail -40 | tee -a "$log"
    $py -m tuner search --recorded --db "$db" --budget "${TUNE_BUDGET:-12}" ${GPUS:+--gpus "$GPUS"} 2>&1 | tail -20 \
        | tee -a "$log"
    echo "record $((recorded - started)) s, tune $(( $(date +%s) - recorded )) s" | tee -a "$log"
    $py -m tuner export --db "$db" -o "$out/$stage.json" | tee -a "$log"
    # PROFILE=1: torch.profiler's tables of one call of each column per setting (where a cell's time goes).
    TUNER_DB="$db" $py scripts/bench_models.py --models "$model" --control ${PROFILE:+--profile} --out "$out/tuned" \
        2>&1 | tail -25 | tee -a "$log" ;;
calibrate)
    $py scripts/calibrate_check.py --budget-s "${CAL_BUDGET:-270}" ${CAL_ARGS:-} --out "$out/cal" 2>&1 | tail -70 \
        | tee -a "$log"
    $py -m tuner verify --workers 14 2>&1 | tail -30 | tee -a "$log"
    # The shipped tables of other GPUs with this one's compute capability (an H100's on an H200): the same
    # compiled kernels, so the same check (docs/RELIABILITY.md, "Stored winners, checked again").
    for alias in $($py -c 'import kernels
from tuner.verify import stored_devices
here = kernels.current_device()
print(" ".join(d.alias for d in stored_devices(None) if d.name != here.name
               and d.compute_capability == here.compute_capability))'); do
        $py -m tuner verify --device "$alias" --workers 14 2>&1 | tail -30 | tee -a "$log"
    done ;;
verify)
    # Several processes where pytest-xdist is there (../shared/gpu/wheels.sh pytest-xdist execnet): the suites
    # took more than 290 s in one (2026-11-28).
    parallel=(); $py -c "import xdist" 2>/dev/null && parallel=(-n 8)
    # Stopped at VERIFY_S with SIGINT, pytest still prints which tests failed (a SIGTERM'd run printed only its
    # progress dots, 2026-11-28); the JUnit file names each failure and its message.
    # The three folders take more than one 10-minute call on one H200 (2026-11-28): TESTS splits them, e.g.
    # TESTS=tests/kernels_tests in one call, TESTS="tests/tuner_tests tests/autotune_tests" in the next.
    # shellcheck disable=SC2086
    timeout -s INT "${VERIFY_S:-420}" $py -m pytest -q "${parallel[@]}" \
        ${TESTS:-tests/kernels_tests tests/tuner_tests tests/autotune_tests} \
        -p no:cacheprovider -rfs --junitxml "$out/verify-junit.xml" 2>&1 | tail -60 | tee -a "$log"
    $py scripts/host_cost.py --json "$out/host_cost.json" 2>&1 | tee -a "$log" ;;
live)
    for shape in ${LIVE_SHAPES:-16x4096x4096 1000x1000x1000}; do
        /usr/bin/time -f "wall %e s" $py -m tuner search --device h100 --dtype fp16 --shape $shape --trials 25 \
            --seed "${SEED:-0}" --no-shipped --db "sqlite:///$out/live-$shape-${SEED:-0}.db" 2>&1 | tee -a "$log"
    done ;;
live-moe)
    # The MoE group of the committed sweep: two cold searches (seeds 0 and 1, fresh databases, --no-shipped so
    # that the shipped table does not start them), then a bf16 search warm-started by the fp16 winner of
    # the same group, as a tuning session runs them.
    group=$($py -c 'from tuner import suites; print(suites.MOE_GPU["16 experts skewed"])')
    for seed in 0 1; do
        /usr/bin/time -f "wall %e s" $py -m tuner search --device h100 --kernel moe_matmul --dtype bf16 --layout nt \
            --shape "$group" --trials 25 --seed $seed --no-shipped --db "sqlite:///$out/live-moe-$seed.db" 2>&1 | tee -a "$log"
    done
    for dtype in fp16 bf16; do
        /usr/bin/time -f "wall %e s" $py -m tuner search --device h100 --kernel moe_matmul --dtype $dtype --layout nt \
            --shape "$group" --trials 25 --no-shipped --db "sqlite:///$out/live-moe-warm.db" 2>&1 | tee -a "$log"
    done ;;
live-grouped)
    # The groups of the committed grouped_matmul sweeps: cold searches (fresh databases, --no-shipped).
    for group_name in ${LIVE_GROUPS:-4x1024^3 4x128^3}; do
        group=$($py -c "from tuner import suites; print(suites.GROUPS_GPU['$group_name'])")
        for seed in 0 1; do
            /usr/bin/time -f "wall %e s" $py -m tuner search --device h100 --kernel grouped_matmul --dtype fp16 \
                --shape "$group" --trials 25 --seed $seed --no-shipped \
                --db "sqlite:///$out/live-grouped-${group_name%^3}-$seed.db" 2>&1 | tee -a "$log"
        done
    done ;;
tune-moe)
    $py -m tuner search --device h100 --kernel moe_matmul --dtype fp16 --dtype bf16 --layout nt --trials 25 \
        --db "$db" 2>&1 | tee -a "$log"
    $py -m tuner export --device h100 --kernel moe_matmul --db "$db" -o "$out/$stage.json" | tee -a "$log" ;;
tune-grouped)
    $py -m tuner search --device h100 --kernel grouped_matmul --dtype bf16 --dtype fp16 --trials 25 \
        --db "$db" 2>&1 | tee -a "$log"
    $py -m tuner export --device h100 --kernel grouped_matmul --db "$db" -o "$out/$stage.json" | tee -a "$log" ;;
bench-moe)
    # Small groups are host-bound on the GPU box (docs/BENCHMARKS.md): interleaved rounds, median over them.
    $py scripts/bench.py --db "$db" --no-dense --moe --groups --rounds 3 --json "$out/$stage.json" 2>&1 | tee -a "$log" ;;
sweep-moe)
    group_name=${SWEEP_GROUP:-16 experts skewed}
    group=$($py -c "from tuner import suites; print(suites.MOE_GPU['$group_name'])")
    sweep moe_matmul "bf16:nt:$group" "moe_matmul-bf16-nt-$(echo "$group_name" | tr -c 'A-Za-z0-9+\n' '-').json" ;;
sweep-dense)
    problem=${SWEEP_PROBLEM:-fp16:nn:16x4096x4096}
    sweep matmul "$problem" "matmul-${problem//:/-}-full.json" ;;
sweep-grouped)
    group_name=${SWEEP_GROUP:-4x1024^3}
    group=$($py -c "from tuner import suites; print(suites.GROUPS_GPU['$group_name'])")
    slug=$(echo "$group_name" | tr -c 'A-Za-z0-9\n' '-')
    sweep grouped_matmul "fp16:nn:$group" "grouped_matmul-fp16-nn-$slug.json" ;;
retune-*)
    dtype_layout=${stage#retune-}
    $py -m tuner search --device h100 --dtype "${dtype_layout%-*}" --layout "${dtype_layout#*-}" --trials 25 \
        --db "$db" 2>&1 | tee -a "$log"
    $py -m tuner export --device h100 --kernel matmul --db "$db" -o "$out/$stage.json" | tee -a "$log" ;;
*)
    echo "unknown stage $stage; see the head of $0" >&2
    exit 2 ;;
esac
