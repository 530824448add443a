#!/usr/bin/env bash
# The README's test command: installs what the tests need (a Vulkan driver for the wgpu tests:
# Mesa's lavapipe when the machine has no GPU), then runs every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/install-gpu-deps.sh)"
# ONNX's backend node tests, the reference of crates/onnx/tests/it/node.rs (onnx 1.22.0 wheel, pip).
KILN_ONNX_NODE_DIR="${KILN_ONNX_NODE_DIR:-$(bash scripts/onnx-node-data.sh)}"
export KILN_ONNX_NODE_DIR
cargo test --workspace "$@"
# Data-parallel training over MPI: installs Open MPI, builds kiln-dist with `--features mpi`, runs
# mpirun with 2 and 4 ranks and the kill/hang tests (KILN_SKIP_MPI=1 skips it).
bash scripts/test-mpi.sh
