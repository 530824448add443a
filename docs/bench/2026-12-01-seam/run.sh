#!/usr/bin/env bash
# Issue #11 before/after: the same suites from the commit before the seam redesign (a0f644c, built
# in its own worktree at $BEFORE) and from the merged redesign, interleaved in one run on one idle
# machine so both see the same conditions. Run from the repository root after
# `cargo build --release -p kiln-cli` here and in the worktree:
#   BEFORE=/work/wt/before bash docs/bench/2026-12-01-seam/run.sh
# No peer anchors: this compares Kiln with itself (the redesign must not regress).
# Rounds 3 and 4 of the models suite (models-*-3.md, models-*-4.md) ran after it by hand, the same
# way: `$bin bench models` alternating before, after, before, after. vm_overhead.md is
# `cargo bench --bench vm_overhead` built in each tree, its binaries run alternately (twice in
# full, then three times `neg_n1_executable_run --measurement-time 4`).
set -euo pipefail
out=docs/bench/2026-12-01-seam
before=${BEFORE:?worktree of a0f644c}/target/release/kiln
after=target/release/kiln
load() { echo "[load] $(date -u +%H:%M:%S) loadavg $(cut -d' ' -f1-3 /proc/loadavg)"; }
for round in 1 2; do
    for which in before after; do
        bin=$before; [ $which = after ] && bin=$after
        { load; $bin bench transformer-compile --layers 1,2,8 --repeats 5; load; } > $out/transformer-$which-$round.md 2>&1
        { load; $bin bench unary --sizes 59049,1594323; load; } > $out/unary-$which-$round.md 2>&1
        { load; $bin bench models; load; } > $out/models-$which-$round.md 2>&1
    done
done
