//! Splitting a launch over the cores: rayon's global pool (persistent threads, shared with the
//! GEMM), with the calling thread doing the first chunk itself.

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

/// Calls `f(lo, hi)` for `chunks` near-equal parts of `0..total`: part 0 on the calling thread, the
/// others on the pool, and returns when every part is done. No allocation beyond rayon's job
/// records; no thread is spawned.
pub fn for_chunks(total: usize, chunks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    let chunks = chunks.clamp(1, total.max(1));
    if chunks == 1 {
        f(0, total);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

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
}
