#!/usr/bin/env bash
# Runs the random-graph property tests (crates/runtime/tests/gpu/random_graphs.rs: the CPU device and
# wgpu against the reference interpreter) with many cases: PROPTEST_CASES, default 2000, which
# every test of that file honours. Built with optimisations, since the interpreter and the code
# generator dominate the time. Extra arguments go to the test binary (a test name filter, say).
#   scripts/proptest-long.sh
#   PROPTEST_CASES=20000 scripts/proptest-long.sh large
set -euo pipefail
cd "$(dirname "$0")/.."
export PROPTEST_CASES="${PROPTEST_CASES:-2000}"
echo "random graphs with PROPTEST_CASES=$PROPTEST_CASES"
cargo test --release -p kiln-runtime --test gpu random_graphs:: -- --nocapture "$@"
