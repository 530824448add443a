#!/usr/bin/env bash
# Runs Kiln's benchmark suites (release) and, when ANCHOR_PYTHON names a Python with numpy/torch
# (and optionally jax, transformers, onnx + onnxruntime), the peer anchors from ../shared/anchors right after
# them, so the ratios in BENCHMARKS.md come from one run on one machine (~35 min).
#   ANCHOR_PYTHON=/path/to/venv/bin/python bash scripts/bench-all.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench-out}"
mkdir -p "$out"
cargo build --release -p kiln-cli
kiln=./target/release/kiln
"$kiln" bench transformer-compile --layers 1,2,4,8,16,32 --fresh-process 5 --out "$out/transformer" | tee "$out/transformer.md"
"$kiln" bench unary --out "$out/unary" | tee "$out/unary.md"
"$kiln" bench matmul --out "$out/matmul" | tee "$out/matmul.md"
"$kiln" bench tree-matmul --out "$out/tree" | tee "$out/tree.md"
"$kiln" bench memory --out "$out/memory" | tee "$out/memory.md"
"$kiln" bench models --out "$out/models" | tee "$out/models.md"
"$kiln" bench embedding --out "$out/embedding" | tee "$out/embedding.md"
"$kiln" bench transformer-compile --layers 1,2,8 --start-pos 2 --out "$out/transformer-cached" | tee "$out/transformer-cached.md"
"$kiln" bench decode --out "$out/decode" | tee "$out/decode.md"
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
fi
echo "results in $out/"
