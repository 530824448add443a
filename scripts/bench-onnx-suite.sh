#!/usr/bin/env bash
# The model suite as ONNX files, Kiln against onnxruntime in the same run: exports the nine
# models of `kiln bench models` (scripts/export_model_suite.py), then, for ROUNDS rounds,
# alternates `kiln bench onnx` (import + trace + compile on the first call, then steady calls)
# and scripts/anchor_onnx_onnxruntime.py (session creation, steady run) on each.
# Usage: ANCHOR_PYTHON=/path/to/python bash scripts/bench-onnx-suite.sh [OUT_DIR] [ROUNDS]
# The Python needs torch, onnx and onnxruntime; kiln is built in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${ANCHOR_PYTHON:-python3}"
out="${1:-target/onnx-suite}"
rounds="${2:-3}"
cargo build --release -q -p kiln-cli --bin kiln
kiln="${CARGO_TARGET_DIR:-target}/release/kiln"
"$py" scripts/export_model_suite.py "$out" > "$out.models"
for round in $(seq "$rounds"); do
    echo "# round $round"
    while read -r name batch shape; do
        "$kiln" bench onnx "$out/$name.onnx" --dim batch="$batch"
        "$py" scripts/anchor_onnx_onnxruntime.py "$out/$name.onnx" "$batch" "$shape"
    done < "$out.models"
done
