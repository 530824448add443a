//! Ahead-of-time compiled element-wise f32 routines over tiles, at the machine's full vector
//! width, that tiled kernels call (see `emit/tile.rs` and `analysis::tile_plan`).
//!
//! Cranelift's x86 vectors are 128 bits wide. A kernel whose inner loop is a chain of f32
//! element-wise ops with a transcendental in it runs instead as a JIT-ed loop over tiles of
//! [`TILE`] elements that calls one routine per op: each routine sweeps the tile (in L1) at full
//! width, and the chain's independent elements give every step full instruction-level
//! parallelism (a fused chain in registers is one long dependency chain). A unary routine can
//! also apply up to four cheap steps with scalar operands before its op and two after it
//! ([`around`]), so a sigmoid or a tanh is two calls per tile, not five or eight.
//!
//! Each routine exists three times, chosen when the kernel is compiled ([`TileLevel`]): compiled
//! with `avx512f,avx2,fma` enabled (512-bit vectors), with `avx2,fma` (256-bit), each used only
//! where `is_x86_feature_detected!` finds its features, and for the baseline target (SSE2 on
//! x86-64, no FMA). The same Rust source serves all three: plain loops over elements that LLVM
//! vectorizes (see [`map1`] for why in-place calls get a loop of their own). The approximations
//! are those of `math.rs`, operation for operation, so with FMA they give the JIT's results bit
//! for bit; without FMA, `exp2` evaluates its polynomial in f64 (f32 steps would round twice
//! each: 1.08 ulp, over the 1 ulp bound).

use std::ptr;

use super::math::{EXP2_POLY, IVLN2HI, IVLN2LO, LG1, LG2, LG3, LG4};

/// Elements in a tile: 2 KiB of f32, so that the few tiles one routine call touches stay in
/// a 32 KiB L1 data cache, and a kernel's scratch tiles (at most [`MAX_SLOTS`]) in L2 at worst.
pub(crate) const TILE: i64 = 512;

/// The fewest iterations a loop of known trip count needs to run over tiles (see
/// `analysis::tile_plan`; `emit_loop` and the native run decide alike).
pub(crate) const TILE_MIN_TRIPS: i64 = 64;

/// The most scratch tiles a tiled kernel may use (each `TILE` f32, 32 KiB of stack in all);
/// beyond, it stays JIT-only. 16, not 8: nn's GRU step (six gathered gate rows, three
/// exponentials per element) needs 11 and ran in the 128-bit JIT loop at 2.5-2.9 us; tiled,
/// 0.6-0.8 us (`kiln profile model gru --launches`, paired binaries).
pub(crate) const MAX_SLOTS: usize = 16;

/// Which instantiation of the tile routines a kernel calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileLevel {
    /// 512-bit AVX-512F with fused multiply-add (x86-64 hosts with AVX-512F, AVX2 and FMA).
    Avx512,
    /// 256-bit AVX2 with fused multiply-add (x86-64 hosts that have both).
    Avx2Fma,
    /// The baseline target: SSE2 (4 lanes) on x86-64, whatever the compiler targets elsewhere.
    Base,
}

impl TileLevel {
    /// The best level this host runs.
    pub fn detect() -> TileLevel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    return TileLevel::Avx512;
                }
                return TileLevel::Avx2Fma;
            }
        }
        TileLevel::Base
    }

    /// The level kernels use unless told otherwise: the best the host runs. (Until the routines
    /// became plain loops, LLVM's code for the 512-bit chunks was slower than the 256-bit one
    /// and AVX2 was the default on AVX-512 hosts; now a sigmoid runs 1.3x faster at 512 bits,
    /// `kiln bench unary` on the Intel machine of 2026-12-02.) `KILN_TILE=auto,avx2` picks AVX2.
    pub fn default_here() -> TileLevel {
        TileLevel::detect()
    }

    /// Whether this host runs the routines of `self`.
    pub fn runs_here(self) -> bool {
        match (self, TileLevel::detect()) {
            (TileLevel::Base, _) | (TileLevel::Avx512, TileLevel::Avx512) => true,
            (TileLevel::Avx2Fma, host) => host != TileLevel::Base,
            (TileLevel::Avx512, _) => false,
        }
    }
}

/// When the CPU compiler runs an eligible inner loop over tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileMode {
    /// Never: every loop is JIT-ed only.
    Off,
    /// Loops whose body computes `exp2` or `log2` (compute-bound, where full width pays for the
    /// tile's extra loads and stores).
    Auto,
    /// Every eligible loop (for tests of the tiled path).
    Always,
}

/// The tiling configuration of a [`CpuCompiler`](super::CpuCompiler).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tiling {
    /// When to tile.
    pub mode: TileMode,
    /// Which routines tiled kernels call.
    pub level: TileLevel,
}

/// Environment variable for the default tiling: `off`, `auto` or `always`, optionally followed
/// by `,base`, `,avx2` or `,avx512` to pick the routines (e.g. `KILN_TILE=always,base`; a level
/// the host lacks is ignored).
pub const TILE_ENV: &str = "KILN_TILE";

impl Tiling {
    /// `Auto` at [`TileLevel::default_here`], unless `KILN_TILE` says otherwise (an unknown value
    /// is ignored).
    pub fn from_env() -> Tiling {
        let mut t = Tiling { mode: TileMode::Auto, level: TileLevel::default_here() };
        if let Ok(v) = std::env::var(TILE_ENV) {
            for part in v.split(',').map(str::trim) {
                match part {
                    "off" => t.mode = TileMode::Off,
                    "auto" => t.mode = TileMode::Auto,
                    "always" => t.mode = TileMode::Always,
                    "base" => t.level = TileLevel::Base,
                    "avx512" if TileLevel::Avx512.runs_here() => t.level = TileLevel::Avx512,
                    "avx2" if TileLevel::Avx2Fma.runs_here() => t.level = TileLevel::Avx2Fma,
                    _ => {}
                }
            }
        }
        t
    }
}

/// Unary routines (the `op` argument of the unary helpers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub(crate) enum TileUnary {
    Copy = 0,
    Neg = 1,
    Sqrt = 2,
    Recip = 3,
    Exp2 = 4,
    Log2 = 5,
    /// `1 / (exp2(x) + d)`: a sigmoid's or a tanh's core in one pass (`d` is the seventh
    /// parameter; only with [`AROUND`]).
    Exp2Recip = 6,
    /// `dst[i] = if f32(first + i) < bound { src[i] } else { other }`: a causal mask, with the
    /// parameters `[bound, other]` then the i64 `first` (see [`select_below`]; never with
    /// [`AROUND`]).
    SelectBelow = 7,
}

/// Parameter positions (in f32 slots) of [`TileUnary::SelectBelow`]: the bound, the other
/// value, then the first element's index as an i64 in two slots.
pub(crate) const SELECT_BOUND: usize = 0;
pub(crate) const SELECT_OTHER: usize = 1;
pub(crate) const SELECT_FIRST: usize = 2;

/// [`TileUnary::SelectBelow`] over `n` elements: each index converted to f32 as the JIT's
/// `index` statement converts it (round to nearest), compared as its `cmplt` compares. Indices
/// within +-2^24 convert exactly from i32, which vectorizes; others take the i64 loop.
#[inline(always)]
unsafe fn select_below(dst: *mut f32, src: *const f32, n: usize, p: *const f32) {
    // SAFETY: the caller passes `n` elements at `dst` and `src` and the parameters at `p`.
    unsafe {
        let bound = *p.add(SELECT_BOUND);
        let other = *p.add(SELECT_OTHER);
        let first = ptr::read_unaligned(p.add(SELECT_FIRST) as *const i64);
        const EXACT: i64 = 1 << 24;
        let last = first.checked_add(n as i64);
        if first > -EXACT && last.is_some_and(|l| l < EXACT) {
            let first = first as i32;
            map_indexed(dst, src, n, |i, x| if ((first + i as i32) as f32) < bound { x } else { other });
        } else {
            map_indexed(dst, src, n, |i, x| if (first.wrapping_add(i as i64) as f32) < bound { x } else { other });
        }
    }
}

/// Binary routines (the low byte of the binary helpers' `mode` argument; bit 8 says `a` is a
/// scalar, bit 9 that `b` is).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub(crate) enum TileBinary {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
    Max = 4,
    Min = 5,
}

/// Unary op bit: the routine computes [`around`] the op, with the `PARAMS` values its last
/// argument points to.
pub(crate) const AROUND: i32 = 1 << 8;
/// With [`AROUND`]: `b1` or `a2` is not neutral (without, the routine skips those steps).
pub(crate) const AROUND_FULL: i32 = 1 << 9;
/// With [`AROUND`]: `a3` or `b3` is not neutral.
pub(crate) const AROUND_POST: i32 = 1 << 10;

/// Values an [`AROUND`] call reads: `[a1, b1, c1, a2, a3, b3, d]` (`d` for
/// [`TileUnary::Exp2Recip`]).
pub(crate) const PARAMS: usize = 7;

/// The parameters that leave every step of [`around`] out: `x * 1 + -0` is `x` (also for `-0`
/// and NaN), `min(x, +inf)` is `x`.
pub(crate) const NEUTRAL: [f32; PARAMS] = [1.0, -0.0, f32::INFINITY, 1.0, 1.0, -0.0, -0.0];

/// Mode bit: operand `a` is one scalar (at `a[0]`), not a tile.
pub(crate) const A_SCALAR: i32 = 1 << 8;
/// Mode bit: operand `b` is one scalar.
pub(crate) const B_SCALAR: i32 = 1 << 9;

/// `dst[i] = f(src[i])` for `i < n`, as a plain loop that LLVM vectorizes at the width the
/// calling routine is compiled for. A destination equal to the source is an in-place loop through
/// one pointer, and disjoint buffers are slices, so neither needs LLVM's runtime alias check
/// (which would send an in-place call to its scalar fallback); buffers that overlap otherwise
/// (the code generator never passes them) run element by element, in order.
#[inline(always)]
unsafe fn map1(dst: *mut f32, src: *const f32, n: usize, f: impl Fn(f32) -> f32) {
    // SAFETY: forwarded to the caller.
    unsafe { map_indexed(dst, src, n, |_, x| f(x)) }
}

/// [`map1`] with each element's position: `dst[i] = f(i, src[i])` for `i < n`.
#[inline(always)]
unsafe fn map_indexed(dst: *mut f32, src: *const f32, n: usize, f: impl Fn(usize, f32) -> f32) {
    // SAFETY (all three): the caller's buffers hold n elements.
    unsafe {
        if ptr::eq(dst, src) {
            let d = std::slice::from_raw_parts_mut(dst, n);
            for (i, x) in d.iter_mut().enumerate() {
                *x = f(i, *x);
            }
        } else if disjoint(dst, src, n) {
            let d = std::slice::from_raw_parts_mut(dst, n);
            let s = std::slice::from_raw_parts(src, n);
            for (i, (d, &x)) in d.iter_mut().zip(s).enumerate() {
                *d = f(i, x);
            }
        } else {
            for i in 0..n {
                *dst.add(i) = f(i, *src.add(i));
            }
        }
    }
}

/// Whether `n` elements at `a` and at `b` share no byte.
#[inline(always)]
fn disjoint(a: *const f32, b: *const f32, n: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a.abs_diff(b) >= n * 4
}

/// `dst[i] = f(a[i], b[i])` for `i < n`, where a scalar operand is read once and broadcast (see
/// [`map1`] for the aliasing cases).
#[inline(always)]
unsafe fn map2(dst: *mut f32, a: *const f32, b: *const f32, n: usize, mode: i32, f: impl Fn(f32, f32) -> f32) {
    // SAFETY (all): the caller's buffers hold n elements, or one for a scalar operand.
    unsafe {
        match (mode & A_SCALAR != 0, mode & B_SCALAR != 0) {
            (false, true) => {
                let s = *b;
                map1(dst, a, n, |x| f(x, s))
            }
            (true, false) => {
                let s = *a;
                map1(dst, b, n, |y| f(s, y))
            }
            _ if ptr::eq(dst, a) && ptr::eq(a, b) => map1(dst, a, n, |x| f(x, x)),
            _ if ptr::eq(dst, a) && disjoint(a, b, n) => {
                let b = std::slice::from_raw_parts(b, n);
                for (i, &y) in b.iter().enumerate() {
                    *dst.add(i) = f(*dst.add(i), y);
                }
            }
            _ if ptr::eq(dst, b) && disjoint(a, b, n) => {
                let a = std::slice::from_raw_parts(a, n);
                for (i, &x) in a.iter().enumerate() {
                    *dst.add(i) = f(x, *dst.add(i));
                }
            }
            _ if disjoint(dst, a, n) && disjoint(dst, b, n) => {
                let d = std::slice::from_raw_parts_mut(dst, n);
                let (a, b) = (std::slice::from_raw_parts(a, n), std::slice::from_raw_parts(b, n));
                for ((d, &x), &y) in d.iter_mut().zip(a).zip(b) {
                    *d = f(x, y);
                }
            }
            _ => {
                for i in 0..n {
                    *dst.add(i) = f(*a.add(i), *b.add(i));
                }
            }
        }
    }
}

/// `c[0] + x*(c[1] + x*(c[2] + ...))`, fused as `math.rs` fuses it.
#[inline(always)]
fn horner<const FMA: bool>(x: f32, c: &[f32]) -> f32 {
    let n = c.len();
    let mut acc = c[n - 1];
    for &ci in c[..n - 1].iter().rev() {
        acc = if FMA { acc.mul_add(x, ci) } else { acc * x + ci };
    }
    acc
}

/// [`horner`] evaluated in f64, rounded once to f32.
#[inline(always)]
fn horner_f64(x: f32, c: &[f32]) -> f32 {
    let x = x as f64;
    let n = c.len();
    let mut acc = c[n - 1] as f64;
    for &ci in c[..n - 1].iter().rev() {
        acc = acc * x + ci as f64;
    }
    acc as f32
}

/// `math.rs`'s `exp2`, step for step (with FMA; without, the polynomial is evaluated in f64).
#[inline(always)]
pub(crate) fn exp2<const FMA: bool>(x: f32) -> f32 {
    exp2_capped::<FMA>(x, 130.0)
}

/// [`exp2`] with its upper clamp at `hi <= 130` instead of 130: `exp2(min(x, hi))` for a `hi`
/// that is not NaN, in one comparison.
#[inline(always)]
fn exp2_capped<const FMA: bool>(x: f32, hi: f32) -> f32 {
    let x = if x > hi { hi } else { x };
    // Below -150 the result is 0, given without an underflowing product (`math.rs`'s `exp2`).
    let zero = x < -150.0;
    let x = if zero { 0.0 } else { x };
    const MAGIC: f32 = 12_582_912.0;
    let t = x + MAGIC;
    let n = t - MAGIC;
    let f = x - n;
    // Without FMA the f32 steps round twice each and cost 1.08 ulp; in f64 they do not.
    let p = if FMA { horner::<true>(f, &EXP2_POLY) } else { horner_f64(f, &EXP2_POLY) };
    let ni = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let n1 = ni >> 1;
    let n2 = ni.wrapping_sub(n1);
    let scale = |e: i32| f32::from_bits((e.wrapping_add(127) << 23) as u32);
    let r = p * scale(n1) * scale(n2);
    if zero { 0.0 } else { r }
}

/// `math.rs`'s `log2` (musl's `log2f` kernel), step for step.
#[inline(always)]
pub(crate) fn log2<const FMA: bool>(x: f32) -> f32 {
    let is_sub = x < f32::MIN_POSITIVE;
    let xs = if is_sub { x * 8_388_608.0 } else { x };
    let k_adj: i32 = if is_sub { 23 } else { 0 };
    let ix = (xs.to_bits() as i32).wrapping_add(0x3f80_0000 - 0x3f35_04f3);
    let k = (ix >> 23).wrapping_sub(0x7f).wrapping_sub(k_adj);
    let m = f32::from_bits((ix & 0x007f_ffff).wrapping_add(0x3f35_04f3) as u32);
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let t1 = w * horner::<FMA>(w, &[LG2, LG4]);
    let t2 = z * horner::<FMA>(w, &[LG1, LG3]);
    let r = t2 + t1;
    let hfsq = 0.5 * (f * f);
    let hi = f32::from_bits((f - hfsq).to_bits() & 0xffff_f000);
    let lo = f - hi - hfsq;
    let lo = lo + s * (hfsq + r);
    let y = (lo + hi) * IVLN2LO + lo * IVLN2HI + hi * IVLN2HI + k as f32;
    let y = if x < 0.0 { f32::NAN } else { y };
    let y = if x == 0.0 { f32::NEG_INFINITY } else { y };
    let y = if x == f32::INFINITY { f32::INFINITY } else { y };
    if x.is_nan() { x } else { y }
}

/// Cranelift's `fmax`: NaN if either is NaN, and `+0 > -0` (no short-circuit `||`: a loop of
/// it then vectorizes, as `map`'s do).
#[inline(always)]
pub(crate) fn fmax(a: f32, b: f32) -> f32 {
    let same = f32::from_bits(a.to_bits() & b.to_bits());
    let m = if a > b { a } else { b };
    let m = if a == b { same } else { m };
    if a.is_nan() | b.is_nan() { a + b } else { m }
}

/// Cranelift's `fmin`: NaN if either is NaN, and `-0 < +0`.
#[inline(always)]
pub(crate) fn fmin(a: f32, b: f32) -> f32 {
    let same = f32::from_bits(a.to_bits() | b.to_bits());
    let m = if a < b { a } else { b };
    let m = if a == b { same } else { m };
    if a.is_nan() | b.is_nan() { a + b } else { m }
}

/// `around(x) = f(min(x * a1 + b1, c1) * a2) * a3 + b3` with `p = [a1, b1, c1, a2, a3, b3, ..]`,
/// each step rounded on its own as the statements it replaces (`analysis::tile_plan` folds them
/// in). `min` is Cranelift's `fmin` for a `c1` that is neither zero nor NaN (the plan folds only
/// such constants), where it is `if c1 < t { c1 } else { t }`. [`NEUTRAL`] leaves a step out
/// exactly; without `FULL` the neutral `b1` and `a2` are not applied, without `POST` nor `a3` and
/// `b3` (each costs about a tenth of an `exp2`).
#[inline(always)]
fn around<const FULL: bool, const POST: bool>(x: f32, p: &[f32; PARAMS], f: impl Fn(f32) -> f32) -> f32 {
    let t = if FULL { x * p[0] + p[1] } else { x * p[0] };
    let t = if p[2] < t { p[2] } else { t };
    let y = if FULL { f(t * p[3]) } else { f(t) };
    post::<POST>(y, p)
}

/// The steps of [`around`] after its op.
#[inline(always)]
fn post<const POST: bool>(y: f32, p: &[f32; PARAMS]) -> f32 {
    if POST { y * p[4] + p[5] } else { y }
}

/// One unary routine with [`around`] in the shape `FULL`, `POST`.
#[inline(always)]
unsafe fn around_op<const FMA: bool, const FULL: bool, const POST: bool>(
    op: i32,
    dst: *mut f32,
    src: *const f32,
    n: usize,
    p: &[f32; PARAMS],
) {
    let d = p[6];
    // SAFETY: forwarded to the caller.
    unsafe {
        match op {
            0 => map1(dst, src, n, |x| around::<FULL, POST>(x, p, |t| t)),
            1 => map1(dst, src, n, |x| around::<FULL, POST>(x, p, |t| -t)),
            2 => map1(dst, src, n, |x| around::<FULL, POST>(x, p, f32::sqrt)),
            3 => map1(dst, src, n, |x| around::<FULL, POST>(x, p, |t| 1.0 / t)),
            // Without the steps between, `min(t, c1)` is exp2's own upper clamp moved to
            // `min(c1, 130)` (the same value for every `t`, NaN included): one comparison less.
            4 if !FULL => {
                let hi = p[2].min(130.0);
                map1(dst, src, n, |x| post::<POST>(exp2_capped::<FMA>(x * p[0], hi), p))
            }
            6 if !FULL => {
                let hi = p[2].min(130.0);
                map1(dst, src, n, |x| post::<POST>(1.0 / (exp2_capped::<FMA>(x * p[0], hi) + d), p))
            }
            4 => map1(dst, src, n, |x| around::<FULL, POST>(x, p, exp2::<FMA>)),
            5 => map1(dst, src, n, |x| around::<FULL, POST>(x, p, log2::<FMA>)),
            6 => map1(dst, src, n, |x| around::<FULL, POST>(x, p, |t| 1.0 / (exp2::<FMA>(t) + d))),
            _ => {}
        }
    }
}

#[inline(always)]
unsafe fn unary<const FMA: bool>(op: i32, dst: *mut f32, src: *const f32, n: usize, params: *const f32) {
    // SAFETY: forwarded to the caller, who passes `PARAMS` values at `params` with `AROUND` or
    // `SelectBelow`.
    unsafe {
        if op & AROUND == 0 {
            match op {
                0 => map1(dst, src, n, |x| x),
                1 => map1(dst, src, n, |x| -x),
                2 => map1(dst, src, n, f32::sqrt),
                3 => map1(dst, src, n, |x| 1.0 / x),
                4 => map1(dst, src, n, exp2::<FMA>),
                5 => map1(dst, src, n, log2::<FMA>),
                7 => select_below(dst, src, n, params),
                _ => {}
            }
            return;
        }
        let p = ptr::read_unaligned(params as *const [f32; PARAMS]);
        let code = op & 0xff;
        match (op & AROUND_FULL != 0, op & AROUND_POST != 0) {
            (false, false) => around_op::<FMA, false, false>(code, dst, src, n, &p),
            (false, true) => around_op::<FMA, false, true>(code, dst, src, n, &p),
            (true, false) => around_op::<FMA, true, false>(code, dst, src, n, &p),
            (true, true) => around_op::<FMA, true, true>(code, dst, src, n, &p),
        }
    }
}

#[inline(always)]
unsafe fn binary(mode: i32, dst: *mut f32, a: *const f32, b: *const f32, n: usize) {
    // SAFETY: forwarded to the caller.
    unsafe {
        match mode & 0xff {
            0 => map2(dst, a, b, n, mode, |x, y| x + y),
            1 => map2(dst, a, b, n, mode, |x, y| x - y),
            2 => map2(dst, a, b, n, mode, |x, y| x * y),
            3 => map2(dst, a, b, n, mode, |x, y| x / y),
            4 => map2(dst, a, b, n, mode, fmax),
            5 => map2(dst, a, b, n, mode, fmin),
            _ => {}
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn unary_avx2_fma(op: i32, dst: *mut f32, src: *const f32, n: usize, p: *const f32) {
    // SAFETY: forwarded to the caller.
    unsafe { unary::<true>(op, dst, src, n, p) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn binary_avx2_fma(mode: i32, dst: *mut f32, a: *const f32, b: *const f32, n: usize) {
    // SAFETY: forwarded to the caller.
    unsafe { binary(mode, dst, a, b, n) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn unary_avx512_fma(op: i32, dst: *mut f32, src: *const f32, n: usize, p: *const f32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        if !avx512::unary(op, dst, src, n, p) {
            unary::<true>(op, dst, src, n, p)
        }
    }
}

/// The exponential routines written with AVX-512 intrinsics, where LLVM's vectorized plain loop
/// cannot reach `vscalefps`: [`exp2_capped`]'s final `p * 2^(n/2) * 2^(n - n/2)` (ten integer
/// and float steps per vector) is one `p * 2^n` that rounds once. The two agree bit for bit:
/// for `n` in `[-150, 130]` and `p` in `[0.7, 1.5]`, `p * 2^(n/2)` is a normal float, so it is
/// exact, and the second product rounds once, as `vscalefps` does (below `x = -150` both zero
/// the lanes rather than scale them: see `exp2_capped`). Every other step is
/// the scalar routine's, operation for operation (the test below sweeps the f32 line against it).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;
    use std::ptr;

    use super::{AROUND, AROUND_FULL, AROUND_POST, EXP2_POLY, PARAMS, disjoint};

    /// [`super::exp2_capped`] on 16 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn exp2_capped(x: __m512, hi: __m512) -> __m512 {
        // `if x < -160 { -160 } else { x }`: `vmaxps` returns its second operand when either is
        // NaN, so a NaN `x` passes through; likewise `min(hi, x)` for the upper clamp.
        let x = _mm512_max_ps(_mm512_set1_ps(-160.0), x);
        let x = _mm512_min_ps(hi, x);
        let magic = _mm512_set1_ps(12_582_912.0);
        let t = _mm512_add_ps(x, magic);
        let n = _mm512_sub_ps(t, magic);
        let f = _mm512_sub_ps(x, n);
        let last = EXP2_POLY.len() - 1;
        let mut acc = _mm512_set1_ps(EXP2_POLY[last]);
        for &c in EXP2_POLY[..last].iter().rev() {
            acc = _mm512_fmadd_ps(acc, f, _mm512_set1_ps(c));
        }
        // Below -150 the result rounds to 0 (`n <= -150` and `p <= 1` there), and `vscalefps`
        // underflowing to it takes a microcode assist on Intel: a causal mask's `exp2(-inf)`,
        // half of a prefill's attention, ran 4.8x slower than the AVX2 routine. Those lanes are
        // zeroed instead of scaled (NaN compares "not less" and is scaled, passing through).
        let scaled = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(-150.0));
        _mm512_maskz_scalef_ps(scaled, acc, n)
    }

    /// `dst[i] = f(src[i])` for `i < n`, 16 lanes at a time and a masked tail; `false` (nothing
    /// done) for buffers that overlap without being the same.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn map(dst: *mut f32, src: *const f32, n: usize, f: impl Fn(__m512) -> __m512) -> bool {
        if !ptr::eq(dst, src) && !disjoint(dst, src, n) {
            return false;
        }
        let mut i = 0;
        // SAFETY: the caller's buffers hold n elements; each access reads or writes lanes below n.
        unsafe {
            while i + 16 <= n {
                _mm512_storeu_ps(dst.add(i), f(_mm512_loadu_ps(src.add(i))));
                i += 16;
            }
            if i < n {
                let m: __mmask16 = ((1u32 << (n - i)) - 1) as u16;
                _mm512_mask_storeu_ps(dst.add(i), m, f(_mm512_maskz_loadu_ps(m, src.add(i))));
            }
        }
        true
    }

    /// The exponential routines ([`super::TileUnary::Exp2`] and `Exp2Recip`, with or without
    /// [`AROUND`]); `false` for the others, which the plain loops serve.
    ///
    /// # Safety
    /// As for `super::unary`: `n` elements at `dst` and `src`, `PARAMS` values at `params` with
    /// `AROUND`; the host has AVX-512F, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn unary(op: i32, dst: *mut f32, src: *const f32, n: usize, params: *const f32) -> bool {
        let code = op & 0xff;
        if code != 4 && code != 6 {
            return false;
        }
        if op & AROUND == 0 {
            // SAFETY: forwarded to the caller.
            return code == 4 && unsafe { map(dst, src, n, |x| exp2_capped(x, _mm512_set1_ps(130.0))) };
        }
        // SAFETY: the caller passes `PARAMS` values with `AROUND`.
        let p = unsafe { ptr::read_unaligned(params as *const [f32; PARAMS]) };
        // SAFETY (all four): forwarded to the caller.
        unsafe {
            match (code == 6, op & AROUND_FULL != 0, op & AROUND_POST != 0) {
                (false, full, false) => around::<false, false>(full, dst, src, n, &p),
                (false, full, true) => around::<false, true>(full, dst, src, n, &p),
                (true, full, false) => around::<true, false>(full, dst, src, n, &p),
                (true, full, true) => around::<true, true>(full, dst, src, n, &p),
            }
        }
    }

    /// `super::around_op` for `exp2` (`RECIP`: `1 / (exp2 + d)`), each step rounded on its own.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn around<const RECIP: bool, const POST: bool>(
        full: bool,
        dst: *mut f32,
        src: *const f32,
        n: usize,
        p: &[f32; PARAMS],
    ) -> bool {
        let splat = _mm512_set1_ps;
        let (a1, b1, c1, a2, a3, b3, d) =
            (splat(p[0]), splat(p[1]), splat(p[2]), splat(p[3]), splat(p[4]), splat(p[5]), splat(p[6]));
        let core = |e: __m512| if RECIP { _mm512_div_ps(splat(1.0), _mm512_add_ps(e, d)) } else { e };
        let post = |y: __m512| if POST { _mm512_add_ps(_mm512_mul_ps(y, a3), b3) } else { y };
        // SAFETY (both): forwarded to the caller.
        unsafe {
            if full {
                map(dst, src, n, |x| {
                    let t = _mm512_add_ps(_mm512_mul_ps(x, a1), b1);
                    // `if c1 < t { c1 } else { t }`.
                    let t = _mm512_min_ps(c1, t);
                    post(core(exp2_capped(_mm512_mul_ps(t, a2), splat(130.0))))
                })
            } else {
                // `min(t, c1)` folded into exp2's own upper clamp, as the plain loop does.
                let hi = splat(p[2].min(130.0));
                map(dst, src, n, |x| post(core(exp2_capped(_mm512_mul_ps(x, a1), hi))))
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn binary_avx512_fma(mode: i32, dst: *mut f32, a: *const f32, b: *const f32, n: usize) {
    // SAFETY: forwarded to the caller.
    unsafe { binary(mode, dst, a, b, n) }
}

/// Unary helper, AVX-512F + FMA: called only where [`TileLevel::detect`] found AVX-512F (see
/// [`unary_avx2`]).
pub(crate) extern "C" fn unary_avx512(op: i32, dst: *mut f32, src: *const f32, n: i64, p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: kernels call this only on hosts with avx512f, avx2 and fma (`TileLevel::detect`),
    // with buffers of n elements.
    unsafe {
        unary_avx512_fma(op, dst, src, n.max(0) as usize, p)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unary_base(op, dst, src, n, p)
}

/// Binary helper, AVX-512F + FMA (see [`unary_avx512`]).
pub(crate) extern "C" fn binary_avx512(mode: i32, dst: *mut f32, a: *const f32, b: *const f32, n: i64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as for `unary_avx512`.
    unsafe {
        binary_avx512_fma(mode, dst, a, b, n.max(0) as usize)
    }
    #[cfg(not(target_arch = "x86_64"))]
    binary_base(mode, dst, a, b, n)
}

/// Unary helper, AVX2 + FMA. The code generator calls it only when [`TileLevel::detect`]
/// found both features (or a test forced a level the host has).
pub(crate) extern "C" fn unary_avx2(op: i32, dst: *mut f32, src: *const f32, n: i64, p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: kernels call this only on hosts with avx2 and fma (`TileLevel::detect`), with
    // buffers of n elements.
    unsafe {
        unary_avx2_fma(op, dst, src, n.max(0) as usize, p)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unary_base(op, dst, src, n, p)
}

/// Binary helper, AVX2 + FMA (see [`unary_avx2`]).
pub(crate) extern "C" fn binary_avx2(mode: i32, dst: *mut f32, a: *const f32, b: *const f32, n: i64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as for `unary_avx2`.
    unsafe {
        binary_avx2_fma(mode, dst, a, b, n.max(0) as usize)
    }
    #[cfg(not(target_arch = "x86_64"))]
    binary_base(mode, dst, a, b, n)
}

/// Unary helper for the baseline target.
pub(crate) extern "C" fn unary_base(op: i32, dst: *mut f32, src: *const f32, n: i64, p: *const f32) {
    // SAFETY: kernels pass buffers of n elements.
    unsafe { unary::<false>(op, dst, src, n.max(0) as usize, p) }
}

/// Binary helper for the baseline target.
pub(crate) extern "C" fn binary_base(mode: i32, dst: *mut f32, a: *const f32, b: *const f32, n: i64) {
    // SAFETY: kernels pass buffers of n elements (one for a scalar operand).
    unsafe { binary(mode, dst, a, b, n.max(0) as usize) }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// f32 bit patterns spread over the whole line, every special value, and the edges of
    /// exp2's clamps and of the denormal range of its results.
    fn sweep() -> Vec<f32> {
        let mut xs: Vec<f32> = (0..=u32::MAX).step_by(3001).map(f32::from_bits).collect();
        xs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MIN_POSITIVE, f32::MAX, f32::MIN]);
        for edge in [-160.0f32, -150.0, -149.0, -126.0, 127.0, 128.0, 130.0] {
            let mut x = edge - 2.0;
            while x < edge + 2.0 {
                xs.push(x);
                x += 1.0 / 64.0;
            }
        }
        xs
    }

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    /// The AVX-512 exponential routines give the plain loops' results bit for bit, for every
    /// shape of `around` they serve, in place and not, at lengths with and without a tail.
    #[test]
    fn avx512_exponentials_match_the_plain_loops_bit_for_bit() {
        if TileLevel::detect() != TileLevel::Avx512 {
            return;
        }
        let xs = sweep();
        let log2e = std::f32::consts::LOG2_E;
        let params: [[f32; PARAMS]; 4] = [
            NEUTRAL,
            [-log2e, -0.0, 80.0, 1.0, 1.0, -0.0, 1.0],
            [-2.0 * log2e, 0.5, 40.0, 1.5, 2.0, -1.0, 1.0],
            [0.25, -3.0, f32::INFINITY, -1.0, -0.5, 0.125, 0.0],
        ];
        let mut ops = vec![(TileUnary::Exp2 as i32, NEUTRAL)];
        for p in params {
            for code in [TileUnary::Exp2 as i32, TileUnary::Exp2Recip as i32] {
                for bits in [0, AROUND_FULL, AROUND_POST, AROUND_FULL | AROUND_POST] {
                    ops.push((code | AROUND | bits, p));
                }
            }
        }
        for (op, p) in ops {
            for n in [xs.len(), 37, 16, 5] {
                let src = &xs[..n];
                let mut want = vec![0.0f32; n];
                let mut got = vec![0.0f32; n];
                let mut in_place = src.to_vec();
                // SAFETY: every buffer holds n elements; `p` holds PARAMS values; the host has
                // AVX-512F (checked above).
                unsafe {
                    unary::<true>(op, want.as_mut_ptr(), src.as_ptr(), n, p.as_ptr());
                    assert!(avx512::unary(op, got.as_mut_ptr(), src.as_ptr(), n, p.as_ptr()));
                    assert!(avx512::unary(op, in_place.as_mut_ptr(), in_place.as_ptr(), n, p.as_ptr()));
                }
                for i in 0..n {
                    assert!(same(want[i], got[i]), "op {op:#x} {p:?} at {}: {} against {}", src[i], got[i], want[i]);
                    assert!(same(want[i], in_place[i]), "in place, op {op:#x} at {}", src[i]);
                }
            }
        }
    }
}
