#!/usr/bin/env bash
# The model suite as ONNX files, Kiln against onnxruntime in the same run: exports the nine
# models of `kiln bench models` (scripts/export_model_suite.py), then, for ROUNDS rounds,
# alternates `kiln bench onnx` (import + trace + compile on the first call, then steady calls)
# and scripts/anchor_onnx_onnxruntime.py (session creation, steady run) on each, and on the three
# exported models of crates/onnx/tests/fixtures (MLP, CNN, tiny GPT-2; issue #14).
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
    fixtures=crates/onnx/tests/fixtures
    # name, batch, the input's shape after the batch (the anchor's arguments), kiln's dims
    while read -r name batch shape dims; do
        # shellcheck disable=SC2086 # `dims` is a list of flags
        "$kiln" bench onnx "$fixtures/$name.onnx" $dims
        "$py" scripts/anchor_onnx_onnxruntime.py "$fixtures/$name.onnx" "$batch" "$shape"
    done <<'MODELS'
mlp 3 16 --dim=batch=3
cnn 3 3,8,8 --dim=batch=3
gpt2 3 9 --dim=batch=3 --dim=seq=9
MODELS
done
