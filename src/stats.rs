//! Cheap counters of the work `realize` does, for tests and profiling.
//!
//! The counters are per thread: `realize` runs its graph on the calling thread, so a test can
//! read them before and after without other tests (on other threads) disturbing the count.

use std::cell::Cell;

thread_local! {
    static GRAPHS: Cell<u64> = const { Cell::new(0) };
    static NODES: Cell<u64> = const { Cell::new(0) };
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
