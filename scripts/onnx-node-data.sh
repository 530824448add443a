#!/usr/bin/env bash
# Prints the folder of ONNX's backend node tests (model.onnx + test_data_set_0 per op test), the
# reference crates/onnx/tests/it/node.rs checks Kiln against. The onnx 1.22.0 wheel is the last one
# that ships the folders; this installs it with pip into a throwaway venv under the cargo target
# folder (target/onnx-venv) the first time and reuses it afterwards. Progress goes to stderr, the
# path alone to stdout:  export KILN_ONNX_NODE_DIR=$(bash scripts/onnx-node-data.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${CARGO_TARGET_DIR:-$PWD/target}/onnx-venv"
find_dir() {
    local d
    for d in "$venv"/lib/python3*/site-packages/onnx/backend/test/data/node; do
        [ -f "$d/test_abs/model.onnx" ] && { echo "$d"; return 0; }
    done
    return 1
}
if ! find_dir >/dev/null; then
    echo "onnx-node-data: installing onnx==1.22.0 into $venv" >&2
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check "onnx==1.22.0" >&2
fi
dir="$(find_dir)" || { echo "onnx-node-data: the onnx wheel in $venv has no node tests" >&2; exit 1; }
cd "$dir" && pwd
