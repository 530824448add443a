#!/usr/bin/env bash
# The commands that produced the 2026-12-01 numbers in BENCHMARKS.md, run from the repository
# root after `cargo build --release -p kiln-cli`. Each result file starts and ends with the load
# average (/proc/loadavg) and CPU busy share seen around it: six other engineers were compiling on
# this 2-core machine all afternoon, so only ratios measured in the same run are quoted.
#   ANCHOR_PYTHON=/work/anchors-venv/bin/python bash docs/bench/2026-12-01/run.sh
# On 2026-12-01 only the two memory runs were made (memory.md, memory-wgpu.md), with the debug
# binary (`kiln=target/debug/kiln`: byte and buffer counts do not depend on the build profile);
# the release build did not finish in time for the timed runs. anchor_transformer_jax_loaded.md
# is the jax anchor run by hand that afternoon under that load, kept for its load record only:
#   cd /work/shared/anchors && ANCHOR_IDLE_WAIT=5 /work/anchors-venv/bin/python \
#       bench_transformer.py --layers 1 2 8 --only jax --repeats 3
# (its .err lists every retry the load caused); anchor_versions.md is `python versions.py`.
# From 16:23 on the idle machine (release build of the merged work): transformer.md by the first
# `run` line below, embedding.md by `kiln bench embedding --out $out/embedding`,
# transformer_base_306e70f.md by the same suite (`--layers 1,2,8`, no --fresh-process, which that
# commit lacks) built from commit 306e70f in its own worktree, and anchor_transformer_jax.md by the
# jax line below (torch.compile's line was not run).
set -euo pipefail
out=docs/bench/2026-12-01
kiln=${CARGO_TARGET_DIR:-target}/release/kiln
anchors=../shared/anchors
[ -d "$anchors" ] || anchors=/work/shared/anchors
load() {
    local a b
    a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
    local busy=$(( (b[1]+b[2]+b[3]+b[6]+b[7]+b[8]) - (a[1]+a[2]+a[3]+a[6]+a[7]+a[8]) ))
    local idle=$(( (b[4]+b[5]) - (a[4]+a[5]) ))
    echo "[load] $(date -u +%H:%M:%S) loadavg $(cut -d' ' -f1-3 /proc/loadavg); CPU busy over 1 s: $(( 100 * busy / (busy + idle) ))%"
}
run() { # run NAME CMD...: stdout and the load around it into $out/NAME.md
    local name=$1; shift
    { load; "$@"; load; } > "$out/$name.md" 2> "$out/$name.err" || echo "$name failed (see $out/$name.err)"
}
run transformer "$kiln" bench transformer-compile --layers 1,2,8 --fresh-process 5 --out "$out/transformer"
if [ -n "${ANCHOR_PYTHON:-}" ]; then
    export ANCHOR_IDLE_WAIT=5
    run anchor_transformer_jax bash -c "cd $anchors && $ANCHOR_PYTHON bench_transformer.py --layers 1 2 8 --only jax --repeats 3"
    run anchor_transformer_torch_compile bash -c "cd $anchors && $ANCHOR_PYTHON bench_transformer.py --layers 1 2 8 --only torch_compile --repeats 1"
fi
run embedding "$kiln" bench embedding --out "$out/embedding"
run memory "$kiln" bench memory --out "$out/memory"
run memory-wgpu "$kiln" bench memory --device wgpu --out "$out/memory-wgpu"
