//! f32 GEMM against a weight packed once into column panels (AVX-512F): the layout a kept copy
//! of a `Linear` weight takes ([`super::RowCopy`]), so that no call packs `b` again.
//!
//! `gemm` packs `b` into its own panels on every call, even from a copy in rows: for dense-large's
//! (128x1024)@(1024x1024) that is 4 MiB written and read again per call. Packed once, each call
//! reads the panels as they lie. The panels are [`NR`] columns wide, `k` deep: element `(p, j)`
//! of `b` is at `(j / NR) * k * NR + p * NR + j % NR`. The kernel keeps an [`MR`]x[`NR`] block of
//! `c` in 24 registers, and each step of `k` broadcasts one element of each of the block's rows
//! of `a` (read in place, rows `lda` apart) against two vectors of the panel; blocks of
//! [`KC`] steps keep a panel's block in L1, and [`MC`] rows of `a` in L2 across the panels.
//! On the development machine (2 cores with AVX-512): 128x1024x1024 at 267-281 GFLOP/s on two
//! threads against 229-255 for `gemm` from rows (best of several standalone runs; its noisy
//! neighbours move single runs by 30%), 128x1024x784 264 against 255.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Columns of a panel (two 16-lane vectors).
pub const NR: usize = 32;

/// Rows of `a` per register block.
pub const MR: usize = 12;

/// Steps of `k` per pass over a block of `c` (a panel's block of 64 KiB).
const KC: usize = 512;

/// Rows of `a` per pass over the panels (a multiple of [`MR`]).
const MC: usize = 96;

/// Packs `b` (`k x n`, columns `col` apart, rows 1 apart: a weight `[n, k]` read as columns)
/// into panels at `dst`, panels `lo..hi` only (the caller splits them over threads).
///
/// # Safety
/// `b` holds the matrix; `dst` holds `k * n` elements; `n` is a multiple of [`NR`]; AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub unsafe fn pack(b: *const f32, col: usize, k: usize, dst: *mut f32, lo: usize, hi: usize) {
    // SAFETY: every access is inside the matrix and the panels (the caller's contract).
    unsafe {
        for jp in lo..hi {
            let panel = dst.add(jp * k * NR);
            for half in 0..NR / 16 {
                let j0 = jp * NR + half * 16;
                let mut p0 = 0;
                while p0 + 16 <= k {
                    // Sixteen columns of sixteen steps each, to sixteen rows of the panel.
                    super::transpose16(b.add(j0 * col + p0), col, panel.add(p0 * NR + half * 16), NR);
                    p0 += 16;
                }
                for p in p0..k {
                    for j in 0..16 {
                        *panel.add(p * NR + half * 16 + j) = *b.add((j0 + j) * col + p);
                    }
                }
            }
        }
    }
}

/// `c (+)= a b` for the columns of panels `lo..hi`: `a` is `m x k` (rows `lda` apart, columns
/// contiguous), `c` is `m x n` (rows `ldc` apart, columns contiguous); `accumulate` adds to `c`.
///
/// # Safety
/// `a`, `c` and `panels` hold their matrices (`c` columns `lo * NR .. hi * NR` written by no one
/// else meanwhile); AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm(
    (m, k): (usize, usize),
    a: *const f32,
    lda: usize,
    panels: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    (lo, hi): (usize, usize),
) {
    let mut pc = 0;
    while pc < k {
        let kc = KC.min(k - pc);
        // Later blocks of `k` add to what the earlier ones wrote.
        let add = accumulate || pc > 0;
        let mut ic = 0;
        while ic < m {
            let mc = MC.min(m - ic);
            for jp in lo..hi {
                // SAFETY: every block lies inside the matrices (the caller's contract).
                unsafe {
                    let b = panels.add(jp * k * NR + pc * NR);
                    let at = |i: usize| (a.add((ic + i) * lda + pc), c.add((ic + i) * ldc + jp * NR));
                    let mut i = 0;
                    while i + MR <= mc {
                        let (a, c) = at(i);
                        block::<MR>(kc, a, lda, b, c, ldc, add);
                        i += MR;
                    }
                    let (a, c) = at(i);
                    match mc - i {
                        0 => {}
                        1 => block::<1>(kc, a, lda, b, c, ldc, add),
                        2 => block::<2>(kc, a, lda, b, c, ldc, add),
                        3 => block::<3>(kc, a, lda, b, c, ldc, add),
                        4 => block::<4>(kc, a, lda, b, c, ldc, add),
                        5 => block::<5>(kc, a, lda, b, c, ldc, add),
                        6 => block::<6>(kc, a, lda, b, c, ldc, add),
                        7 => block::<7>(kc, a, lda, b, c, ldc, add),
                        8 => block::<8>(kc, a, lda, b, c, ldc, add),
                        9 => block::<9>(kc, a, lda, b, c, ldc, add),
                        10 => block::<10>(kc, a, lda, b, c, ldc, add),
                        _ => block::<11>(kc, a, lda, b, c, ldc, add),
                    }
                }
            }
            ic += mc;
        }
        pc += kc;
    }
}

/// `R` rows of `c`'s block of one panel over `kc` steps, in registers; `add` adds the block to
/// what `c` holds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn block<const R: usize>(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    add: bool,
) {
    // SAFETY: `R` rows of `kc` elements of `a`, `kc` rows of the panel and `R` rows of `NR`
    // elements of `c` (the caller's contract).
    unsafe {
        // Plain loops over arrays, which LLVM keeps in registers (see `dotrxn_avx512`).
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        let mut b = b;
        for p in 0..kc {
            let (b0, b1) = (_mm512_loadu_ps(b), _mm512_loadu_ps(b.add(16)));
            for i in 0..R {
                let x = _mm512_set1_ps(*a.add(i * lda + p));
                lo[i] = _mm512_fmadd_ps(x, b0, lo[i]);
                hi[i] = _mm512_fmadd_ps(x, b1, hi[i]);
            }
            b = b.add(NR);
        }
        for i in 0..R {
            let row = c.add(i * ldc);
            let (mut x0, mut x1) = (lo[i], hi[i]);
            if add {
                x0 = _mm512_add_ps(_mm512_loadu_ps(row), x0);
                x1 = _mm512_add_ps(_mm512_loadu_ps(row.add(16)), x1);
            }
            _mm512_storeu_ps(row, x0);
            _mm512_storeu_ps(row.add(16), x1);
        }
    }
}
