//! Cheap counters of the work `realize` does, for tests and profiling.
//!
//! The counters are per thread: `realize` runs its graph on the calling thread, so a test can
//! read them before and after without other tests (on other threads) disturbing the count.

use std::cell::Cell;

thread_local! {
    static GRAPHS: Cell<u64> = const { Cell::new(0) };
    static NODES: Cell<u64> = const { Cell::new(0) };
    static INTERP_RUNS: Cell<u64> = const { Cell::new(0) };
    static CPU_RUNS: Cell<u64> = const { Cell::new(0) };
    static CPU_LAUNCHES: Cell<u64> = const { Cell::new(0) };
    static REALIZE_CACHE_HITS: Cell<u64> = const { Cell::new(0) };
}

/// How many graphs this thread has executed (one per `realize` that had work to do).
pub fn graphs_executed() -> u64 {
    GRAPHS.with(Cell::get)
}

/// How many air nodes the graphs this thread executed held, in total.
pub fn nodes_executed() -> u64 {
    NODES.with(Cell::get)
}

pub(crate) fn record_execution(nodes: usize) {
    GRAPHS.with(|g| g.set(g.get() + 1));
    NODES.with(|n| n.set(n.get() + nodes as u64));
}

/// How many graphs this thread ran on the reference interpreter (`Device::Interp`).
pub fn interp_runs() -> u64 {
    INTERP_RUNS.with(Cell::get)
}

/// How many graphs this thread ran as native code on the CPU device.
pub fn cpu_runs() -> u64 {
    CPU_RUNS.with(Cell::get)
}

/// How many kernel launches those CPU runs made (counted by each executable as it launches).
pub fn cpu_launches() -> u64 {
    CPU_LAUNCHES.with(Cell::get)
}

pub(crate) fn record_interp_run() {
    INTERP_RUNS.with(|c| c.set(c.get() + 1));
}

pub(crate) fn record_cpu_run(launches: u64) {
    CPU_RUNS.with(|c| c.set(c.get() + 1));
    CPU_LAUNCHES.with(|c| c.set(c.get() + launches));
}

/// How many realizes on this thread found their structure in the realize cache: they ran the
/// program loaded for an equal graph before, without tracing a graph or asking the device.
pub fn realize_cache_hits() -> u64 {
    REALIZE_CACHE_HITS.with(Cell::get)
}

pub(crate) fn record_realize_cache_hit() {
    REALIZE_CACHE_HITS.with(|c| c.set(c.get() + 1));
}
