//! Splitting a launch over the cores: rayon's global pool (persistent threads, shared with the
//! GEMM), with the calling thread doing chunks itself, and a hot team of helpers that stay
//! spinning for a moment after a split so that the next split of the same run starts in
//! nanoseconds instead of paying a wake-up.
//!
//! Why the team: a pool thread that went to sleep takes 17 us to wake after 50 us idle and 77 us
//! after 200 us (#18's measurements), while a decoding step runs 73 GEMVs of 100-500 us each with
//! small kernels between them, so every split paid a wake-up and the 768x768 GEMVs of GPT-2 ran
//! slower split than on one thread. A helper spins (`spin_loop`) for up to [`SPIN`] after its last
//! chunk, which is what OpenMP runtimes do by default (`GOMP_SPINCOUNT`), then goes back to the
//! pool (so other rayon work in the process waits at most that long for a pool thread). GEMMs
//! split through here too (`matmul`), one single-threaded `gemm` call per part.
//!
//! While the JIT's background thread has kernels to optimise (`codegen::cpu::tier_up_pending`),
//! no helper is started and spinning ones leave: that thread runs at idle priority and gets a
//! core only when nothing spins on it, and a loop of runs otherwise never reached optimised
//! code. The calling thread takes every part itself meanwhile (a few milliseconds).

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A pointer that may cross to a pool thread for the duration of one launch.
#[derive(Clone, Copy, Debug)]
pub struct SendPtr(pub *mut u8);

// SAFETY: a `SendPtr` only travels into closures that finish before the launch that made it
// returns, while the memory it points to is kept alive by that launch; which parts each thread
// writes is decided by the kernel's range split (disjoint by construction).
unsafe impl Send for SendPtr {}
// SAFETY: as above; sharing the pointer value itself is harmless.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so that closures capture the whole `SendPtr`, not its field).
    pub fn get(self) -> *mut u8 {
        self.0
    }
}

/// Threads a launch may use (rayon's global pool size, normally the number of cores).
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// `[lo, hi)` of chunk `i` when `0..total` is cut into `chunks` near-equal parts.
pub fn chunk_range(total: usize, chunks: usize, i: usize) -> (usize, usize) {
    let base = total / chunks;
    let extra = total % chunks;
    let lo = i * base + i.min(extra);
    let hi = lo + base + usize::from(i < extra);
    (lo, hi)
}

/// Calls `f(lo, hi)` for `chunks` near-equal parts of `0..total` and returns when every part is
/// done: the calling thread takes parts itself, and helpers of the hot team take the others (a
/// helper already spinning from the last split, or a new one started on rayon's pool). When
/// another split holds the team (a concurrent run on another thread, or a split inside a part),
/// the parts go to rayon's pool directly. Which thread runs which part is not fixed; each part runs
/// exactly once.
pub fn for_chunks(total: usize, chunks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    let chunks = chunks.clamp(1, total.max(1));
    if chunks == 1 {
        f(0, total);
        return;
    }
    if TEAM.owner.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
        // `team_split` releases the team.
        team_split(total, chunks, f);
        return;
    }
    rayon::in_place_scope(|scope| {
        for i in 1..chunks {
            let (lo, hi) = chunk_range(total, chunks, i);
            scope.spawn(move |_| f(lo, hi));
        }
        let (lo, hi) = chunk_range(total, chunks, 0);
        f(lo, hi);
    });
}

/// How long a helper spins for the next split after its last chunk.
pub const SPIN: Duration = Duration::from_micros(500);

/// The process's one hot team (see the module docs).
static TEAM: Team = Team {
    owner: AtomicBool::new(false),
    job: AtomicPtr::new(std::ptr::null_mut()),
    generation: AtomicU64::new(0),
    active: AtomicUsize::new(0),
    spinning: AtomicUsize::new(0),
    released: AtomicU64::new(0),
};

struct Team {
    /// Held by the split that publishes jobs.
    owner: AtomicBool,
    /// The job being split, or null.
    job: AtomicPtr<Job<'static>>,
    /// Bumped at every publication, so that a helper takes each job once.
    generation: AtomicU64,
    /// Helpers between loading `job` and being done with it: the owner waits for 0 after
    /// clearing `job`, before the job (on its stack) goes away.
    active: AtomicUsize,
    /// Helpers in their loop (spinning or working).
    spinning: AtomicUsize,
    /// Bumped by [`release`]: a spinning helper that sees it change leaves.
    released: AtomicU64,
}

/// Sends the team's spinning helpers back to the pool now rather than after [`SPIN`]: no split
/// is coming soon (a compile begins, whose early task needs a pool thread; a third thread
/// spinning on two cores would take turns with the compile).
pub fn release() {
    if TEAM.spinning.load(Ordering::Relaxed) > 0 {
        TEAM.released.fetch_add(1, Ordering::SeqCst);
    }
}

/// One split: parts are claimed through `next`; `done` counts the finished ones (a part that
/// panicked counts as finished, its panic kept for the owner to resume).
struct Job<'a> {
    f: &'a (dyn Fn(usize, usize) + Sync),
    total: usize,
    chunks: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Job<'_> {
    /// Claims and runs parts until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.chunks {
                return;
            }
            let (lo, hi) = chunk_range(self.total, self.chunks, i);
            if let Err(payload) = std::panic::catch_unwind(AssertUnwindSafe(|| (self.f)(lo, hi))) {
                self.panic.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(payload);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

fn team_split(total: usize, chunks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    /// Unpublishes the job and releases the team, also when a part panics on this thread: no
    /// helper may still hold the job (on this frame) once the frame is gone.
    struct Unpublish;
    impl Drop for Unpublish {
        fn drop(&mut self) {
            TEAM.job.store(std::ptr::null_mut(), Ordering::SeqCst);
            while TEAM.active.load(Ordering::SeqCst) != 0 {
                std::hint::spin_loop();
            }
            TEAM.owner.store(false, Ordering::Release);
        }
    }
    let job = Job { f, total, chunks, next: AtomicUsize::new(0), done: AtomicUsize::new(0), panic: Mutex::new(None) };
    // SAFETY (lifetime erasure): the pointer is published only until `Unpublish` runs (at the end
    // of this function, or while unwinding out of it), which clears it and then waits until no
    // helper holds it (`active == 0`, see `helper`).
    let ptr = &job as *const Job<'_> as *mut Job<'static>;
    let unpublish = Unpublish;
    TEAM.job.store(ptr, Ordering::SeqCst);
    TEAM.generation.fetch_add(1, Ordering::SeqCst);
    // No helper while the JIT's thread needs the core (see the module docs).
    let wanted = if codegen::cpu::tier_up_pending() { 0 } else { chunks.min(threads()) - 1 };
    for _ in TEAM.spinning.load(Ordering::SeqCst)..wanted {
        rayon::spawn(helper);
    }
    job.work();
    while job.done.load(Ordering::Acquire) < chunks {
        std::hint::spin_loop();
    }
    drop(unpublish);
    if let Some(payload) = job.panic.into_inner().unwrap_or_else(PoisonError::into_inner) {
        // A part panicked (on whichever thread ran it): the split panics, as a rayon scope does.
        std::panic::resume_unwind(payload);
    }
}

/// A helper of the team, run on a pool thread: takes parts of every job published while it spins,
/// and leaves after [`SPIN`] without one.
fn helper() {
    TEAM.spinning.fetch_add(1, Ordering::SeqCst);
    let released = TEAM.released.load(Ordering::SeqCst);
    let mut seen = None;
    let mut idle_since = Instant::now();
    let mut polls = 0u32;
    loop {
        let generation = TEAM.generation.load(Ordering::SeqCst);
        if seen != Some(generation) {
            seen = Some(generation);
            TEAM.active.fetch_add(1, Ordering::SeqCst);
            let ptr = TEAM.job.load(Ordering::SeqCst);
            if !ptr.is_null() {
                // SAFETY: a non-null `job` read after `active` was raised stays alive until
                // `active` is lowered again: its owner clears `job`, then waits for `active == 0`
                // (both sequentially consistent, so either the owner sees this helper active or
                // this helper sees null).
                unsafe { (*ptr).work() };
            }
            TEAM.active.fetch_sub(1, Ordering::SeqCst);
            idle_since = Instant::now();
            continue;
        }
        std::hint::spin_loop();
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(64)
            && (idle_since.elapsed() >= SPIN
                || TEAM.released.load(Ordering::Relaxed) != released
                || codegen::cpu::tier_up_pending())
        {
            break;
        }
    }
    TEAM.spinning.fetch_sub(1, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_range_once() {
        for total in [0usize, 1, 2, 7, 100, 101] {
            for chunks in 1..6 {
                let mut next = 0;
                for i in 0..chunks {
                    let (lo, hi) = chunk_range(total, chunks, i);
                    assert_eq!(lo, next);
                    assert!(hi >= lo);
                    next = hi;
                }
                assert_eq!(next, total);
            }
        }
    }

    #[test]
    fn for_chunks_runs_every_part() {
        let sum = AtomicUsize::new(0);
        for_chunks(1000, 4, &|lo, hi| {
            sum.fetch_add((lo..hi).sum::<usize>(), Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), (0..1000).sum::<usize>());
    }

    /// Every element of `0..total` is visited exactly once by a split of `chunks` parts.
    fn split_visits_each_once(total: usize, chunks: usize) {
        let hits: Vec<AtomicUsize> = (0..total).map(|_| AtomicUsize::new(0)).collect();
        for_chunks(total, chunks, &|lo, hi| {
            for h in &hits[lo..hi] {
                h.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{total} in {chunks} parts");
    }

    #[test]
    fn back_to_back_splits_through_the_hot_team_run_every_part_once() {
        // Splits close together reuse the spinning helper; some land after it left.
        for round in 0..2000 {
            split_visits_each_once(64 + round % 7, 2 + round % 3);
            if round % 500 == 0 {
                std::thread::sleep(SPIN * 2);
            }
        }
    }

    #[test]
    fn concurrent_and_nested_splits_fall_back_to_the_pool() {
        // Several threads split at once (one holds the team, the others use rayon's scope), and
        // a part that splits again cannot take the team its own split holds.
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || {
                    for round in 0..300 {
                        split_visits_each_once(100 + t, 2);
                        if round % 50 == 0 {
                            let sum = AtomicUsize::new(0);
                            for_chunks(8, 2, &|lo, hi| {
                                for_chunks(10, 2, &|a, b| {
                                    sum.fetch_add((hi - lo) * (b - a), Ordering::Relaxed);
                                });
                            });
                            assert_eq!(sum.load(Ordering::Relaxed), 80);
                        }
                    }
                });
            }
        });
    }

    #[test]
    fn a_panicking_part_panics_the_split_and_the_team_stays_usable() {
        for _ in 0..20 {
            let caught = std::panic::catch_unwind(|| {
                for_chunks(100, 2, &|lo, _| {
                    if lo > 0 {
                        panic!("part panicked");
                    }
                })
            });
            assert!(caught.is_err());
            split_visits_each_once(100, 2);
        }
    }
}
