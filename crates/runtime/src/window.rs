//! A product whose `b` is what a copy nest wrote (a convolution's im2col), run with `b` read from
//! the copy's source in place, the copy skipped: each row of `b` is one shifted window of the
//! source, so a vector of 16 columns of a row is one load (or two and a lane permutation for a
//! stride of 2) from the source, and the copy's stores and the product's reads of them go.
//!
//! Why: a convolution lowers to a pad, an im2col copy and a GEMM (`lower::schedule`). For a
//! short `k` (a stem of 3 input channels, 27 rows; one input channel, 9) the copy writes as many
//! bytes as the product reads, and the product is a few microseconds: MobileNet's stem copied
//! 27,648 floats in 8-9 us before its 8x27x1024 product of 5 us; read in place, the product takes
//! 4.5 us and the copy is gone (see BENCHMARKS.md).
//!
//! [`Window::of`] proves the fusion sound for one binding set: the copy's stores cover `b`'s
//! `k x n` elements exactly once, its rows each one window (a base in the source and a walk of
//! the columns common to all rows, at most three levels with the innermost contiguous or every
//! other element), and every element read lies inside the source. `lower` names the candidate
//! pairs (`Program::skippable_copies`: the copy's output is a temporary that only the product
//! reads) and keeps the copy's source alive until the product; the VM
//! (`vm::launch::read_windows`) checks that no later step writes the source.

use codegen::cpu::CopyNest;

use crate::matmul::{MatmulLaunch, avx512_here};
use crate::parallel::{self, SendPtr};

/// The most rows-times-copies a copy nest may enumerate while its rows are matched to `b`'s.
const MAX_ROW_COMBOS: usize = 1 << 12;

/// From this many multiply-adds on, the columns are split over the threads.
const SPLIT_MACS: usize = 1 << 19;

/// Rows of `c` computed together (one accumulator register each).
const ROWS: usize = 8;

/// How a product reads its `b` from the source of the copy that wrote it (see the module docs):
/// row `r` of `b` starts at `bases[r]` of the source, and its columns walk `outer` (two levels,
/// each `(extent, step)`, outermost first) and then runs of `inner` elements `step` apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    bases: Vec<isize>,
    outer: [(usize, isize); 2],
    inner: usize,
    step: isize,
}

impl Window {
    /// The window of `mm`'s `b` when the copy `nest` (its destination `b`'s buffer, its source
    /// holding `source_numel` elements) wrote all of it: f32, one batch entry, `b`'s and `c`'s
    /// columns contiguous, an AVX-512F host; `None` where anything else holds.
    pub fn of(mm: &MatmulLaunch, nest: &CopyNest, source_numel: usize) -> Option<Window> {
        if mm.dtype != air::DType::F32 || mm.batch != 1 || mm.b.col != 1 || mm.c.col != 1 || !avx512_here() {
            return None;
        }
        let first = nest.moves.first()?;
        let (src, dst) = (first.src.param, first.dst.param);
        let depth = nest.extents.len();
        if nest.moves.iter().any(|m| {
            m.src.param != src
                || m.dst.param != dst
                || m.dst.steps != first.dst.steps
                || m.src.steps.len() != depth
                || m.dst.steps.len() != depth
        }) {
            return None;
        }
        let (k, n, row) = (mm.k, mm.n, mm.b.row as i64);
        if k == 0 || n == 0 || row <= 0 || nest.extents.contains(&0) {
            return None;
        }
        // Levels of more than one step: those moving across `b`'s rows, those along its columns.
        let (mut rows, mut cols) = (Vec::new(), Vec::new());
        for d in (0..depth).filter(|&d| nest.extents[d] > 1) {
            match first.dst.steps[d] {
                s if s > 0 && s % row == 0 => rows.push(d),
                s if s > 0 && s < row => cols.push(d),
                _ => return None,
            }
        }
        // The columns: a row-major walk of all `n` of them, each level's source step the same
        // for every copy.
        cols.sort_by_key(|&d| std::cmp::Reverse(first.dst.steps[d]));
        let mut span = 1i64;
        for &d in cols.iter().rev() {
            if first.dst.steps[d] != span || nest.moves.iter().any(|m| m.src.steps[d] != first.src.steps[d]) {
                return None;
            }
            span = span.checked_mul(nest.extents[d])?;
        }
        if span != n as i64 || cols.len() > 3 {
            return None;
        }
        let level = |i: usize| -> Option<(usize, isize)> {
            match cols.len().checked_sub(3 - i) {
                Some(j) => Some((usize::try_from(nest.extents[cols[j]]).ok()?, first.src.steps[cols[j]] as isize)),
                None => Some((1, 0)),
            }
        };
        let ((o0, o1), (inner, step)) = ((level(0)?, level(1)?), level(2)?);
        if !matches!(step, 1 | 2) {
            return None;
        }
        // The rows: every copy at every point of the row levels stores one row of `b`, each
        // row once, all `k` of them.
        let combos = rows.iter().map(|&d| nest.extents[d] as usize).try_fold(nest.moves.len(), usize::checked_mul)?;
        if combos != k || combos > MAX_ROW_COMBOS {
            return None;
        }
        let mut bases = vec![None; k];
        for m in &nest.moves {
            let start = m.dst.offset - mm.b.offset as i64;
            if start < 0 || start % row != 0 {
                return None;
            }
            let mut at = vec![0i64; rows.len()];
            loop {
                let r = start / row + rows.iter().zip(&at).map(|(&d, &v)| v * (m.dst.steps[d] / row)).sum::<i64>();
                let base = m.src.offset + rows.iter().zip(&at).map(|(&d, &v)| v * m.src.steps[d]).sum::<i64>();
                let slot = bases.get_mut(usize::try_from(r).ok()?)?;
                if slot.replace(base as isize).is_some() {
                    return None;
                }
                // The next point of the row levels (an odometer).
                let Some(i) = (0..rows.len()).rev().find(|&i| at[i] + 1 < nest.extents[rows[i]]) else { break };
                at[i] += 1;
                at[i + 1..].iter_mut().for_each(|v| *v = 0);
            }
        }
        let bases: Vec<isize> = bases.into_iter().collect::<Option<_>>()?;
        // Every element read lies inside the source.
        let reach = |e: usize, s: isize| (e as isize - 1) * s;
        let (lo, hi) = [(o0.0, o0.1), (o1.0, o1.1), (inner, step)]
            .iter()
            .fold((0isize, 0isize), |(lo, hi), &(e, s)| (lo + reach(e, s).min(0), hi + reach(e, s).max(0)));
        if bases.iter().any(|&b| b + lo < 0 || b + hi >= source_numel as isize) {
            return None;
        }
        Some(Window { bases, outer: [o0, o1], inner, step })
    }

    /// Whether [`Window::run`] splits `mm`'s columns over the threads when it may: from
    /// [`SPLIT_MACS`] multiply-adds on.
    pub fn splits(mm: &MatmulLaunch) -> bool {
        mm.m * mm.k * mm.n >= SPLIT_MACS
    }

    /// Runs `mm` with `b` read through the window from `source`, `a` and `c` from `args` (the
    /// product's own pointers), the columns split over the threads where `threads` (see
    /// [`Window::splits`]).
    ///
    /// # Safety
    /// `args` holds the product's buffer pointers (its operands bounds-checked by
    /// `MatmulLaunch::new`), `source` the copy's source of at least the `source_numel` elements
    /// [`Window::of`] was given, and `mm` is the launch the window was made for.
    pub unsafe fn run(&self, mm: &MatmulLaunch, args: *const *mut u8, source: *const u8, threads: bool) {
        // SAFETY: the caller's contract.
        let (a, c) = unsafe { (*args.add(mm.a.param), *args.add(mm.c.param)) };
        let (a, s, c) = (SendPtr(a), SendPtr(source as *mut u8), SendPtr(c));
        let runs = self.outer[0].0 * self.outer[1].0;
        let chunks = if threads { parallel::threads() } else { 1 };
        parallel::for_chunks(runs, chunks, &|lo, hi| {
            // SAFETY: the caller's contract; chunks write disjoint columns of `c`.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                self.runs_avx512(mm, a.get() as *const f32, s.get() as *const f32, c.get() as *mut f32, lo, hi)
            }
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("a window on a host without AVX-512F ({lo}..{hi})")
        });
    }

    /// Runs `lo..hi` of the window's runs of columns (outer levels in order).
    ///
    /// # Safety
    /// As for [`Window::run`]; AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn runs_avx512(&self, mm: &MatmulLaunch, a: *const f32, s: *const f32, c: *mut f32, lo: usize, hi: usize) {
        let [(_, s0), (e1, s1)] = self.outer;
        let mask = |lanes: usize| ((1u32 << lanes.min(16)) - 1) as u16;
        for run in lo..hi {
            let from = (run / e1) as isize * s0 + (run % e1) as isize * s1;
            for j in (0..self.inner).step_by(16) {
                let lanes = (self.inner - j).min(16);
                let words = if self.step == 2 { 2 * lanes - 1 } else { lanes };
                let cols = Cols {
                    src: s.wrapping_offset(from + j as isize * self.step),
                    col: (run * self.inner + j) as isize,
                    store: mask(lanes),
                    lo: mask(words),
                    hi: mask(words.saturating_sub(16)),
                };
                let mut m0 = 0;
                // SAFETY (every block): the caller's contract, for these rows and columns.
                unsafe {
                    while m0 + ROWS <= mm.m {
                        self.block_avx512::<ROWS>(mm, a, c, &cols, m0);
                        m0 += ROWS;
                    }
                    if m0 + 4 <= mm.m {
                        self.block_avx512::<4>(mm, a, c, &cols, m0);
                        m0 += 4;
                    }
                    while m0 < mm.m {
                        self.block_avx512::<1>(mm, a, c, &cols, m0);
                        m0 += 1;
                    }
                }
            }
        }
    }

    /// Rows `m0..m0 + R` of `c` at the columns of `cols`: one accumulator each, every step of
    /// `k` one read of `b`'s row through the window and `R` fused multiply-adds.
    ///
    /// # Safety
    /// As for [`Window::run`], the rows inside `c` and `a`; AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn block_avx512<const R: usize>(
        &self,
        mm: &MatmulLaunch,
        a: *const f32,
        c: *mut f32,
        cols: &Cols,
        m0: usize,
    ) {
        use std::arch::x86_64::*;
        let out: [*mut f32; R] =
            std::array::from_fn(|r| c.wrapping_offset(mm.c.offset + (m0 + r) as isize * mm.c.row + cols.col));
        let a_rows: [*const f32; R] =
            std::array::from_fn(|r| a.wrapping_offset(mm.a.offset + (m0 + r) as isize * mm.a.row));
        // SAFETY (loads and stores): `c`'s elements of these rows and columns and `a`'s of these
        // rows (bounds-checked by `MatmulLaunch::new`), the window's source elements of these
        // columns (`Window::of`); masked-off lanes are not touched.
        let mut acc: [__m512; R] = std::array::from_fn(|r| unsafe {
            if mm.accumulate { _mm512_maskz_loadu_ps(cols.store, out[r]) } else { _mm512_setzero_ps() }
        });
        let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        for (kk, &base) in self.bases.iter().enumerate() {
            let p = cols.src.wrapping_offset(base);
            let b = unsafe {
                if self.step == 2 {
                    let lo = _mm512_maskz_loadu_ps(cols.lo, p);
                    let hi = _mm512_maskz_loadu_ps(cols.hi, p.wrapping_add(16));
                    _mm512_permutex2var_ps(lo, evens, hi)
                } else {
                    _mm512_maskz_loadu_ps(cols.lo, p)
                }
            };
            let at = kk as isize * mm.a.col;
            for r in 0..R {
                let x = unsafe { *a_rows[r].wrapping_offset(at) };
                acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x), b, acc[r]);
            }
        }
        for r in 0..R {
            unsafe { _mm512_mask_storeu_ps(out[r], cols.store, acc[r]) };
        }
    }
}

/// A vector of columns of a run: where its window starts in the source (before a row's base),
/// its first column of `c`, and the masks of its store and of its source loads.
#[cfg(target_arch = "x86_64")]
struct Cols {
    src: *const f32,
    col: isize,
    store: u16,
    lo: u16,
    hi: u16,
}

#[cfg(test)]
mod tests {
    use air::DType;
    use codegen::cpu::{CopyMove, CopyNest, CopySide};

    use super::*;
    use crate::matmul::Strides;

    /// An im2col of `channels` planes of `batch` images (`[batch][channels][h][w]`) for a 3x3
    /// window at `stride`, into `b` of `[channels * 9][batch * oh * ow]` (each channel's taps
    /// side by side), as the lowering writes it: loops (channel, image, out row, out column), one
    /// copy per tap.
    fn im2col(channels: i64, batch: i64, (h, w): (i64, i64), stride: i64) -> (CopyNest, (i64, i64)) {
        let (oh, ow) = ((h - 3) / stride + 1, (w - 3) / stride + 1);
        let n = batch * oh * ow;
        let moves = (0..9)
            .map(|t| CopyMove {
                src: CopySide {
                    param: 1,
                    offset: (t / 3) * w + t % 3,
                    steps: vec![h * w, channels * h * w, stride * w, stride],
                },
                dst: CopySide { param: 0, offset: t * n, steps: vec![9 * n, oh * ow, ow, 1] },
            })
            .collect();
        (CopyNest { extents: vec![channels, batch, oh, ow], moves }, (oh, ow))
    }

    fn product(m: usize, k: usize, n: usize, accumulate: bool) -> MatmulLaunch {
        let strides = |param, row: usize| Strides { param, offset: 0, batch: 0, row: row as isize, col: 1 };
        MatmulLaunch {
            dtype: DType::F32,
            batch: 1,
            m,
            n,
            k,
            a: strides(1, k),
            b: strides(2, n),
            c: strides(0, n),
            accumulate,
            packed: false,
        }
    }

    /// What the copy stores: `b` from the nest, element by element.
    fn copied(nest: &CopyNest, source: &[f32], b_len: usize) -> Vec<f32> {
        let mut b = vec![f32::NAN; b_len];
        let e = &nest.extents;
        for mv in &nest.moves {
            for i0 in 0..e[0] {
                for i1 in 0..e[1] {
                    for i2 in 0..e[2] {
                        for i3 in 0..e[3] {
                            let at =
                                |off: i64, s: &[i64]| (off + i0 * s[0] + i1 * s[1] + i2 * s[2] + i3 * s[3]) as usize;
                            b[at(mv.dst.offset, &mv.dst.steps)] = source[at(mv.src.offset, &mv.src.steps)];
                        }
                    }
                }
            }
        }
        b
    }

    #[test]
    fn a_product_through_the_window_matches_the_copy_then_the_product() {
        let value = |i: usize| ((i * 37 % 101) as f32 - 50.0) / 25.0;
        // Stride 2 and 1, runs of 7 and 19 columns (a vector and a tail), rows 5 and 13 (blocks
        // of 8, 4 and 1), with and without a bias already in `c`.
        for (channels, batch, hw, stride, m) in [(2, 2, (11, 15), 2, 5), (1, 3, (7, 21), 1, 13), (3, 1, (9, 9), 2, 8)] {
            let (nest, (oh, ow)) = im2col(channels, batch, hw, stride);
            let (k, n) = ((9 * channels) as usize, (batch * oh * ow) as usize);
            let source: Vec<f32> = (0..(channels * batch * hw.0 * hw.1) as usize).map(value).collect();
            let a: Vec<f32> = (0..m * k).map(|i| value(i + 7)).collect();
            let b = copied(&nest, &source, k * n);
            assert!(b.iter().all(|x| !x.is_nan()), "the copy writes all of b");
            for accumulate in [false, true] {
                let mm = product(m, k, n, accumulate);
                let w = Window::of(&mm, &nest, source.len()).expect("a window");
                let bias: Vec<f32> = (0..m * n).map(|i| value(i + 3)).collect();
                let mut c = if accumulate { bias.clone() } else { vec![f32::NAN; m * n] };
                let args = [c.as_mut_ptr() as *mut u8, a.as_ptr() as *mut u8, std::ptr::null_mut()];
                // SAFETY: `a` and `c` are the product's `m x k` and `m x n`, the source the
                // window's (checked by `of`).
                unsafe { w.run(&mm, args.as_ptr(), source.as_ptr() as *const u8, Window::splits(&mm)) };
                for r in 0..m {
                    for col in 0..n {
                        let dot: f32 = (0..k).map(|p| a[r * k + p] * b[p * n + col]).sum();
                        let want = if accumulate { bias[r * n + col] + dot } else { dot };
                        let got = c[r * n + col];
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{m}x{k}x{n} [{r}, {col}]: {got} against {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_copy_that_is_not_all_of_b_once_or_reads_past_its_source_has_no_window() {
        let (nest, (oh, ow)) = im2col(2, 2, (11, 15), 2);
        let (k, n) = (18, (2 * oh * ow) as usize);
        let source_len = 2 * 2 * 11 * 15;
        let mm = product(4, k, n, false);
        assert!(Window::of(&mm, &nest, source_len).is_some());
        // A source one element short of the last window's reach.
        assert!(Window::of(&mm, &nest, source_len - 1).is_none());
        // Two copies into the same rows (and so none into others).
        let mut twice = nest.clone();
        twice.moves[1].dst.offset = twice.moves[0].dst.offset;
        assert!(Window::of(&mm, &twice, source_len).is_none());
        // A `b` with a row more than the copy writes.
        assert!(Window::of(&product(4, k + 1, n, false), &nest, source_len).is_none());
        // Columns every third element: no window routine reads those.
        let mut third = nest.clone();
        third.moves.iter_mut().for_each(|m| m.src.steps[3] = 3);
        assert!(Window::of(&mm, &third, 4 * source_len).is_none());
        // A nest that runs no iteration stores nothing.
        let mut empty = nest.clone();
        empty.extents[1] = 0;
        assert!(Window::of(&mm, &empty, source_len).is_none());
        // Copies that disagree on a column's step.
        let mut apart = nest.clone();
        apart.moves[2].src.steps[2] += 1;
        assert!(Window::of(&mm, &apart, 4 * source_len).is_none());
    }
}
