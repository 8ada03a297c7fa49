#!/usr/bin/env bash
# The GPU run in one command (issue 26; kernels.md, "Status and rule"), on a machine without network:
#
#   bash benchmarks/gpu/run.sh OUT_DIR            # on the GPU machine, inside 8 minutes
#   bash benchmarks/gpu/run.sh OUT_DIR --smoke    # the same stages on CPU in seconds (CI: tests/test_gpu_run_smoke.py)
#   bash benchmarks/gpu/run.sh OUT_DIR --stages install,attention,speed   # only these stages
#
# Stages, each under its own time budget (`timeout`): a failing or slow stage is recorded and the next one runs.
# --stages (a comma-separated list; default all four) runs only those, always in the order below; a stage left
# out is recorded in the summary as "skipped (not in --stages)", not as a failure, and when the speed stage runs
# it gets the left-out stages' budgets (the total stays inside 8 minutes). A bad list exits with status 2 first.
#   install    the package from this tree (pip --no-deps -e .) and the wheels it lacks from benchmarks/gpu/wheels
#              (fetched beforehand with benchmarks/gpu/fetch_wheels.sh); --smoke: skipped when the package is
#              already importable
#   attention  pytest on the two attention test files (with CUDA they add "cuda" parameters: the Triton kernel
#              compiled for the GPU; float32 and bfloat16 tests), junit XML; 4 pytest-xdist processes on the GPU
#   speed      benchmarks/gpu_speed.py (bf16; eager, compiled, CUDA graphs; inference and training; peak memory;
#              compile time of T = 24; a profile of one call each, eager and compiled): eager over every group
#              first, then the compiled and CUDA-graph passes group by group, the compile time of T = 24 first
#              (gpu_speed.py's Group.priority), writing after each task (inference, training) so a stopped run
#              keeps what it measured; it resumes from benchmarks/results/gpu_speed.json (the committed results
#              of earlier sessions on the same device and software) and measures only what that lacks
#   sudoku     a short run of the Sudoku recipe below on the puzzles carried in benchmarks/gpu/, its training
#              stopped early enough for the evaluation to fit the budget
# then summary.md: device name, each stage's status, time and result files.
#
# OUT_DIR receives at most 8 files (what the GPU tool brings back): summary.md, run.log (every stage's output),
# attention.xml, gpu_speed.{json,md} (smoke: gpu_speed_smoke.{json,md}), sudoku.json. Scratch (run folder,
# checkpoints, caches) goes to a temporary folder that is removed at the end.
set -u

# The Sudoku stage's recipe (a name of training.recipes.RECIPES), its model and its length: the setting the CPU
# probes measured to leave the chance plateau (the comment above the recipe in training/recipes.py and
# benchmarks/results/sudoku_easy.md, setting b1-H2-lr1e-2-sincos-b16): the recipe's optimiser, and this model,
# the `sudoku` preset with the width, heads (2 of width 32), depth, init and sin-cos board positions of that
# setting (the CLI's --config KEY=VALUE, space-separated; no value may contain a space).
SUDOKU_RECIPE=hyperset-sudoku-ds-fast
SUDOKU_CONFIG="hidden_size=64 num_attention_heads=2 intermediate_size=256 num_iterations=8 initializer_range=0.2 \
position_embedding_type=sincos-2d"
# The cosine schedule's length: that of the probe the setting was chosen by, so the stage's first steps, warm-up
# included, are the probe's. A cap, not a plan: the stage's time limit (below) is meant to stop training first.
SUDOKU_STEPS=6000
SUDOKU_RESERVE=30 # seconds of the stage's budget kept for the final evaluation and writing its result
# Processes that compile the speed stage's compiled passes ahead of its measuring process (gpu_speed.py
# --compile_workers; benchmarks/gpu/README.md, "Compile workers"): half the cores, at most 8
COMPILE_WORKERS=$(($(nproc) / 2 < 8 ? $(nproc) / 2 : 8))

STAGE_NAMES=(install attention speed sudoku) # every stage, in the order they run
usage() {
    echo "usage: bash benchmarks/gpu/run.sh OUT_DIR [--smoke] [--stages install,attention,speed,sudoku]" >&2
    exit 2
}
[[ $# -ge 1 ]] || usage
OUT=$1
shift
[[ $OUT != --* ]] || {
    echo "run.sh: OUT_DIR must be a folder, got the option '$OUT'" >&2
    usage
}
SMOKE=0
STAGE_LIST=install,attention,speed,sudoku
STAGES_GIVEN=0
while [[ $# -gt 0 ]]; do
    case $1 in
    --smoke) SMOKE=1 ;;
    --stages)
        [[ $# -ge 2 && $STAGES_GIVEN == 0 ]] || {
            echo "run.sh: --stages takes one value, given once: a comma-separated list of install, attention," \
                "speed, sudoku" >&2
            usage
        }
        STAGE_LIST=$2 STAGES_GIVEN=1
        shift
        ;;
    *)
        echo "run.sh: unknown option '$1'; the options are --smoke and --stages" >&2
        usage
        ;;
    esac
    shift
done
# --stages: checked whole before any work (nothing is written to OUT_DIR for a bad list)
stages_error() {
    echo "run.sh: --stages '$STAGE_LIST': $1; allowed: install, attention, speed, sudoku, comma-separated," \
        "each at most once (they run in that order)" >&2
    exit 2
}
[[ -n $STAGE_LIST ]] || stages_error "an empty list"
[[ $STAGE_LIST != ,* && $STAGE_LIST != *, && $STAGE_LIST != *,,* ]] || stages_error "an empty stage name"
declare -A WANTED=()
IFS=, read -ra REQUESTED <<<"$STAGE_LIST"
for name in "${REQUESTED[@]}"; do
    known=0
    for stage in "${STAGE_NAMES[@]}"; do [[ $name == "$stage" ]] && known=1; done
    [[ $known == 1 ]] || stages_error "unknown stage '$name'"
    [[ -z ${WANTED[$name]:-} ]] || stages_error "'$name' is given twice"
    WANTED[$name]=1
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
PYTHON=${PYTHON:-python3}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/gpu-run.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT
STAGES=$SCRATCH/stages.tsv
LOG=$OUT/run.log
: >"$STAGES"
: >"$LOG"
# the speed results so far, which the speed stage continues (benchmarks/gpu/README.md, "Results over sessions")
SPEED_RESULTS=$ROOT/benchmarks/results/gpu_speed.json
export PYTHON ROOT OUT SMOKE SCRATCH SUDOKU_RECIPE SUDOKU_CONFIG SUDOKU_STEPS SUDOKU_RESERVE SPEED_RESULTS \
    COMPILE_WORKERS
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# Seconds per stage: 430 s, with the summary's 20 s and `timeout`'s grace periods at most 475 s (8 minutes: 480 s).
# The smoke run checks that every stage works, not how fast: its budgets only stop a hung stage, and are wide
# enough for a small CPU shared with other work (CI runs it beside the rest of the test suite).
if [[ $SMOKE == 1 ]]; then
    BUDGET_INSTALL=300 BUDGET_ATTENTION=300 BUDGET_SPEED=300 BUDGET_SUDOKU=300 BUDGET_SUMMARY=120
else
    BUDGET_INSTALL=45 BUDGET_ATTENTION=80 BUDGET_SPEED=205 BUDGET_SUDOKU=100 BUDGET_SUMMARY=20
fi
# a stage left out by --stages gives its budget to the speed stage (whose results add up over GPU sessions; the
# more of it a session has, the more it measures); the total stays the same
if [[ -n ${WANTED[speed]:-} ]]; then
    for name in "${STAGE_NAMES[@]}"; do
        budget=BUDGET_${name^^}
        [[ -n ${WANTED[$name]:-} ]] || BUDGET_SPEED=$((BUDGET_SPEED + ${!budget}))
    done
fi
GRACE=5 # seconds between timeout's TERM and KILL
export BUDGET_SUDOKU
# Each stage's last command is `exec`ed: `timeout` then watches the program itself and waits for it (a shell in
# between died at the TERM while its program still wrote results after the summary had been made).

stage_install() {
    # find_spec: whether it is installed, without paying for importing torch; asked from another folder, since
    # this tree's energyformers/ (without the subpackages the install maps in) is importable from here
    if [[ $SMOKE == 1 ]] && (cd "$SCRATCH" && "$PYTHON" -c "import importlib.util as u, sys; \
s = u.find_spec('energyformers'); print(s.origin) if s else sys.exit(1)"); then
        echo "smoke: the package is importable in $PYTHON (above); install skipped"
        return 0
    fi
    local version requirements
    version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || return 1
    requirements=$ROOT/benchmarks/gpu/wheels/requirements-$version.txt
    if [[ -f $requirements ]]; then
        # --no-deps: exactly the pinned wheels, nothing resolved against an index that is not there
        "$PYTHON" -m pip install --no-index --no-deps --no-cache-dir --find-links "$ROOT/benchmarks/gpu/wheels" \
            -r "$requirements" || return 1
    else
        echo "no $requirements: no wheels fetched for Python $version (benchmarks/gpu/fetch_wheels.sh --python $version)"
    fi
    "$PYTHON" -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir -e "$ROOT" || return 1
    "$PYTHON" -m pip check || echo "(pip check reports the above; the stages below show whether it matters)"
    "$PYTHON" -c "import energyformers, datasets, evaluate, kornia, pytest; print('imports ok:', energyformers.__file__)"
}

stage_attention() {
    local select=() workers=()
    # smoke: one short length of each check (the interpreter runs the Triton kernel slowly on CPU)
    [[ $SMOKE == 1 ]] && select=(-k "(float32_matches_eager and N17-d64-padded) or (bfloat16_no_worse and 17) or default_is_the_same_on_cuda")
    # GPU: most of this stage is Triton compiling each launch configuration for the GPU, one at a time per
    # process; pytest-xdist (in the GPU image) spreads the tests, hence the compiles, over 4 processes (test by
    # test: `--dist load`, as tests/conftest.py would otherwise give each of the two files to one process)
    [[ $SMOKE == 0 ]] && "$PYTHON" -c "import xdist" 2>/dev/null && workers=(-n 4 --dist load)
    exec "$PYTHON" -m pytest tests/test_attention_implementations.py tests/test_hyperbf_attention_implementations.py \
        -p no:randomly -p no:cacheprovider -q -rfE --durations=15 "${workers[@]}" "${select[@]}" \
        --junitxml "$OUT/attention.xml"
}

stage_speed() {
    # --resume: the committed results are kept (same device and software; else the script says why it ignores
    # them) and only what they lack is measured, so GPU sessions add up; OUT gets the whole, old rows and new
    local resume=()
    [[ -f $SPEED_RESULTS ]] && resume=(--resume "$SPEED_RESULTS")
    # one new inductor cache folder for the stage, shared by gpu_speed.py and its compile workers (what they
    # compile, it loads), and empty at the start: a cold compile (the T = 24 compile time) is cold
    export TORCHINDUCTOR_CACHE_DIR=$SCRATCH/inductor-cache
    if [[ $SMOKE == 1 ]]; then
        # the check covers the resume the real run passes: the committed (real) results are read and refused
        # for a smoke run (a run resumed from a smoke run's own results: tests/test_gpu_speed_smoke.py)
        # (--compile_workers: passed as in a real run; with the eager mode alone there is nothing to warm)
        exec "$PYTHON" benchmarks/gpu_speed.py --device cpu --smoke --groups "Hyper-SET sudoku" --modes eager \
            --output_dir "$OUT" --compile_workers "$COMPILE_WORKERS" "${resume[@]}"
    else
        exec "$PYTHON" benchmarks/gpu_speed.py --repeats 10 --compile_workers "$COMPILE_WORKERS" "${resume[@]}" \
            --output_dir "$OUT"
    fi
}

stage_sudoku() {
    # training stops at SUDOKU_STEPS or SUDOKU_RESERVE seconds before the budget, whichever comes first, so the
    # evaluation (the board accuracy) always runs inside the budget; smoke: the time is up at once, so the check
    # covers that stop (after the first step)
    # (smoke: sudoku_train.py's reduced sizes replace SUDOKU_CONFIG's, its other fields stay)
    local smoke=() steps=$SUDOKU_STEPS seconds=$((BUDGET_SUDOKU - SUDOKU_RESERVE)) config
    read -ra config <<<"$SUDOKU_CONFIG"
    [[ $SMOKE == 1 ]] && smoke=(--smoke) && steps=2 && seconds=0
    exec "$PYTHON" benchmarks/gpu/sudoku_train.py --recipe "$SUDOKU_RECIPE" --config "${config[@]}" \
        --max_steps "$steps" --train_seconds "$seconds" --work_dir "$SCRATCH/sudoku" --result "$OUT/sudoku.json" \
        "${smoke[@]}"
}
export -f stage_install stage_attention stage_speed stage_sudoku

run_stage() { # name budget
    local name=$1 budget=$2 start end rc status ms
    echo "===== $name (budget ${budget} s) =====" >>"$LOG"
    echo "[run.sh] $name: up to ${budget} s"
    start=$(date +%s%N)
    timeout --kill-after="$GRACE" "$budget" bash -c "stage_$name" >>"$LOG" 2>&1
    rc=$?
    end=$(date +%s%N)
    ms=$(((end - start) / 1000000))
    case $rc in
    0) status=ok ;;
    124 | 137) status=timeout ;;
    *) status="failed (exit $rc)" ;;
    esac
    printf '%s\t%s\t%d.%d\t%s\n' "$name" "$status" $((ms / 1000)) $((ms % 1000 / 100)) "$budget" >>"$STAGES"
    echo "===== $name: $status =====" >>"$LOG"
    echo "[run.sh] $name: $status"
}

SKIPPED="skipped (not in --stages)"
for name in "${STAGE_NAMES[@]}"; do
    if [[ -n ${WANTED[$name]:-} ]]; then
        budget=BUDGET_${name^^}
        run_stage "$name" "${!budget}"
    else # recorded, so the summary lists every stage and says why this one did not run
        printf '%s\t%s\t-\t-\n' "$name" "$SKIPPED" >>"$STAGES"
        echo "===== $name: $SKIPPED =====" >>"$LOG"
        echo "[run.sh] $name: $SKIPPED"
    fi
done
timeout --kill-after="$GRACE" "$BUDGET_SUMMARY" "$PYTHON" benchmarks/gpu/summary.py --out_dir "$OUT" --stages "$STAGES" \
    $([[ $SMOKE == 1 ]] && echo --smoke) >>"$LOG" 2>&1 || echo "[run.sh] summary failed: see $LOG"
echo "[run.sh] wrote $OUT/summary.md"
# the exit status says whether every stage that ran passed; the summary says which did not
! grep -v -e "	ok	" -e "	$SKIPPED	" "$STAGES" | grep -q .
