//! The cost of splitting a launch in two over the hot team (`runtime::parallel::for_chunks`)
//! against running it on the calling thread, for work of a few microseconds with a short gap
//! between launches (the helper still spinning), as a program's small kernels run:
//! `cargo run --release -p kiln-cli --example split_cost`.

use std::time::{Duration, Instant};

/// Busy for `d` (a kernel's work; a spin, so that it scales exactly with the split).
fn busy(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn main() {
    const CALLS: u32 = 2000;
    let gap = Duration::from_micros(3);
    for work_us in [0u64, 1, 2, 4, 8] {
        let work = Duration::from_micros(work_us);
        let mut per_call = [0.0f64; 2];
        for (i, chunks) in [1usize, 2].into_iter().enumerate() {
            let mut runs: Vec<f64> = (0..5)
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..CALLS {
                        runtime::parallel::for_chunks(2, chunks, &|lo, hi| busy(work * (hi - lo) as u32 / 2));
                        busy(gap);
                    }
                    (t.elapsed() / CALLS).saturating_sub(gap).as_secs_f64() * 1e6
                })
                .collect();
            runs.sort_by(f64::total_cmp);
            per_call[i] = runs[2];
        }
        println!("work {work_us} us: {:.2} us on one thread, {:.2} us split in two", per_call[0], per_call[1]);
    }
}
