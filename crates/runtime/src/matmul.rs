//! `Kernel::Matmul` on the CPU: strided, batched GEMM through the `gemm` crate (f32 and f64), and a
//! plain loop for the other dtypes.
//!
//! Why `gemm`: on this project's 2-core AVX-512 machine it beat `matrixmultiply` 0.3.11 (both with
//! 2 threads; see the crate docs for the numbers), it takes arbitrary row and column strides (so a
//! transposed operand costs nothing), and it threads through rayon, the pool the VM already uses.
//!
//! Everything a launch needs is evaluated once per binding set ([`MatmulLaunch::new`]), including
//! a bounds check of every operand against its buffer: a launch never reads or writes outside the
//! buffers it was given.

use std::sync::{Arc, Weak};

use air::{DType, HostData};
use half::{bf16, f16};
use lower::kir::{MatOperand, MatmulKernel};

use crate::error::{Result, RuntimeError};
use crate::parallel::{self, SendPtr};

/// Below this many multiply-adds in one batch entry, a batched matmul splits its batch over the
/// threads (each entry single-threaded) instead of threading inside each GEMM. Larger entries
/// split the batch too when it divides evenly over the threads: 32 entries of
/// (128x256)@(256x512) ran at 354 GFLOP/s with each GEMM cut in two (a fork and join per entry,
/// and each half packing its operands) and 371 with 16 whole entries per thread (`kiln bench
/// tree-matmul`, 2 threads).
const SPLIT_BATCH_BELOW: u128 = 1 << 20;

/// Below this many multiply-adds in total, a batched matmul runs on the calling thread.
const PARALLEL_MIN_MACS: u128 = 1 << 16;

/// The most rows of `a` a launch may have to run as dot products ([`MatmulLaunch::dots`]): a
/// few tokens times a `Linear` weight. Measured on GPT-2's shapes at 8 tokens (`kiln profile
/// transformer --layers 12 --dim 768 --heads 12 --vocab 50257 --max-seq 1024 --batch 1 --seq 8
/// --start-pos 0 --launches 12`): through `gemm`, which packs the column-major weight first, the
/// 8x768x3072 product took 2.3 ms and 8x768x768 0.40 ms, several times the time to read the
/// weight once. Above [`DOT_ALWAYS_M`] rows, only a long `k` goes this way: with `k = 32` (an
/// RNN step, 16x128x32) the per-element horizontal sums cost more than `gemm`'s packing, and
/// the LSTM's predict ran 1.5x slower.
const DOT_MAX_M: usize = 16;

/// Launches with at most this many rows are dot products whatever `k` (decoding's one token).
const DOT_ALWAYS_M: usize = 4;

/// Launches of `DOT_ALWAYS_M < m <= DOT_MAX_M` rows are dot products from this `k` on.
const DOT_MIN_K: usize = 256;

/// Launches with fewer columns than this are dot products whatever `m`, from `k >= DOT_MIN_K`
/// on: dense-large's head, (128x1024)@(1024x10) with the weight column-major, took 46 us through
/// `gemm`.
const DOT_NARROW_N: usize = 16;

/// Entries of at most this many multiply-adds run through [`small_avx512`] where the host has
/// AVX-512F: `gemm`'s fixed cost per call (about 0.5 us) and [`MatmulLaunch::dots`]' horizontal
/// sums over a short `k` are most of such an entry's time. An attention's per-head products at
/// three queries over 64 cached positions (batch 80 of 3x64x8 with `K^T` gathered, and 3x8x64)
/// took 55 and 44 us per launch that way.
const SMALL_MACS: usize = 1 << 15;

/// A small entry's `b` whose columns are not contiguous is gathered only below this `k` and from
/// [`SMALL_GATHER_MIN_N`] columns on. A gather costs about as much as 16 scalar loads here (AMD
/// EPYC, AVX-512): it pays against the dots' horizontal sum per output when there are many
/// outputs per row (three queries against 64 cached keys of 8: 55 -> 11 us per launch of 80
/// heads), not for a few (3x3x8 at 80 heads: 3.7 -> 7.6 us; 16x8x16 at 64 heads, against
/// `gemm`: 11.5 -> 16 us), and from `k = 64` on (a 32x10 classifier head over 64 features)
/// `gemm`'s packing costs less.
const SMALL_GATHER_MAX_K: usize = 32;

/// See [`SMALL_GATHER_MAX_K`].
const SMALL_GATHER_MIN_N: usize = 32;

/// The most elements of a small entry's `b` copied to rows on the stack when its columns are not
/// contiguous and not gathered: the copy costs less than `gemm`'s packing and fixed cost
/// (an attention's 16x16x8 and 16x8x16 per head).
const SMALL_COPY_MAX: usize = 1024;

/// Entries of at most this many rows against a `b` in rows also run through [`small_avx512`]
/// past [`SMALL_MACS`] (see [`MatmulLaunch::few_rows_wide`]).
const FEW_ROWS: usize = 8;

/// See [`FEW_ROWS`]: two blocks of rows at least (one row or four against a wide `b`, through
/// `small_avx512`, measured 1x16384x3 2.6 -> 3.4 us and 4x8192x16 7.8 -> 8.0 against `gemm`).
const FEW_ROWS_MIN: usize = 5;

/// See [`FEW_ROWS`]: a `k` of at most this many steps.
const FEW_ROWS_MAX_K: usize = 64;

/// See [`FEW_ROWS`]: at most this many multiply-adds, a few microseconds, below what a thread
/// split pays for (`small_avx512` runs an entry on one thread; 8x2048x64 took 14.4 us so
/// against 10.0 threaded through `gemm`).
const FEW_ROWS_MAX_MACS: u128 = 1 << 18;

/// Entries of at most this many steps of `k`, against a `b` in rows, with at least
/// [`TINY_K_MIN_M`] rows and [`TINY_K_MIN_N`] columns, run through [`tiny_k_avx512`]: a strip of 16
/// columns of `b`, all of `k`, is held in registers and every row of `a` runs against it, each
/// output one chain over `k`. `gemm` packs both operands and keeps `c`'s tile in registers over a
/// `k` too short to pay for either: the im2col product of a convolution of one input channel
/// (32x9x5408, conv-32's) took 30 us on two threads.
const TINY_K_MAX: usize = 16;

/// See [`TINY_K_MAX`]: rows enough that loading `b`'s strip once pays (fewer run through
/// [`small_avx512`] or `gemm`).
const TINY_K_MIN_M: usize = 8;

/// See [`TINY_K_MAX`].
const TINY_K_MIN_N: usize = 64;

/// The most steps of `k` a small entry may take over all its blocks: one step broadcasts a few
/// elements of `a` against at most four vectors of `b`, so a product whose blocks use a few
/// lanes each over a long `k` (a dot product of thousands) stays with `gemm` or the dots.
const SMALL_MAX_STEPS: usize = 512;

/// The most rows of `a` an entry may have to run through [`columns_avx512`] (see
/// [`MatmulLaunch::reads_columns`]).
const COLUMNS_MAX_M: usize = 64;

/// The shortest `k` whose weight is packed in panels ([`crate::panel`]); a shorter one is kept in
/// rows for `gemm`. The panel kernel stores each tile once per call and packs `a` first, which a
/// short `k` does not amortise: an attention's four `Linear`s (128x64x64, one thread) took 42 us
/// from panels against 32 from rows (`kiln profile model attention --launches 300`), where
/// dense-large's 784 and 1024 gained. Since the kernel reads `a` in place (s54), a 30x64x64
/// product takes 1.5 us from panels against 2.2 packing `a`, yet a minimum of 16 left the cached
/// Transformer's forward unchanged (`kiln bench transformer-compile --layers 2,8`, two
/// alternations: 3.06-3.24 and 4.96-5.01 ms either way).
const PANEL_MIN_K: usize = 256;

/// A threaded GEMM is cut into blocks of at least this many columns (or rows) per thread.
const GEMM_SPLIT_MIN: usize = 32;

/// From this many bytes of `b` per entry, a dot-shaped launch always threads (see
/// [`MatmulLaunch::streams_large_weight`]): one core streams about 20 GB/s here, so 2 MiB take
/// some 100 us alone, where waking the pool costs at most 77 us (#18). GPT-2's 768x2304 and
/// 768x3072 weights (7 and 9 MiB) were calibration candidates, run on one thread for five runs
/// of every new cached length; at 4 MiB its 768x768 ones (2.25 MiB, 48 per token) still were,
/// and calibration left most of them on one thread: a token at past length 8 took 21.2 ms
/// against 18.9 with them split (four alternations of `kiln bench decode --model gpt2`).
const DOT_ALWAYS_SPLIT_BYTES: usize = 2 << 20;

/// Dot products for fewer rows than this over a `b` of at least [`STREAM_BYTES_MIN`] take its
/// columns one at a time, each read front to back, rather than three side by side: a decoding
/// step's weight products are bound by memory bandwidth, and one stream of a weight's rows is
/// read faster than three rows interleaved (768x3072 f32, one row of `a`, one thread: 20.8 GB/s
/// against 13.7 in a standalone loop; `examples/gemv_bw`, two threads: 22-24 -> 28-35 GB/s, and
/// a GPT-2 small token at past 8 20.8-22.7 -> 15.1-15.2 ms, `kiln bench decode`). A small `b`
/// stays in cache, where three columns' independent chains of multiply-adds are what counts
/// (the dim-64 model's token: 0.016 ms with them, 0.020 without). The per-output arithmetic is
/// the same either way (one 16-lane accumulator, `k` in order), so a column's result does not
/// depend on the path that computed it.
const STREAM_ROWS_BELOW: usize = 4;

/// See [`STREAM_ROWS_BELOW`]: half of a 1 MiB L2.
const STREAM_BYTES_MIN: usize = 1 << 19;

/// From this many bytes of `b`, a dot-shaped launch splits its columns over the threads.
const DOT_PARALLEL_BYTES: usize = 1 << 18;

/// From this many multiply-adds, a dot-shaped launch with a smaller `b` splits its rows over
/// the threads (about 5 us on one core; the launch's calibration keeps the split only where it
/// gains).
const DOT_PARALLEL_MACS: u128 = 1 << 18;

/// The most elements of a column-major `b` that [`MatmulLaunch::gemm_rows`] copies to rows
/// whatever its column stride (256 KiB: the copy stays in L2).
const B_ROWS_MAX: usize = 1 << 16;

/// The most elements of a column-major `b` copied to rows when its columns lie a multiple of
/// [`B_ROWS_ALIASED_BYTES`] apart (16 MiB: the copy is kept by each thread that made it).
const B_ROWS_ALIASED_MAX: usize = 1 << 22;

/// Column strides (in bytes) that are multiples of this map `gemm`'s packing reads of 16 columns
/// into a few L1 sets (see [`MatmulLaunch::b_to_rows`]).
const B_ROWS_ALIASED_BYTES: usize = 2048;

/// Floats of padding after each row of a copy to rows: rows of a power-of-two length would
/// otherwise lie a multiple of 4 KiB apart, and the 16 rows each 16x16 block stores to would
/// share an L1 set (a 1024x1024 copy took 730 us unpadded, 117 padded).
const B_ROWS_PAD: usize = 16;

/// The largest `b` of a small entry that is prefetched two entries ahead. A batch of small
/// products whose `b`s lie apart (a cached attention's `Q K^T` and `P V` over 80 heads, each
/// head's 3-8 positions of 8 floats in its own 2 KiB of the cache) otherwise waits on each
/// entry's lines in turn: the cached GPT forward at depth 8 (`kiln profile transformer --layers
/// 8 --start-pos 2 --launches 40`, three alternations) took 24-25 us in its eight score
/// products against 37-38 without, 17-19 against 21-22 in its eight value products, and on its
/// first run (the cache not yet in L2) 32-47 against 55-90 and 23-40 against 39-60.
const PREFETCH_B_MAX: usize = 1024;

/// Asks for the `bytes` bytes at `p` (every line they touch) to be brought into L1.
#[inline]
fn prefetch(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let first = p as usize & !63;
        for line in (first..p as usize + bytes).step_by(64) {
            // SAFETY: a prefetch of any address is harmless.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}

/// Whether this CPU has AVX-512F ([`dotrxn_avx512`], [`columns_to_rows`], `crate::window`).
pub(crate) fn avx512_here() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `sum(x[p] * y[p] for p in 0..k)` in f32.
///
/// # Safety
/// `x` and `y` point to `k` readable `f32` each.
unsafe fn dot(x: *const f32, y: *const f32, k: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA; the caller's contract covers the reads.
        return unsafe { dot_avx2(x, y, k) };
    }
    let mut acc = [0.0f32; 8];
    let mut p = 0;
    while p + 8 <= k {
        for (l, a) in acc.iter_mut().enumerate() {
            // SAFETY: `p + l < k`.
            *a += unsafe { *x.add(p + l) * *y.add(p + l) };
        }
        p += 8;
    }
    let mut sum: f32 = acc.iter().sum();
    while p < k {
        // SAFETY: `p < k`.
        sum += unsafe { *x.add(p) * *y.add(p) };
        p += 1;
    }
    sum
}

/// [`dot`] with four 8-lane FMA accumulators (32 products in flight per iteration).
///
/// # Safety
/// As for [`dot`], on a CPU with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(x: *const f32, y: *const f32, k: usize) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: every load reads `[p, p + 8)` with `p + 8 <= k`, or the scalar tail below `k`.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut p = 0;
        while p + 32 <= k {
            for (l, a) in acc.iter_mut().enumerate() {
                let q = p + 8 * l;
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(q)), _mm256_loadu_ps(y.add(q)), *a);
            }
            p += 32;
        }
        while p + 8 <= k {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(p)), _mm256_loadu_ps(y.add(p)), acc[0]);
            p += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut sum = hsum_avx(v);
        while p < k {
            sum += *x.add(p) * *y.add(p);
            p += 1;
        }
        sum
    }
}

/// The sum of the eight lanes of `v`, in the order [`dot_avx2`] and [`dot4_avx2`] both use.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn hsum_avx(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let quad = _mm_add_ps(half, _mm_movehl_ps(half, half));
    _mm_cvtss_f32(_mm_add_ss(quad, _mm_shuffle_ps(quad, quad, 1)))
}

/// `[dot(x[r], y, k) for r in 0..4]`: four rows against one column, each chunk of `y` loaded
/// once for the four (the weight's column is read once per four rows of `a`).
///
/// # Safety
/// Each `x[r]` and `y` point to `k` readable `f32`.
unsafe fn dot4(x: [*const f32; 4], y: *const f32, k: usize) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA; the caller's contract covers the reads.
        return unsafe { dot4_avx2(x, y, k) };
    }
    // SAFETY: as above, one row at a time.
    x.map(|row| unsafe { dot(row, y, k) })
}

/// [`dot4`] with two 8-lane FMA accumulators per row (eight chains in flight).
///
/// # Safety
/// As for [`dot4`], on a CPU with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot4_avx2(x: [*const f32; 4], y: *const f32, k: usize) -> [f32; 4] {
    use std::arch::x86_64::*;
    // SAFETY: every load reads `[p, p + 8)` with `p + 8 <= k`, or the scalar tail below `k`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        let mut p = 0;
        while p + 16 <= k {
            let (y0, y1) = (_mm256_loadu_ps(y.add(p)), _mm256_loadu_ps(y.add(p + 8)));
            for (a, &row) in acc.iter_mut().zip(&x) {
                a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(p)), y0, a[0]);
                a[1] = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(p + 8)), y1, a[1]);
            }
            p += 16;
        }
        if p + 8 <= k {
            let y0 = _mm256_loadu_ps(y.add(p));
            for (a, &row) in acc.iter_mut().zip(&x) {
                a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(p)), y0, a[0]);
            }
            p += 8;
        }
        let mut out = [0f32; 4];
        for ((o, a), &row) in out.iter_mut().zip(&acc).zip(&x) {
            let v = _mm256_add_ps(a[0], a[1]);
            *o = hsum_avx(v);
            for q in p..k {
                *o += *row.add(q) * *y.add(q);
            }
        }
        out
    }
}

/// `out[r][j] = dot(x[r], y[j], k)` for `R` rows and `N` columns at once, with AVX-512F: one
/// 16-lane accumulator per output (`R * N` chains in flight), the last `k % 16` products through
/// a masked load into the same accumulator, then the lanes summed. Each chunk of a row is loaded
/// once for the `N` columns and each chunk of a column once for the `R` rows, so a 4x3 block
/// does 12 multiply-adds per 7 loads where [`dot4`] does 4 per 5. Every output is computed the
/// same way whatever `R` and `N`, so its result does not depend on the block it falls in (nor on
/// how the columns are split over threads). The rows left below a multiple of four (an
/// attention's three queries, a decoding step's one) take the same blocks with `R < 4`.
///
/// # Safety
/// Each `x[r]` and `y[j]` point to `k` readable `f32`, on a CPU with AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dotrxn_avx512<const R: usize, const N: usize>(
    x: [*const f32; R],
    y: [*const f32; N],
    k: usize,
) -> [[f32; N]; R] {
    use std::arch::x86_64::*;
    // SAFETY: every full load reads `[p, p + 16)` with `p + 16 <= k`; the masked tail reads only
    // the lanes below `k`.
    unsafe {
        // Plain loops, no closures: a closure here is compiled as a function of its own that
        // LLVM may leave out of line, and the reduction's closure once took 55% of a decoding
        // step's time that way (the tiny model's 0.023 ms per token became 0.043).
        let mut acc = [[_mm512_setzero_ps(); N]; R];
        let mut cols = [_mm512_setzero_ps(); N];
        let mut p = 0;
        while p + 16 <= k {
            for j in 0..N {
                cols[j] = _mm512_loadu_ps(y[j].add(p));
            }
            for r in 0..R {
                let row = _mm512_loadu_ps(x[r].add(p));
                for j in 0..N {
                    acc[r][j] = _mm512_fmadd_ps(row, cols[j], acc[r][j]);
                }
            }
            p += 16;
        }
        if p < k {
            let mask: __mmask16 = (1u16 << (k - p)) - 1;
            for j in 0..N {
                cols[j] = _mm512_maskz_loadu_ps(mask, y[j].add(p));
            }
            for r in 0..R {
                let row = _mm512_maskz_loadu_ps(mask, x[r].add(p));
                for j in 0..N {
                    acc[r][j] = _mm512_fmadd_ps(row, cols[j], acc[r][j]);
                }
            }
        }
        let mut out = [[0f32; N]; R];
        for r in 0..R {
            for j in 0..N {
                out[r][j] = _mm512_reduce_add_ps(acc[r][j]);
            }
        }
        out
    }
}

/// [`dotrxn_avx512`] for `R` rows and the first `w` (3 or 1) of `cols`, as a block of three
/// columns (the unused ones zero).
///
/// # Safety
/// As for [`dotrxn_avx512`], for the rows and the first `w` columns.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn wide_block<const R: usize>(
    rows: [*const f32; R],
    cols: [*const f32; 3],
    w: usize,
    k: usize,
) -> [[f32; 3]; R] {
    // SAFETY: the caller's contract.
    unsafe {
        if w == 3 {
            dotrxn_avx512::<R, 3>(rows, cols, k)
        } else {
            let one = dotrxn_avx512::<R, 1>(rows, [cols[0]], k);
            let mut out = [[0f32; 3]; R];
            for r in 0..R {
                out[r][0] = one[r][0];
            }
            out
        }
    }
}

/// `dst[j * dst_row + p] = src[p * src_row + j]` for a 16x16 block, in registers (three rounds
/// of shuffles: pairs of rows, pairs of pairs, then 128-bit lanes twice).
///
/// # Safety
/// Sixteen rows of sixteen `f32` at `src` and at `dst`; AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(src: *const f32, src_row: usize, dst: *mut f32, dst_row: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract covers the sixteen loads and stores.
    unsafe {
        // Plain loops, not `array::from_fn` closures (see `dotrxn_avx512`).
        let zero = _mm512_setzero_ps();
        let (mut r, mut t, mut u, mut v) = ([zero; 16], [zero; 16], [zero; 16], [zero; 16]);
        for (i, r) in r.iter_mut().enumerate() {
            *r = _mm512_loadu_ps(src.add(i * src_row));
        }
        // t[2g], t[2g + 1]: rows 2g and 2g + 1 interleaved (low and high halves of each lane).
        for i in 0..16 {
            let (a, b) = (r[i & !1], r[i | 1]);
            t[i] = if i & 1 == 0 { _mm512_unpacklo_ps(a, b) } else { _mm512_unpackhi_ps(a, b) };
        }
        // u[4g + w]: per 128-bit lane, one column of rows 4g..4g + 4.
        for (i, u) in u.iter_mut().enumerate() {
            let (g, w) = (i / 4, i % 4);
            let (lo, hi) = (t[4 * g + w / 2], t[4 * g + 2 + w / 2]);
            *u = if w % 2 == 0 { _mm512_shuffle_ps::<0x44>(lo, hi) } else { _mm512_shuffle_ps::<0xEE>(lo, hi) };
        }
        for (i, v) in v.iter_mut().enumerate() {
            let (h, w) = (i / 8, i % 8);
            let (a, b) = (u[8 * h + w % 4], u[8 * h + 4 + w % 4]);
            *v = if w < 4 { _mm512_shuffle_f32x4::<0x88>(a, b) } else { _mm512_shuffle_f32x4::<0xDD>(a, b) };
        }
        for i in 0..16 {
            let (a, b) = (v[i % 8], v[8 + i % 8]);
            let o = if i < 8 { _mm512_shuffle_f32x4::<0x88>(a, b) } else { _mm512_shuffle_f32x4::<0xDD>(a, b) };
            _mm512_storeu_ps(dst.add(i * dst_row), o);
        }
    }
}

/// `dst[p * ld + j] = src[j * col + p]` for `p < k`, `j < n`: a column-major `k x n` matrix
/// (columns `col` apart) copied to row-major (rows `ld >= n` apart), by 16x16 blocks
/// ([`transpose16`]) and element by element at the edges.
///
/// # Safety
/// `src` holds the matrix; `dst` holds `(k - 1) * ld + n` elements; AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn columns_to_rows(src: *const f32, col: usize, k: usize, n: usize, dst: *mut f32, ld: usize) {
    // SAFETY: every access is below `k` along columns and `n` across them.
    unsafe {
        for j0 in (0..n).step_by(16) {
            for p0 in (0..k).step_by(16) {
                if j0 + 16 <= n && p0 + 16 <= k {
                    transpose16(src.add(j0 * col + p0), col, dst.add(p0 * ld + j0), ld);
                } else {
                    for j in j0..(j0 + 16).min(n) {
                        for p in p0..(p0 + 16).min(k) {
                            *dst.add(p * ld + j) = *src.add(j * col + p);
                        }
                    }
                }
            }
        }
    }
}

/// `c (+)= a b` for an entry with `b`'s columns contiguous along `k` (a `Linear`'s `[out, in]`
/// weight read as `[in, out]`), read in place, with no copy of `b`: `a` is transposed into `at`
/// (rows padded to a multiple of 16), and each tile of `16 R` rows by `16 / R` columns keeps
/// `c`'s tile transposed in registers, one step `R` vectors of rows of `a^T` times each
/// column's element broadcast. `b` is read once per `16 R` rows, its columns in order along `k`
/// side by side; the tile is transposed back ([`transpose16`]) and stored row by row. Each
/// output is one chain of fused multiply-adds in `k` order, whatever its tile.
///
/// # Safety
/// `a`, `b`, `c` point to the entry's matrices with the launch's strides, inside their
/// buffers; `b.row == 1`, `c.col == 1`, `m <= COLUMNS_MAX_M`; AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn columns_avx512(l: &MatmulLaunch, a: *const f32, b: *const f32, c: *mut f32, at: &mut Vec<Line16>) {
    let mp = l.m.div_ceil(16) * 16;
    let lines = l.k * mp / 16;
    if at.len() < lines {
        at.resize(lines, Line16([0.0; 16]));
    }
    let t = at.as_mut_ptr() as *mut f32;
    // SAFETY: `at` holds `k * mp` elements; the caller's contract for the rest.
    unsafe {
        transpose_rows(l, a, t, mp);
        let mut i0 = 0;
        while i0 < l.m {
            if l.m - i0 > 16 {
                columns_rows::<2, 8>(l, t, mp, i0, b, c);
                i0 += 32;
            } else {
                columns_rows::<1, 16>(l, t, mp, i0, b, c);
                i0 += 16;
            }
        }
    }
}

/// `at[p * mp + i] = a[i][p]` for `i < m` (rows up to `mp` filled with copies of the last: lanes
/// [`columns_rows`] computes and never stores), `p < k`, by 16x16 blocks.
///
/// # Safety
/// `a` holds the entry's `m x k` matrix with the launch's strides; `at` holds `k * mp`
/// elements, `mp` a multiple of 16 at least `m`; AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_rows(l: &MatmulLaunch, a: *const f32, at: *mut f32, mp: usize) {
    use std::arch::x86_64::*;
    let (m, k) = (l.m, l.k);
    // SAFETY: every read is of `a`'s element `(min(i, m - 1), p)` with `p < k`; every write
    // below `k * mp`.
    unsafe {
        if l.a.col != 1 {
            for i in 0..mp {
                let row = a.offset(i.min(m - 1) as isize * l.a.row);
                for p in 0..k {
                    *at.add(p * mp + i) = *row.offset(p as isize * l.a.col);
                }
            }
            return;
        }
        let mut block = Line16s([Line16([0.0; 16]); 16]);
        for i0 in (0..mp).step_by(16) {
            for p0 in (0..k).step_by(16) {
                let mask: __mmask16 = if k - p0 >= 16 { 0xffff } else { (1u16 << (k - p0)) - 1 };
                for (r, line) in block.0.iter_mut().enumerate() {
                    let row = a.offset((i0 + r).min(m - 1) as isize * l.a.row + p0 as isize);
                    _mm512_storeu_ps(line.0.as_mut_ptr(), _mm512_maskz_loadu_ps(mask, row));
                }
                if k - p0 >= 16 {
                    transpose16(block.0.as_ptr() as *const f32, 16, at.add(p0 * mp + i0), mp);
                } else {
                    let mut out = Line16s([Line16([0.0; 16]); 16]);
                    transpose16(block.0.as_ptr() as *const f32, 16, out.0.as_mut_ptr() as *mut f32, 16);
                    for p in 0..k - p0 {
                        _mm512_storeu_ps(at.add((p0 + p) * mp + i0), _mm512_loadu_ps(out.0[p].0.as_ptr()));
                    }
                }
            }
        }
    }
}

/// The tiles of [`columns_avx512`] in rows `i0..i0 + 16 R` (those below `m` stored): `R`
/// vectors of rows by `N = 16 / R` columns, `R * N = 16` accumulators.
///
/// # Safety
/// As for [`columns_avx512`], with `at` its transposed `a` (`mp` apart).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn columns_rows<const R: usize, const N: usize>(
    l: &MatmulLaunch,
    at: *const f32,
    mp: usize,
    i0: usize,
    b: *const f32,
    c: *mut f32,
) {
    use std::arch::x86_64::*;
    let (m, n, k) = (l.m, l.n, l.k);
    let rows = (m - i0).min(16 * R);
    // SAFETY: `at` rows `i0..i0 + 16 R <= mp`; `b`'s columns clamped below `n`; `c`'s rows
    // below `m` and columns below `n` (masked).
    unsafe {
        let mut tile = Line16s([Line16([0.0; 16]); 16]);
        let mut out = Line16s([Line16([0.0; 16]); 16]);
        for j0 in (0..n).step_by(N) {
            let width = (n - j0).min(N);
            let mut cols = [b; N];
            for (jj, col) in cols.iter_mut().enumerate() {
                *col = b.offset((j0 + jj.min(width - 1)) as isize * l.b.col);
            }
            // The next tile's columns, one line of them asked for every step (their lines are
            // at most `k`: `N * k.div_ceil(16)`): a short column (four lines at `k = 64`) is
            // over before the hardware's prefetcher takes it up.
            let next = (j0 + N).min(n - 1);
            let mut acc = [[_mm512_setzero_ps(); R]; N];
            let mut x = at.add(i0);
            for p in 0..k {
                let (jj, line) = (p % N, 16 * (p / N));
                if line < k {
                    let col = b.offset((next + jj).min(n - 1) as isize * l.b.col);
                    _mm_prefetch::<_MM_HINT_T0>(col.add(line) as *const i8);
                }
                let mut v = [_mm512_setzero_ps(); R];
                for (r, v) in v.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(x.add(16 * r));
                }
                for jj in 0..N {
                    let w = _mm512_set1_ps(*cols[jj].add(p));
                    for r in 0..R {
                        acc[jj][r] = _mm512_fmadd_ps(w, v[r], acc[jj][r]);
                    }
                }
                x = x.add(mp);
            }
            let mask: __mmask16 = if width == 16 { 0xffff } else { (1u16 << width) - 1 };
            for r in 0..R {
                // Tile line `jj` is column `j0 + jj` of rows `i0 + 16 r ..`; transposed, line
                // `q` is row `i0 + 16 r + q`'s columns.
                for (line, column) in tile.0.iter_mut().zip(&acc) {
                    _mm512_storeu_ps(line.0.as_mut_ptr(), column[r]);
                }
                transpose16(tile.0.as_ptr() as *const f32, 16, out.0.as_mut_ptr() as *mut f32, 16);
                for q in 0..rows.saturating_sub(16 * r).min(16) {
                    let dst = c.offset((i0 + 16 * r + q) as isize * l.c.row + j0 as isize);
                    let mut v = _mm512_loadu_ps(out.0[q].0.as_ptr());
                    if l.accumulate {
                        v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, dst), v);
                    }
                    _mm512_mask_storeu_ps(dst, mask, v);
                }
            }
        }
    }
}

/// Sixteen lines: a 16x16 tile.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line16s([Line16; 16]);

/// `c (+)= a b` for columns `cols.0..cols.1` of an entry with a short `k` (see [`TINY_K_MAX`]),
/// `b`'s rows and `c`'s columns contiguous: panels of [`TINY_K_PANEL`] columns, each copied into
/// one contiguous block on the stack (`b`'s rows of a power-of-two width would otherwise share
/// L1's sets: 64x16x4096 ran at a third of the speed) and run four rows of `a` at a time, strip by
/// strip of 16 columns: the strip's `k` vectors, four chains of fused multiply-adds, each output
/// one chain in `k` order from zero as in [`small_block`]. Which columns a call takes never
/// changes an output's bits.
///
/// # Safety
/// `a`, `b`, `c` point to the entry's `[m, k]`, `[k, n]` and `[m, n]` matrices with the launch's
/// strides, inside their buffers; `b.col == 1`, `c.col == 1`, `1 <= k <= TINY_K_MAX`;
/// `cols.0 <= cols.1 <= n`; AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tiny_k_avx512(l: &MatmulLaunch, a: *const f32, b: *const f32, c: *mut f32, cols: (usize, usize)) {
    macro_rules! by_k {
        ($($k:literal)*) => {
            match l.k {
                // SAFETY: the caller's contract, with `K == k`.
                $($k => unsafe { tiny_k_panels::<$k>(l, a, b, c, cols) },)*
                _ => unreachable!("tiny_k checked 1 <= k <= TINY_K_MAX"),
            }
        };
    }
    by_k!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}

/// Strips of 16 columns in one panel of [`tiny_k_avx512`] (at most 16 KiB of `b`).
const TINY_K_PANEL: usize = 16;

/// [`tiny_k_avx512`] for `k == K`, its loops over `k` unrolled.
///
/// # Safety
/// As for [`tiny_k_avx512`], with `l.k == K`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline(never)]
unsafe fn tiny_k_panels<const K: usize>(
    l: &MatmulLaunch,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    cols: (usize, usize),
) {
    use std::arch::x86_64::*;
    // SAFETY: masked loads and stores touch only the columns below `cols.1 <= n`; every row and
    // `k` index is inside the entry (the caller's contract); the panel's reads stay below the
    // strips it filled.
    unsafe {
        let zero = _mm512_setzero_ps();
        let x = |i: usize, p: usize| _mm512_set1_ps(*a.offset(i as isize * l.a.row + p as isize * l.a.col));
        let mask = |j: usize| ((1u32 << (cols.1 - j).min(16)) - 1) as __mmask16;
        let store = |i: usize, j: usize, sum: __m512| {
            let out = c.offset(i as isize * l.c.row).add(j);
            let v = if l.accumulate { _mm512_add_ps(_mm512_maskz_loadu_ps(mask(j), out), sum) } else { sum };
            _mm512_mask_storeu_ps(out, mask(j), v);
        };
        // Strip `s` of the panel, step `p`: line `s * K + p` (left uninitialized: a panel reads
        // only the lines it wrote, and zeroing 16 KiB per call would cost a small product more).
        let mut panel = std::mem::MaybeUninit::<[Line16; TINY_K_PANEL * TINY_K_MAX]>::uninit();
        let lines = panel.as_mut_ptr() as *mut f32;
        let mut j0 = cols.0;
        while j0 < cols.1 {
            let strips = (cols.1 - j0).div_ceil(16).min(TINY_K_PANEL);
            for s in 0..strips {
                let j = j0 + 16 * s;
                for p in 0..K {
                    let v = _mm512_maskz_loadu_ps(mask(j), b.offset(p as isize * l.b.row).add(j));
                    _mm512_storeu_ps(lines.add(16 * (s * K + p)), v);
                }
            }
            let strip = |s: usize| {
                let mut bv = [zero; K];
                for (p, v) in bv.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(lines.add(16 * (s * K + p)));
                }
                bv
            };
            let mut i = 0;
            while i + 4 <= l.m {
                for s in 0..strips {
                    let bv = strip(s);
                    let mut acc = [zero; 4];
                    for (p, v) in bv.iter().enumerate() {
                        for (r, acc) in acc.iter_mut().enumerate() {
                            *acc = _mm512_fmadd_ps(x(i + r, p), *v, *acc);
                        }
                    }
                    for (r, &sum) in acc.iter().enumerate() {
                        store(i + r, j0 + 16 * s, sum);
                    }
                }
                i += 4;
            }
            while i < l.m {
                for s in 0..strips {
                    let mut acc = zero;
                    for (p, v) in strip(s).iter().enumerate() {
                        acc = _mm512_fmadd_ps(x(i, p), *v, acc);
                    }
                    store(i, j0 + 16 * s, acc);
                }
                i += 1;
            }
            j0 += 16 * strips;
        }
    }
}

/// The call of [`small_block`] for a block's `(rows, vectors, gather)`, one arm per listed
/// `(R, V, U)` with `b` loaded and one with it gathered.
#[cfg(target_arch = "x86_64")]
macro_rules! small_blocks {
    ($key:expr, $l:expr, $block:expr; $(($r:literal, $v:literal, $u:literal)),* $(,)?) => {
        match $key {
            $(
                ($r, $v, false) => small_block::<$r, $v, $u, false>($l, $block),
                ($r, $v, true) => small_block::<$r, $v, $u, true>($l, $block),
            )*
            _ => unreachable!("blocks have 1 to 4 rows and vectors"),
        }
    };
}

/// `c (+)= a b` for one small entry ([`MatmulLaunch::is_small`]) with AVX-512F: blocks of up to
/// four rows of `a` and 64 columns of `b`, `c`'s block in registers over the whole of `k`, each
/// step a broadcast element of `a` times a row of `b` (one load, or one gather when `b`'s
/// columns are not contiguous: a `K^T` read from the keys in place). Each output is one chain of
/// fused multiply-adds in `k` order, whatever the block it falls in.
///
/// # Safety
/// `a`, `b`, `c` point to the entry's `[m, k]`, `[k, n]` and `[m, n]` matrices with the launch's
/// strides, inside their buffers; `b`'s column stride fits a gather's offsets
/// ([`MatmulLaunch::is_small`]); AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn small_avx512(l: &MatmulLaunch, a: *const f32, b: *const f32, c: *mut f32) {
    if l.b.col != 1 && !l.small_gathers() {
        // `b` copied to contiguous rows on the stack (`is_small` bounded `k * n`), left
        // uninitialized past them: zeroing 4 KiB per entry doubled a 3x3x8 head's time.
        let mut rows = std::mem::MaybeUninit::<[f32; SMALL_COPY_MAX]>::uninit();
        let dst = rows.as_mut_ptr() as *mut f32;
        for j in 0..l.n {
            for p in 0..l.k {
                // SAFETY: element `(p, j)` of the entry's `b` (the caller's contract), written
                // below `k * n <= SMALL_COPY_MAX`.
                unsafe { *dst.add(p * l.n + j) = *b.offset(p as isize * l.b.row + j as isize * l.b.col) };
            }
        }
        let copy = MatmulLaunch { b: Strides { row: l.n as isize, col: 1, ..l.b }, ..l.clone() };
        // SAFETY: the first `k * n` elements of `rows`, all written above, hold the entry's `b`
        // with the copy's strides; nothing reads past them.
        return unsafe { small_avx512(&copy, a, dst, c) };
    }
    let gather = l.b.col != 1;
    let mut i = 0;
    while i < l.m {
        let rows = (l.m - i).min(4);
        let mut j = 0;
        while j < l.n {
            let left = l.n - j;
            let at = |p: *const f32, s: &Strides, r: usize, q: usize| {
                p.wrapping_offset(r as isize * s.row + q as isize * s.col)
            };
            let block = Block { a: at(a, &l.a, i, 0), b: at(b, &l.b, 0, j), c: at(c, &l.c, i, j) as *mut f32, left };
            // SAFETY: rows `i..i + rows` and columns `j..j + min(left, 64)` lie in the entry.
            unsafe {
                // `(R, V, U)`: rows, vectors of columns, accumulator sets (see `small_block`).
                small_blocks!((rows, left.div_ceil(16).min(4), gather), l, &block;
                    (1, 1, 4), (1, 2, 4), (1, 3, 4), (1, 4, 2),
                    (2, 1, 4), (2, 2, 2), (2, 3, 2), (2, 4, 1),
                    (3, 1, 4), (3, 2, 2), (3, 3, 1), (3, 4, 1),
                    (4, 1, 2), (4, 2, 1), (4, 3, 1), (4, 4, 1))
            }
            j += 64;
        }
        i += 4;
    }
}

/// One block of [`small_avx512`]: its first elements of `a`, `b` and `c`, and the columns left
/// from its first (it computes `min(left, 64)` of them).
struct Block {
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    left: usize,
}

/// `R` rows by `V` 16-lane vectors of columns (the last masked to `block.left`) of
/// [`small_avx512`], step `p` of `k` into accumulator set `p % U` (the last `k % U` steps into
/// set 0), the sets then summed in order. `U` (4 for at most three accumulators per set, 2 for
/// at most seven) keeps enough chains of multiply-adds in flight: three queries against eight
/// values of a head are three chains otherwise, each step waiting for the last.
///
/// # Safety
/// The block's `R` rows and `min(block.left, 16 V)` columns lie inside the entry's matrices;
/// `GATHER` when `b`'s column stride is not 1, which fits a gather's 32-bit offsets; AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline(never)]
unsafe fn small_block<const R: usize, const V: usize, const U: usize, const GATHER: bool>(
    l: &MatmulLaunch,
    block: &Block,
) {
    use std::arch::x86_64::*;
    // SAFETY: masked loads, gathers and stores touch only the lanes below `block.left`; every
    // row and `k` index is inside the entry (the caller's contract).
    unsafe {
        let zero = _mm512_setzero_ps();
        let mut masks = [0 as __mmask16; V];
        for (q, mask) in masks.iter_mut().enumerate() {
            let lanes = block.left.saturating_sub(16 * q).min(16);
            *mask = ((1u32 << lanes) - 1) as __mmask16;
        }
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let offsets = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(l.b.col as i32));
        // Plain loops over arrays (see `dotrxn_avx512`).
        let mut acc = [[[zero; V]; R]; U];
        let mut bv = [zero; V];
        // One step of `k` into accumulator set `u` (a constant in each unrolled use below, so
        // that the accumulators stay in registers).
        let step = |acc: &mut [[[__m512; V]; R]; U], bv: &mut [__m512; V], p: usize, u: usize| {
            let row = block.b.offset(p as isize * l.b.row);
            for q in 0..V {
                bv[q] = if GATHER {
                    let base = row.offset(16 * q as isize * l.b.col);
                    _mm512_mask_i32gather_ps::<4>(zero, masks[q], offsets, base)
                } else {
                    _mm512_maskz_loadu_ps(masks[q], row.add(16 * q))
                };
            }
            for (r, acc) in acc[u].iter_mut().enumerate() {
                let x = _mm512_set1_ps(*block.a.offset(r as isize * l.a.row + p as isize * l.a.col));
                for q in 0..V {
                    acc[q] = _mm512_fmadd_ps(x, bv[q], acc[q]);
                }
            }
        };
        let mut p = 0;
        while p + U <= l.k {
            for u in 0..U {
                step(&mut acc, &mut bv, p + u, u);
            }
            p += U;
        }
        while p < l.k {
            step(&mut acc, &mut bv, p, 0);
            p += 1;
        }
        for r in 0..R {
            for q in 0..V {
                let mut sum = acc[0][r][q];
                for set in &acc[1..] {
                    sum = _mm512_add_ps(sum, set[r][q]);
                }
                let out = block.c.offset(r as isize * l.c.row + 16 * q as isize * l.c.col);
                if l.c.col == 1 {
                    let v = if l.accumulate { _mm512_add_ps(_mm512_maskz_loadu_ps(masks[q], out), sum) } else { sum };
                    _mm512_mask_storeu_ps(out, masks[q], v);
                } else {
                    let mut lanes = [0f32; 16];
                    _mm512_storeu_ps(lanes.as_mut_ptr(), sum);
                    for (e, &x) in lanes.iter().enumerate().take(block.left.saturating_sub(16 * q).min(16)) {
                        let o = out.offset(e as isize * l.c.col);
                        *o = if l.accumulate { *o + x } else { x };
                    }
                }
            }
        }
    }
}

/// Starts, once per process, a background thread that reads the cache sizes `gemm` blocks its
/// products for. `gemm` reads them on its first product, from a file per cache level of every
/// CPU in `/sys/devices/system/cpu` (0.41-0.45 ms on this project's 2-CPU machine, more with more
/// CPUs), so a process's first run of a program with a `gemm` product paid that inside one
/// launch; a device calls this when it is made, well before its first run.
pub fn warm_up() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        // Without the thread (none could be started) the first product reads them as before.
        let _ = std::thread::Builder::new().name("kiln-gemm-init".into()).spawn(|| {
            let _ = &*gemm_common::cache::CACHE_INFO;
        });
    });
}

thread_local! {
    /// A column-major `b` copied to rows (see [`MatmulLaunch::gemm_rows`]).
    static B_ROWS: std::cell::RefCell<Vec<Line16>> = const { std::cell::RefCell::new(Vec::new()) };
    /// `a` transposed for [`columns_avx512`], kept for the next call.
    static A_COLUMNS: std::cell::RefCell<Vec<Line16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Sixteen f32 on a 64-byte boundary: the storage unit of a copy in rows, so that a row whose
/// start is a multiple of 16 elements from the first starts a cache line and each 16-wide store
/// of [`transpose16`] fills exactly one line. Unaligned, every such store straddled two lines:
/// a 1024x1024 copy took 406 us against 333 aligned on this Intel host (one thread, best of 30).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line16(pub(crate) [f32; 16]);

/// A weight packed once and kept across runs while the weight is the same (ONNX Runtime
/// prepacks constant weights when it creates a session): in panels of 32 columns for
/// [`crate::panel`]'s kernel, or in rows (a weight read by columns with a short `k` or in a small
/// entry, for `gemm` or [`small_avx512`]; see [`MatmulLaunch::with_packed_b`]). `gemm`
/// packs its `b` again on every call, and a column-major one slowly: dense-large's
/// (128x784)@(784x1024) and (128x1024)@(1024x1024) with their `Linear` weights as read (`[out,
/// in]`, columns of `b` contiguous) took 590 and 1955 us against about 565 and 700 from rows
/// (AMD EPYC host), and from panels the steady call of the whole model took 1.65 ms against 1.74
/// from rows (Intel host, `kiln bench onnx`, three alternations).
///
/// The copy pays only from a step's second run on: a step's first run (of a run state) reads
/// the weight in place and only notes it, and the second run makes the copy, as a tiered JIT
/// compiles code once it runs again. A program called once never copies its weights; the first
/// call of one called again does not wait for the copies (a GPT decoder's cached forward at
/// depth 8 copies 1.6 MB of weights, whose fresh pages cost 2 us each in this machine's virtual
/// machine: about half of its first run). After that, a changed weight (one updated every
/// training step) is copied again into the same storage.
///
/// "The same weight" is the same shared array: the copy holds a [`Weak`] reference to the
/// input's `Arc<HostData>`, and a shared `HostData` cannot change (it has no interior
/// mutability; `Arc::get_mut` fails while the `Weak` lives, and an array taken out with
/// `Arc::try_unwrap` to be written in place leaves the `Weak` dead, so the next run copies
/// again). The address and the launch's strides are compared too (an offset may move with a
/// symbol).
pub struct PackedWeight {
    /// The weight last seen (`lines` holds its copy when `valid`).
    source: Weak<HostData>,
    /// `(address of b's first element, k, n, row stride, column stride, in panels)`: one step may
    /// take either layout in different binding sets (a few rows run from rows, more from panels).
    key: (usize, usize, usize, isize, isize, bool),
    /// Empty until the second run.
    lines: Vec<Line16>,
    valid: bool,
}

impl PackedWeight {
    /// The copy of `launch`'s `b` (at `b`, the entry's first element, in the array `source`)
    /// for `copied` (`launch`'s [`MatmulLaunch::with_packed_b`]) from `copy`, made again unless
    /// it is one of the same array, address and shape; null on the step's first run (`copy` is
    /// `None`), which reads `b` in place.
    ///
    /// # Safety
    /// `b` points into `source`'s elements and holds the launch's `b` (its strides checked in
    /// `MatmulLaunch::new`); `copied` came from `launch.with_packed_b()`.
    pub unsafe fn refresh(
        copy: &mut Option<PackedWeight>,
        (launch, copied): (&MatmulLaunch, &MatmulLaunch),
        source: &Arc<HostData>,
        b: *mut u8,
        threaded: bool,
    ) -> *mut u8 {
        let key = (b as usize, launch.k, launch.n, launch.b.row, launch.b.col, copied.packed);
        let Some(c) = copy else {
            *copy = Some(PackedWeight { source: Arc::downgrade(source), key, lines: Vec::new(), valid: false });
            return std::ptr::null_mut();
        };
        let same = c.key == key && c.source.upgrade().is_some_and(|s| Arc::ptr_eq(&s, source));
        if !same && launch.b.col == 1 {
            // A weight in rows that changed since the last run (one updated every training step)
            // is read in place, as on a step's first run: `gemm` reads rows well, and a copy pays
            // only when the next run reads the same weight (dense-large's fit step took 7.3 ms
            // against 6.4 packing its backward's weights every step).
            c.source = Arc::downgrade(source);
            c.key = key;
            c.valid = false;
            return std::ptr::null_mut();
        }
        if !(same && c.valid) {
            let len = copied.copy_len();
            let lines = len.div_ceil(16);
            if c.lines.len() != lines {
                // A new copy is written once, not zeroed first: every element of `len` by the
                // copy below (padding included), the tail of the last line here.
                let mut fresh = Vec::<Line16>::with_capacity(lines);
                // SAFETY: the tail lies inside the reserved lines; the rest is written below
                // before anything reads it.
                unsafe {
                    std::ptr::write_bytes((fresh.as_mut_ptr() as *mut f32).add(len), 0, lines * 16 - len);
                    fresh.set_len(lines);
                }
                c.lines = fresh;
            }
            let dst = c.lines.as_mut_ptr() as *mut f32;
            // SAFETY: the caller's contract; `dst` holds `copy_len` floats on a cache line;
            // `with_packed_b` qualified the launch only on an AVX-512F host.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                if copied.packed {
                    crate::panel::pack(
                        b as *const f32,
                        (launch.b.row, launch.b.col),
                        launch.k,
                        launch.n,
                        dst,
                        threaded,
                    );
                } else {
                    // A copy in rows is of a weight read by columns (`with_packed_b`).
                    launch.copy_b_to_rows(b, dst, threaded);
                    for p in 0..launch.k {
                        std::ptr::write_bytes(dst.add(p * (launch.n + B_ROWS_PAD) + launch.n), 0, B_ROWS_PAD);
                    }
                }
            }
            c.source = Arc::downgrade(source);
            c.key = key;
            c.valid = true;
        }
        c.lines.as_mut_ptr() as *mut u8
    }
}

/// One operand, evaluated: element `(b, r, c)` is at `offset + b*batch + r*row + c*col`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strides {
    /// Parameter position of the buffer.
    pub param: usize,
    pub offset: isize,
    pub batch: isize,
    pub row: isize,
    pub col: isize,
}

/// A matmul launch with its sizes and strides evaluated for one binding set.
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulLaunch {
    pub dtype: DType,
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Strides,
    pub b: Strides,
    pub c: Strides,
    pub accumulate: bool,
    /// `b` is a weight packed in panels ([`PackedWeight`], [`crate::panel`]), not a strided
    /// matrix (`b`'s strides then name only its parameter).
    pub packed: bool,
}

fn eval_size(name: &str, e: &lower::kir::IExpr, syms: &[i64]) -> Result<usize> {
    let v = e.eval(&[], syms);
    usize::try_from(v).map_err(|_| RuntimeError::BadSize(format!("matmul {name} = {v} (from `{e}`)")))
}

fn eval_operand(name: &str, o: &MatOperand, syms: &[i64], n_params: usize) -> Result<Strides> {
    let param = o.buf as usize;
    if param >= n_params {
        return Err(RuntimeError::InvalidProgram(format!(
            "matmul operand {name} reads parameter b{param} of {n_params}"
        )));
    }
    let conv = |v: i64| {
        isize::try_from(v).map_err(|_| RuntimeError::BadSize(format!("matmul operand {name}: stride {v} too large")))
    };
    Ok(Strides {
        param,
        offset: conv(o.offset.eval(&[], syms))?,
        batch: conv(o.batch_stride.eval(&[], syms))?,
        row: conv(o.row_stride.eval(&[], syms))?,
        col: conv(o.col_stride.eval(&[], syms))?,
    })
}

/// Checks that every element of a `[batch, rows, cols]` operand lies in `0..numel`.
fn check_bounds(name: &str, s: &Strides, batch: usize, rows: usize, cols: usize, numel: usize) -> Result<()> {
    if batch == 0 || rows == 0 || cols == 0 {
        return Ok(());
    }
    let (mut lo, mut hi) = (s.offset as i128, s.offset as i128);
    for (extent, stride) in [(batch, s.batch), (rows, s.row), (cols, s.col)] {
        let span = (extent as i128 - 1) * stride as i128;
        if span < 0 {
            lo += span;
        } else {
            hi += span;
        }
    }
    if lo < 0 || hi >= numel as i128 {
        return Err(RuntimeError::InvalidProgram(format!(
            "matmul operand {name} spans elements {lo}..={hi} of a buffer of {numel}"
        )));
    }
    Ok(())
}

impl MatmulLaunch {
    /// Evaluates `kernel` with symbol values `syms`; `numel[p]` is the element count of the buffer
    /// bound to parameter `p`.
    pub fn new(kernel: &MatmulKernel, syms: &[i64], numel: &[usize]) -> Result<MatmulLaunch> {
        let np = kernel.params.len();
        let launch = MatmulLaunch {
            dtype: kernel.dtype,
            batch: eval_size("batch", &kernel.batch, syms)?,
            m: eval_size("m", &kernel.m, syms)?,
            n: eval_size("n", &kernel.n, syms)?,
            k: eval_size("k", &kernel.k, syms)?,
            a: eval_operand("a", &kernel.a, syms, np)?,
            b: eval_operand("b", &kernel.b, syms, np)?,
            c: eval_operand("c", &kernel.c, syms, np)?,
            accumulate: kernel.accumulate,
            packed: false,
        };
        let (batch, m, n, k) = (launch.batch, launch.m, launch.n, launch.k);
        for (p, name) in [(&kernel.a, "a"), (&kernel.b, "b"), (&kernel.c, "c")] {
            let dtype = kernel.params[p.buf as usize].dtype;
            if dtype != kernel.dtype {
                return Err(RuntimeError::InvalidProgram(format!(
                    "matmul of {} has operand {name} of dtype {dtype}",
                    kernel.dtype
                )));
            }
        }
        let len = |s: &Strides| numel.get(s.param).copied().unwrap_or(0);
        check_bounds("a", &launch.a, batch, m, k, len(&launch.a))?;
        check_bounds("b", &launch.b, batch, k, n, len(&launch.b))?;
        check_bounds("c", &launch.c, batch, m, n, len(&launch.c))?;
        match launch.dtype {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::I32 | DType::I64 => Ok(launch),
            DType::Bool => Err(RuntimeError::unsupported_dtype("matmul", DType::Bool)),
        }
    }

    /// Whether the launch stores every element of a `c` buffer of `numel` elements without reading
    /// it first: it does not accumulate, `k > 0` (so every product is computed, not skipped), and
    /// `c` is the whole buffer in row-major `[batch, m, n]` order.
    pub fn writes_all_of_c(&self, numel: usize) -> bool {
        let (m, n) = (self.m as isize, self.n as isize);
        let c = &self.c;
        !self.accumulate
            && self.k > 0
            && self.batch.checked_mul(self.m).and_then(|x| x.checked_mul(self.n)) == Some(numel)
            && c.offset == 0
            && (c.col == 1 || self.n <= 1)
            && (c.row == n || self.m <= 1)
            && (c.batch == m * n || self.batch <= 1)
    }

    /// Multiply-adds the launch performs.
    pub fn macs(&self) -> u128 {
        self.batch as u128 * self.m as u128 * self.n as u128 * self.k as u128
    }

    /// Whether [`MatmulLaunch::run`] spreads this launch over the threads.
    pub fn threads_itself(&self) -> bool {
        parallel::threads() > 1 && self.macs() >= PARALLEL_MIN_MACS
    }

    /// Whether this is dot products over at least [`DOT_ALWAYS_SPLIT_BYTES`] of `b` per entry
    /// (a decoding step's weight product): bound by memory bandwidth, one core's share of it
    /// takes longer than the slowest wake-up of the pool, so the split needs no calibration.
    pub fn streams_large_weight(&self) -> bool {
        self.is_dot_shaped() && self.k * self.n * self.dtype.size_bytes() >= DOT_ALWAYS_SPLIT_BYTES
    }

    /// [`MatmulLaunch::run`] when `threads`, else the whole launch on the calling thread, each GEMM
    /// single-threaded (a step of a level whose steps run at the same time).
    ///
    /// # Safety
    /// As for [`MatmulLaunch::run`].
    pub unsafe fn run_threads(&self, args: *const *mut u8, threads: bool) {
        if threads {
            // SAFETY: the caller keeps `run`'s contract.
            unsafe { self.run(args) }
        } else {
            // SAFETY: as in `run`: one pointer per parameter, `new` checked `param < len`.
            let (a, b, c) = unsafe { (*args.add(self.a.param), *args.add(self.b.param), *args.add(self.c.param)) };
            // SAFETY: every entry lies inside its buffers (checked in `new`).
            unsafe { self.run_entries((SendPtr(a), SendPtr(b), SendPtr(c)), 0, self.batch, false) }
        }
    }

    /// Runs `copied` (this launch's [`MatmulLaunch::with_packed_b`]) on this launch's `a` and `c`
    /// in `args` and the copy of `b` at `rows`.
    ///
    /// # Safety
    /// As for [`MatmulLaunch::run`] on `args`; `rows` holds the copy of this launch's `b`
    /// ([`PackedWeight::refresh`]).
    pub unsafe fn run_with_copy(&self, copied: &MatmulLaunch, args: *const *mut u8, rows: *mut u8, threads: bool) {
        // SAFETY: the caller's contract; `copied` reads its operands at 0, 1 and 2.
        unsafe {
            let ptrs = [*args.add(self.a.param), rows, *args.add(self.c.param)];
            copied.run_threads(ptrs.as_ptr(), threads)
        }
    }

    /// Runs the launch on the buffers `args[param]`.
    ///
    /// # Safety
    /// `args` must point to one valid buffer pointer per kernel parameter, each buffer holding at
    /// least the element count `new` was given for it, with `c`'s buffer writable and not read
    /// through `a` or `b` elsewhere during the call.
    pub unsafe fn run(&self, args: *const *mut u8) {
        // SAFETY: the caller guarantees one pointer per parameter; `new` checked `param < len`.
        let (a, b, c) = unsafe { (*args.add(self.a.param), *args.add(self.b.param), *args.add(self.c.param)) };
        let ptrs = (SendPtr(a), SendPtr(b), SendPtr(c));
        let macs_per_entry = self.m as u128 * self.n as u128 * self.k as u128;
        let threads = parallel::threads();
        let split_batch = macs_per_entry < SPLIT_BATCH_BELOW || self.batch.is_multiple_of(threads);
        if self.batch > 1 && split_batch && self.macs() >= PARALLEL_MIN_MACS && threads > 1 {
            parallel::for_chunks(self.batch, threads, &|lo, hi| {
                // SAFETY: batch entries `lo..hi` are within the checked bounds; distinct chunks
                // write distinct entries of `c` (the lowering never aliases c's batch entries).
                unsafe { self.run_entries(ptrs, lo, hi, false) }
            });
        } else {
            // SAFETY: as above, on the calling thread (GEMM may thread internally).
            unsafe { self.run_entries(ptrs, 0, self.batch, threads > 1) }
        }
    }

    /// Runs batch entries `lo..hi` one after another.
    unsafe fn run_entries(&self, ptrs: (SendPtr, SendPtr, SendPtr), lo: usize, hi: usize, threaded: bool) {
        let size = self.dtype.size_bytes();
        let at = |p: &SendPtr, s: &Strides, entry: usize| {
            (p.get() as isize + (s.offset + entry as isize * s.batch) * size as isize) as *mut u8
        };
        #[cfg(target_arch = "x86_64")]
        if self.packed {
            for entry in lo..hi {
                let (a, c) = (at(&ptrs.0, &self.a, entry), at(&ptrs.2, &self.c, entry));
                // SAFETY: the entry's `a` and `c` lie inside their buffers (checked in `new`);
                // `b` is the weight packed for this launch (`with_packed_b`, `refresh`), which
                // qualified it only on an AVX-512F host.
                unsafe {
                    crate::panel::gemm(
                        (self.m, self.n, self.k),
                        a as *const f32,
                        (self.a.row, self.a.col),
                        ptrs.1.get() as *const f32,
                        c as *mut f32,
                        self.c.row,
                        self.accumulate,
                        threaded,
                    )
                }
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.is_small() {
            if self.b_copied_once(hi - lo) {
                // One copy of the shared `b` in rows for every entry and block of rows, which
                // would each gather it again (an LSTM's input projection: ten time steps times
                // four blocks of rows, 10.2 -> 2.9 us).
                let mut rows = std::mem::MaybeUninit::<[f32; SMALL_COPY_MAX]>::uninit();
                let dst = rows.as_mut_ptr() as *mut f32;
                let b = at(&ptrs.1, &self.b, lo) as *const f32;
                // SAFETY: `b` is every entry's `k x n` matrix, rows 1 apart and columns `b.col`
                // (checked by `b_copied_once`); `rows` holds `k * n <= SMALL_COPY_MAX`
                // elements; `is_small` checked AVX-512F.
                unsafe { columns_to_rows(b, self.b.col as usize, self.k, self.n, dst, self.n) };
                let copy = MatmulLaunch { b: Strides { row: self.n as isize, col: 1, ..self.b }, ..self.clone() };
                for entry in lo..hi {
                    let (a, c) = (at(&ptrs.0, &self.a, entry), at(&ptrs.2, &self.c, entry));
                    // SAFETY: as below, with `b` the copy written above.
                    unsafe { small_avx512(&copy, a as *const f32, dst, c as *mut f32) };
                }
                return;
            }
            // Each entry's own small `b` (an attention head's keys or values in a cache, 2 KiB
            // from the next head's) is asked for two entries ahead (see `PREFETCH_B_MAX`).
            let ahead = self.b_span_bytes().filter(|&bytes| self.b.batch != 0 && bytes <= PREFETCH_B_MAX);
            for entry in lo..hi {
                if let Some(bytes) = ahead
                    && entry + 2 < hi
                {
                    prefetch(at(&ptrs.1, &self.b, entry + 2), bytes);
                }
                let (a, b, c) = (at(&ptrs.0, &self.a, entry), at(&ptrs.1, &self.b, entry), at(&ptrs.2, &self.c, entry));
                // SAFETY: the entry's operands lie inside their buffers (checked in `new`);
                // `is_small` checked AVX-512F and the gather offsets.
                unsafe { small_avx512(self, a as *const f32, b as *const f32, c as *mut f32) };
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.tiny_k() {
            let strips = self.n.div_ceil(16);
            for entry in lo..hi {
                let (a, b, c) = (at(&ptrs.0, &self.a, entry), at(&ptrs.1, &self.b, entry), at(&ptrs.2, &self.c, entry));
                let (a, b, c) = (SendPtr(a), SendPtr(b), SendPtr(c));
                let part = |s0: usize, s1: usize| {
                    // SAFETY: the entry's operands lie inside their buffers (checked in `new`);
                    // `tiny_k` checked the layout, `k` and AVX-512F; columns `16 s0..` below
                    // `n`, disjoint between parts.
                    unsafe {
                        tiny_k_avx512(
                            self,
                            a.get() as *const f32,
                            b.get() as *const f32,
                            c.get() as *mut f32,
                            (16 * s0, (16 * s1).min(self.n)),
                        )
                    }
                };
                if threaded {
                    parallel::for_chunks(strips, parallel::threads(), &part);
                } else {
                    part(0, strips);
                }
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if !threaded && self.reads_columns() {
            A_COLUMNS.with_borrow_mut(|buf| {
                for entry in lo..hi {
                    let (a, b, c) =
                        (at(&ptrs.0, &self.a, entry), at(&ptrs.1, &self.b, entry), at(&ptrs.2, &self.c, entry));
                    // SAFETY: the entry's operands lie inside their buffers (checked in `new`);
                    // `reads_columns` checked the layout, `m` and AVX-512F.
                    unsafe { columns_avx512(self, a as *const f32, b as *const f32, c as *mut f32, buf) };
                }
            });
            return;
        }
        if self.dtype == DType::F32 && !self.is_dot_shaped() && self.b_to_rows() {
            // SAFETY: as below; `gemm_rows` copies each distinct `b` once.
            unsafe {
                self.gemm_rows(
                    (lo..hi).map(|e| (at(&ptrs.0, &self.a, e), at(&ptrs.1, &self.b, e), at(&ptrs.2, &self.c, e))),
                    threaded,
                )
            };
            return;
        }
        for entry in lo..hi {
            let (a, b, c) = (at(&ptrs.0, &self.a, entry), at(&ptrs.1, &self.b, entry), at(&ptrs.2, &self.c, entry));
            // SAFETY: the entry's operands lie inside their buffers (checked in `new`).
            unsafe {
                match self.dtype {
                    DType::F32 if self.is_dot_shaped() => self.dots(a, b, c, threaded),
                    DType::F32 => self.gemm::<f32>(a, b, c, threaded),
                    DType::F64 => self.gemm::<f64>(a, b, c, threaded),
                    DType::F16 => self.naive::<f16>(a, b, c),
                    DType::BF16 => self.naive::<bf16>(a, b, c),
                    DType::I32 => self.naive::<i32>(a, b, c),
                    DType::I64 => self.naive::<i64>(a, b, c),
                    DType::Bool => {}
                }
            }
        }
    }

    /// Bytes from an entry's first element of `b` to just past its last, for non-negative
    /// strides.
    fn b_span_bytes(&self) -> Option<usize> {
        let (row, col) = (usize::try_from(self.b.row).ok()?, usize::try_from(self.b.col).ok()?);
        let last = self.k.checked_sub(1)?.checked_mul(row)?.checked_add(self.n.checked_sub(1)?.checked_mul(col)?)?;
        last.checked_add(1)?.checked_mul(self.dtype.size_bytes())
    }

    /// Whether an f32 entry runs through [`small_avx512`]: at most [`SMALL_MACS`] multiply-adds
    /// in at most [`SMALL_MAX_STEPS`] steps, or a few rows against a wide `b` in rows
    /// ([`MatmulLaunch::few_rows_wide`]); `b`'s rows contiguous, or its columns gathered
    /// ([`MatmulLaunch::small_gathers`]), or `b` at most [`SMALL_COPY_MAX`] elements, on an
    /// AVX-512F host. Dot-shaped entries stay dot products unless gathered: a few short dots
    /// (three queries against three keys of 8) cost less than the copy (18 against 30 ns).
    fn is_small(&self) -> bool {
        let macs = self.m as u128 * self.n as u128 * self.k as u128;
        let steps = self.m.div_ceil(4) as u128 * self.n.div_ceil(64) as u128 * self.k as u128;
        let wide = self.few_rows_wide();
        self.dtype == DType::F32
            && ((macs <= SMALL_MACS as u128 && steps <= SMALL_MAX_STEPS as u128) || wide)
            && (self.b.col == 1 || self.small_gathers() || self.k * self.n <= SMALL_COPY_MAX)
            && (self.small_gathers() || !self.is_dot_shaped())
            && avx512_here()
    }

    /// Whether an f32 entry whose `b` has its columns contiguous along `k` (a `Linear`'s weight)
    /// runs through [`columns_avx512`], which reads `b` in place: more rows than the dot
    /// products take and at most [`COLUMNS_MAX_M`], at least 16 columns, not small, `c`'s
    /// columns contiguous, an AVX-512F host.
    fn reads_columns(&self) -> bool {
        self.dtype == DType::F32
            && self.b.row == 1
            && self.c.col == 1
            && self.m <= COLUMNS_MAX_M
            && self.n >= 16
            && !self.is_dot_shaped()
            && !self.is_small()
            && avx512_here()
    }

    /// Whether an f32 entry runs through [`tiny_k_avx512`] (see [`TINY_K_MAX`]): `b`'s rows and
    /// `c`'s columns contiguous, not small, an AVX-512F host.
    fn tiny_k(&self) -> bool {
        self.dtype == DType::F32
            && (1..=TINY_K_MAX).contains(&self.k)
            && self.m >= TINY_K_MIN_M
            && self.n >= TINY_K_MIN_N
            && self.b.col == 1
            && self.c.col == 1
            && !self.is_small()
            && avx512_here()
    }

    /// Whether an entry is [`FEW_ROWS_MIN`] to [`FEW_ROWS`] rows against a `b` in rows of at most
    /// [`FEW_ROWS_MAX_K`] steps and at most [`FEW_ROWS_MAX_MACS`] multiply-adds: each block of
    /// [`small_avx512`] then reads its columns of `b` once, where `gemm` packs all of `b` for a
    /// few rows (a convolution stem's im2col product, 8x1024x27: 3.9 -> 3.1 us on one thread;
    /// 6x1000x9 1.8 -> 1.3).
    fn few_rows_wide(&self) -> bool {
        self.b.col == 1
            && (FEW_ROWS_MIN..=FEW_ROWS).contains(&self.m)
            && self.k <= FEW_ROWS_MAX_K
            && self.m as u128 * self.n as u128 * self.k as u128 <= FEW_ROWS_MAX_MACS
    }

    /// Whether `entries` small entries that share one `b` (batch stride 0, a weight) with
    /// columns contiguous along `k` copy it to rows once, rather than gather it once per block
    /// of four rows of every entry: when that is two gathers of it or more.
    fn b_copied_once(&self, entries: usize) -> bool {
        self.b.batch == 0
            && self.b.row == 1
            && self.b.col > 1
            && self.small_gathers()
            && self.k * self.n <= SMALL_COPY_MAX
            && entries * self.m.div_ceil(4) >= 2
    }

    /// Whether a small entry's `b` with columns not contiguous is gathered (see
    /// [`SMALL_GATHER_MAX_K`]; a column stride whose 16 lanes fit 32-bit offsets) rather than
    /// copied to rows, or, for a few rows of dot products, rather than computed as dots.
    fn small_gathers(&self) -> bool {
        self.b.col != 1
            && self.k < SMALL_GATHER_MAX_K
            && (self.n >= SMALL_GATHER_MIN_N || self.gathers_over_dots())
            && self.b.col.unsigned_abs() <= i32::MAX as usize / 64
    }

    /// Whether a dot-shaped entry with a short `k` (below [`SMALL_GATHER_MAX_K`]) runs faster
    /// gathered: a block of up to four rows costs `k` gathers whatever its columns, the dots one
    /// horizontal sum per output, so the gathers pay from about `1.25 k` outputs and 4 columns.
    /// Medians of 2000 launches of 80 entries, `b` column-major (`K^T`), Intel Xeon with AVX-512,
    /// dots against gathers: 3x3x8 2.10 / 2.40 us, 3x4x8 2.76 / 2.35, 3x8x8 (the cached
    /// Transformer's attention scores) 4.92 / 2.38, 1x16x8 4.42 / 2.17, 3x5x16 3.56 / 3.84,
    /// 3x8x16 5.06 / 3.97, 3x5x24 3.44 / 4.09 (64 entries), 3x16x24 7.62 / 4.48.
    fn gathers_over_dots(&self) -> bool {
        self.is_dot_shaped() && self.n >= 4 && 4 * self.m * self.n >= 5 * self.k
    }

    /// Whether an f32 entry is a few rows of dot products: at most `DOT_ALWAYS_M` rows of `a`
    /// (or `DOT_MAX_M` with `k >= DOT_MIN_K`) and every
    /// column of `b` contiguous along `k` (a vector or a few tokens times a `Linear`'s
    /// `[out, in]` weight, read as `[in, out]` column-major). `gemm` packs `b` for such shapes,
    /// which costs as much as the product; [`MatmulLaunch::dots`] streams `b` once instead.
    /// So is any number of rows against fewer than [`DOT_NARROW_N`] such columns with `k >=
    /// DOT_MIN_K` (a classifier's head: `b` stays in cache for every block of rows, where
    /// `gemm`'s kernels fill only part of their width).
    fn is_dot_shaped(&self) -> bool {
        let rows = self.m <= DOT_ALWAYS_M || (self.m <= DOT_MAX_M && self.k >= DOT_MIN_K);
        let narrow = self.n < DOT_NARROW_N && self.k >= DOT_MIN_K;
        (rows || narrow) && self.a.col == 1 && self.b.row == 1 && self.k >= 8
    }

    /// Whether an f32 entry's column-major `b` (a `Linear`'s `[out, in]` weight) is copied to rows
    /// before `gemm` ([`Self::gemm_rows`]): where the host has AVX-512F and `b` is at least 16x16
    /// (or at least 16 columns shared by every entry of a batch: one copy for all) and either at
    /// most [`B_ROWS_MAX`] elements or, up to [`B_ROWS_ALIASED_MAX`], with columns a multiple of
    /// [`B_ROWS_ALIASED_BYTES`] apart. `gemm` packs a small column-major `b` slowly: a
    /// recurrent step's 16x128x32 took 1.74 us that way and 0.74 with a row-major `b`, the copy
    /// 0.24 us (a standalone `gemm` 0.19 timing). It packs a large one slowly when its columns
    /// lie 2 KiB-multiples apart: (128x1024)@(1024x1024) took 2441 us column-major against 698
    /// row-major plus 117 for the copy (dense-large's second layer), 128x768x3072 4532 against
    /// 2002 + 623, 128x2048x512 1353 against 758 + 127; but 128x3072x768 (columns 3 KiB apart)
    /// 2574 against 2040 + 666, so other strides keep `gemm`'s packing (medians of 25 calls of
    /// `MatmulLaunch::run` and of the copy alone, AMD EPYC with AVX-512, 2 threads).
    fn b_to_rows(&self) -> bool {
        let shared = self.batch > 1 && self.b.batch == 0;
        let elements = self.k * self.n;
        let aliased = (self.b.col as usize * 4).is_multiple_of(B_ROWS_ALIASED_BYTES);
        self.b.row == 1
            && self.b.col >= self.k as isize
            && (self.k >= 16 || shared)
            && self.n >= 16
            && (elements <= B_ROWS_MAX || (aliased && elements <= B_ROWS_ALIASED_MAX))
            && avx512_here()
    }

    /// Entries `(a, b, c)` through `gemm` with their column-major `b` first copied to rows, in a
    /// buffer of the calling thread (kept for the next call); consecutive entries that share
    /// their `b` (a weight broadcast over the batch) share one copy.
    unsafe fn gemm_rows(&self, entries: impl Iterator<Item = (*mut u8, *mut u8, *mut u8)>, threaded: bool) {
        let (k, ld) = (self.k, self.n + B_ROWS_PAD);
        B_ROWS.with_borrow_mut(|lines| {
            let need = (k * ld).div_ceil(16);
            if lines.len() < need {
                lines.resize(need, Line16([0.0; 16]));
            }
            let rows = lines.as_mut_ptr() as *mut f32;
            let launch = MatmulLaunch { b: Strides { row: ld as isize, col: 1, ..self.b }, ..self.clone() };
            let mut copied: Option<*mut u8> = None;
            for (a, b, c) in entries {
                if copied != Some(b) {
                    // SAFETY: `b` holds the entry's matrix (checked in `new`); `rows` holds
                    // `k * ld`; `b_to_rows` found AVX-512F.
                    unsafe { self.copy_b_to_rows(b, rows, threaded) };
                    copied = Some(b);
                }
                // SAFETY: as for `gemm`, with `b` now the row-major copy.
                unsafe { launch.gemm::<f32>(a, rows as *mut u8, c, threaded) }
            }
        })
    }

    /// Copies one entry's column-major `b` (at `b`, columns `b.col` apart) to rows `n +
    /// B_ROWS_PAD` apart at `rows`, by column blocks split over the threads when `threaded` and
    /// `b` is large.
    ///
    /// # Safety
    /// `b` holds the entry's `k x n` matrix with the launch's strides; `rows` holds `k * (n +
    /// B_ROWS_PAD)` elements; the host has AVX-512F.
    unsafe fn copy_b_to_rows(&self, b: *mut u8, rows: *mut f32, threaded: bool) {
        #[cfg(target_arch = "x86_64")]
        {
            let (k, n, ld) = (self.k, self.n, self.n + B_ROWS_PAD);
            let (src, dst) = (SendPtr(b), SendPtr(rows as *mut u8));
            let col = self.b.col as usize;
            // Columns `16 * lo .. 16 * hi` of the copy.
            let copy = |lo: usize, hi: usize| {
                let (lo, hi) = (lo * 16, (hi * 16).min(n));
                let (src, dst) = (src.get() as *const f32, dst.get() as *mut f32);
                // SAFETY: the caller's contract; distinct column ranges write distinct elements.
                unsafe { columns_to_rows(src.add(lo * col), col, k, hi - lo, dst.add(lo), ld) }
            };
            let blocks = n.div_ceil(16);
            let threads = parallel::threads();
            if threaded && threads > 1 && k * n >= B_ROWS_MAX {
                parallel::for_chunks(blocks, threads, &copy);
            } else {
                copy(0, blocks);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (b, rows, threaded);
    }

    /// This launch with its `b` replaced by a copy kept across runs, where one pays (see
    /// [`PackedWeight`]): f32, one `b` for every batch entry with its rows or its columns
    /// contiguous, not dot-shaped, `b` at least 16x16 and at most [`B_ROWS_ALIASED_MAX`]
    /// elements, an AVX-512F host. The copy is in panels ([`crate::panel`], `packed`; `k` at
    /// least [`PANEL_MIN_K`], `c`'s columns contiguous), else, for a weight read by columns, in
    /// rows `n + B_ROWS_PAD` apart (for `gemm`, or [`small_avx512`]: an RNN step's 16x128x32); a
    /// weight read by rows gains nothing from a copy in rows. It runs on `[a, copy, c]` as its
    /// parameters 0, 1 and 2 ([`MatmulLaunch::run_with_copy`]).
    pub fn with_packed_b(&self) -> Option<MatmulLaunch> {
        let b = &self.b;
        let columns = b.row == 1 && b.col >= self.k as isize;
        let rows = b.col == 1 && b.row >= self.n as isize;
        let fits = self.dtype == DType::F32
            && (self.batch == 1 || b.batch == 0)
            && (columns || rows)
            && self.k >= 16
            && self.n >= 16
            && self.k * self.n <= B_ROWS_ALIASED_MAX
            && !self.is_dot_shaped()
            && avx512_here();
        if !fits {
            return None;
        }
        // Run on the three pointers `[a, copy, c]` (see `run_with_copy`).
        let (a, c) = (Strides { param: 0, ..self.a }, Strides { param: 2, ..self.c });
        let in_rows = Strides { param: 1, offset: 0, batch: 0, row: (self.n + B_ROWS_PAD) as isize, col: 1 };
        let copy = MatmulLaunch { a, b: in_rows, c, ..self.clone() };
        if copy.is_small() || self.k < PANEL_MIN_K || self.c.col != 1 {
            return columns.then_some(copy);
        }
        Some(MatmulLaunch { b: Strides { row: crate::panel::NR as isize, ..in_rows }, packed: true, ..copy })
    }

    /// Elements of the copy of `b` this launch (from [`MatmulLaunch::with_packed_b`]) reads.
    pub fn copy_len(&self) -> usize {
        if self.packed { crate::panel::packed_len(self.k, self.n) } else { self.k * (self.n + B_ROWS_PAD) }
    }

    /// `c[i][j] (+)= dot(a[i, :], b[:, j])` for one entry of a dot-shaped launch: columns of `b`
    /// split over the threads when `threaded` and `b` is large enough to be read from memory,
    /// where two cores stream more than one.
    unsafe fn dots(&self, a: *mut u8, b: *mut u8, c: *mut u8, threaded: bool) {
        let (a, b, c) = (SendPtr(a), SendPtr(b), SendPtr(c));
        let bytes = self.n * self.k * 4;
        let wide = avx512_here();
        let stream = bytes >= STREAM_BYTES_MIN;
        // Columns `lo..hi` of rows `first..end`.
        let run = |lo: usize, hi: usize, (first, end): (usize, usize)| {
            let (a, b, c) = (a.get() as *const f32, b.get() as *const f32, c.get() as *mut f32);
            // SAFETY (all three and the block below): row `i < m` of `a` (contiguous, `k` long),
            // column `j < n` of `b` (contiguous, `k` long) and element `(i, j)` of `c` lie
            // inside their buffers (checked in `new`); distinct `j` ranges write distinct
            // elements of `c`.
            let row = |i: usize| unsafe { a.offset(i as isize * self.a.row) };
            let col = |j: usize| unsafe { b.offset(j as isize * self.b.col) };
            let store = |i: usize, j: usize, d: f32| unsafe {
                let out = c.offset(i as isize * self.c.row + j as isize * self.c.col);
                *out = if self.accumulate { *out + d } else { d };
            };
            let mut j = lo;
            while j < hi {
                // Blocks of three columns where AVX-512 computes them (see `dotrxn_avx512`),
                // unless fewer than four rows share a large `b` (see `STREAM_ROWS_BELOW`).
                let w = if wide && j + 3 <= hi && !(stream && end - first < STREAM_ROWS_BELOW) { 3 } else { 1 };
                let cols = [col(j), col((j + 1).min(hi - 1)), col((j + 2).min(hi - 1))];
                // Stores a block of dot products for rows `i..` and columns `j..j + w`.
                let put = |i: usize, d: &[[f32; 3]]| {
                    for (r, d) in d.iter().enumerate() {
                        for (q, &d) in d[..w].iter().enumerate() {
                            store(i + r, j + q, d);
                        }
                    }
                };
                let mut i = first;
                unsafe {
                    while i + 4 <= end {
                        let rows = [row(i), row(i + 1), row(i + 2), row(i + 3)];
                        match wide {
                            #[cfg(target_arch = "x86_64")]
                            true => put(i, &wide_block(rows, cols, w, self.k)),
                            _ => put(i, &dot4(rows, col(j), self.k).map(|d| [d, 0.0, 0.0])),
                        }
                        i += 4;
                    }
                    // The last one to three rows: the same blocks with fewer rows.
                    #[cfg(target_arch = "x86_64")]
                    if wide && i < end {
                        match end - i {
                            1 => put(i, &wide_block([row(i)], cols, w, self.k)),
                            2 => put(i, &wide_block([row(i), row(i + 1)], cols, w, self.k)),
                            _ => put(i, &wide_block([row(i), row(i + 1), row(i + 2)], cols, w, self.k)),
                        }
                        i = end;
                    }
                    for i in i..end {
                        for j in j..j + w {
                            store(i, j, dot(row(i), col(j), self.k));
                        }
                    }
                }
                j += w;
            }
        };
        let threads = parallel::threads();
        let all_rows = (0, self.m);
        if threaded && threads > 1 && bytes >= DOT_PARALLEL_BYTES {
            parallel::for_chunks(self.n, threads, &|lo, hi| run(lo, hi, all_rows));
        } else if threaded && threads > 1 && self.m >= 8 && self.macs() >= DOT_PARALLEL_MACS {
            // Many rows times a small `b` (dense-large's head, 128 rows times a 1024x10 weight):
            // blocks of four rows per thread, each thread reading all of `b`.
            let blocks = self.m.div_ceil(4);
            parallel::for_chunks(blocks, threads, &|lo, hi| run(0, self.n, (4 * lo, (4 * hi).min(self.m))));
        } else {
            run(0, self.n, all_rows);
        }
    }

    /// One entry through `gemm` (`T` is f32 or f64). Threaded, the entry is cut into one block
    /// of columns (or, for a narrow product, rows) per thread, each a single-threaded `gemm`
    /// call, through [`parallel::for_chunks`] (the hot team). Measured against `gemm`'s own
    /// rayon split on this machine (`kiln profile model dense-large --launches`, `kiln bench
    /// matmul`, `kiln bench tree-matmul`): a `Linear`'s product at batch 128 (128x1024x1024,
    /// `b` column-major) 1844 -> 1181 us, the same with `b` row-major 1114 -> 971 us,
    /// (512x1024)@(1024x2048) 305 -> 321 GFLOP/s, a loop of 32 (128x256)@(256x512) 181 -> 247
    /// GFLOP/s. `gemm` would split a column-major `b` poorly, and each of its splits paid a
    /// pool wake-up.
    unsafe fn gemm<T: Copy + 'static + From<f32>>(&self, a: *mut u8, b: *mut u8, c: *mut u8, threaded: bool) {
        let threads = if threaded { parallel::threads() } else { 1 };
        let (a, b, c) = (a as *const T, b as *const T, c as *mut T);
        // Blocks of columns (`b` and `c` step along their columns) or, for a narrow product,
        // of rows (`a` and `c` step along their rows): (by columns, extent, a, b and c steps).
        let split = if self.n >= GEMM_SPLIT_MIN * threads {
            Some((true, self.n, 0, self.b.col, self.c.col))
        } else if self.m >= GEMM_SPLIT_MIN * threads {
            Some((false, self.m, self.a.row, 0, self.c.row))
        } else {
            None
        };
        match split {
            Some((by_columns, extent, a_step, b_step, c_step)) if threads > 1 => {
                let (a, b, c) = (SendPtr(a as *mut u8), SendPtr(b as *mut u8), SendPtr(c as *mut u8));
                parallel::for_chunks(extent.div_ceil(GEMM_SPLIT_MIN), threads, &|lo, hi| {
                    let (lo, hi) = (lo * GEMM_SPLIT_MIN, (hi * GEMM_SPLIT_MIN).min(extent));
                    let size = if by_columns { (self.m, hi - lo) } else { (hi - lo, self.n) };
                    let at = |p: SendPtr, step: isize| (p.get() as *mut T).wrapping_offset(lo as isize * step);
                    // SAFETY: block `lo..hi` of the split dimension lies inside the checked
                    // matrices; the blocks write disjoint columns (or rows) of `c`.
                    unsafe { self.gemm_block::<T>(size, at(a, a_step), at(b, b_step), at(c, c_step)) }
                });
            }
            // SAFETY: the whole entry, as checked in `new`.
            _ => unsafe { self.gemm_block::<T>((self.m, self.n), a, b, c) },
        }
    }

    /// `c (+)= a b` for an `(m, n)` block of the entry on the calling thread (`k` and the strides
    /// are the entry's).
    ///
    /// # Safety
    /// `a`, `b` and `c` point to in-bounds `[m, k]`, `[k, n]` and `[m, n]` matrices of `T` with
    /// the entry's strides; nothing else writes `c`'s block meanwhile.
    unsafe fn gemm_block<T: Copy + 'static + From<f32>>(
        &self,
        (m, n): (usize, usize),
        a: *const T,
        b: *const T,
        c: *mut T,
    ) {
        // SAFETY: the caller's contract; gemm computes dst = alpha*dst + beta*lhs*rhs, reading
        // dst only when `read_dst` is set.
        unsafe {
            gemm::gemm::<T>(
                m,
                n,
                self.k,
                c,
                self.c.col,
                self.c.row,
                self.accumulate,
                a,
                self.a.col,
                self.a.row,
                b,
                self.b.col,
                self.b.row,
                T::from(if self.accumulate { 1.0 } else { 0.0 }),
                T::from(1.0),
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    }

    /// One entry by the definition, with the interpreter's rounding (see [`NaiveElement`]).
    unsafe fn naive<T: NaiveElement>(&self, a: *mut u8, b: *mut u8, c: *mut u8) {
        let (a, b, c) = (a as *const T, b as *const T, c as *mut T);
        for i in 0..self.m as isize {
            for j in 0..self.n as isize {
                let mut acc = T::Acc::default();
                for p in 0..self.k as isize {
                    // SAFETY: in bounds by the check in `new`.
                    let (x, y) = unsafe {
                        (*a.offset(i * self.a.row + p * self.a.col), *b.offset(p * self.b.row + j * self.b.col))
                    };
                    acc = T::mul_add(acc, x, y);
                }
                // SAFETY: in bounds by the check in `new`.
                unsafe {
                    let dst = c.offset(i * self.c.row + j * self.c.col);
                    *dst = T::finish(acc, if self.accumulate { Some(*dst) } else { None });
                }
            }
        }
    }
}

/// Element types the plain-loop matmul handles, with the interpreter's arithmetic for
/// `sum(a * b)`: ints wrap; f16/bf16 round each product to storage and sum in f64.
trait NaiveElement: Copy {
    type Acc: Copy + Default;
    fn mul_add(acc: Self::Acc, a: Self, b: Self) -> Self::Acc;
    fn finish(acc: Self::Acc, add_to: Option<Self>) -> Self;
}

macro_rules! naive_int {
    ($t:ty) => {
        impl NaiveElement for $t {
            type Acc = $t;
            fn mul_add(acc: $t, a: $t, b: $t) -> $t {
                acc.wrapping_add(a.wrapping_mul(b))
            }
            fn finish(acc: $t, add_to: Option<$t>) -> $t {
                add_to.map_or(acc, |c| c.wrapping_add(acc))
            }
        }
    };
}
naive_int!(i32);
naive_int!(i64);

macro_rules! naive_half {
    ($t:ty) => {
        impl NaiveElement for $t {
            type Acc = f64;
            fn mul_add(acc: f64, a: $t, b: $t) -> f64 {
                acc + <$t>::from_f32(a.to_f32() * b.to_f32()).to_f64()
            }
            fn finish(acc: f64, add_to: Option<$t>) -> $t {
                let sum = <$t>::from_f32(acc as f32);
                add_to.map_or(sum, |c| <$t>::from_f32(c.to_f32() + sum.to_f32()))
            }
        }
    };
}
naive_half!(f16);
naive_half!(bf16);

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `launch` (threaded when the machine has 2+ threads) on buffers 0 (a), 1 (b), 2 (c)
    /// and compares with the sum computed here in f64.
    fn check(m: usize, n: usize, k: usize, a_col_major: bool, b_col_major: bool, accumulate: bool) {
        let strides = |param, rows: usize, cols: usize, col_major: bool| Strides {
            param,
            offset: 0,
            batch: (rows * cols) as isize,
            row: if col_major { 1 } else { cols as isize },
            col: if col_major { rows as isize } else { 1 },
        };
        let launch = MatmulLaunch {
            dtype: DType::F32,
            batch: 1,
            m,
            n,
            k,
            a: strides(0, m, k, a_col_major),
            b: strides(1, k, n, b_col_major),
            c: strides(2, m, n, false),
            accumulate,
            packed: false,
        };
        let value = |i: usize, salt: usize| ((i * 31 + salt * 17) % 23) as f32 / 8.0 - 1.0;
        let mut a: Vec<f32> = (0..m * k).map(|i| value(i, 1)).collect();
        let mut b: Vec<f32> = (0..k * n).map(|i| value(i, 2)).collect();
        let mut c: Vec<f32> = (0..m * n).map(|i| value(i, 3)).collect();
        let at = |s: &Strides, r: usize, col: usize| (r as isize * s.row + col as isize * s.col) as usize;
        let want: Vec<f64> = (0..m * n)
            .map(|e| {
                let (i, j) = (e / n, e % n);
                let dot: f64 = (0..k).map(|p| a[at(&launch.a, i, p)] as f64 * b[at(&launch.b, p, j)] as f64).sum();
                dot + if accumulate { c[e] as f64 } else { 0.0 }
            })
            .collect();
        let args = [a.as_mut_ptr() as *mut u8, b.as_mut_ptr() as *mut u8, c.as_mut_ptr() as *mut u8];
        // SAFETY: three buffers of the sizes the strides describe.
        unsafe { launch.run(args.as_ptr()) };
        for (e, (&got, &want)) in c.iter().zip(&want).enumerate() {
            assert!((got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()), "{m}x{n}x{k} at {e}: {got} vs {want}");
        }
    }

    #[test]
    fn a_weight_read_by_columns_in_place_matches_the_definition_at_every_edge() {
        // `columns_avx512`: rows on either side of one and two vectors, columns on either side
        // of a tile, `k` on either side of a transposed block, `a` in rows or columns, every
        // matrix with padded strides, `c` accumulated or not.
        if !avx512_here() {
            return;
        }
        let value = |i: usize, salt: usize| ((i * 31 + salt * 17) % 23) as f32 / 8.0 - 1.0;
        for &(m, n, k) in
            &[(5, 112, 64), (16, 17, 130), (17, 129, 16), (30, 64, 64), (33, 100, 17), (40, 60, 15), (64, 23, 70)]
        {
            for (a_columns, accumulate) in [(false, false), (false, true), (true, false)] {
                let (lda, ldb, ldc) = (if a_columns { m + 2 } else { k + 2 }, k + 3, n + 5);
                let launch = MatmulLaunch {
                    dtype: DType::F32,
                    batch: 1,
                    m,
                    n,
                    k,
                    a: if a_columns {
                        Strides { param: 0, offset: 1, batch: 0, row: 1, col: lda as isize }
                    } else {
                        Strides { param: 0, offset: 1, batch: 0, row: lda as isize, col: 1 }
                    },
                    b: Strides { param: 1, offset: 2, batch: 0, row: 1, col: ldb as isize },
                    c: Strides { param: 2, offset: 3, batch: 0, row: ldc as isize, col: 1 },
                    accumulate,
                    packed: false,
                };
                assert!(launch.reads_columns(), "{m}x{n}x{k}");
                let len = |s: &Strides, rows: usize, cols: usize| {
                    (s.offset + (rows as isize - 1) * s.row + (cols as isize - 1) * s.col + 1) as usize
                };
                let mut a: Vec<f32> = (0..len(&launch.a, m, k)).map(|i| value(i, 1)).collect();
                let mut b: Vec<f32> = (0..len(&launch.b, k, n)).map(|i| value(i, 2)).collect();
                let mut c: Vec<f32> = (0..len(&launch.c, m, n)).map(|i| value(i, 3)).collect();
                let at =
                    |s: &Strides, r: usize, col: usize| (s.offset + r as isize * s.row + col as isize * s.col) as usize;
                let mut want: Vec<f64> = c.iter().map(|&x| x as f64).collect();
                for i in 0..m {
                    for j in 0..n {
                        let dot: f64 =
                            (0..k).map(|p| a[at(&launch.a, i, p)] as f64 * b[at(&launch.b, p, j)] as f64).sum();
                        let e = at(&launch.c, i, j);
                        want[e] = dot + if accumulate { want[e] } else { 0.0 };
                    }
                }
                let args = [a.as_mut_ptr() as *mut u8, b.as_mut_ptr() as *mut u8, c.as_mut_ptr() as *mut u8];
                // SAFETY: three buffers of the sizes the strides describe.
                unsafe { launch.run_threads(args.as_ptr(), false) };
                for (e, (&got, &want)) in c.iter().zip(&want).enumerate() {
                    // Elements between `c`'s rows are left as they were.
                    near(got, want, || format!("{m}x{n}x{k} a_columns {a_columns} accumulate {accumulate} at {e}"));
                }
            }
        }
    }

    /// Asserts `got` within 1e-4 (relative, and absolute near 0) of `want`.
    fn near(got: f32, want: f64, what: impl Fn() -> String) {
        assert!((got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()), "{}: {got} vs {want}", what());
    }

    /// One `[m, k] x [k, n]` f32 product with `b` column-major (a `Linear`'s `[n, k]` weight)
    /// and `a`, `c` row-major.
    fn weight_product(m: usize, n: usize, k: usize) -> MatmulLaunch {
        MatmulLaunch {
            dtype: DType::F32,
            batch: 1,
            m,
            n,
            k,
            a: Strides { param: 0, offset: 0, batch: 0, row: k as isize, col: 1 },
            b: Strides { param: 1, offset: 0, batch: 0, row: 1, col: k as isize },
            c: Strides { param: 2, offset: 0, batch: 0, row: n as isize, col: 1 },
            accumulate: false,
            packed: false,
        }
    }

    #[test]
    fn a_large_column_major_weight_with_aliased_columns_is_copied_to_rows_and_matches() {
        // Over `B_ROWS_MAX` elements, columns 4 and 8 KiB apart: copied to padded rows (on
        // AVX-512 hosts), split over the threads, `n` not a multiple of 16; then a 3 KiB stride,
        // which keeps `gemm`'s own packing.
        for (m, n, k, copied) in [(40, 100, 1024, true), (33, 48, 2048, true), (40, 100, 768, false)] {
            let launch = weight_product(m, n, k);
            assert!(k * n > B_ROWS_MAX && !launch.is_dot_shaped());
            assert_eq!(launch.b_to_rows(), copied && avx512_here(), "{m}x{n}x{k}");
            for accumulate in [false, true] {
                check(m, n, k, false, true, accumulate);
            }
        }
    }

    #[test]
    fn a_batch_sharing_a_column_major_weight_matches_the_definition() {
        // Entries of `x @ w` with one column-major `w` for all (copied to rows once), `k` below
        // one 16x16 block and not a multiple of it.
        for (batch, m, n, k) in [(3, 5, 20, 8), (4, 17, 33, 19), (2, 16, 128, 32)] {
            let launch = MatmulLaunch {
                dtype: DType::F32,
                batch,
                m,
                n,
                k,
                a: Strides { param: 0, offset: 0, batch: (m * k) as isize, row: k as isize, col: 1 },
                b: Strides { param: 1, offset: 0, batch: 0, row: 1, col: k as isize },
                c: Strides { param: 2, offset: 0, batch: (m * n) as isize, row: n as isize, col: 1 },
                accumulate: false,
                packed: false,
            };
            let mut a: Vec<f32> = (0..batch * m * k).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
            let mut b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 89) as f32 / 44.0 - 1.0).collect();
            let mut c = vec![0f32; batch * m * n];
            let args = [a.as_mut_ptr() as *mut u8, b.as_mut_ptr() as *mut u8, c.as_mut_ptr() as *mut u8];
            // SAFETY: three buffers of the sizes the strides describe.
            unsafe { launch.run(args.as_ptr()) };
            for e in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k).map(|p| a[e * m * k + i * k + p] as f64 * b[j * k + p] as f64).sum();
                        let got = c[e * m * n + i * n + j] as f64;
                        assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "{batch}x{m}x{n}x{k} at {e},{i},{j}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_few_rows_against_a_wide_row_major_b_run_small_and_match_the_definition() {
        // Past `SMALL_MACS` and `SMALL_MAX_STEPS`: a convolution stem's im2col product and
        // others of five to eight rows, `n` past one block of 64 and not a multiple of it.
        for (m, n, k) in [(8, 1024, 27), (5, 700, 64), (6, 4000, 9), (8, 1000, 32)] {
            let launch = MatmulLaunch {
                dtype: DType::F32,
                batch: 1,
                m,
                n,
                k,
                a: Strides { param: 0, offset: 0, batch: 0, row: k as isize, col: 1 },
                b: Strides { param: 1, offset: 0, batch: 0, row: n as isize, col: 1 },
                c: Strides { param: 2, offset: 0, batch: 0, row: n as isize, col: 1 },
                accumulate: m == 5,
                packed: false,
            };
            assert!(launch.few_rows_wide() && launch.macs() > SMALL_MACS as u128);
            assert_eq!(launch.is_small(), avx512_here(), "{m}x{n}x{k}");
            let mut a: Vec<f32> = (0..m * k).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
            let mut b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 89) as f32 / 44.0 - 1.0).collect();
            let start: Vec<f32> = (0..m * n).map(|i| ((i * 29) % 13) as f32 / 8.0).collect();
            let mut c = start.clone();
            let args = [a.as_mut_ptr() as *mut u8, b.as_mut_ptr() as *mut u8, c.as_mut_ptr() as *mut u8];
            // SAFETY: three buffers of the sizes the strides describe.
            unsafe { launch.run(args.as_ptr()) };
            for i in 0..m {
                for j in 0..n {
                    let dot: f64 = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum();
                    let want = dot + if launch.accumulate { start[i * n + j] as f64 } else { 0.0 };
                    let got = c[i * n + j] as f64;
                    assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "{m}x{n}x{k} at {i},{j}");
                }
            }
        }
    }

    #[test]
    fn a_short_k_against_wide_rows_of_b_matches_the_definition_and_splits_to_the_same_bits() {
        // `tiny_k_avx512`: an im2col product (32x5408x9), every `k` edge (1, 16), rows past a
        // multiple of four, columns past a panel and a strip (700, 300), a power-of-two width
        // (4096), `a` by columns, accumulating or not.
        for (m, n, k, a_by_columns) in
            [(32, 5408, 9, false), (16, 4096, 1, false), (13, 700, 16, true), (9, 4096, 3, false), (64, 300, 12, true)]
        {
            let launch = MatmulLaunch {
                dtype: DType::F32,
                batch: 1,
                m,
                n,
                k,
                a: if a_by_columns {
                    Strides { param: 0, offset: 0, batch: 0, row: 1, col: m as isize }
                } else {
                    Strides { param: 0, offset: 0, batch: 0, row: k as isize, col: 1 }
                },
                b: Strides { param: 1, offset: 0, batch: 0, row: n as isize, col: 1 },
                c: Strides { param: 2, offset: 0, batch: 0, row: n as isize, col: 1 },
                accumulate: m % 2 == 1,
                packed: false,
            };
            assert_eq!(launch.tiny_k(), avx512_here(), "{m}x{n}x{k}");
            let mut a: Vec<f32> = (0..m * k).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
            let mut b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 89) as f32 / 44.0 - 1.0).collect();
            let start: Vec<f32> = (0..m * n).map(|i| ((i * 29) % 13) as f32 / 8.0).collect();
            let mut outs = Vec::new();
            for threads in [false, true] {
                let mut c = start.clone();
                let args = [a.as_mut_ptr() as *mut u8, b.as_mut_ptr() as *mut u8, c.as_mut_ptr() as *mut u8];
                // SAFETY: three buffers of the sizes the strides describe.
                unsafe { launch.run_threads(args.as_ptr(), threads) };
                outs.push(c);
            }
            assert!(outs[0].iter().zip(&outs[1]).all(|(x, y)| x.to_bits() == y.to_bits()), "{m}x{n}x{k}: split");
            let c = &outs[0];
            for i in 0..m {
                for j in 0..n {
                    let x = |p: usize| if a_by_columns { a[p * m + i] } else { a[i * k + p] };
                    let dot: f64 = (0..k).map(|p| x(p) as f64 * b[p * n + j] as f64).sum();
                    let want = dot + if launch.accumulate { start[i * n + j] as f64 } else { 0.0 };
                    let got = c[i * n + j] as f64;
                    assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "{m}x{n}x{k} at {i},{j}: {got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn dot_products_over_a_large_weight_always_thread() {
        // GPT-2's 768x2304, 768x3072 and 768x768 weights (7, 9 and 2.25 MiB), 2 MiB exactly;
        // not 1.9 MiB, nor a product of many rows.
        for (m, n, k, always) in [
            (1, 2304, 768, true),
            (1, 3072, 768, true),
            (1, 768, 768, true),
            (1, 512, 1024, true),
            (1, 500, 1024, false),
        ] {
            assert_eq!(weight_product(m, n, k).streams_large_weight(), always, "{m}x{n}x{k}");
        }
        assert!(!weight_product(512, 2304, 768).streams_large_weight());
    }

    #[test]
    fn weights_packed_in_panels_give_the_product_at_every_edge() {
        // Rows past a multiple of the strip (12), columns past a panel (32), `k` past a block
        // (1024, cut into equal blocks), accumulating or not, `a` by rows or by columns, the
        // weight by columns (a `Linear`'s) or by rows (a Conv1D's), a batch sharing one weight,
        // on one thread and split over the threads.
        #[cfg(target_arch = "x86_64")]
        if avx512_here() {
            let cases = [(5, 16, 16), (13, 33, 17), (40, 100, 64), (25, 70, 1500), (128, 64, 300), (7, 512, 40)];
            for (case, &(m, n, k)) in cases.iter().enumerate() {
                // Layouts 4 and 5: `a`'s rows all one row (a broadcast view, row stride 0).
                for layout in 0..6 {
                    let (a_cols, b_cols, accumulate) = (layout & 1 == 1, layout & 2 == 2, (case + layout) % 2 == 1);
                    let (a_cols, b_cols) = if layout >= 4 { (false, layout == 5) } else { (a_cols, b_cols) };
                    let batch = if case % 2 == 0 { 1 } else { 3 };
                    let a = if a_cols {
                        Strides { param: 0, offset: 0, batch: (m * k) as isize, row: 1, col: m as isize }
                    } else if layout >= 4 {
                        Strides { param: 0, offset: 0, batch: (m * k) as isize, row: 0, col: 1 }
                    } else {
                        Strides { param: 0, offset: 0, batch: (m * k) as isize, row: k as isize, col: 1 }
                    };
                    let b = if b_cols {
                        Strides { param: 1, offset: 0, batch: 0, row: 1, col: k as isize }
                    } else {
                        Strides { param: 1, offset: 0, batch: 0, row: n as isize, col: 1 }
                    };
                    let c = Strides { param: 2, offset: 0, batch: (m * n) as isize, row: n as isize, col: 1 };
                    let launch = MatmulLaunch { dtype: DType::F32, batch, m, n, k, a, b, c, accumulate, packed: false };
                    let Some(copied) = launch.with_packed_b() else {
                        // A weight in rows is copied only into panels.
                        assert!(!b_cols && k < PANEL_MIN_K, "{m}x{n}x{k} layout {layout}");
                        continue;
                    };
                    assert_eq!(copied.packed, !copied.is_small() && k >= PANEL_MIN_K, "{m}x{n}x{k}");
                    let value = |i: usize, salt: usize| ((i * 31 + salt * 17) % 23) as f32 / 8.0 - 1.0;
                    let mut xa: Vec<f32> = (0..batch * m * k).map(|i| value(i, 1)).collect();
                    let w = Arc::new(HostData::F32((0..k * n).map(|i| value(i, 2)).collect()));
                    let HostData::F32(wv) = &*w else { unreachable!() };
                    let start: Vec<f32> = (0..batch * m * n).map(|i| value(i, 3)).collect();
                    let at = |s: &Strides, e: usize, r: usize, col: usize| {
                        (e as isize * s.batch + r as isize * s.row + col as isize * s.col) as usize
                    };
                    let want: Vec<f64> = (0..batch * m * n)
                        .map(|o| {
                            let (e, i, j) = (o / (m * n), o / n % m, o % n);
                            let dot: f64 =
                                (0..k).map(|p| xa[at(&a, e, i, p)] as f64 * wv[at(&b, 0, p, j)] as f64).sum();
                            dot + if accumulate { start[o] as f64 } else { 0.0 }
                        })
                        .collect();
                    let mut copy = None;
                    let wp = wv.as_ptr() as *mut u8;
                    // SAFETY: `wp` is the first element of `w`; the second refresh makes the copy.
                    let packed = unsafe {
                        PackedWeight::refresh(&mut copy, (&launch, &copied), &w, wp, false);
                        PackedWeight::refresh(&mut copy, (&launch, &copied), &w, wp, true)
                    };
                    assert!(!packed.is_null());
                    for threads in [false, true] {
                        let mut out = start.clone();
                        let args = [xa.as_mut_ptr() as *mut u8, wp, out.as_mut_ptr() as *mut u8];
                        // SAFETY: buffers of the sizes the strides describe; `packed` holds
                        // the copy of `b`.
                        unsafe { launch.run_with_copy(&copied, args.as_ptr(), packed, threads) };
                        for (o, (&got, &want)) in out.iter().zip(&want).enumerate() {
                            near(got, want, || format!("{m}x{n}x{k} layout {layout} threads {threads} at {o}"));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_copy_kept_in_one_layout_is_not_read_as_the_other() {
        // One step, one weight, read in rows by one binding set's launch and in panels by
        // another's: the copy kept from the first must not be handed to the second (the
        // exported GPT-2 at batch 1, then 3, read garbage when rows of a few tokens took the
        // copy in rows and more took panels).
        #[cfg(target_arch = "x86_64")]
        if avx512_here() {
            let (m, n, k) = (40, 48, 300);
            let launch = weight_product(m, n, k);
            let panels = launch.with_packed_b().expect("a weight that qualifies for a copy");
            assert!(panels.packed);
            let ld = (n + B_ROWS_PAD) as isize;
            let rows = MatmulLaunch { packed: false, b: Strides { row: ld, ..panels.b }, ..panels.clone() };
            let w = Arc::new(HostData::F32((0..n * k).map(|i| ((i * 7) % 97) as f32 / 48.0 - 1.0).collect()));
            let HostData::F32(wv) = &*w else { unreachable!() };
            let wp = wv.as_ptr() as *mut u8;
            let mut a: Vec<f32> = (0..m * k).map(|i| ((i * 31) % 89) as f32 / 44.0 - 1.0).collect();
            let mut copy = None;
            for copied in [&rows, &panels, &rows] {
                // SAFETY: `wp` is the first element of `w`.
                let kept = unsafe {
                    PackedWeight::refresh(&mut copy, (&launch, copied), &w, wp, false);
                    PackedWeight::refresh(&mut copy, (&launch, copied), &w, wp, false)
                };
                let mut c = vec![0f32; m * n];
                let args = [a.as_mut_ptr() as *mut u8, wp, c.as_mut_ptr() as *mut u8];
                // SAFETY: buffers of the sizes the strides describe; `kept` holds the copy.
                unsafe { launch.run_with_copy(copied, args.as_ptr(), kept, false) };
                for (o, &got) in c.iter().enumerate() {
                    let (i, j) = (o / n, o % n);
                    let want: f64 = (0..k).map(|p| a[i * k + p] as f64 * wv[j * k + p] as f64).sum();
                    near(got, want, || format!("panels {} at {o}", copied.packed));
                }
            }
        }
    }

    #[test]
    fn a_weight_in_rows_that_changed_since_the_last_run_is_read_in_place() {
        // A training step's weight in rows changes every run: packing it each time cost more
        // than `gemm` reading it in place. One that stays the same is packed on its second run.
        #[cfg(target_arch = "x86_64")]
        if avx512_here() {
            let (m, n, k) = (40, 48, 300);
            let mut launch = weight_product(m, n, k);
            launch.b = Strides { param: 1, offset: 0, batch: 0, row: n as isize, col: 1 };
            let copied = launch.with_packed_b().expect("a weight in rows that qualifies for panels");
            let weight = |seed: usize| Arc::new(HostData::F32((0..n * k).map(|i| ((i * seed) % 97) as f32).collect()));
            let ptr = |w: &Arc<HostData>| match &**w {
                HostData::F32(v) => v.as_ptr() as *mut u8,
                _ => unreachable!(),
            };
            let (w1, w2) = (weight(7), weight(11));
            let mut copy = None;
            // SAFETY (each `refresh`): `ptr(w)` is the first element of the weight `w`.
            let mut refresh = |w: &Arc<HostData>| unsafe {
                PackedWeight::refresh(&mut copy, (&launch, &copied), w, ptr(w), false).is_null()
            };
            let in_place: Vec<bool> = [&w1, &w1, &w2, &w2, &w1, &w1].into_iter().map(&mut refresh).collect();
            assert_eq!(in_place, [true, false, true, false, true, false]);
        }
    }

    #[test]
    fn a_weight_is_read_in_place_on_a_steps_first_run_and_copied_from_its_second() {
        #[cfg(target_arch = "x86_64")]
        if avx512_here() {
            // `x @ w^T` with `w` a `[n, k]` weight read as columns.
            let (m, k, n) = (40, 64, 48);
            let launch = MatmulLaunch {
                dtype: DType::F32,
                batch: 1,
                m,
                n,
                k,
                a: Strides { param: 0, offset: 0, batch: 0, row: k as isize, col: 1 },
                b: Strides { param: 1, offset: 0, batch: 0, row: 1, col: k as isize },
                c: Strides { param: 2, offset: 0, batch: 0, row: n as isize, col: 1 },
                accumulate: false,
                packed: false,
            };
            let copied = launch.with_packed_b().expect("a weight that qualifies for a copy");
            let weight = |seed: usize| {
                Arc::new(HostData::F32((0..n * k).map(|i| ((i * seed) % 97) as f32 / 48.0 - 1.0).collect()))
            };
            let ptr = |w: &Arc<HostData>| match &**w {
                HostData::F32(v) => v.as_ptr() as *mut u8,
                _ => unreachable!(),
            };
            let mut a: Vec<f32> = (0..m * k).map(|i| ((i * 31) % 89) as f32 / 44.0 - 1.0).collect();
            let product = |a: &mut Vec<f32>, b: *mut u8, copy: *mut u8| {
                let mut c = vec![0f32; m * n];
                let args = [a.as_mut_ptr() as *mut u8, b, c.as_mut_ptr() as *mut u8];
                // SAFETY: buffers of the sizes the strides describe; `copy` (when not null) holds
                // the copy of `b` that `refresh` made.
                unsafe {
                    if copy.is_null() {
                        launch.run_threads(args.as_ptr(), false)
                    } else {
                        launch.run_with_copy(&copied, args.as_ptr(), copy, false)
                    }
                }
                c.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
            };
            let (w1, w2) = (weight(7), weight(11));
            let mut copy = None;
            // SAFETY (each `refresh`): `ptr(w)` is the first element of the weight `w`.
            let first = unsafe { PackedWeight::refresh(&mut copy, (&launch, &copied), &w1, ptr(&w1), false) };
            assert!(first.is_null(), "a step's first run reads the weight in place");
            let in_place = product(&mut a, ptr(&w1), first);
            let second = unsafe { PackedWeight::refresh(&mut copy, (&launch, &copied), &w1, ptr(&w1), false) };
            assert!(!second.is_null(), "the second run makes the copy");
            assert_eq!(second as usize % 64, 0, "the copy's rows start on cache lines");
            let from_copy = product(&mut a, ptr(&w1), second);
            let HostData::F32(w) = &*w1 else { unreachable!() };
            let want: Vec<u32> = (0..m * n)
                .map(|o| {
                    let (i, j) = (o / n, o % n);
                    let dot: f64 = (0..k).map(|p| a[i * k + p] as f64 * w[j * k + p] as f64).sum();
                    (dot as f32).to_bits()
                })
                .collect();
            let close = |got: &[u32], want: &[u32], name: &str| {
                for (o, (&g, &w)) in got.iter().zip(want).enumerate() {
                    let (g, w) = (f32::from_bits(g), f32::from_bits(w));
                    assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{name} at {o}: {g} vs {w}");
                }
            };
            close(&in_place, &want, "in place");
            close(&from_copy, &want, "from the copy");
            let third = unsafe { PackedWeight::refresh(&mut copy, (&launch, &copied), &w1, ptr(&w1), false) };
            assert_eq!(third, second, "the same weight keeps its copy");
            // Another weight is copied at once, into the same storage.
            let other = unsafe { PackedWeight::refresh(&mut copy, (&launch, &copied), &w2, ptr(&w2), false) };
            assert_eq!(other, second);
            let (copy2, in_place2) =
                (product(&mut a, ptr(&w2), other), product(&mut a, ptr(&w2), std::ptr::null_mut()));
            close(&copy2, &in_place2, "the other weight's copy");
            assert_ne!(copy2, from_copy);
        }
    }

    #[test]
    fn a_gathered_weight_shared_by_a_batch_is_copied_once_to_the_same_bits() {
        // An LSTM's input projection: ten time steps of 16 rows (each step's inputs 8 apart in
        // rows of 80) against one `[128, 8]` weight read as columns. Copied to rows once, the
        // products are bit for bit those of gathering the weight per block of rows.
        let (batch, m, n, k) = (10, 16, 128, 8);
        let launch = MatmulLaunch {
            dtype: DType::F32,
            batch,
            m,
            n,
            k,
            a: Strides { param: 0, offset: 0, batch: k as isize, row: (batch * k) as isize, col: 1 },
            b: Strides { param: 1, offset: 0, batch: 0, row: 1, col: k as isize },
            c: Strides { param: 2, offset: 0, batch: (m * n) as isize, row: n as isize, col: 1 },
            accumulate: true,
            packed: false,
        };
        assert!(launch.small_gathers() && launch.b_copied_once(batch) && launch.b_copied_once(1));
        let mut a: Vec<f32> = (0..batch * m * k).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        let mut b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 89) as f32 / 44.0 - 1.0).collect();
        let start: Vec<f32> = (0..batch * m * n).map(|i| ((i * 29) % 13) as f32 / 8.0).collect();
        let mut c = start.clone();
        let args = [a.as_mut_ptr() as *mut u8, b.as_mut_ptr() as *mut u8, c.as_mut_ptr() as *mut u8];
        // SAFETY: three buffers of the sizes the strides describe.
        unsafe { launch.run(args.as_ptr()) };
        for e in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let o = e * m * n + i * n + j;
                    let dot: f64 = (0..k).map(|p| a[i * batch * k + e * k + p] as f64 * b[j * k + p] as f64).sum();
                    let want = dot + start[o] as f64;
                    assert!((c[o] as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()), "at {e},{i},{j}");
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if avx512_here() {
            let mut gathered = start.clone();
            for e in 0..batch {
                // SAFETY: entry `e`'s operands lie inside the buffers; the host has AVX-512F.
                unsafe {
                    small_avx512(&launch, a.as_ptr().add(e * k), b.as_ptr(), gathered.as_mut_ptr().add(e * m * n))
                };
            }
            let bits = |c: &[f32]| c.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(&c), bits(&gathered));
        }
    }

    #[test]
    fn a_dot_shaped_product_is_the_same_bits_on_one_thread_and_split() {
        // Columns fall into different blocks of three (AVX-512) when the columns are split over
        // threads; each output must not depend on its block.
        let (m, n, k) = (9, 301, 777);
        let launch = weight_product(m, n, k);
        assert!(launch.is_dot_shaped() && n * k * 4 >= DOT_PARALLEL_BYTES);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 89) as f32 / 44.0 - 1.0).collect();
        let run = |threaded: bool| {
            let mut c = vec![0f32; m * n];
            let (a, b) = (a.as_ptr() as *mut u8, b.as_ptr() as *mut u8);
            // SAFETY: three buffers of the sizes the strides describe; `a` and `b` are only read.
            unsafe { launch.dots(a, b, c.as_mut_ptr() as *mut u8, threaded) };
            c.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
        };
        assert_eq!(run(false), run(true));
    }

    #[test]
    fn a_few_rows_streamed_over_a_large_weight_give_the_bits_of_a_blocked_product() {
        // One to three rows against a `b` past `STREAM_BYTES_MIN` take one column at a time;
        // nine rows take blocks of three columns (four rows at a time, then the last one).
        // Every output is the same bits both ways, and the definition's value.
        let (n, k) = (301, 777);
        assert!(n * k * 4 >= STREAM_BYTES_MIN);
        let a: Vec<f32> = (0..9 * k).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 89) as f32 / 44.0 - 1.0).collect();
        let run = |m: usize, threaded: bool| {
            let launch = weight_product(m, n, k);
            assert!(launch.is_dot_shaped());
            let mut c = vec![f32::NAN; m * n];
            let (a, b) = (a.as_ptr() as *mut u8, b.as_ptr() as *mut u8);
            // SAFETY: `a` holds at least `m` rows of `k`, `b` and `c` the sizes the strides
            // describe; `a` and `b` are only read.
            unsafe { launch.dots(a, b, c.as_mut_ptr() as *mut u8, threaded) };
            c.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
        };
        let blocked = run(9, false);
        for m in 1..STREAM_ROWS_BELOW {
            for threaded in [false, true] {
                let streamed = run(m, threaded);
                assert_eq!(streamed[..], blocked[..m * n], "{m} rows, threaded {threaded}");
            }
        }
        for (e, &got) in blocked.iter().enumerate() {
            let (i, j) = (e / n, e % n);
            let want: f64 = (0..k).map(|p| a[i * k + p] as f64 * b[j * k + p] as f64).sum();
            let got = f32::from_bits(got) as f64;
            assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "9x{n}x{k} at {e}: {got} vs {want}");
        }
    }

    #[test]
    fn many_rows_against_a_small_weight_split_by_rows_to_the_same_bits() {
        // Below `DOT_PARALLEL_BYTES` of `b` but over `DOT_PARALLEL_MACS`: blocks of four rows
        // per thread (130 rows: the last block has two), against one thread bit for bit and
        // against the definition.
        for (m, n, k) in [(130, 10, 1024), (128, 7, 300)] {
            let launch = weight_product(m, n, k);
            assert!(launch.is_dot_shaped() && n * k * 4 < DOT_PARALLEL_BYTES && launch.macs() >= DOT_PARALLEL_MACS);
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 89) as f32 / 44.0 - 1.0).collect();
            let run = |threaded: bool| {
                let mut c = vec![f32::NAN; m * n];
                let (a, b) = (a.as_ptr() as *mut u8, b.as_ptr() as *mut u8);
                // SAFETY: three buffers of the sizes the strides describe; `a` and `b` are only read.
                unsafe { launch.dots(a, b, c.as_mut_ptr() as *mut u8, threaded) };
                c
            };
            let (one, split) = (run(false), run(true));
            let bits = |c: &[f32]| c.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(&one), bits(&split), "{m}x{n}x{k}");
            for (e, &got) in split.iter().enumerate() {
                let (i, j) = (e / n, e % n);
                let want: f64 = (0..k).map(|p| a[i * k + p] as f64 * b[j * k + p] as f64).sum();
                assert!((got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()), "{m}x{n}x{k} at {e}");
            }
        }
    }

    #[test]
    fn small_entries_match_the_definition_in_every_layout() {
        // Shapes of each way through `small_avx512` (rows of `b` loaded, columns gathered,
        // `b` copied to rows), with row and column tails (1-3 rows past a block of four,
        // columns past 16 and past 64), `k` not a multiple of the accumulator sets, a `b`
        // shared by the batch, `a` and `c` in either layout, `b`'s columns in reverse order (a
        // negative column stride, gathered or copied), accumulating or not.
        // A few queries against a few keys (dot-shaped with `b` column-major) are gathered.
        let gathered = [(3, 8, 8), (1, 16, 8), (4, 6, 16)];
        let shapes = [(3, 8, 64), (5, 70, 9), (7, 33, 7), (2, 130, 3), (16, 16, 8), (9, 8, 16), (1, 1, 1), (4, 17, 31)];
        let shapes = shapes.iter().chain(&gathered);
        for &(m, n, k) in shapes {
            for layout in 0..32 {
                let (a_cols, b_cols, c_cols, shared) =
                    (layout & 1 == 1, layout & 2 == 2, layout & 4 == 4, layout & 8 == 8);
                let batch = 3;
                let matrix = |param, rows: usize, cols: usize, col_major: bool, shared: bool| Strides {
                    param,
                    offset: 1,
                    batch: if shared { 0 } else { (rows * cols + 5) as isize },
                    row: if col_major { 1 } else { cols as isize },
                    col: if col_major { rows as isize } else { 1 },
                };
                let mut b = matrix(1, k, n, b_cols, shared);
                if layout & 16 == 16 {
                    // Column `j` where column `n - 1 - j` was.
                    b.offset += (n as isize - 1) * b.col;
                    b.col = -b.col;
                }
                let launch = MatmulLaunch {
                    dtype: DType::F32,
                    batch,
                    m,
                    n,
                    k,
                    a: matrix(0, m, k, a_cols, false),
                    b,
                    c: matrix(2, m, n, c_cols, false),
                    accumulate: layout % 3 == 0,
                    packed: false,
                };
                if launch.is_dot_shaped() && gathered.contains(&(m, n, k)) {
                    assert!(launch.small_gathers(), "{m}x{n}x{k} layout {layout}");
                }
                if !launch.is_dot_shaped() || launch.small_gathers() {
                    assert_eq!(launch.is_small(), avx512_here(), "{m}x{n}x{k} layout {layout}");
                }
                let len = |rows: usize, cols: usize| 1 + batch * (rows * cols + 5);
                let value = |i: usize, salt: usize| ((i * 31 + salt * 17) % 23) as f32 / 8.0 - 1.0;
                let mut a: Vec<f32> = (0..len(m, k)).map(|i| value(i, 1)).collect();
                let mut b: Vec<f32> = (0..len(k, n)).map(|i| value(i, 2)).collect();
                let mut c: Vec<f32> = (0..len(m, n)).map(|i| value(i, 3)).collect();
                let at = |s: &Strides, e: usize, r: usize, col: usize| {
                    (s.offset + e as isize * s.batch + r as isize * s.row + col as isize * s.col) as usize
                };
                let mut want: Vec<f64> = c.iter().map(|&x| x as f64).collect();
                for e in 0..batch {
                    for i in 0..m {
                        for j in 0..n {
                            let dot: f64 = (0..k)
                                .map(|p| a[at(&launch.a, e, i, p)] as f64 * b[at(&launch.b, e, p, j)] as f64)
                                .sum();
                            let o = at(&launch.c, e, i, j);
                            want[o] = dot + if launch.accumulate { c[o] as f64 } else { 0.0 };
                        }
                    }
                }
                let args = [a.as_mut_ptr() as *mut u8, b.as_mut_ptr() as *mut u8, c.as_mut_ptr() as *mut u8];
                // SAFETY: three buffers holding every element the strides reach.
                unsafe { launch.run(args.as_ptr()) };
                for (o, (&got, &want)) in c.iter().zip(&want).enumerate() {
                    assert!(
                        (got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{m}x{n}x{k} layout {layout} at {o}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn threaded_gemm_blocks_cover_every_column_and_row_once() {
        // Dot-shaped ones too (`b` column-major, at most `DOT_MAX_M` rows): four rows at a time
        // and the last one to three together, `k` with and without 16- and 8-element tails.
        let shapes = [(5, 200, 17), (7, 97, 300), (200, 5, 9), (130, 70, 33), (64, 64, 64), (1, 3, 2)];
        let dots = [
            (4, 9, 16),
            (8, 33, 264),
            (11, 40, 259),
            (16, 5, 256),
            (3, 7, 9),
            (13, 300, 770),
            (1, 50, 64),
            (2, 31, 40),
            (1, 1, 8),
            // Narrow: many rows against fewer than 16 columns.
            (40, 10, 300),
            (130, 7, 257),
        ];
        for (m, n, k) in [(40, 10, 300), (130, 7, 257)] {
            let launch = weight_product(m, n, k);
            assert!(launch.is_dot_shaped(), "{m}x{n}x{k}");
        }
        for &(m, n, k) in shapes.iter().chain(&dots) {
            for layout in 0..4 {
                for accumulate in [false, true] {
                    check(m, n, k, layout & 1 == 1, layout & 2 == 2, accumulate);
                }
            }
        }
    }
}
