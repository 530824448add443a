#!/usr/bin/env bash
# Runs Kiln's benchmark suites (release) and, when ANCHOR_PYTHON names a Python with numpy/torch
# (and optionally jax, transformers, onnx + onnxruntime), each peer anchor from ../shared/anchors
# right after the suite it is set against, then the ONNX suite against onnxruntime
# (scripts/bench-onnx-suite.sh, one round), so the ratios in BENCHMARKS.md come from one run on
# one machine (~10 min).
#   ANCHOR_PYTHON=/path/to/venv/bin/python bash scripts/bench-all.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench-out}"
mkdir -p "$out"
cargo build --release -p kiln-cli
kiln=./target/release/kiln

# The fraction of all CPU time (steal included: a neighbour on the host) that was busy over one
# second, in percent, from /proc/stat.
busy_percent() {
    local a b
    read -r -a a < <(head -1 /proc/stat)
    sleep 1
    read -r -a b < <(head -1 /proc/stat)
    local total=0 idle i
    for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
    idle=$((b[4] - a[4] + b[5] - a[5]))
    echo $(((total - idle) * 100 / (total > 0 ? total : 1)))
}

# Waits (up to KILN_IDLE_WAIT seconds, default 60) until the machine is under 10% busy, as the
# anchors do before each of theirs (`shared/anchors/common.py` `wait_for_idle`), so that Kiln's
# suites and the peers' are measured alike; prints what it saw.
wait_idle() {
    local start=$SECONDS busy
    busy=$(busy_percent)
    while [ "$busy" -gt 10 ] && [ $((SECONDS - start)) -lt "${KILN_IDLE_WAIT:-60}" ]; do
        sleep 3
        busy=$(busy_percent)
    done
    if [ "$busy" -le 10 ]; then
        echo "[load check] CPU busy before start: ${busy}% -> idle"
    else
        echo "[load check] CPU busy before start: ${busy}% -> NOT idle (results may be skewed)"
    fi
}

# `suite NAME ARGS...`: `kiln bench ARGS... --out OUT/NAME`, its table in OUT/NAME.md.
suite() {
    local name=$1
    shift
    { wait_idle; "$kiln" bench "$@" --out "$out/$name"; } | tee "$out/$name.md"
}

anchors=../shared/anchors
have_anchors=false
if [ -n "${ANCHOR_PYTHON:-}" ] && [ -d "$anchors" ]; then
    have_anchors=true
    export ANCHOR_IDLE_WAIT="${ANCHOR_IDLE_WAIT:-60}"
fi

# `anchor NAME SCRIPT ARGS...`: the peer anchor SCRIPT of ../shared/anchors into OUT/anchor_NAME.md
# (its stderr beside it), when ANCHOR_PYTHON is set. Each runs right after the Kiln suite it is
# set against: the machine's speed drifts over minutes (a tree of products ran 2.58 ms and, half
# an hour later, 2.92, torch's `bmm` alike), so a suite and its peer are measured minutes apart
# at most, not a whole run apart.
anchor() {
    local name=$1 script=$2
    shift 2
    if $have_anchors; then
        (cd "$anchors" && "$ANCHOR_PYTHON" "$script" "$@") > "$out/anchor_$name.md" 2> "$out/anchor_$name.err" || true
    fi
}

suite transformer transformer-compile --layers 1,2,4,8,16,32 --fresh-process 5
anchor transformer bench_transformer.py --layers 1 2 8 --only jax --repeats 3
suite unary unary
anchor unary bench_unary.py
suite matmul matmul
anchor matmul bench_matmul.py
suite tree tree-matmul
anchor tree bench_tree_matmul.py
suite models models
anchor models bench_models.py
anchor onnxruntime bench_onnxruntime.py
suite memory memory
suite embedding embedding
suite transformer-cached transformer-compile --layers 1,2,8 --start-pos 2 --repeats 51
suite decode decode
anchor decode bench_decode.py
if $have_anchors; then
    "$ANCHOR_PYTHON" scripts/anchor_decode_onnxruntime.py > "$out/anchor_decode_onnxruntime.md" \
        2> "$out/anchor_decode_onnxruntime.err" || true
    # ONNX import (issue #14): the nine-model suite and the three exported models, Kiln and
    # onnxruntime alternating per model.
    bash scripts/bench-onnx-suite.sh target/onnx-suite 1 > "$out/onnx-suite.txt" 2>&1 || true
fi
echo "results in $out/"
