#!/usr/bin/env bash
# Runs Kiln's benchmark suites (release) and, when ANCHOR_PYTHON names a Python with numpy/torch
# (and optionally jax, transformers, onnx + onnxruntime), the peer anchors from ../shared/anchors
# right after them, then the ONNX suite against onnxruntime (scripts/bench-onnx-suite.sh, one
# round), so the ratios in BENCHMARKS.md come from one run on one machine (~35 min).
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

suite transformer transformer-compile --layers 1,2,4,8,16,32 --fresh-process 5
suite unary unary
suite matmul matmul
suite tree tree-matmul
suite memory memory
suite models models
suite embedding embedding
suite transformer-cached transformer-compile --layers 1,2,8 --start-pos 2 --repeats 51
suite decode decode
anchors=../shared/anchors
if [ -n "${ANCHOR_PYTHON:-}" ] && [ -d "$anchors" ]; then
    export ANCHOR_IDLE_WAIT="${ANCHOR_IDLE_WAIT:-60}"
    (cd "$anchors" && "$ANCHOR_PYTHON" bench_unary.py) > "$out/anchor_unary.md" 2> "$out/anchor_unary.err" || true
    (cd "$anchors" && "$ANCHOR_PYTHON" bench_matmul.py) > "$out/anchor_matmul.md" 2> "$out/anchor_matmul.err" || true
    (cd "$anchors" && "$ANCHOR_PYTHON" bench_tree_matmul.py) > "$out/anchor_tree.md" 2> "$out/anchor_tree.err" || true
    (cd "$anchors" && "$ANCHOR_PYTHON" bench_models.py) > "$out/anchor_models.md" 2> "$out/anchor_models.err" || true
    (cd "$anchors" && "$ANCHOR_PYTHON" bench_onnxruntime.py) > "$out/anchor_onnxruntime.md" 2> "$out/anchor_onnxruntime.err" || true
    (cd "$anchors" && "$ANCHOR_PYTHON" bench_decode.py) > "$out/anchor_decode.md" 2> "$out/anchor_decode.err" || true
    "$ANCHOR_PYTHON" scripts/anchor_decode_onnxruntime.py > "$out/anchor_decode_onnxruntime.md" \
        2> "$out/anchor_decode_onnxruntime.err" || true
    (cd "$anchors" && "$ANCHOR_PYTHON" bench_transformer.py --layers 1 2 8 --only jax --repeats 3) \
        > "$out/anchor_transformer.md" 2> "$out/anchor_transformer.err" || true
    # ONNX import (issue #14): the nine-model suite and the three exported models, Kiln and
    # onnxruntime alternating per model.
    bash scripts/bench-onnx-suite.sh target/onnx-suite 1 > "$out/onnx-suite.txt" 2>&1 || true
fi
echo "results in $out/"
