#!/usr/bin/env bash
# Long fuzzing runs on stable Rust: the proptest harnesses of the text parser, the safetensors
# loader, random facade op sequences and the ONNX importer (random bytes, mutated models), with
# many more cases than CI replays.
#   bash scripts/fuzz.sh [CASES]          (default 100000 cases per property)
# Each harness runs under `timeout` (FUZZ_TIMEOUT seconds, default 3600) so a hang is a failure.
# A failing case is shrunk by proptest and saved under the crate's `tests/proptest-regressions/`;
# commit that file and fix the bug (keep the input as a regression test).
set -euo pipefail
cd "$(dirname "$0")/.."
export PROPTEST_CASES="${1:-100000}"
limit="${FUZZ_TIMEOUT:-3600}"
# A random seed per run unless the caller pins one (CI pins PROPTEST_RNG_SEED in .ci/run).
unset PROPTEST_RNG_SEED || true
run() {
    echo "== $* (PROPTEST_CASES=$PROPTEST_CASES)" >&2
    timeout "$limit" cargo test --release "$@" -- --test-threads=2
}
run -p kiln-air --test it fuzz_text::
run -p kiln-nn --test it fuzz_safetensors::
run -p kiln --test it fuzz_ops::
run -p kiln-onnx --test it import::
