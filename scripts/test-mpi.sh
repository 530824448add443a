#!/usr/bin/env bash
#! The MPI tests of data-parallel training (`kiln-dist` with `--features mpi`), over loopback:
#!   1. `mpirun -n 2` and `mpirun -n 4 --oversubscribe` of crates/dist/examples/train_ddp: after
#!      10 steps every rank's parameters are bitwise identical, and within 1e-6 of one process
#!      trained on the global batch (the example checks both and prints `train_ddp: ok`);
#!   2. one rank killed (SIGKILL) mid-run under plain `mpirun`: mpirun ends the job with an error
#!      within a bounded time, and the surviving rank neither finishes nor hangs;
#!   3. one rank of 4 killed (SIGKILL) mid-run under `mpirun --enable-recovery`: every surviving
#!      rank gets `Err(Timeout)` from its collective (2 s), prints it, checks that its poisoned
#!      collective fails the next call at once, and exits with code 3;
#!   4. one rank hung (SIGSTOP) mid-run, and one rank that sleeps instead of joining: the survivor
#!      gets `Err(Timeout)`, prints it and exits with code 3, after which mpirun ends the job (the
#!      hung rank too) and exits 3.
#! Installs Open MPI and libclang first (scripts/install-mpi-deps.sh). Set KILN_SKIP_MPI=1 to skip.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "test-mpi: $*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

if [ "${KILN_SKIP_MPI:-0}" = 1 ]; then
    log "KILN_SKIP_MPI=1: skipped"
    exit 0
fi
bash scripts/install-mpi-deps.sh
# Open MPI refuses root unless told; CI containers run as root.
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Containers usually forbid the cross-memory attach of Open MPI's shared-memory transport.
export OMPI_MCA_btl_vader_single_copy_mechanism=none

# `kiln-nn/wgpu`: the features `cargo test --workspace` built the crates with, so they are reused.
cargo clippy -p kiln-dist --features mpi,kiln-nn/wgpu --all-targets -- -D warnings
# The backend's unit tests (its polling and backoff), which need no mpirun.
cargo test -p kiln-dist --features mpi,kiln-nn/wgpu --lib
cargo build -p kiln-dist --features mpi,kiln-nn/wgpu --example train_ddp
exe="${CARGO_TARGET_DIR:-target}/debug/examples/train_ddp"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. Two and four ranks.
for ranks in 2 4; do
    log "mpirun -n $ranks"
    out="$work/n$ranks.log"
    if ! timeout 300 mpirun -n "$ranks" --oversubscribe "$exe" --steps 10 >"$out" 2>&1; then
        cat "$out" >&2
        fail "mpirun -n $ranks exited non-zero"
    fi
    grep -E "identical across ranks|vs one process" "$out" >&2
    oks=$(grep -c "^train_ddp: ok" "$out" || true)
    [ "$oks" = "$ranks" ] || { cat "$out" >&2; fail "$oks of $ranks ranks printed ok"; }
    grep -q "rank 0: vs one process on the global batch" "$out" || fail "rank 0 did not compare with one process"
done

# Whether process $1 has ended (absent, or a zombie).
gone() {
    local state
    state="$(ps -o stat= -p "$1" 2>/dev/null || true)"
    [ -z "$state" ] || [[ "$state" == Z* ]]
}

# interrupt NAME SIGNAL RANKS BOUND "MPIRUN OPTIONS" [train_ddp options...]: starts a RANKS-rank
# run (collective timeout 2 s) that would take minutes, waits until rank 1 has taken 3 steps, then
# sends SIGNAL to rank 1 (`none`: nothing; `--hang-rank 1` makes rank 1 hang by itself) and
# checks that the job ends within BOUND seconds, that no rank finished as if nothing happened and
# that every other rank is gone. Prints the log ($work/NAME.log), leaves mpirun's exit status in
# $status and the ranks' recorded exit codes in $work/NAME/rank<r>.exit.
interrupt() {
    local name="$1" signal="$2" ranks="$3" bound="$4" mpirun_options="$5"
    shift 5
    local out="$work/$name.log" pids="$work/$name"
    mkdir -p "$pids"
    local what="rank 1 gets SIG$signal after its third step"
    [ "$signal" != none ] || what="no signal"
    log "$name: mpirun -n $ranks $mpirun_options, train_ddp $*: $what"
    # shellcheck disable=SC2086 # the options are words
    mpirun -n "$ranks" --oversubscribe $mpirun_options "$exe" --steps 2000 --step-delay-ms 100 --timeout-secs 2 \
        --no-reference --pid-dir "$pids" "$@" >"$out" 2>&1 &
    local job=$!
    local waited=0
    until grep -q "rank 1: step 2 done" "$out" 2>/dev/null; do
        sleep 0.2
        waited=$((waited + 1))
        [ "$waited" -lt 1500 ] || { kill -KILL "$job" || true; cat "$out" >&2; fail "$name: rank 1 never took 3 steps"; }
    done
    local rank1
    rank1="$(cat "$pids/rank1.pid")"
    local start=$SECONDS
    [ "$signal" = none ] || kill "-$signal" "$rank1"
    status=0
    # `wait` on the job, bounded: a watcher kills it past the bound (and the test then fails).
    ( sleep "$bound"; kill -KILL "$job" 2>/dev/null ) &
    local watcher=$!
    wait "$job" || status=$?
    kill "$watcher" 2>/dev/null || true
    local took=$((SECONDS - start))
    kill -KILL "$rank1" 2>/dev/null || true
    cat "$out" >&2
    [ "$took" -lt "$bound" ] || fail "$name: the job did not end within ${bound}s"
    # Every other rank is gone (or a zombie nobody reaped yet) within a few seconds of the job's end.
    local r pid tries
    for r in $(seq 0 $((ranks - 1))); do
        [ "$r" != 1 ] || continue
        pid="$(cat "$pids/rank$r.pid")"
        tries=0
        until gone "$pid"; do
            sleep 0.5
            tries=$((tries + 1))
            [ "$tries" -lt 20 ] || fail "$name: rank $r (pid $pid) still runs"
        done
    done
    if grep -q "^train_ddp: ok" "$out"; then fail "$name: a rank finished as if nothing happened"; fi
    log "$name: mpirun exited $status after ${took}s, the other ranks are gone"
}

# Rank $2 of run $1 printed its collective's `Err(Timeout)` and the poisoned collective's next
# call failed at once, and it recorded exit code 3.
survivor_got_err() {
    local name="$1" r="$2" ranks="$3" out="$work/$1.log"
    grep -q "^rank $r: collective failed: all_reduce(mean) on rank $r of $ranks: timed out after 2\.[0-9]*s$" "$out" \
        || fail "$name: rank $r did not print the collective's timeout"
    grep -q "^rank $r: a later barrier failed at once .*the group failed earlier: all_reduce(mean) on rank $r" "$out" \
        || fail "$name: rank $r's later call did not fail at once"
    [ "$(cat "$work/$name/rank$r.exit" 2>/dev/null)" = 3 ] || fail "$name: rank $r did not exit with code 3"
}

# 2. A rank dies under plain mpirun: mpirun ends the job (the survivor gets no Err).
interrupt kill KILL 2 60 ""
[ "$status" -ne 0 ] || fail "kill: mpirun exited 0"
# 3. A rank of 4 dies under --enable-recovery: the survivors keep running until their
#    collective's deadline, get the Err and exit 3 (mpirun itself exits 0 under that option).
interrupt kill-recovery KILL 4 60 --enable-recovery
for r in 0 2 3; do survivor_got_err kill-recovery "$r" 4; done
# 4. A rank hangs (stopped, or asleep instead of joining): the survivor gets the Err and exits 3,
#    and mpirun ends the job with that status.
interrupt stop STOP 2 60 ""
survivor_got_err stop 0 2
[ "$status" = 3 ] || fail "stop: mpirun exited $status, not 3 (the survivor's code)"
interrupt hang none 2 60 "" --hang-rank 1
survivor_got_err hang 0 2
[ "$status" = 3 ] || fail "hang: mpirun exited $status, not 3 (the survivor's code)"
log "all MPI tests passed"
