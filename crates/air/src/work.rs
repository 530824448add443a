//! Work counters for the compile-time regression guard: every compile pass (in air, lower,
//! codegen and the runtime) adds the units of work it does (nodes visited, edges touched, rule
//! attempts, planner steps, tree operations, instructions emitted) to one per-thread counter, and
//! an observer reads the counter before and after each pass. `Graph` counts every node lookup
//! itself (see [`crate::graph`]); passes add what happens off the graph (kir statements, buffers,
//! steps, placement queries, machine instructions).
//!
//! Why a thread-local counter: a pass runs on the thread that compiles (code generation on worker
//! threads hands its counts back to that thread), so the difference of two reads on that thread is
//! exactly the work done in between, with no counter struct threaded through every function and
//! no atomics. Adding is a plain read-modify-write of a `const`-initialised `Cell`: a few
//! instructions, no allocation, no destructor.
//!
//! Units are counts, not times: deterministic for a given graph, so tests can assert how they grow
//! (`crates/cli/tests/compile_work.rs` checks that each pass grows linearly with model depth).

use std::cell::Cell;

thread_local! {
    static UNITS: Cell<u64> = const { Cell::new(0) };
}

/// Adds `units` of work to this thread's counter.
#[inline]
pub fn add(units: u64) {
    UNITS.with(|u| u.set(u.get().wrapping_add(units)));
}

/// Adds one unit of work to this thread's counter.
#[inline]
pub fn tick() {
    add(1);
}

/// This thread's counter: the work done on it so far. Only differences between two reads mean
/// anything.
#[inline]
pub fn total() -> u64 {
    UNITS.with(Cell::get)
}

/// Runs `f` and returns its result with the work it did on this thread.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let start = total();
    let out = f();
    (out, total().wrapping_sub(start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measure_sees_only_the_work_inside() {
        add(5);
        let ((), inside) = measure(|| {
            tick();
            add(3);
        });
        assert_eq!(inside, 4);
        let other = std::thread::spawn(|| measure(|| add(7)).1).join().unwrap();
        assert_eq!(other, 7);
        assert_eq!(measure(|| ()).1, 0);
    }
}
