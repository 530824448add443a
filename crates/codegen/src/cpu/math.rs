//! Inline f32 approximations of `exp2`, `log2`, `sin` and `erf`, emitted as straight-line
//! Cranelift IR that works unchanged on `f32` and `f32x4` (constants are splatted, conditions
//! become lane masks and `select` becomes `bitselect`).
//!
//! - `exp2`: `x` capped at 130 and 0 below -150 (no underflowing product), `x = n + f` with `n = round(x)`, `|f| <= 1/2`; `2^f` by its degree-7 Taylor
//!   polynomial; `2^n` built from exponent bits in two halves, so results that are subnormal or
//!   overflow round correctly.
//! - `log2`: musl's `log2f` kernel: `x = 2^k m` with `m` in `[sqrt(1/2), sqrt(2))`,
//!   `s = (m-1)/(m+1)`, an odd polynomial in `s`, and a hi/lo split of `1/ln 2`. Subnormals are
//!   scaled by `2^23` first; `x < 0`, `0`, `inf` and NaN get IEEE results.
//! - `sin`: `k = round(x * 2/pi)`, a three-part Cody-Waite reduction (exact for `|k| < 2^12`),
//!   then cephes' sin/cos polynomials on `[-pi/4, pi/4]` chosen by `k mod 4`. The caller sends
//!   `|x| > 4096` (and infinities) to `libm::sinf`.
//! - `erf`: for `|x| < 1/2` its Taylor series `x P(x^2)`; above, Abramowitz-Stegun 7.1.26,
//!   `1 - t P(t) exp(-x^2)` with `t = 1/(1 + p|x|)` (absolute error 1.5e-7), with the sign of `x`.
//!
//! Polynomials use fused multiply-add where the host has it (`has_fma`).
//! Measured errors are in `tests/it/approx.rs` and the crate's report.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use rustc_hash::FxHashMap as HashMap;

use cranelift_codegen::cursor::{Cursor, FuncCursor};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::immediates::{Ieee32, Ieee64};
use cranelift_codegen::ir::{Block, InstBuilder, InstructionData, MemFlagsData, Opcode, Type, Value, types};
use cranelift_frontend::FunctionBuilder;

/// Constants (scalar or splatted), each emitted once, in the entry block, so that loop bodies
/// and their unrolled copies share them. This saves Cranelift's e-graph pass the work of
/// deduplicating and hoisting hundreds of identical constants (most of a small kernel's IR).
pub(crate) struct ConstPool {
    entry: Block,
    map: HashMap<(Type, u64), Value>,
}

impl ConstPool {
    pub(crate) fn new(entry: Block) -> ConstPool {
        ConstPool { entry, map: HashMap::default() }
    }

    /// The constant of type `ty` (a lane type or a vector of it) whose lanes have bit pattern
    /// `bits` (an integer is its value, sign-extended).
    pub(crate) fn get(&mut self, b: &mut FunctionBuilder, ty: Type, bits: u64) -> Value {
        if let Some(v) = self.map.get(&(ty, bits)) {
            return *v;
        }
        let lane = ty.lane_type();
        // A vector constant is the splat of the scalar one (shared with scalar code).
        let scalar = if ty.is_vector() { Some(self.get(b, lane, bits)) } else { None };
        let v = if b.current_block() == Some(self.entry) {
            match (scalar, lane) {
                (Some(s), _) => b.ins().splat(ty, s),
                (None, types::F32) => b.ins().f32const(Ieee32::with_bits(bits as u32)),
                (None, types::F64) => b.ins().f64const(Ieee64::with_bits(bits)),
                (None, _) => b.ins().iconst(lane, bits as i64),
            }
        } else {
            let mut pos = FuncCursor::new(b.func);
            pos.goto_last_inst(self.entry);
            match (scalar, lane) {
                (Some(s), _) => pos.ins().splat(ty, s),
                (None, types::F32) => pos.ins().f32const(Ieee32::with_bits(bits as u32)),
                (None, types::F64) => pos.ins().f64const(Ieee64::with_bits(bits)),
                (None, _) => pos.ins().iconst(lane, bits as i64),
            }
        };
        self.map.insert((ty, bits), v);
        v
    }

    /// `c` as `ty` (`f32`/`f64` or vectors of them).
    pub(crate) fn float(&mut self, b: &mut FunctionBuilder, ty: Type, c: f64) -> Value {
        let bits = if ty.lane_type() == types::F64 { c.to_bits() } else { (c as f32).to_bits() as u64 };
        self.get(b, ty, bits)
    }
}

/// Emits f32 math for one type: `F32` or `F32X4`.
pub(crate) struct Math<'a, 'b> {
    pub(crate) b: &'a mut FunctionBuilder<'b>,
    pub(crate) consts: &'a mut ConstPool,
    pub(crate) ty: Type,
    /// Whether the target has fused multiply-add (else `fma` would become a libcall).
    pub(crate) fma: bool,
}

/// `2^f` for `|f| <= 1/2`: its degree-7 Taylor polynomial (lowest degree first).
pub(crate) const EXP2_POLY: [f32; 8] = [
    1.0,
    std::f32::consts::LN_2,
    0.240_226_5,
    0.055_504_11,
    0.009_618_129,
    0.001_333_355_8,
    0.000_154_035_3,
    1.525_273_4e-5,
];
/// musl's `log2f` polynomial coefficients.
pub(crate) const LG1: f32 = 0.666_666_6; // 0xaaaaaa.0p-24
pub(crate) const LG2: f32 = 0.400_009_72; // 0xccce13.0p-25
pub(crate) const LG3: f32 = 0.284_987_87; // 0x91e9ee.0p-25
pub(crate) const LG4: f32 = 0.242_790_79; // 0xf89e26.0p-26
/// `1 / ln 2` split in a high part (12 significant bits) and the rest.
pub(crate) const IVLN2HI: f32 = 1.442_871_1; // 0x3fb8b000
pub(crate) const IVLN2LO: f32 = -1.760_528_5e-4; // 0xb9389ad4

/// The larger magnitude that `sin` handles inline.
pub(crate) const SIN_FAST_LIMIT: f32 = 4096.0;

/// Room in [`SPLATS`]: more than the distinct constants of this file's functions, the only
/// values it holds.
const SPLAT_SLOTS: usize = 128;

/// The constants of the vector math, each splatted to four 32-bit lanes, 16 bytes apart: vector
/// code loads a constant where it uses it ([`Math::k`]) rather than keeping it in a register. A
/// polynomial's dozen constants held in registers from the entry block on outnumber x86's 16
/// vector registers: the register allocator spilled them and stored them back on every loop
/// edge (the softmax `exp` of a 3-token decoder step, whose inner loops run 5 elements, took 10
/// us for 1,200 of them). A load folds into the instruction that uses it.
#[repr(C, align(16))]
struct Splats([AtomicU32; 4 * SPLAT_SLOTS]);

static SPLATS: Splats = Splats([const { AtomicU32::new(0) }; 4 * SPLAT_SLOTS]);

/// The lane bit patterns that [`SPLATS`]' slots hold, in slot order. A slot is written before
/// its index is handed out (under this lock), and its code is published after that.
static SPLAT_BITS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// The byte offset in [`SPLATS`] of the slot that holds `bits` in every lane (filled on first
/// use), or `None` when every slot holds another constant.
fn splat_offset(bits: u32) -> Option<i32> {
    let mut slots = SPLAT_BITS.lock().unwrap_or_else(|e| e.into_inner());
    let slot = match slots.iter().position(|&b| b == bits) {
        Some(slot) => slot,
        None if slots.len() < SPLAT_SLOTS => {
            let slot = slots.len();
            for lane in &SPLATS.0[4 * slot..4 * slot + 4] {
                lane.store(bits, Ordering::Relaxed);
            }
            slots.push(bits);
            slot
        }
        None => return None,
    };
    Some(16 * slot as i32)
}

impl Math<'_, '_> {
    fn ity(&self) -> Type {
        if self.ty.is_vector() { types::I32X4 } else { types::I32 }
    }
    pub(crate) fn f(&mut self, c: f32) -> Value {
        let ty = self.ty;
        self.k(ty, c.to_bits())
    }
    fn i(&mut self, c: i32) -> Value {
        let ity = self.ity();
        self.k(ity, c as u32)
    }
    /// The constant of 32-bit lanes `bits` as `ty`: a scalar from the entry block's constants
    /// (Cranelift rematerializes those where they are used); a vector loaded from [`SPLATS`]
    /// at the point of use.
    fn k(&mut self, ty: Type, bits: u32) -> Value {
        let offset = if ty.is_vector() { splat_offset(bits) } else { None };
        let Some(offset) = offset else {
            // An integer constant is its value, sign-extended (`ConstPool::get`).
            let value = if ty.lane_type() == types::I32 { bits as i32 as i64 as u64 } else { u64::from(bits) };
            return self.consts.get(self.b, ty, value);
        };
        let base = self.consts.get(self.b, types::I64, SPLATS.0.as_ptr() as u64);
        let flags = MemFlagsData::new().with_notrap().with_aligned().with_readonly();
        self.b.ins().load(ty, flags, base, offset)
    }
    fn int_bits(&mut self, x: Value) -> Value {
        let ity = self.ity();
        self.b.ins().bitcast(ity, MemFlagsData::new(), x)
    }
    fn float_of_bits(&mut self, x: Value) -> Value {
        let ty = self.ty;
        self.b.ins().bitcast(ty, MemFlagsData::new(), x)
    }
    /// `cond ? a : b` for a comparison result (`i8` scalar or lane mask).
    /// NaN-propagating maximum (`max`) or minimum of `a` and `b`, as Cranelift's `fmax`/`fmin`
    /// (a tie of +0 and -0 gives +0 for the maximum, -0 for the minimum). For `f32x4`, from
    /// x86's `maxps`/`minps` (matched from a compare and a bit-select), which return the second
    /// operand on a tie or a NaN: both operand orders, combined bitwise (which settles the signed
    /// zeros), then every lane where either operand is NaN set to all ones (a NaN). Five
    /// instructions where Cranelift's NaN-exact sequence takes eight.
    pub(crate) fn min_max(&mut self, a: Value, b: Value, max: bool) -> Value {
        if let Some(v) = self.min_max_const(a, b, max).or_else(|| self.min_max_const(b, a, max)) {
            return v;
        }
        if self.ty != types::F32X4 {
            return if max { self.b.ins().fmax(a, b) } else { self.b.ins().fmin(a, b) };
        }
        let native = |m: &mut Self, x: Value, y: Value| {
            let c = if max { m.b.ins().fcmp(FloatCC::LessThan, y, x) } else { m.b.ins().fcmp(FloatCC::LessThan, x, y) };
            m.sel(c, x, y)
        };
        let (ab, ba) = (native(self, a, b), native(self, b, a));
        let both = if max { self.b.ins().band(ab, ba) } else { self.b.ins().bor(ab, ba) };
        let nan = self.b.ins().fcmp(FloatCC::Unordered, a, b);
        let nan = self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), nan);
        self.b.ins().bor(both, nan)
    }

    /// [`Math::min_max`] of `x` and a constant `c` that is no NaN and not the zero a tie must
    /// not give (-0 for the maximum, +0 for the minimum): `x` where it is NaN or beyond `c`,
    /// else `c` (on a tie `c` is the answer: equal nonzero values have equal bits, and a tie of
    /// zeros goes to `c`). One compare and one select: a ReLU's `max(x, 0)` in two vector
    /// instructions where both operand orders take six.
    fn min_max_const(&mut self, x: Value, c: Value, max: bool) -> Option<Value> {
        let bits = self.const_bits(c)?;
        let (nan, wrong_zero) = match self.ty.lane_type() {
            types::F32 => {
                let v = f32::from_bits(bits as u32);
                (v.is_nan(), v == 0.0 && v.is_sign_negative() == max)
            }
            types::F64 => {
                let v = f64::from_bits(bits);
                (v.is_nan(), v == 0.0 && v.is_sign_negative() == max)
            }
            _ => return None,
        };
        if nan || wrong_zero {
            return None;
        }
        let cc = if max { FloatCC::UnorderedOrGreaterThan } else { FloatCC::UnorderedOrLessThan };
        let keep = self.b.ins().fcmp(cc, x, c);
        Some(self.sel(keep, x, c))
    }

    /// The bit pattern of `v`'s lanes when it is a float constant (a scalar constant or its
    /// splat).
    fn const_bits(&self, v: Value) -> Option<u64> {
        let dfg = &self.b.func.dfg;
        match dfg.insts[dfg.value_def(v).inst()?] {
            InstructionData::UnaryIeee32 { opcode: Opcode::F32const, imm } => Some(u64::from(imm.bits())),
            InstructionData::UnaryIeee64 { opcode: Opcode::F64const, imm } => Some(imm.bits()),
            InstructionData::Unary { opcode: Opcode::Splat, arg } => self.const_bits(arg),
            _ => None,
        }
    }

    pub(crate) fn sel(&mut self, cond: Value, a: Value, b: Value) -> Value {
        let t = self.b.func.dfg.value_type(a);
        if t.is_vector() {
            let c = if self.b.func.dfg.value_type(cond) == t {
                cond
            } else {
                self.b.ins().bitcast(t, MemFlagsData::new(), cond)
            };
            self.b.ins().bitselect(c, a, b)
        } else {
            self.b.ins().select(cond, a, b)
        }
    }
    fn mul(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fmul(a, b)
    }
    fn add(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fadd(a, b)
    }
    fn sub(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fsub(a, b)
    }
    /// `c[0] + x*(c[1] + x*(c[2] + ...))`.
    fn horner(&mut self, x: Value, c: &[f32]) -> Value {
        let n = c.len();
        let mut acc = self.f(c[n - 1]);
        for &ci in c[..n - 1].iter().rev() {
            let k = self.f(ci);
            acc = if self.fma {
                self.b.ins().fma(acc, x, k)
            } else {
                let t = self.mul(acc, x);
                self.add(t, k)
            };
        }
        acc
    }

    pub(crate) fn exp2(&mut self, x: Value) -> Value {
        // Below -150 the result rounds to 0. Those lanes compute `2^0` and are zeroed at the end
        // instead of scaled down to it: a product that underflows takes a microcode assist on
        // x86 (40 cycles a scalar on an AMD EPYC, more on Intel), and a causal mask's `exp2(-inf)`
        // is a fifth of a short prefill's softmax. NaN compares "not less" and passes through.
        let hi = self.f(130.0);
        let above = self.b.ins().fcmp(FloatCC::GreaterThan, x, hi);
        let x = self.sel(above, hi, x);
        let lo = self.f(-150.0);
        let zero = self.b.ins().fcmp(FloatCC::LessThan, x, lo);
        let z = self.f(0.0);
        let x = self.sel(zero, z, x);
        // Round to nearest with the 1.5 * 2^23 trick: the integer lands in the low mantissa bits.
        const MAGIC: f32 = 12_582_912.0;
        let magic = self.f(MAGIC);
        let t = self.add(x, magic);
        let n = self.sub(t, magic);
        let f = self.sub(x, n);
        let p = self.horner(f, &EXP2_POLY);
        let tb = self.int_bits(t);
        let mb = self.i(MAGIC.to_bits() as i32);
        let ni = self.b.ins().isub(tb, mb);
        // 2^n as 2^(n/2) * 2^(n - n/2): both factors are normal for n in [-150, 130].
        let n1 = self.b.ins().sshr_imm_u(ni, 1);
        let n2 = self.b.ins().isub(ni, n1);
        let scale = |m: &mut Self, e: Value| {
            let bias = m.i(127);
            let e = m.b.ins().iadd(e, bias);
            let bits = m.b.ins().ishl_imm_u(e, 23);
            m.float_of_bits(bits)
        };
        let s1 = scale(self, n1);
        let s2 = scale(self, n2);
        let r = self.mul(p, s1);
        let r = self.mul(r, s2);
        let z = self.f(0.0);
        self.sel(zero, z, r)
    }

    pub(crate) fn log2(&mut self, x: Value) -> Value {
        // Scale subnormals (and anything below the smallest normal) into the normal range.
        let tiny = self.f(f32::MIN_POSITIVE);
        let is_sub = self.b.ins().fcmp(FloatCC::LessThan, x, tiny);
        let two23 = self.f(8_388_608.0);
        let scaled = self.mul(x, two23);
        let xs = self.sel(is_sub, scaled, x);
        let i23 = self.i(23);
        let zero_i = self.i(0);
        let k_adj = self.sel(is_sub, i23, zero_i);

        let ix = self.int_bits(xs);
        let off = self.i(0x3f80_0000 - 0x3f35_04f3);
        let ix = self.b.ins().iadd(ix, off);
        let e = self.b.ins().sshr_imm_u(ix, 23);
        let bias = self.i(0x7f);
        let k = self.b.ins().isub(e, bias);
        let k = self.b.ins().isub(k, k_adj);
        let mant_mask = self.i(0x007f_ffff);
        let m = self.b.ins().band(ix, mant_mask);
        let base = self.i(0x3f35_04f3);
        let m = self.b.ins().iadd(m, base);
        let m = self.float_of_bits(m);

        let one = self.f(1.0);
        let two = self.f(2.0);
        let half = self.f(0.5);
        let f = self.sub(m, one);
        let denom = self.add(two, f);
        let s = self.b.ins().fdiv(f, denom);
        let z = self.mul(s, s);
        let w = self.mul(z, z);
        let t1 = self.horner(w, &[LG2, LG4]);
        let t1 = self.mul(w, t1);
        let t2 = self.horner(w, &[LG1, LG3]);
        let t2 = self.mul(z, t2);
        let r = self.add(t2, t1);
        let ff = self.mul(f, f);
        let hfsq = self.mul(half, ff);
        // hi = f - hfsq with its low 12 bits cleared, lo = the rest.
        let hi = self.sub(f, hfsq);
        let hi_bits = self.int_bits(hi);
        let clear = self.i(0xffff_f000_u32 as i32);
        let hi_bits = self.b.ins().band(hi_bits, clear);
        let hi = self.float_of_bits(hi_bits);
        let lo = self.sub(f, hi);
        let lo = self.sub(lo, hfsq);
        let hr = self.add(hfsq, r);
        let shr = self.mul(s, hr);
        let lo = self.add(lo, shr);
        let c_hi = self.f(IVLN2HI);
        let c_lo = self.f(IVLN2LO);
        let lohi = self.add(lo, hi);
        let a = self.mul(lohi, c_lo);
        let b = self.mul(lo, c_hi);
        let c = self.mul(hi, c_hi);
        let ty = self.ty;
        let kf = self.b.ins().fcvt_from_sint(ty, k);
        let sum = self.add(a, b);
        let sum = self.add(sum, c);
        let y = self.add(sum, kf);

        // Special values.
        let zero = self.f(0.0);
        let nan = self.f(f32::NAN);
        let ninf = self.f(f32::NEG_INFINITY);
        let pinf = self.f(f32::INFINITY);
        let neg = self.b.ins().fcmp(FloatCC::LessThan, x, zero);
        let y = self.sel(neg, nan, y);
        let is_zero = self.b.ins().fcmp(FloatCC::Equal, x, zero);
        let y = self.sel(is_zero, ninf, y);
        let is_inf = self.b.ins().fcmp(FloatCC::Equal, x, pinf);
        let y = self.sel(is_inf, pinf, y);
        let is_nan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
        self.sel(is_nan, x, y)
    }

    /// `sin(x)` for `|x| <= SIN_FAST_LIMIT` (NaN gives NaN).
    pub(crate) fn sin(&mut self, x: Value) -> Value {
        let two_over_pi = self.f(std::f32::consts::FRAC_2_PI);
        let t = self.mul(x, two_over_pi);
        let kf = self.b.ins().nearest(t);
        const C1: f32 = 1.570_312_5;
        const C2: f32 = 4.837_513e-4;
        const C3: f32 = 7.549_79e-8;
        let mut r = x;
        for c in [C1, C2, C3] {
            let cv = self.f(c);
            let p = self.mul(kf, cv);
            r = self.sub(r, p);
        }
        let z = self.mul(r, r);
        // sin(r) = r + r z (S1 + z (S2 + z S3))
        let ps = self.horner(z, &[-1.666_665_5e-1, 8.332_161e-3, -1.951_529_6e-4]);
        let rz = self.mul(r, z);
        let ps = self.mul(rz, ps);
        let sin_r = self.add(r, ps);
        // cos(r) = 1 - z/2 + z^2 (C1 + z (C2 + z C3))
        let pc = self.horner(z, &[4.166_664_6e-2, -1.388_731_6e-3, 2.443_315_7e-5]);
        let zz = self.mul(z, z);
        let pc = self.mul(zz, pc);
        let half = self.f(0.5);
        let hz = self.mul(half, z);
        let one = self.f(1.0);
        let cos_r = self.sub(one, hz);
        let cos_r = self.add(cos_r, pc);
        let ity = self.ity();
        let k = self.b.ins().fcvt_to_sint_sat(ity, kf);
        let one_i = self.i(1);
        let odd = self.b.ins().band(k, one_i);
        let zero_i = self.i(0);
        let odd = self.b.ins().icmp(IntCC::NotEqual, odd, zero_i);
        let y = self.sel(odd, cos_r, sin_r);
        // Quadrants 2 and 3 flip the sign: bit 1 of k moved to the sign bit.
        let two_i = self.i(2);
        let q2 = self.b.ins().band(k, two_i);
        let sign = self.b.ins().ishl_imm_u(q2, 30);
        let yb = self.int_bits(y);
        let yb = self.b.ins().bxor(yb, sign);
        let y = self.float_of_bits(yb);
        // sin(x) = x below 2^-12 (this also keeps the sign of -0).
        let ax = self.b.ins().fabs(x);
        let tiny = self.f(1.0 / 4096.0);
        let is_tiny = self.b.ins().fcmp(FloatCC::LessThan, ax, tiny);
        self.sel(is_tiny, x, y)
    }

    pub(crate) fn erf(&mut self, x: Value) -> Value {
        let ax = self.b.ins().fabs(x);
        // Small |x|: Taylor series of erf(x)/x in x^2.
        let z = self.mul(x, x);
        const T: [f32; 7] = [
            std::f32::consts::FRAC_2_SQRT_PI,
            -0.376_126_4,
            0.112_837_92,
            -0.026_866_17,
            0.005_223_977_6,
            -8.548_327e-4,
            1.205_533_3e-4,
        ];
        let p = self.horner(z, &T);
        let small = self.mul(ax, p);
        // Large |x|: Abramowitz and Stegun 7.1.26.
        let pcoef = self.f(0.327_591_1);
        let one = self.f(1.0);
        let pa = self.mul(pcoef, ax);
        let den = self.add(one, pa);
        let t = self.b.ins().fdiv(one, den);
        const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_8, -1.453_152_1, 1.061_405_4];
        let q = self.horner(t, &A);
        let q = self.mul(t, q);
        let log2e = self.f(-std::f32::consts::LOG2_E);
        let arg = self.mul(z, log2e);
        let e = self.exp2(arg);
        let qe = self.mul(q, e);
        let large = self.sub(one, qe);
        let half = self.f(0.5);
        let is_small = self.b.ins().fcmp(FloatCC::LessThan, ax, half);
        let y = self.sel(is_small, small, large);
        // Copy the sign of x.
        let sign_mask = self.i(i32::MIN);
        let xb = self.int_bits(x);
        let sign = self.b.ins().band(xb, sign_mask);
        let yb = self.int_bits(y);
        let yb = self.b.ins().bor(yb, sign);
        self.float_of_bits(yb)
    }
}

#[cfg(test)]
mod tests {
    use cranelift_codegen::ir::Function;
    use cranelift_frontend::FunctionBuilderContext;

    use super::*;

    #[test]
    fn a_splat_slot_holds_its_constant_in_every_lane_and_serves_every_use() {
        let (x, y) = (1.5f32.to_bits(), (-2.25f32).to_bits());
        let (a, b) = (splat_offset(x).unwrap(), splat_offset(y).unwrap());
        assert_ne!(a, b);
        assert_eq!(splat_offset(x), Some(a));
        for (offset, bits) in [(a, x), (b, y)] {
            let slot = offset as usize / 16;
            for lane in &SPLATS.0[4 * slot..4 * slot + 4] {
                assert_eq!(lane.load(Ordering::Relaxed), bits);
            }
        }
    }

    /// Every constant of the vector math is a load from the table, none a splat held in a
    /// register, and the table has room for all of them.
    #[test]
    fn the_vector_math_reads_its_constants_from_the_table() {
        let mut func = Function::new();
        let mut ctx = FunctionBuilderContext::new();
        let mut b = FunctionBuilder::new(&mut func, &mut ctx);
        let entry = b.create_block();
        let x = b.append_block_param(entry, types::F32X4);
        b.switch_to_block(entry);
        let mut consts = ConstPool::new(entry);
        for fma in [false, true] {
            let mut m = Math { b: &mut b, consts: &mut consts, ty: types::F32X4, fma };
            let e = m.exp2(x);
            let l = m.log2(e);
            let s = m.sin(l);
            m.erf(s);
        }
        let text = b.func.display().to_string();
        assert!(!text.contains("splat"), "{text}");
        assert!(text.contains("readonly"), "{text}");
        let used = SPLAT_BITS.lock().unwrap_or_else(|e| e.into_inner()).len();
        assert!(used < SPLAT_SLOTS, "{used} constants");
    }
}
