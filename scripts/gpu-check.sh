#!/usr/bin/env bash
#! Checks Kiln's wgpu backend on a machine with a real GPU (e.g. an NVIDIA H200 through Vulkan).
#
# 1. Makes sure a Vulkan loader/ICD is present (scripts/install-gpu-deps.sh) and sets XDG_RUNTIME_DIR.
# 2. Runs the wgpu op test suite with KILN_REQUIRE_VULKAN=1 (a missing or non-Vulkan adapter fails).
# 3. Runs the benchmark (release): neg/sigmoid eager vs lazy, matmul GFLOP/s, planned vs naive
#    memory, buffers created on a repeat run.
# Extra arguments go to the benchmark (e.g. `--matmul 2048 --reps 5`).
set -euo pipefail
cd "$(dirname "$0")/.."

eval "$(scripts/install-gpu-deps.sh)"
export KILN_REQUIRE_VULKAN=1

if command -v vulkaninfo >/dev/null 2>&1; then
    vulkaninfo --summary 2>/dev/null | grep -E "deviceName|driverName|apiVersion" || true
fi

echo "== wgpu op tests" >&2
cargo test -p kiln-codegen --test it wgsl_gen::
cargo test -p kiln-runtime --test gpu wgpu_ops:: -- --nocapture 2>&1 | grep -E "kiln wgpu: adapter|^test |test result" | sort -u

echo "== wgpu benchmark" >&2
cargo run --release -p kiln-runtime --example wgpu_bench -- "$@"
