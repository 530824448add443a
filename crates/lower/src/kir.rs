//! kir: the kernel IR between the scheduled graph and the code generators (Cranelift, WGSL).
//!
//! A `LoopKernel` is a loop nest over index expressions with SSA registers, loads, stores and
//! reduction accumulators. A `MatmulKernel` is a strided batched contraction that backends map to
//! their fastest GEMM. Both are printable (golden tests) and structurally hashable (kernel caches).
//!
//! Conventions every producer and backend keeps:
//! - Buffers are the kernel's parameters, addressed by position (`b0`, `b1`, ...). Indices are in
//!   elements, not bytes.
//! - Symbols (`seq`) are read from the `syms` array by position (`s0`, `s1`, ...), in the order of
//!   `Program::symbols`; kernels are compiled once and run for any symbol values.
//! - Registers (`r3`) are SSA: defined once by `Let`, used after, in the same or an inner scope.
//! - A loop marked `parallel` must be the single top-level statement of the kernel body. The
//!   runtime may split its range across threads, calling the kernel with `[start, end)`; backends
//!   iterate that loop over `start..end` instead of `0..extent`. Kernels without a top-level
//!   parallel loop are called once with `start = 0, end = 1` and ignore the range.
//! - `IExpr::Div`/`Mod` are floor division/remainder on non-negative operands (indices).
//! - F16/BF16 values are computed in f32 and rounded to storage after every op, as the
//!   interpreter's: loads widen, stores narrow.
//! - Data-dependent failures (an index out of range, an integer division by zero) never trap and
//!   never touch memory out of bounds: the faulting element uses a safe substitute (index 0,
//!   divisor 1) and the kernel records the failure in the run's status buffer, a parameter of
//!   dtype `i32` holding [`STATUS_WORDS`] words: word 0 is 0 while nothing failed, else `check + 1`
//!   of the first failure recorded (set once, by a compare-and-swap from 0); words 1 and 2 are
//!   the low and high halves of the offending value. `check` numbers `Program::checks`.

use std::fmt;
use std::hash::{Hash, Hasher};

use air::{BinaryOp, DType, ReduceOp, Scalar, UnaryOp};

/// The number of `i32` words of a status buffer (see the module docs).
pub const STATUS_WORDS: usize = 4;

/// A loop variable (`i0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Var(pub u32);

/// An SSA register (`r0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reg(pub u32);

/// A reduction accumulator (`acc0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Acc(pub u32);

impl fmt::Display for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "i{}", self.0)
    }
}
impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}", self.0)
    }
}
impl fmt::Display for Acc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "acc{}", self.0)
    }
}

/// An integer index expression over loop variables, symbols and constants (i64 arithmetic).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum IExpr {
    /// A constant.
    Const(i64),
    /// The current value of a loop variable.
    Var(Var),
    /// The value of symbol number `n` (position in `Program::symbols`).
    Sym(u32),
    /// `a + b` (wrapping).
    Add(Box<IExpr>, Box<IExpr>),
    /// `a * b` (wrapping).
    Mul(Box<IExpr>, Box<IExpr>),
    /// Floor division (operands non-negative).
    Div(Box<IExpr>, Box<IExpr>),
    /// Remainder (operands non-negative).
    Mod(Box<IExpr>, Box<IExpr>),
    /// 1 if `a < b`, else 0.
    Lt(Box<IExpr>, Box<IExpr>),
    /// 1 if both are non-zero, else 0.
    And(Box<IExpr>, Box<IExpr>),
}

// The smart constructors are named after the operations they build; they fold constants, so
// they are not the `std::ops` traits (which would hide the folding behind operators).
#[allow(clippy::should_implement_trait)]
impl IExpr {
    /// The loop variable `v` as an expression.
    pub fn var(v: Var) -> IExpr {
        IExpr::Var(v)
    }

    /// `a + b`, folding constants and zeros.
    pub fn add(a: IExpr, b: IExpr) -> IExpr {
        match (a, b) {
            (IExpr::Const(x), IExpr::Const(y)) => IExpr::Const(x + y),
            (IExpr::Const(0), e) | (e, IExpr::Const(0)) => e,
            (a, b) => IExpr::Add(Box::new(a), Box::new(b)),
        }
    }

    /// `a * b`, folding constants, zeros and ones.
    pub fn mul(a: IExpr, b: IExpr) -> IExpr {
        match (a, b) {
            (IExpr::Const(x), IExpr::Const(y)) => IExpr::Const(x * y),
            (IExpr::Const(0), _) | (_, IExpr::Const(0)) => IExpr::Const(0),
            (IExpr::Const(1), e) | (e, IExpr::Const(1)) => e,
            (a, b) => IExpr::Mul(Box::new(a), Box::new(b)),
        }
    }

    /// `a / b` (floor), folding constants and division by one.
    pub fn div(a: IExpr, b: IExpr) -> IExpr {
        match (a, b) {
            (IExpr::Const(x), IExpr::Const(y)) if y != 0 => IExpr::Const(x.div_euclid(y)),
            (e, IExpr::Const(1)) => e,
            (a, b) => IExpr::Div(Box::new(a), Box::new(b)),
        }
    }

    /// `a % b`, folding constants and modulo one.
    pub fn rem(a: IExpr, b: IExpr) -> IExpr {
        match (a, b) {
            (IExpr::Const(x), IExpr::Const(y)) if y != 0 => IExpr::Const(x.rem_euclid(y)),
            (_, IExpr::Const(1)) => IExpr::Const(0),
            (a, b) => IExpr::Mod(Box::new(a), Box::new(b)),
        }
    }

    /// `a < b` as 1 or 0, folding constants.
    pub fn lt(a: IExpr, b: IExpr) -> IExpr {
        match (a, b) {
            (IExpr::Const(x), IExpr::Const(y)) => IExpr::Const((x < y) as i64),
            (a, b) => IExpr::Lt(Box::new(a), Box::new(b)),
        }
    }

    /// `a && b` as 1 or 0; a constant operand folds (0 gives 0, any other leaves the other operand).
    pub fn and(a: IExpr, b: IExpr) -> IExpr {
        match (a, b) {
            (IExpr::Const(0), _) | (_, IExpr::Const(0)) => IExpr::Const(0),
            (IExpr::Const(_), e) | (e, IExpr::Const(_)) => e,
            (a, b) => IExpr::And(Box::new(a), Box::new(b)),
        }
    }

    /// The value if this expression is a constant.
    pub fn as_const(&self) -> Option<i64> {
        match self {
            IExpr::Const(c) => Some(*c),
            _ => None,
        }
    }

    /// Appends the number of every symbol this expression reads to `out`.
    pub fn symbols(&self, out: &mut Vec<u32>) {
        match self {
            IExpr::Const(_) | IExpr::Var(_) => {}
            IExpr::Sym(s) => out.push(*s),
            IExpr::Add(a, b)
            | IExpr::Mul(a, b)
            | IExpr::Div(a, b)
            | IExpr::Mod(a, b)
            | IExpr::Lt(a, b)
            | IExpr::And(a, b) => {
                a.symbols(out);
                b.symbols(out);
            }
        }
    }

    /// Evaluates with loop variable values `vars[v]` and symbol values `syms[n]`.
    pub fn eval(&self, vars: &[i64], syms: &[i64]) -> i64 {
        match self {
            IExpr::Const(c) => *c,
            IExpr::Var(v) => vars[v.0 as usize],
            IExpr::Sym(n) => syms[*n as usize],
            IExpr::Add(a, b) => a.eval(vars, syms).wrapping_add(b.eval(vars, syms)),
            IExpr::Mul(a, b) => a.eval(vars, syms).wrapping_mul(b.eval(vars, syms)),
            IExpr::Div(a, b) => {
                let d = b.eval(vars, syms);
                if d == 0 { 0 } else { a.eval(vars, syms).div_euclid(d) }
            }
            IExpr::Mod(a, b) => {
                let d = b.eval(vars, syms);
                if d == 0 { 0 } else { a.eval(vars, syms).rem_euclid(d) }
            }
            IExpr::Lt(a, b) => (a.eval(vars, syms) < b.eval(vars, syms)) as i64,
            IExpr::And(a, b) => (a.eval(vars, syms) != 0 && b.eval(vars, syms) != 0) as i64,
        }
    }

    /// Whether `v` occurs in this expression.
    pub fn uses(&self, v: Var) -> bool {
        self.any_leaf(&|e| *e == IExpr::Var(v))
    }

    /// Whether some loop variable occurs in this expression.
    pub fn reads_vars(&self) -> bool {
        self.any_leaf(&|e| matches!(e, IExpr::Var(_)))
    }

    /// Whether `f` holds for every leaf (constant, variable or symbol) of this expression.
    pub fn all_leaves(&self, f: &impl Fn(&IExpr) -> bool) -> bool {
        !self.any_leaf(&|e| !f(e))
    }

    /// Whether `f` holds for some leaf (constant, variable or symbol) of this expression.
    fn any_leaf(&self, f: &impl Fn(&IExpr) -> bool) -> bool {
        match self {
            IExpr::Const(_) | IExpr::Var(_) | IExpr::Sym(_) => f(self),
            IExpr::Add(a, b)
            | IExpr::Mul(a, b)
            | IExpr::Div(a, b)
            | IExpr::Mod(a, b)
            | IExpr::Lt(a, b)
            | IExpr::And(a, b) => a.any_leaf(f) || b.any_leaf(f),
        }
    }

    /// If this expression is `c * v + rest` with `rest` and `c` free of `v` (and `v` nowhere
    /// under a div/mod/lt), returns `c` (0 when `v` does not occur). Backends use it to find
    /// contiguous (c = 1) and broadcast (c = 0) accesses in the loop over `v`.
    pub fn linear_coeff(&self, v: Var) -> Option<IExpr> {
        if !self.uses(v) {
            return Some(IExpr::Const(0));
        }
        match self {
            IExpr::Var(_) => Some(IExpr::Const(1)),
            IExpr::Add(a, b) => Some(IExpr::add(a.linear_coeff(v)?, b.linear_coeff(v)?)),
            IExpr::Mul(a, b) => match (a.uses(v), b.uses(v)) {
                (true, false) => Some(IExpr::mul(a.linear_coeff(v)?, (**b).clone())),
                (false, true) => Some(IExpr::mul((**a).clone(), b.linear_coeff(v)?)),
                _ => None,
            },
            _ => None,
        }
    }
}

impl fmt::Display for IExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IExpr::Const(c) => write!(f, "{c}"),
            IExpr::Var(v) => write!(f, "{v}"),
            IExpr::Sym(n) => write!(f, "s{n}"),
            IExpr::Add(a, b) => write!(f, "({a} + {b})"),
            IExpr::Mul(a, b) => write!(f, "{a}*{b}"),
            IExpr::Div(a, b) => write!(f, "({a} / {b})"),
            IExpr::Mod(a, b) => write!(f, "({a} % {b})"),
            IExpr::Lt(a, b) => write!(f, "({a} < {b})"),
            IExpr::And(a, b) => write!(f, "({a} && {b})"),
        }
    }
}

/// The computation that defines a register.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Inst {
    /// `buf[index]`; when `mask` is given and evaluates to 0, the value is `other` instead and
    /// memory is not touched (padding).
    Load {
        /// The buffer parameter's position.
        buf: u32,
        /// The element index.
        index: IExpr,
        /// When given and 0, the load is skipped and yields `other`.
        mask: Option<IExpr>,
        /// The value of a masked-off load.
        other: Scalar,
    },
    /// A constant value.
    Const(Scalar),
    /// The integer value of an index expression, converted to the register's dtype (iota).
    Index(IExpr),
    /// An element-wise op of one register.
    Unary(UnaryOp, Reg),
    /// An element-wise op of two registers of one dtype.
    Binary(BinaryOp, Reg, Reg),
    /// `where(cond, a, b)`: `a` where `cond` is true, else `b`.
    Where(Reg, Reg, Reg),
    /// Converts to the register's dtype.
    Cast(Reg),
    /// The current value of an accumulator.
    ReadAcc(Acc),
    /// `buf[base + i * stride]` where `i` is the value of the integer register `index`, checked
    /// against `0..size`: out of range, the kernel records `check` with the value `i` in the status
    /// buffer `status` and the value is 0, read from nothing (`size` may be 0 and `buf` empty; the
    /// run fails with the check anyway). WGSL, whose reads are bounded by the robust buffer
    /// access rules, reads `buf[base]` instead.
    Gather {
        /// The buffer parameter read.
        buf: u32,
        /// The element index for `i = 0`.
        base: IExpr,
        /// The integer register holding `i`.
        index: Reg,
        /// The element distance between consecutive `i`.
        stride: IExpr,
        /// The number of valid `i`.
        size: IExpr,
        /// The status buffer parameter.
        status: u32,
        /// The check recorded on a bad index (a position in `Program::checks`).
        check: u32,
    },
}

impl Inst {
    /// The registers the instruction reads, in operand order.
    pub fn operands(&self) -> smallvec::SmallVec<[Reg; 3]> {
        match self {
            Inst::Unary(_, r) | Inst::Cast(r) => smallvec::smallvec![*r],
            Inst::Binary(_, a, b) => smallvec::smallvec![*a, *b],
            Inst::Where(c, a, b) => smallvec::smallvec![*c, *a, *b],
            Inst::Gather { index, .. } => smallvec::smallvec![*index],
            Inst::Load { .. } | Inst::Const(_) | Inst::Index(_) | Inst::ReadAcc(_) => smallvec::SmallVec::new(),
        }
    }
}

/// One statement of a loop nest.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Stmt {
    /// Defines `reg` of `dtype` as the value of `inst`.
    Let {
        /// The register defined (SSA: defined once).
        reg: Reg,
        /// The register's dtype.
        dtype: DType,
        /// The computation.
        inst: Inst,
    },
    /// Runs `body` for `var` in `0..extent` (`start..end` when `parallel`; see the module docs).
    Loop {
        /// The loop variable.
        var: Var,
        /// The trip count.
        extent: IExpr,
        /// Whether the runtime may split the range across threads (top level only).
        parallel: bool,
        /// The statements run for each value of `var`.
        body: Vec<Stmt>,
    },
    /// Declares `acc` and sets it to the identity of `op` (0 for sum, -inf/MIN for max).
    AccInit {
        /// The accumulator declared.
        acc: Acc,
        /// The accumulator's dtype.
        dtype: DType,
        /// The reduction it performs.
        op: ReduceOp,
    },
    /// `acc = op(acc, value)`.
    AccUpdate {
        /// The accumulator updated.
        acc: Acc,
        /// The value folded into it.
        value: Reg,
    },
    /// `buf[base + i * stride] += value`, `i` from the integer register `index`, checked like
    /// [`Inst::Gather`] (out of range: the failure is recorded and nothing is written).
    ScatterAdd {
        /// The buffer parameter updated.
        buf: u32,
        /// The element index for `i = 0`.
        base: IExpr,
        /// The integer register holding `i`.
        index: Reg,
        /// The element distance between consecutive `i`.
        stride: IExpr,
        /// The number of valid `i`.
        size: IExpr,
        /// The value added.
        value: Reg,
        /// The status buffer parameter.
        status: u32,
        /// The check recorded on a bad index.
        check: u32,
    },
    /// When the bool register `cond` is true, records `check` with the integer value of `value`
    /// in the status buffer `status` (the first failure of a run wins).
    Check {
        /// The failure condition.
        cond: Reg,
        /// The offending value reported.
        value: Reg,
        /// The status buffer parameter.
        status: u32,
        /// The check recorded (a position in `Program::checks`).
        check: u32,
    },
    /// `buf[index] = value`.
    Store {
        /// The buffer parameter's position.
        buf: u32,
        /// The element index.
        index: IExpr,
        /// The value stored.
        value: Reg,
    },
}

/// How a kernel uses one of its buffer parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// The kernel only reads the buffer.
    Read,
    /// The kernel writes the buffer.
    Write,
}

/// One buffer parameter of a kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Param {
    /// Element type of the buffer.
    pub dtype: DType,
    /// Whether the kernel reads or writes it.
    pub access: Access,
}

/// A loop-nest kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LoopKernel {
    /// The buffer parameters (`b0`, `b1`, ...), in order.
    pub params: Vec<Param>,
    /// Number of symbols the kernel may read (`s0 .. s{n-1}`).
    pub n_syms: u32,
    /// The loop nest.
    pub body: Vec<Stmt>,
}

/// One operand of a matmul: element `(batch, row, col)` lives at
/// `offset + batch*batch_stride + row*row_stride + col*col_stride` in buffer `buf`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MatOperand {
    /// The buffer parameter's position.
    pub buf: u32,
    /// Element offset of element `(0, 0, 0)`.
    pub offset: IExpr,
    /// Element stride between batches.
    pub batch_stride: IExpr,
    /// Element stride between rows.
    pub row_stride: IExpr,
    /// Element stride between columns.
    pub col_stride: IExpr,
}

/// `c[b] = a[b] @ bmat[b]` (+ `c[b]` if `accumulate`) for `b in 0..batch`, with `a` of shape
/// `[m, k]`, `bmat` of shape `[k, n]` and `c` of shape `[m, n]`, all f32 (for now).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MatmulKernel {
    /// The buffer parameters (`b0`, `b1`, ...), in order.
    pub params: Vec<Param>,
    /// Number of symbols the kernel may read (`s0 .. s{n-1}`).
    pub n_syms: u32,
    /// Element type of every operand.
    pub dtype: DType,
    /// Number of independent products.
    pub batch: IExpr,
    /// Rows of `a` and `c`.
    pub m: IExpr,
    /// Columns of `bmat` and `c`.
    pub n: IExpr,
    /// The contracted dimension: columns of `a`, rows of `bmat`.
    pub k: IExpr,
    /// The left operand.
    pub a: MatOperand,
    /// The right operand (`bmat`).
    pub b: MatOperand,
    /// The result.
    pub c: MatOperand,
    /// Add the product to what `c` holds (a bias written into `c` by an earlier kernel).
    pub accumulate: bool,
}

/// A kernel: what one launch computes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)] // Few kernels per program; boxing would only add indirection.
pub enum Kernel {
    /// A loop-nest kernel.
    Loops(LoopKernel),
    /// A batched matmul kernel.
    Matmul(MatmulKernel),
}

impl Kernel {
    /// The kernel's buffer parameters, in order.
    pub fn params(&self) -> &[Param] {
        match self {
            Kernel::Loops(k) => &k.params,
            Kernel::Matmul(k) => &k.params,
        }
    }

    /// A structural hash: equal kernels hash equal, whatever program they come from (`FxHasher`:
    /// fast, not collision-resistant, so a cache compares kernels in full on a match).
    pub fn structural_hash(&self) -> u64 {
        fx_hash(self)
    }
}

impl LoopKernel {
    /// A structural hash, as [`Kernel::structural_hash`].
    pub fn structural_hash(&self) -> u64 {
        fx_hash(self)
    }
}

/// Removes the loops of `body` (at any depth) whose extent is the constant 0 or less, which run
/// nothing, and then the accumulators that no update is left for: each read of one becomes the
/// constant it was initialised to (its reduction's identity). A reduction over an empty axis (the
/// zero an ONNX import ties to a tensor, a sum over none of its elements) is then a store of that
/// constant, which the code generator need not compile a loop for.
pub fn drop_empty_loops(body: &mut Vec<Stmt>) {
    fn drop_loops(body: &mut Vec<Stmt>) {
        body.retain(|s| !matches!(s, Stmt::Loop { extent: IExpr::Const(n), .. } if *n <= 0));
        for s in body.iter_mut() {
            if let Stmt::Loop { body, .. } = s {
                drop_loops(body);
            }
        }
    }
    fn updated(body: &[Stmt], accs: &mut Vec<Acc>) {
        for s in body {
            match s {
                Stmt::AccUpdate { acc, .. } => accs.push(*acc),
                Stmt::Loop { body, .. } => updated(body, accs),
                _ => {}
            }
        }
    }
    /// Drops the inits of accumulators not in `live`, recording their identities.
    fn drop_inits(body: &mut Vec<Stmt>, live: &[Acc], idle: &mut Vec<(Acc, Scalar)>) {
        body.retain(|s| match s {
            Stmt::AccInit { acc, dtype, op } if !live.contains(acc) => match acc_start(*op, *dtype) {
                Some(identity) => {
                    idle.push((*acc, identity));
                    false
                }
                None => true,
            },
            _ => true,
        });
        for s in body.iter_mut() {
            if let Stmt::Loop { body, .. } = s {
                drop_inits(body, live, idle);
            }
        }
    }
    fn reads(body: &mut [Stmt], idle: &[(Acc, Scalar)]) {
        for s in body {
            match s {
                Stmt::Let { inst, .. } => {
                    if let Inst::ReadAcc(acc) = inst
                        && let Some((_, value)) = idle.iter().find(|(a, _)| a == acc)
                    {
                        *inst = Inst::Const(*value);
                    }
                }
                Stmt::Loop { body, .. } => reads(body, idle),
                _ => {}
            }
        }
    }
    drop_loops(body);
    let mut live = Vec::new();
    updated(body, &mut live);
    let mut idle = Vec::new();
    drop_inits(body, &live, &mut idle);
    if !idle.is_empty() {
        reads(body, &idle);
    }
}

/// What [`Stmt::AccInit`] sets an accumulator of `dtype` to: its reduction's identity (0 for a
/// sum, the lowest value for a maximum), as a scalar of `dtype`'s kind; `None` for a maximum of
/// a type without one (bool).
pub fn acc_start(op: ReduceOp, dtype: DType) -> Option<Scalar> {
    Some(match (op, dtype) {
        (ReduceOp::Sum, d) if d.is_float() => Scalar::Float(0.0),
        (ReduceOp::Sum, DType::Bool) => Scalar::Bool(false),
        (ReduceOp::Sum, _) => Scalar::Int(0),
        (ReduceOp::Max, d) if d.is_float() => Scalar::Float(f64::NEG_INFINITY),
        (ReduceOp::Max, DType::I32) => Scalar::Int(i64::from(i32::MIN)),
        (ReduceOp::Max, DType::I64) => Scalar::Int(i64::MIN),
        (ReduceOp::Max, _) => return None,
    })
}

fn fx_hash(t: &impl Hash) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    t.hash(&mut h);
    h.finish()
}

fn indent(f: &mut fmt::Formatter<'_>, depth: usize) -> fmt::Result {
    for _ in 0..depth {
        f.write_str("  ")?;
    }
    Ok(())
}

fn fmt_inst(f: &mut fmt::Formatter<'_>, inst: &Inst) -> fmt::Result {
    match inst {
        Inst::Load { buf, index, mask: None, .. } => write!(f, "load b{buf}[{index}]"),
        Inst::Load { buf, index, mask: Some(m), other } => {
            write!(f, "load b{buf}[{index}] if {m} else {other}")
        }
        Inst::Const(s) => write!(f, "const {s}"),
        Inst::Index(e) => write!(f, "index {e}"),
        Inst::Unary(op, r) => write!(f, "{} {r}", op.name()),
        Inst::Binary(op, a, b) => write!(f, "{} {a}, {b}", op.name()),
        Inst::Where(c, a, b) => write!(f, "where {c}, {a}, {b}"),
        Inst::Cast(r) => write!(f, "cast {r}"),
        Inst::ReadAcc(a) => write!(f, "read {a}"),
        Inst::Gather { buf, base, index, stride, size, status, check } => {
            write!(f, "gather b{buf}[{base} + {index}*{stride}] size {size} check {check} in b{status}")
        }
    }
}

fn fmt_stmts(f: &mut fmt::Formatter<'_>, stmts: &[Stmt], depth: usize) -> fmt::Result {
    for s in stmts {
        indent(f, depth)?;
        match s {
            Stmt::Let { reg, dtype, inst } => {
                write!(f, "{reg}: {dtype} = ")?;
                fmt_inst(f, inst)?;
                writeln!(f)?;
            }
            Stmt::Loop { var, extent, parallel, body } => {
                let p = if *parallel { " parallel" } else { "" };
                writeln!(f, "for {var} in 0..{extent}{p} {{")?;
                fmt_stmts(f, body, depth + 1)?;
                indent(f, depth)?;
                writeln!(f, "}}")?;
            }
            Stmt::AccInit { acc, dtype, op } => writeln!(f, "{acc}: {dtype} = {}.init", op.name())?,
            Stmt::AccUpdate { acc, value } => writeln!(f, "{acc} <- {value}")?,
            Stmt::Store { buf, index, value } => writeln!(f, "store b{buf}[{index}] = {value}")?,
            Stmt::ScatterAdd { buf, base, index, stride, size, value, status, check } => writeln!(
                f,
                "scatter_add b{buf}[{base} + {index}*{stride}] += {value} size {size} check {check} in b{status}"
            )?,
            Stmt::Check { cond, value, status, check } => {
                writeln!(f, "check {check} if {cond} value {value} in b{status}")?
            }
        }
    }
    Ok(())
}

fn fmt_params(f: &mut fmt::Formatter<'_>, params: &[Param], n_syms: u32) -> fmt::Result {
    for (i, p) in params.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        let a = match p.access {
            Access::Read => "in",
            Access::Write => "out",
        };
        write!(f, "b{i}: {a} {}", p.dtype)?;
    }
    if n_syms > 0 {
        write!(f, "; syms {n_syms}")?;
    }
    Ok(())
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kernel::Loops(k) => {
                f.write_str("kernel(")?;
                fmt_params(f, &k.params, k.n_syms)?;
                writeln!(f, ") {{")?;
                fmt_stmts(f, &k.body, 1)?;
                writeln!(f, "}}")
            }
            Kernel::Matmul(k) => {
                f.write_str("matmul(")?;
                fmt_params(f, &k.params, k.n_syms)?;
                writeln!(f, ") {{")?;
                writeln!(f, "  batch {}, m {}, n {}, k {}, {}", k.batch, k.m, k.n, k.k, k.dtype)?;
                for (name, o) in [("a", &k.a), ("b", &k.b), ("c", &k.c)] {
                    writeln!(
                        f,
                        "  {name} = b{}[{} + batch*{} + row*{} + col*{}]",
                        o.buf, o.offset, o.batch_stride, o.row_stride, o.col_stride
                    )?;
                }
                if k.accumulate {
                    writeln!(f, "  accumulate")?;
                }
                writeln!(f, "}}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn let_(reg: u32, dtype: DType, inst: Inst) -> Stmt {
        Stmt::Let { reg: Reg(reg), dtype, inst }
    }

    fn sum_over(extent: i64, acc: u32, read: u32) -> Vec<Stmt> {
        vec![
            Stmt::AccInit { acc: Acc(acc), dtype: DType::F32, op: ReduceOp::Sum },
            Stmt::Loop {
                var: Var(acc),
                extent: IExpr::Const(extent),
                parallel: false,
                body: vec![
                    let_(
                        10 + acc,
                        DType::F32,
                        Inst::Load { buf: 1, index: IExpr::Var(Var(acc)), mask: None, other: Scalar::Float(0.0) },
                    ),
                    Stmt::AccUpdate { acc: Acc(acc), value: Reg(10 + acc) },
                ],
            },
            let_(read, DType::F32, Inst::ReadAcc(Acc(acc))),
        ]
    }

    /// A sum over nothing becomes its identity; a sum over something, and a maximum's identity
    /// at each integer width, are as they should be.
    #[test]
    fn empty_loops_go_and_their_accumulators_read_as_identities() {
        let mut body = sum_over(0, 0, 1);
        body.extend(sum_over(4, 1, 2));
        body.push(let_(3, DType::F32, Inst::Binary(BinaryOp::Add, Reg(1), Reg(2))));
        body.push(Stmt::Store { buf: 0, index: IExpr::Const(0), value: Reg(3) });
        drop_empty_loops(&mut body);
        assert!(matches!(body[0], Stmt::Let { reg: Reg(1), inst: Inst::Const(Scalar::Float(z)), .. } if z == 0.0));
        assert!(matches!(body[1], Stmt::AccInit { acc: Acc(1), .. }));
        assert!(matches!(body[2], Stmt::Loop { extent: IExpr::Const(4), .. }));
        assert!(matches!(body[3], Stmt::Let { inst: Inst::ReadAcc(Acc(1)), .. }));
        assert_eq!(body.len(), 6);

        for (dtype, want) in [
            (DType::F32, Scalar::Float(f64::NEG_INFINITY)),
            (DType::I32, Scalar::Int(i64::from(i32::MIN))),
            (DType::I64, Scalar::Int(i64::MIN)),
        ] {
            let mut body = vec![Stmt::Loop {
                var: Var(0),
                extent: IExpr::Const(3),
                parallel: true,
                body: vec![
                    Stmt::AccInit { acc: Acc(0), dtype, op: ReduceOp::Max },
                    Stmt::Loop { var: Var(1), extent: IExpr::Const(0), parallel: false, body: Vec::new() },
                    let_(0, dtype, Inst::ReadAcc(Acc(0))),
                    Stmt::Store { buf: 0, index: IExpr::Var(Var(0)), value: Reg(0) },
                ],
            }];
            drop_empty_loops(&mut body);
            let Stmt::Loop { body: inner, .. } = &body[0] else { panic!("the parallel loop stays") };
            assert_eq!(inner.len(), 2, "{dtype:?}");
            assert!(matches!(&inner[0], Stmt::Let { inst: Inst::Const(v), .. } if *v == want), "{dtype:?}");
        }
    }
}
