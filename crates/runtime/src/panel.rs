//! f32 GEMM against a weight packed once into panels of 32 columns (`matmul::PackedWeight`): the
//! register-blocked AVX-512 kernel behind a `Linear`'s product on the CPU.
//!
//! `gemm` packs its `b` again on every call and its AVX-512 kernel reached about 145 GFLOP/s on
//! one core of this project's Intel host (dense-large's 128x512x1024 half of a weight product),
//! where the core's FMA peak is 215. A weight is packed here once per weight version (as ONNX
//! Runtime prepacks constant weights when it creates a session): panel `p` holds columns
//! `32p..32p + 32` of `b` as `k` rows of 32 floats, the last panel zero-padded. A product then
//! runs [`kernel`] on strips of [`MR`] rows of `a`, [`KC`] steps at a time, against each panel's
//! block: 12 rows times two vectors of 16 columns are 24 accumulators, two vector loads of the
//! panel and twelve broadcasts of `a` per step. A row-major `a` is read in place (twelve rows,
//! each read in order); a column-major one is packed first, a block of [`MC`] rows into strips
//! (`[step][row]`). A panel's block and the strips stream from L2; the next panel's block is
//! prefetched into L2 while the current one's strips run, and the next tile of `c` between two
//! tiles. Threaded, the panels are split over the threads.
//!
//! Measured on the same host: one thread, median of 50, a standalone copy of this code against
//! `gemm` 0.19: 128x512x1024 845 against 925 us, 128x512x784 633 against 683; dense-large's
//! steady call (`kiln bench onnx`, two threads) 1.60-1.64 ms against 1.73-1.78 with the weights
//! kept in rows for `gemm`. Two alternatives measured no faster: splitting the rows over the
//! threads (each then packs only its rows of `a` but reads all of `b`: 1.71-1.81 against
//! 1.62-1.78 ms), and an epilogue adding the bias and applying the ReLU as tiles are stored
//! (the element-wise kernel it removed mostly paid for moving the product between the cores,
//! which the next product's packing of `a` then paid: dense-large's predict unchanged, its fit
//! step 6.8-6.9 against 6.2-6.4 ms, the RNNs' predict 3-8% slower).
//!
//! Reading a row-major `a` in place rather than packing it (s54; one thread, best of 200 calls
//! with everything in cache): 128x256x512 (the tree of matmuls' products) 198 -> 187 us,
//! 128x1024x1024 1581 -> 1487, 128x784x1024 1172 -> 1130, 30x64x64 2.2 -> 1.5; the kernel then
//! runs at 179 GFLOP/s against the 214 that a loop of nothing but FMAs reaches on this core (the
//! same loop as hand-written assembly ran no faster, and with the broadcasts folded into the
//! FMAs slower). With 32 distinct products in turn (their operands and outputs out of cache, as
//! in a tree of products), prefetching the next tile of `c` took a product from 248 to 220 us.
//! The `kiln bench tree-matmul` tree realize: 3.66-3.69 -> 3.39-3.51 ms (alternating binaries).

#[cfg(target_arch = "x86_64")]
use crate::matmul::Line16;
use crate::parallel::{self, SendPtr};

/// Columns of a panel: two AVX-512 vectors.
pub const NR: usize = 32;

/// Rows of `a` per strip: 12 x 2 accumulators of the 32 vector registers, two for the panel's
/// row, one for the broadcast.
const MR: usize = 12;

/// The most steps of `k` per block; a longer `k` is cut into equal blocks. A block as long as
/// `k` stores each tile of `c` once, where shorter blocks load and store it again per block:
/// with `c`'s rows 4 KiB apart (dense-large's 1024 columns), those 12 lines share an L1 set
/// with the panel's. Measured against 256 steps (a 32 KiB block of the panel, L1-sized), two
/// threads each computing half of 128x1024x1024 at once: 850 against 910-946 us per half.
const KC: usize = 1024;

/// Rows of `a` packed per block (768 KiB at `KC`: L2, with a panel's 128 KiB block).
const MC: usize = 16 * MR;

/// Floats of a packed `k x n` weight.
pub fn packed_len(k: usize, n: usize) -> usize {
    n.div_ceil(NR) * k * NR
}

/// Packs the `k x n` matrix at `b` (element `(p, j)` at `b[p * row + j * col]`, one of the two
/// strides 1) into panels at `dst` ([`packed_len`] floats), split over the threads when
/// `threaded`.
///
/// # Safety
/// `b` holds the matrix with those strides; `dst` holds `packed_len(k, n)` floats and starts on a
/// 64-byte boundary; the host has AVX-512F.
#[cfg(target_arch = "x86_64")]
pub unsafe fn pack(b: *const f32, (row, col): (isize, isize), k: usize, n: usize, dst: *mut f32, threaded: bool) {
    let (src, out) = (SendPtr(b as *mut u8), SendPtr(dst as *mut u8));
    let panels = n.div_ceil(NR);
    let one = |p: usize| {
        let (b, dst) = (src.get() as *const f32, out.get() as *mut f32);
        let cols = (n - p * NR).min(NR);
        // SAFETY: the caller's contract; panel `p` reads columns `p * NR..p * NR + cols` and
        // writes its own `k * NR` floats.
        unsafe {
            let (from, to) = (b.offset((p * NR) as isize * col), dst.add(p * k * NR));
            if row == 1 {
                crate::matmul::columns_to_rows(from, col as usize, k, cols, to, NR);
            } else {
                for s in 0..k {
                    std::ptr::copy_nonoverlapping(from.offset(s as isize * row), to.add(s * NR), cols);
                }
            }
            if cols < NR {
                for s in 0..k {
                    std::ptr::write_bytes(to.add(s * NR + cols), 0, NR - cols);
                }
            }
        }
    };
    let threads = parallel::threads();
    if threaded && threads > 1 && panels >= threads && k * n >= 1 << 16 {
        parallel::for_chunks(panels, threads, &|lo, hi| (lo..hi).for_each(one));
    } else {
        (0..panels).for_each(one);
    }
}

/// `c (+)= a b` for one `[m, k] x [k, n]` entry with `b` packed by [`pack`] at `panels`: `a`'s
/// element `(i, p)` at `a[i * a_row + p * a_col]`, `c`'s `(i, j)` at `c[i * c_row + j]`. The
/// panels are split over the threads when `threaded` (rows, in strips, where there are fewer
/// panels than threads).
///
/// # Safety
/// `a` and `c` hold their matrices with those strides, `panels` the packed `b`; nothing else
/// writes `c` meanwhile; the host has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm(
    (m, n, k): (usize, usize, usize),
    a: *const f32,
    (a_row, a_col): (isize, isize),
    panels: *const f32,
    c: *mut f32,
    c_row: isize,
    accumulate: bool,
    threaded: bool,
) {
    let (pa, pb, pc) = (SendPtr(a as *mut u8), SendPtr(panels as *mut u8), SendPtr(c as *mut u8));
    // Rows `r0..r1` against panels `p0..p1`.
    let block = |(r0, r1): (usize, usize), (p0, p1): (usize, usize)| {
        let x = Operands {
            a: pa.get() as *const f32,
            a_row,
            a_col,
            b: pb.get() as *const f32,
            c: pc.get() as *mut f32,
            c_row,
            n,
            k,
            accumulate,
        };
        // SAFETY: the caller's contract; distinct blocks write distinct elements of `c`.
        unsafe { x.block((r0, r1), (p0, p1)) }
    };
    let count = n.div_ceil(NR);
    let threads = if threaded { parallel::threads() } else { 1 };
    if threads > 1 && count >= threads {
        parallel::for_chunks(count, threads, &|lo, hi| block((0, m), (lo, hi)));
    } else if threads > 1 && m >= 2 * MR {
        let strips = m.div_ceil(MR);
        parallel::for_chunks(strips, threads, &|lo, hi| block((lo * MR, (hi * MR).min(m)), (0, count)));
    } else {
        block((0, m), (0, count));
    }
}

/// One entry's operands (see [`gemm`]).
#[cfg(target_arch = "x86_64")]
struct Operands {
    a: *const f32,
    a_row: isize,
    a_col: isize,
    b: *const f32,
    c: *mut f32,
    c_row: isize,
    n: usize,
    k: usize,
    accumulate: bool,
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// One `[MC, KC]` block of `a` in strips, per thread (in cache lines).
    static STRIPS: std::cell::RefCell<Vec<Line16>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(target_arch = "x86_64")]
impl Operands {
    /// Rows `r0..r1` of `c` against panels `p0..p1`.
    ///
    /// # Safety
    /// As for [`gemm`], for that block.
    #[target_feature(enable = "avx512f")]
    unsafe fn block(&self, (r0, r1): (usize, usize), (p0, p1): (usize, usize)) {
        // A row-major `a` is read in place: its strips' rows are `a_row` apart, each read in
        // order (a stream per row). Packing it cost more than it saved (see the module docs).
        let direct = self.a_col == 1;
        // This thread's strips for a packed `a` (the buffer stays put: nothing else on the
        // thread resizes it while this runs; 768 KiB, so not made where nothing is packed). No
        // closure runs the work: a closure does not inherit `target_feature` and, left out of
        // line, would call every intrinsic.
        let buf = if direct {
            std::ptr::null_mut()
        } else {
            STRIPS.with_borrow_mut(|strips| {
                if strips.len() < MC * KC / 16 {
                    strips.resize(MC * KC / 16, Line16([0.0; 16]));
                }
                strips.as_mut_ptr() as *mut f32
            })
        };
        let blocks = self.k.div_ceil(KC);
        let step = self.k.div_ceil(blocks);
        let c_bytes = self.c_row * 4;
        for pc in (0..self.k).step_by(step) {
            let kc = step.min(self.k - pc);
            // The first block of `k` stores `c` unless the launch accumulates.
            let load = pc > 0 || self.accumulate;
            for ic in (r0..r1).step_by(MC) {
                let mc = MC.min(r1 - ic);
                if !direct {
                    // SAFETY: rows `ic..ic + mc` and steps `pc..pc + kc` of `a` are in bounds;
                    // `buf` holds `MC * KC` floats.
                    unsafe { self.pack_strips(ic, mc, pc, kc, buf) };
                }
                // A panel's block in cache lines, and each strip's share of the next one's.
                let lines = kc * NR * 4 / 64;
                let share = lines.div_ceil(mc.div_ceil(MR));
                for p in p0..p1 {
                    let cols = (self.n - p * NR).min(NR);
                    let masks = (lanes(cols), lanes(cols.saturating_sub(16)));
                    // SAFETY (pointer arithmetic below): panel `p`'s block of steps `pc..pc +
                    // kc` lies inside the packed `b`, rows `ic..ic + mc` of `a` and `c` inside
                    // theirs; prefetched addresses are only computed (wrapping), never read.
                    let panel = unsafe { self.b.add((p * self.k + pc) * NR) };
                    // The next panel's block, fetched into L2 a share per strip while this
                    // one's strips run: a block read straight from L3 starves the kernel
                    // through the first strip.
                    let next_panel = self.b.wrapping_add(((p + 1) * self.k + pc) * NR) as *const u8;
                    let mut strip = buf as *const f32;
                    for i in (0..mc).step_by(MR) {
                        let rows = MR.min(mc - i);
                        let c = self.c.wrapping_offset((ic + i) as isize * self.c_row).wrapping_add(p * NR);
                        let a_at = self.a.wrapping_offset((ic + i) as isize * self.a_row + pc as isize);
                        // The next tile of `c` (down the panel, or the next panel's first),
                        // which a fresh output would otherwise fetch from L3 when it is stored.
                        if i + MR < mc {
                            let next = c.wrapping_offset(MR as isize * self.c_row) as *const u8;
                            prefetch_rows(next, c_bytes, MR.min(mc - i - MR), cols * 4);
                        } else if p + 1 < p1 {
                            let next = self.c.wrapping_offset(ic as isize * self.c_row).wrapping_add((p + 1) * NR);
                            let cols = (self.n - (p + 1) * NR).min(NR);
                            prefetch_rows(next as *const u8, c_bytes, MR.min(mc), cols * 4);
                        }
                        let pf = if p + 1 < p1 {
                            let first = (i / MR) * share;
                            (next_panel.wrapping_add(first * 64), share.min(lines.saturating_sub(first)))
                        } else {
                            (std::ptr::null(), 0)
                        };
                        let t = Tile {
                            kc,
                            a: if direct { a_at } else { strip },
                            direct,
                            a_row: self.a_row,
                            b: panel,
                            c,
                            c_row: self.c_row,
                            load,
                            masks,
                            pf,
                        };
                        // SAFETY: rows `ic + i..ic + i + rows`, columns `p * NR..p * NR + cols`
                        // of `c` are in bounds (the masks stop at `cols`); the strip's `kc`
                        // steps of `a` and the panel's block are in theirs.
                        unsafe { tile(rows, t) };
                        // (Only read when packed: `buf` is null otherwise.)
                        strip = strip.wrapping_add(kc * rows);
                    }
                }
            }
        }
    }

    /// Packs rows `i0..i0 + mc`, steps `p0..p0 + kc` of `a` into strips of [`MR`] rows at `dst`
    /// (`[step][row]`; the last strip has `mc % MR` rows), one step's rows after another: the
    /// writes are in order, and a column-major `a` (the case that packs) is read in order too.
    ///
    /// # Safety
    /// The block lies inside `a`; `dst` holds `mc * kc` floats.
    unsafe fn pack_strips(&self, i0: usize, mc: usize, p0: usize, kc: usize, dst: *mut f32) {
        let mut out = dst;
        for i in (i0..i0 + mc).step_by(MR) {
            let rows = MR.min(i0 + mc - i);
            // SAFETY: the caller's contract.
            unsafe {
                let first = self.a.offset(i as isize * self.a_row + p0 as isize * self.a_col);
                for s in 0..kc {
                    let src = first.offset(s as isize * self.a_col);
                    for r in 0..rows {
                        *out.add(r) = *src.offset(r as isize * self.a_row);
                    }
                    out = out.add(rows);
                }
            }
        }
    }
}

/// The first `cols` lanes of a vector of 16 (all from 16 on).
#[cfg(target_arch = "x86_64")]
fn lanes(cols: usize) -> u16 {
    if cols >= 16 { u16::MAX } else { ((1u32 << cols) - 1) as u16 }
}

/// One call of [`kernel`]: `kc` steps of a strip at `a` (`[step][row]`) against a panel's block
/// at `b` (`[step][NR]`), into the tile of `c` at `c` (rows `c_row` apart, columns masked by
/// `masks`), added to the tile's values when `load`.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Tile {
    kc: usize,
    a: *const f32,
    /// The strip is `a` read in place, its rows `a_row` elements apart and its steps 1 apart;
    /// otherwise a packed strip (`[step][row]`).
    direct: bool,
    a_row: isize,
    b: *const f32,
    c: *mut f32,
    c_row: isize,
    load: bool,
    masks: (u16, u16),
    /// Lines to prefetch into L2 meanwhile, spread over the loop: `(first, count)`.
    pf: (*const u8, usize),
}

/// Fetches `rows` runs of `bytes` from `first`, `stride` bytes apart, into L2: a burst between
/// two tiles, for the next tile of `c`. Spread over the kernel's loop instead, the bookkeeping
/// cost the loop its registers (a tenth of its speed with the data in cache).
#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch_rows(first: *const u8, stride: isize, rows: usize, bytes: usize) {
    use std::arch::x86_64::*;
    for r in 0..rows {
        let row = first.wrapping_offset(r as isize * stride);
        for line in 0..bytes.div_ceil(64) {
            // SAFETY: a prefetch of any address is harmless.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(line * 64) as *const i8) };
        }
    }
}

/// [`kernel`] for a strip of `rows` (1 to [`MR`]) rows.
///
/// # Safety
/// As for [`kernel`] with `R = rows`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile(rows: usize, t: Tile) {
    // SAFETY: the caller's contract.
    unsafe {
        macro_rules! by_rows {
            ($direct:literal) => {
                match rows {
                    12 => kernel::<12, $direct>(t),
                    11 => kernel::<11, $direct>(t),
                    10 => kernel::<10, $direct>(t),
                    9 => kernel::<9, $direct>(t),
                    8 => kernel::<8, $direct>(t),
                    7 => kernel::<7, $direct>(t),
                    6 => kernel::<6, $direct>(t),
                    5 => kernel::<5, $direct>(t),
                    4 => kernel::<4, $direct>(t),
                    3 => kernel::<3, $direct>(t),
                    2 => kernel::<2, $direct>(t),
                    _ => kernel::<1, $direct>(t),
                }
            };
        }
        if t.direct { by_rows!(true) } else { by_rows!(false) }
    }
}

/// Steps of the kernel's loop per iteration.
#[cfg(target_arch = "x86_64")]
const UNROLL: usize = 4;

/// `R` rows of `c` times 32 columns, over `t.kc` steps, in 2R accumulators.
///
/// # Safety
/// `t.a` holds `t.kc * R` floats, `t.b` `t.kc * NR`; the tile's `R` rows of masked columns lie
/// inside `c`; the host has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn kernel<const R: usize, const DIRECT: bool>(t: Tile) {
    use std::arch::x86_64::*;
    let (m0, m1) = t.masks;
    // SAFETY: the caller's contract: every load and store below stays inside `a`, `b` and the
    // masked tile of `c`.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        if t.load {
            for (r, acc) in acc.iter_mut().enumerate() {
                let row = t.c.offset(r as isize * t.c_row);
                *acc = [_mm512_maskz_loadu_ps(m0, row), _mm512_maskz_loadu_ps(m1, row.add(16))];
            }
        }
        // `a`'s rows when read in place: one pointer per three rows, the other two `a_row` and
        // `2 a_row` past it (an address mode's scaled index, so moving on costs four adds and
        // no per-row arithmetic).
        let mut bases = [t.a; 4];
        if DIRECT {
            for (q, base) in bases.iter_mut().enumerate() {
                *base = t.a.offset((3 * q).min(R - 1) as isize * t.a_row);
            }
        }
        let (mut a, mut b) = (t.a, t.b);
        // One step: a panel row against `R` broadcasts of `a` (a macro, not a closure: see
        // `Operands::block`).
        macro_rules! step {
            ($acc:expr, $u:expr, $b:expr) => {{
                let (u, b) = ($u, $b);
                let (b0, b1) = (_mm512_loadu_ps(b), _mm512_loadu_ps(b.add(16)));
                for (r, acc) in $acc.iter_mut().enumerate() {
                    let x = if DIRECT {
                        *bases[r / 3].add(u).offset((r % 3) as isize * t.a_row)
                    } else {
                        *a.add(u * R + r)
                    };
                    let x = _mm512_set1_ps(x);
                    acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
                }
            }};
        }
        // Past `$n` steps of the strip.
        macro_rules! advance {
            ($n:expr) => {
                if DIRECT {
                    for base in bases.iter_mut() {
                        *base = base.add($n);
                    }
                } else {
                    a = a.add($n * R);
                }
            };
        }
        let mut left = t.kc;
        let (mut pf, mut pf_left) = t.pf;
        // Lines per iteration, so that a strip alone in its block (a product of a few rows)
        // still fetches the whole next block.
        let per = pf_left.div_ceil((t.kc / UNROLL).max(1));
        while left >= UNROLL {
            if pf_left > 0 {
                for _ in 0..per {
                    _mm_prefetch::<_MM_HINT_T1>(pf as *const i8);
                    // (Wrapping: the last round may run past the block, and the panel.)
                    pf = pf.wrapping_add(64);
                }
                pf_left = pf_left.saturating_sub(per);
            }
            for u in 0..UNROLL {
                step!(acc, u, b.add(u * NR));
            }
            advance!(UNROLL);
            b = b.add(UNROLL * NR);
            left -= UNROLL;
        }
        for _ in 0..left {
            step!(acc, 0, b);
            advance!(1);
            b = b.add(NR);
        }
        for (r, acc) in acc.iter().enumerate() {
            let row = t.c.offset(r as isize * t.c_row);
            _mm512_mask_storeu_ps(row, m0, acc[0]);
            _mm512_mask_storeu_ps(row.add(16), m1, acc[1]);
        }
    }
}
