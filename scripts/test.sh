#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets
