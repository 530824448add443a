//! Shared test helpers: typed byte buffers, a plain Rust evaluator of kir (the reference the JIT
//! is compared with), kernel builders and a tolerant comparison.
#![allow(dead_code)]

use air::{BinaryOp, DType, ReduceOp, Scalar, UnaryOp};
use half::{bf16, f16};
use kiln_codegen::CpuCompiler;
use lower::kir::{Acc, Access, IExpr, Inst, LoopKernel, Param, Reg, Stmt, Var};

/// A host buffer of one dtype, as raw bytes (what the kernels see).
#[derive(Clone, Debug)]
pub struct Buf {
    pub dtype: DType,
    pub bytes: Vec<u8>,
}

/// A value of the reference evaluator. Half types are held as their exact f32 value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum V {
    B(bool),
    I32(i32),
    I64(i64),
    F(f32),
    D(f64),
}

impl V {
    pub fn f64(self) -> f64 {
        match self {
            V::B(b) => b as i64 as f64,
            V::I32(i) => i as f64,
            V::I64(i) => i as f64,
            V::F(x) => x as f64,
            V::D(x) => x,
        }
    }
    fn i64(self) -> i64 {
        match self {
            V::B(b) => b as i64,
            V::I32(i) => i as i64,
            V::I64(i) => i,
            V::F(x) => x as i64,
            V::D(x) => x as i64,
        }
    }
}

impl Buf {
    pub fn zeros(dtype: DType, n: usize) -> Buf {
        Buf { dtype, bytes: vec![0; n * dtype.size_bytes()] }
    }
    pub fn from_vals(dtype: DType, vals: &[V]) -> Buf {
        let mut b = Buf::zeros(dtype, vals.len());
        for (i, v) in vals.iter().enumerate() {
            b.set(i, *v);
        }
        b
    }
    pub fn f32s(v: &[f32]) -> Buf {
        Buf::from_vals(DType::F32, &v.iter().map(|&x| V::F(x)).collect::<Vec<_>>())
    }
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size_bytes()
    }
    pub fn get(&self, i: usize) -> V {
        let s = self.dtype.size_bytes();
        let b = &self.bytes[i * s..(i + 1) * s];
        match self.dtype {
            DType::Bool => V::B(b[0] != 0),
            DType::I32 => V::I32(i32::from_le_bytes(b.try_into().unwrap())),
            DType::I64 => V::I64(i64::from_le_bytes(b.try_into().unwrap())),
            DType::F16 => V::F(f16::from_bits(u16::from_le_bytes(b.try_into().unwrap())).to_f32()),
            DType::BF16 => V::F(bf16::from_bits(u16::from_le_bytes(b.try_into().unwrap())).to_f32()),
            DType::F32 => V::F(f32::from_le_bytes(b.try_into().unwrap())),
            DType::F64 => V::D(f64::from_le_bytes(b.try_into().unwrap())),
        }
    }
    pub fn set(&mut self, i: usize, v: V) {
        let v = cast(v, self.dtype);
        let s = self.dtype.size_bytes();
        let out = &mut self.bytes[i * s..(i + 1) * s];
        match v {
            V::B(b) => out[0] = b as u8,
            V::I32(x) => out.copy_from_slice(&x.to_le_bytes()),
            V::I64(x) => out.copy_from_slice(&x.to_le_bytes()),
            V::F(x) => match self.dtype {
                DType::F16 => out.copy_from_slice(&f16::from_f32(x).to_bits().to_le_bytes()),
                DType::BF16 => out.copy_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes()),
                _ => out.copy_from_slice(&x.to_le_bytes()),
            },
            V::D(x) => out.copy_from_slice(&x.to_le_bytes()),
        }
    }
    pub fn vals(&self) -> Vec<V> {
        (0..self.len()).map(|i| self.get(i)).collect()
    }
}

fn round_half(d: DType, x: f32) -> f32 {
    match d {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// The interpreter's cast rules.
pub fn cast(v: V, to: DType) -> V {
    match (v, to) {
        (V::B(b), DType::Bool) => V::B(b),
        (V::I32(i), DType::I32) => V::I32(i),
        (V::I64(i), DType::I64) => V::I64(i),
        (V::D(x), DType::F64) => V::D(x),
        (V::F(x), DType::F16 | DType::BF16 | DType::F32) => V::F(round_half(to, x)),
        (v, DType::Bool) => V::B(match v {
            V::F(x) => x != 0.0,
            V::D(x) => x != 0.0,
            v => v.i64() != 0,
        }),
        (V::F(x), DType::I32) => V::I32(x as i32),
        (V::D(x), DType::I32) => V::I32(x as i32),
        (V::F(x), DType::I64) => V::I64(x as i64),
        (V::D(x), DType::I64) => V::I64(x as i64),
        (v, DType::I32) => V::I32(v.i64() as i32),
        (v, DType::I64) => V::I64(v.i64()),
        (V::F(x), DType::F64) => V::D(x as f64),
        (V::D(x), _) => V::F(round_half(to, x as f32)),
        (v, DType::F64) => V::D(v.i64() as f64),
        (v, _) => V::F(round_half(to, v.i64() as f32)),
    }
}

fn scalar_const(s: Scalar, d: DType) -> V {
    match s {
        Scalar::Bool(b) => cast(V::B(b), d),
        Scalar::Int(i) => cast(V::I64(i), d),
        Scalar::Float(x) => cast(V::D(x), d),
    }
}

fn fmax<T: PartialOrd + Copy>(a: T, b: T, nan: impl Fn(T) -> bool, pos: impl Fn(T) -> bool) -> T {
    if nan(a) {
        a
    } else if nan(b) {
        b
    } else if a > b {
        a
    } else if b > a {
        b
    } else if pos(a) {
        a
    } else {
        b
    }
}
fn fmin<T: PartialOrd + Copy>(a: T, b: T, nan: impl Fn(T) -> bool, pos: impl Fn(T) -> bool) -> T {
    if nan(a) {
        a
    } else if nan(b) {
        b
    } else if a < b {
        a
    } else if b < a {
        b
    } else if !pos(a) {
        a
    } else {
        b
    }
}

pub fn unary(op: UnaryOp, v: V) -> V {
    match v {
        V::F(x) => V::F(match op {
            UnaryOp::Neg => -x,
            UnaryOp::Exp2 => libm::exp2f(x),
            UnaryOp::Log2 => libm::log2f(x),
            UnaryOp::Sin => libm::sinf(x),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Recip => 1.0 / x,
            UnaryOp::Erf => libm::erff(x),
            UnaryOp::Trunc => x.trunc(),
            UnaryOp::Not => panic!("not of float"),
        }),
        V::D(x) => V::D(match op {
            UnaryOp::Neg => -x,
            UnaryOp::Exp2 => libm::exp2(x),
            UnaryOp::Log2 => libm::log2(x),
            UnaryOp::Sin => libm::sin(x),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Recip => 1.0 / x,
            UnaryOp::Erf => libm::erf(x),
            UnaryOp::Trunc => x.trunc(),
            UnaryOp::Not => panic!("not of float"),
        }),
        V::I32(x) => V::I32(if op == UnaryOp::Neg { x.wrapping_neg() } else { !x }),
        V::I64(x) => V::I64(if op == UnaryOp::Neg { x.wrapping_neg() } else { !x }),
        V::B(b) => V::B(!b),
    }
}

macro_rules! int_bin {
    ($op:expr, $a:expr, $b:expr, $w:ident) => {{
        let (a, b) = ($a, $b);
        match $op {
            BinaryOp::Add => V::$w(a.wrapping_add(b)),
            BinaryOp::Sub => V::$w(a.wrapping_sub(b)),
            BinaryOp::Mul => V::$w(a.wrapping_mul(b)),
            BinaryOp::Div => V::$w(if b == 0 { 0 } else { a.wrapping_div(b) }),
            BinaryOp::Mod => V::$w(if b == 0 { 0 } else { a.wrapping_rem(b) }),
            BinaryOp::Max => V::$w(a.max(b)),
            BinaryOp::Min => V::$w(a.min(b)),
            BinaryOp::And => V::$w(a & b),
            BinaryOp::Or => V::$w(a | b),
            BinaryOp::CmpLt => V::B(a < b),
            BinaryOp::CmpEq => V::B(a == b),
            BinaryOp::CmpNe => V::B(a != b),
            BinaryOp::Pow => panic!("pow of int"),
        }
    }};
}

macro_rules! float_bin {
    ($op:expr, $a:expr, $b:expr, $w:ident, $pow:path) => {{
        let (a, b) = ($a, $b);
        match $op {
            BinaryOp::Add => V::$w(a + b),
            BinaryOp::Sub => V::$w(a - b),
            BinaryOp::Mul => V::$w(a * b),
            BinaryOp::Div => V::$w(a / b),
            BinaryOp::Mod => V::$w(a % b),
            BinaryOp::Pow => V::$w($pow(a, b)),
            BinaryOp::Max => V::$w(fmax(a, b, |x| x.is_nan(), |x| x.is_sign_positive())),
            BinaryOp::Min => V::$w(fmin(a, b, |x| x.is_nan(), |x| x.is_sign_positive())),
            BinaryOp::CmpLt => V::B(a < b),
            BinaryOp::CmpEq => V::B(a == b),
            BinaryOp::CmpNe => V::B(a != b),
            BinaryOp::And | BinaryOp::Or => panic!("and/or of float"),
        }
    }};
}

pub fn binary(op: BinaryOp, a: V, b: V) -> V {
    match (a, b) {
        (V::I32(a), V::I32(b)) => int_bin!(op, a, b, I32),
        (V::I64(a), V::I64(b)) => int_bin!(op, a, b, I64),
        (V::F(a), V::F(b)) => float_bin!(op, a, b, F, libm::powf),
        (V::D(a), V::D(b)) => float_bin!(op, a, b, D, libm::pow),
        (V::B(a), V::B(b)) => V::B(match op {
            BinaryOp::And | BinaryOp::Min => a && b,
            BinaryOp::Or | BinaryOp::Max => a || b,
            BinaryOp::CmpLt => !a & b,
            BinaryOp::CmpEq => a == b,
            BinaryOp::CmpNe => a != b,
            _ => panic!("{op:?} of bool"),
        }),
        _ => panic!("mixed operands {a:?} {b:?}"),
    }
}

/// The plain evaluator of kir.
pub struct Eval<'a> {
    pub k: &'a LoopKernel,
    pub bufs: &'a mut [Buf],
    pub syms: &'a [i64],
    vars: Vec<i64>,
    regs: std::collections::HashMap<Reg, (DType, V)>,
    accs: std::collections::HashMap<Acc, (DType, ReduceOp, V)>,
}

pub fn eval(k: &LoopKernel, bufs: &mut [Buf], syms: &[i64], start: i64, end: i64) {
    let mut e = Eval { k, bufs, syms, vars: vec![0; 16], regs: Default::default(), accs: Default::default() };
    match k.body.as_slice() {
        [Stmt::Loop { var, extent, parallel: true, body }] => {
            let ext = extent.eval(&e.vars, syms);
            for i in start.max(0)..end.min(ext) {
                e.vars[var.0 as usize] = i;
                e.stmts(body);
            }
        }
        b => e.stmts(b),
    }
}

impl Eval<'_> {
    fn stmts(&mut self, stmts: &[Stmt]) {
        for s in stmts {
            match s {
                Stmt::Let { reg, dtype, inst } => {
                    let v = self.inst(*dtype, inst);
                    self.regs.insert(*reg, (*dtype, v));
                }
                Stmt::Loop { var, extent, body, .. } => {
                    let ext = extent.eval(&self.vars, self.syms);
                    for i in 0..ext {
                        self.vars[var.0 as usize] = i;
                        self.stmts(body);
                    }
                }
                Stmt::AccInit { acc, dtype, op } => {
                    let init = match (op, dtype.is_float()) {
                        (ReduceOp::Sum, true) => V::D(0.0),
                        (ReduceOp::Sum, false) => cast(V::I64(0), *dtype),
                        (ReduceOp::Max, true) => cast(V::D(f64::NEG_INFINITY), *dtype),
                        (ReduceOp::Max, false) => {
                            if *dtype == DType::I32 {
                                V::I32(i32::MIN)
                            } else {
                                V::I64(i64::MIN)
                            }
                        }
                    };
                    self.accs.insert(*acc, (*dtype, *op, init));
                }
                Stmt::AccUpdate { acc, value } => {
                    let (d, op, cur) = self.accs[acc];
                    let (_, v) = self.regs[value];
                    let next = match (op, cur) {
                        // Float sums accumulate in f64 (the interpreter's rule).
                        (ReduceOp::Sum, V::D(c)) => V::D(c + v.f64()),
                        (ReduceOp::Sum, _) => binary(BinaryOp::Add, cur, v),
                        (ReduceOp::Max, _) => binary(BinaryOp::Max, cur, v),
                    };
                    self.accs.insert(*acc, (d, op, next));
                }
                Stmt::Store { buf, index, value } => {
                    let i = index.eval(&self.vars, self.syms) as usize;
                    let (_, v) = self.regs[value];
                    self.bufs[*buf as usize].set(i, v);
                }
                Stmt::ScatterAdd { buf, base, index, stride, size, value, status, check } => {
                    if let Some(i) = self.checked(*index, size, *status, *check) {
                        let at = (base.eval(&self.vars, self.syms) + i * stride.eval(&self.vars, self.syms)) as usize;
                        let (_, v) = self.regs[value];
                        let cur = self.bufs[*buf as usize].get(at);
                        self.bufs[*buf as usize].set(at, binary(BinaryOp::Add, cur, v));
                    }
                }
                Stmt::Check { cond, value, status, check } => {
                    if self.regs[cond].1 == V::B(true) {
                        let v = int(self.regs[value].1);
                        self.record(*status, *check, v);
                    }
                }
            }
        }
    }

    /// The index register's value if it lies in `0..size`, else records the failure.
    fn checked(&mut self, index: Reg, size: &IExpr, status: u32, check: u32) -> Option<i64> {
        let i = int(self.regs[&index].1);
        if (0..size.eval(&self.vars, self.syms)).contains(&i) {
            return Some(i);
        }
        self.record(status, check, i);
        None
    }

    /// The status protocol of `lower::kir`: the first failure sets word 0 and the value words.
    fn record(&mut self, status: u32, check: u32, value: i64) {
        let b = &mut self.bufs[status as usize];
        if b.get(0) == V::I32(0) {
            b.set(0, V::I32(check as i32 + 1));
            b.set(1, V::I32(value as i32));
            b.set(2, V::I32((value >> 32) as i32));
        }
    }

    fn inst(&mut self, d: DType, inst: &Inst) -> V {
        match inst {
            Inst::Load { buf, index, mask, other } => {
                if let Some(m) = mask
                    && m.eval(&self.vars, self.syms) == 0
                {
                    return scalar_const(*other, d);
                }
                let i = index.eval(&self.vars, self.syms) as usize;
                cast(self.bufs[*buf as usize].get(i), d)
            }
            Inst::Gather { buf, base, index, stride, size, status, check } => {
                let i = self.checked(*index, size, *status, *check).unwrap_or(0);
                let at = base.eval(&self.vars, self.syms) + i * stride.eval(&self.vars, self.syms);
                cast(self.bufs[*buf as usize].get(at as usize), d)
            }
            Inst::Const(s) => scalar_const(*s, d),
            Inst::Index(e) => cast(V::I64(e.eval(&self.vars, self.syms)), d),
            Inst::Unary(op, r) => unary(*op, self.regs[r].1),
            Inst::Binary(op, a, b) => binary(*op, self.regs[a].1, self.regs[b].1),
            Inst::Where(c, a, b) => {
                if self.regs[c].1 == V::B(true) {
                    self.regs[a].1
                } else {
                    self.regs[b].1
                }
            }
            Inst::Cast(r) => cast(self.regs[r].1, d),
            Inst::ReadAcc(a) => {
                let (ad, _, v) = self.accs[a];
                cast(cast(v, ad), d)
            }
        }
    }
}

/// The integer value of an int or bool register.
pub fn int(v: V) -> i64 {
    match v {
        V::B(b) => b as i64,
        V::I32(i) => i as i64,
        V::I64(i) => i,
        other => panic!("{other:?} is not an integer"),
    }
}

/// Compiles with a fresh compiler and runs over `[start, end)`.
pub fn jit(k: &LoopKernel, bufs: &mut [Buf], syms: &[i64], start: i64, end: i64) {
    let c = CpuCompiler::new().expect("host ISA");
    jit_with(&c, k, bufs, syms, start, end)
}

pub fn jit_with(c: &CpuCompiler, k: &LoopKernel, bufs: &mut [Buf], syms: &[i64], start: i64, end: i64) {
    let compiled =
        c.compile(k).unwrap_or_else(|e| panic!("compile failed: {e}\n{}", lower::kir::Kernel::Loops(k.clone())));
    let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.bytes.as_mut_ptr()).collect();
    // SAFETY: the tests size every buffer for the indices the kernel touches.
    unsafe { compiled.run(&ptrs, syms, start, end).expect("arity") };
}

/// Asserts `got` matches `want` through `air::testing`: floats within `tol * (1 + |want|)` (NaN
/// only where `want` is NaN, infinities equal), integers and bools exactly. Two empty buffers (a
/// kernel over zero elements) match; anything else must compare at least one element.
pub fn assert_bufs_close(got: &Buf, want: &Buf, tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if want.len() == 0 {
        return;
    }
    let (g, w): (Vec<V>, Vec<V>) =
        ((0..got.len()).map(|i| got.get(i)).collect(), (0..want.len()).map(|i| want.get(i)).collect());
    if want.dtype.is_float() {
        let (g, w): (Vec<f64>, Vec<f64>) = (g.iter().map(|v| v.f64()).collect(), w.iter().map(|v| v.f64()).collect());
        air::testing::assert_close(what, &g, &w, air::testing::Tol::both(tol));
    } else {
        air::testing::assert_equal(what, &g, &w);
    }
}

/// Runs `k` with the JIT and the evaluator on copies of `bufs` and compares every buffer.
pub fn check(k: &LoopKernel, bufs: &[Buf], syms: &[i64], start: i64, end: i64, tol: f64, what: &str) {
    let mut a = bufs.to_vec();
    let mut b = bufs.to_vec();
    jit(k, &mut a, syms, start, end);
    eval(k, &mut b, syms, start, end);
    for (i, (g, w)) in a.iter().zip(&b).enumerate() {
        assert_bufs_close(g, w, tol, &format!("{what}, buffer b{i}"));
    }
}

// ---- kernel builders ----

pub fn p(dtype: DType, access: Access) -> Param {
    Param { dtype, access }
}
pub fn r(n: u32) -> Reg {
    Reg(n)
}
pub fn i(n: u32) -> IExpr {
    IExpr::Var(Var(n))
}
pub fn c(n: i64) -> IExpr {
    IExpr::Const(n)
}
pub fn let_(n: u32, dtype: DType, inst: Inst) -> Stmt {
    Stmt::Let { reg: Reg(n), dtype, inst }
}
pub fn load(n: u32, dtype: DType, buf: u32, index: IExpr) -> Stmt {
    let_(n, dtype, Inst::Load { buf, index, mask: None, other: Scalar::Int(0) })
}
pub fn store(buf: u32, index: IExpr, value: u32) -> Stmt {
    Stmt::Store { buf, index, value: Reg(value) }
}
pub fn for_(var: u32, extent: IExpr, parallel: bool, body: Vec<Stmt>) -> Stmt {
    Stmt::Loop { var: Var(var), extent, parallel, body }
}

/// `out[i] = op(in[i])` over a parallel loop of `n` (a symbol when `n` is None).
pub fn unary_kernel(op: UnaryOp, d: DType, out: DType, n: IExpr) -> LoopKernel {
    LoopKernel {
        params: vec![p(d, Access::Read), p(out, Access::Write)],
        n_syms: 1,
        body: vec![for_(0, n, true, vec![load(0, d, 0, i(0)), let_(1, out, Inst::Unary(op, r(0))), store(1, i(0), 1)])],
    }
}

/// `out[i] = op(a[i], b[i])`.
pub fn binary_kernel(op: BinaryOp, d: DType, out: DType, n: IExpr) -> LoopKernel {
    LoopKernel {
        params: vec![p(d, Access::Read), p(d, Access::Read), p(out, Access::Write)],
        n_syms: 1,
        body: vec![for_(
            0,
            n,
            true,
            vec![
                load(0, d, 0, i(0)),
                load(1, d, 1, i(0)),
                let_(2, out, Inst::Binary(op, r(0), r(1))),
                store(2, i(0), 2),
            ],
        )],
    }
}

/// Deterministic pseudo-random values of a dtype, with special values mixed in.
pub fn sample(d: DType, n: usize, seed: u64) -> Vec<V> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..n)
        .map(|k| {
            let r = next();
            let special = r % 7 == 0;
            match d {
                DType::Bool => V::B(r & 1 == 1),
                DType::I32 => {
                    if special {
                        [0, -1, 1, i32::MIN, i32::MAX, 7][k % 6].into_i32()
                    } else {
                        V::I32((r >> 20) as i32 % 1000)
                    }
                }
                DType::I64 => {
                    if special {
                        V::I64([0, -1, 1, i64::MIN, i64::MAX, 7][k % 6])
                    } else {
                        V::I64((r >> 20) as i64 % 100_000 - 50_000)
                    }
                }
                _ => {
                    let x = if special {
                        [0.0, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.0, -2.5][k % 7]
                    } else {
                        ((r >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 20.0
                    };
                    cast(V::D(x), d)
                }
            }
        })
        .collect()
}

trait IntoI32 {
    fn into_i32(self) -> V;
}
impl IntoI32 for i32 {
    fn into_i32(self) -> V {
        V::I32(self)
    }
}

pub const SIZES: [usize; 12] = [0, 1, 3, 4, 5, 7, 8, 15, 16, 17, 1000, 1001];
