#!/usr/bin/env bash
# The README's test command: installs what the tests need (a Vulkan driver for the wgpu tests:
# Mesa's lavapipe when the machine has no GPU), then runs every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/install-gpu-deps.sh)"
cargo test --workspace "$@"
