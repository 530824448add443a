//! Measures what `vm::PARALLEL_MIN_WORK` is chosen from: the cost of handing a chunk of a launch to
//! rayon's pool, and when splitting an f32 `neg` loop over two chunks beats one core.
//!
//! `cargo run --release -p kiln-runtime --example measure` (10th percentile of 1000-2000 calls).

use std::time::Instant;

use kiln_runtime::parallel::{SendPtr, for_chunks};

/// `b1[i] = -b0[i]` for `i in start..end`, with the kernel ABI.
unsafe extern "C" fn neg_f32(bufs: *const *mut u8, _syms: *const i64, start: i64, end: i64) {
    // SAFETY: callers pass two f32 buffers covering `start..end`.
    unsafe {
        let (x, y) = (*bufs as *const f32, *bufs.add(1) as *mut f32);
        let len = (end - start) as usize;
        let x = std::slice::from_raw_parts(x.add(start as usize), len);
        let y = std::slice::from_raw_parts_mut(y.add(start as usize), len);
        for (a, b) in x.iter().zip(y) {
            *b = -*a;
        }
    }
}

/// The 10th percentile of `iters` single-call times, in seconds.
fn p10(iters: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[iters / 10]
}

fn main() {
    let t = p10(2000, || for_chunks(2, 2, &|_, _| {}));
    println!("for_chunks, 2 chunks, no work: {:.2} us", t * 1e6);
    for n in [8192usize, 16384, 32768, 65536, 131072, 262144, 524288] {
        let src = vec![1f32; n];
        let mut dst = vec![0f32; n];
        let ptrs = [src.as_ptr() as *mut u8, dst.as_mut_ptr() as *mut u8];
        let table = SendPtr(ptrs.as_ptr() as *mut u8);
        // SAFETY: both buffers hold `n` f32.
        let one = p10(1000, || unsafe { neg_f32(ptrs.as_ptr(), std::ptr::null(), 0, n as i64) });
        let two = p10(1000, || {
            for_chunks(n, 2, &|lo, hi| {
                // SAFETY: as above; the chunks are disjoint.
                unsafe { neg_f32(table.get() as *const *mut u8, std::ptr::null(), lo as i64, hi as i64) }
            })
        });
        println!("neg n={n}: 1 thread {:.2} us, 2 chunks {:.2} us", one * 1e6, two * 1e6);
    }
}
