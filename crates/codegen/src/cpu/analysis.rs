//! What the emitter needs to know about a kernel before it emits anything: the dtype of every
//! register and accumulator, and, per innermost loop, whether it can run four lanes at a time.
//!
//! Vectorization rule (an innermost loop over `v`):
//! - every register it reads or defines is `f32`, `i32` or `bool` (bools become lane masks);
//! - every load is from an `f32`/`i32` buffer of the register's dtype, at an index whose linear
//!   coefficient in `v` is the constant 1 (contiguous: a vector load) or 0 (broadcast: a scalar
//!   load and a splat), and any mask does not depend on `v`;
//! - every store writes an `f32`/`i32` buffer contiguously (coefficient 1), and no buffer that is
//!   stored is also loaded at another index in the loop (that could be a recurrence);
//! - `index` values have coefficient 0 or 1;
//! - accumulator updates are `sum`/`max` of `f32`/`i32` into accumulators declared outside the
//!   loop, and nothing in the loop reads an accumulator (a reduction: partial sums per lane).

use rustc_hash::FxHashMap as HashMap;

use air::{BinaryOp, DType, ReduceOp, Scalar, UnaryOp};
use lower::kir::{Acc, IExpr, Inst, LoopKernel, Reg, Stmt, Var};
use smallvec::{SmallVec, smallvec};

use super::tile::{AROUND, AROUND_FULL, AROUND_POST, MAX_SLOTS, PARAMS, TILE, TileBinary, TileMode, TileUnary};
use crate::error::{CodegenError, Result};

/// Dtypes of the kernel's registers and accumulators.
pub(crate) struct KernelInfo {
    pub(crate) regs: HashMap<Reg, DType>,
    pub(crate) accs: HashMap<Acc, (DType, ReduceOp)>,
}

impl KernelInfo {
    pub(crate) fn new(k: &LoopKernel) -> Result<KernelInfo> {
        let mut info = KernelInfo { regs: HashMap::default(), accs: HashMap::default() };
        info.collect(k, &k.body)?;
        Ok(info)
    }

    fn collect(&mut self, k: &LoopKernel, stmts: &[Stmt]) -> Result<()> {
        for s in stmts {
            match s {
                Stmt::Let { reg, dtype, inst } => {
                    if self.regs.insert(*reg, *dtype).is_some() {
                        return Err(CodegenError::Invalid(format!("register {reg} defined twice")));
                    }
                    match inst {
                        Inst::Load { buf, .. } => check_buf(k, *buf)?,
                        Inst::Gather { buf, status, .. } => {
                            check_buf(k, *buf)?;
                            check_buf(k, *status)?;
                        }
                        _ => {}
                    }
                }
                Stmt::Loop { body, .. } => self.collect(k, body)?,
                Stmt::AccInit { acc, dtype, op } => {
                    if dtype.is_bool() {
                        return Err(CodegenError::Unsupported(format!("accumulator {acc} of dtype bool")));
                    }
                    if self.accs.insert(*acc, (*dtype, *op)).is_some() {
                        return Err(CodegenError::Invalid(format!("accumulator {acc} declared twice")));
                    }
                }
                Stmt::Store { buf, .. } => check_buf(k, *buf)?,
                Stmt::ScatterAdd { buf, status, .. } => {
                    check_buf(k, *buf)?;
                    check_buf(k, *status)?;
                }
                Stmt::Check { status, .. } => check_buf(k, *status)?,
                Stmt::AccUpdate { .. } => {}
            }
        }
        Ok(())
    }

    pub(crate) fn reg(&self, r: Reg) -> Result<DType> {
        self.regs.get(&r).copied().ok_or_else(|| CodegenError::Invalid(format!("register {r} is never defined")))
    }

    pub(crate) fn acc(&self, a: Acc) -> Result<(DType, ReduceOp)> {
        self.accs.get(&a).copied().ok_or_else(|| CodegenError::Invalid(format!("accumulator {a} is never declared")))
    }
}

fn check_buf(k: &LoopKernel, buf: u32) -> Result<()> {
    if (buf as usize) < k.params.len() {
        Ok(())
    } else {
        Err(CodegenError::Invalid(format!("buffer b{buf} out of range ({} params)", k.params.len())))
    }
}

/// How an innermost loop is vectorized.
pub(crate) struct VecPlan {
    /// Accumulators updated in the loop, in first-update order.
    pub(crate) reductions: Vec<Acc>,
    /// Cranelift instructions one copy of the body emits, roughly (see [`unroll_weight`]), to
    /// pick the unroll factor.
    pub(crate) size: usize,
}

fn lane_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::I32 | DType::Bool)
}

fn coeff_is(e: &IExpr, v: Var, allowed: &[i64]) -> bool {
    matches!(e.linear_coeff(v), Some(IExpr::Const(c)) if allowed.contains(&c))
}

/// Decides whether the innermost loop `body` over `v` can be vectorized. Loops nested in it
/// must unroll fully (`unrolls_fully`: a pooling window, a convolution's taps); an accumulator
/// initialized inside the body (a window's maximum per output) then runs lane-wise, one lane per
/// value of `v`.
pub(crate) fn vector_plan(k: &LoopKernel, info: &KernelInfo, v: Var, body: &[Stmt]) -> Option<VecPlan> {
    let mut scan =
        VecScan { k, info, v, reductions: Vec::new(), local: Vec::new(), loads: Vec::new(), stores: Vec::new() };
    scan.stmts(body)?;
    for (sb, si) in &scan.stores {
        if scan.loads.iter().any(|(lb, li)| lb == sb && li != si) {
            return None;
        }
    }
    Some(VecPlan { reductions: scan.reductions, size: weighted_size(body)? })
}

/// [`unrolled_size`] with each statement weighted by the instructions it expands to, in units
/// of a plain statement: a polynomial approximation (`exp2`, `log2`, `sin`, `erf`) is some 25
/// Cranelift instructions where an add is one to three. The unroll factor bounds the unrolled
/// body's compile time by this size: an LSTM cell (five `exp2` in 40 statements) was unrolled
/// four times as if it were 40 plain statements, 1,200 instructions of its 1,500.
fn weighted_size(body: &[Stmt]) -> Option<usize> {
    body.iter().try_fold(0usize, |total, s| match s {
        Stmt::Loop { extent, body, .. } => {
            let n = extent.as_const()?;
            unrolls_fully(n, body).then(|| total + n as usize * weighted_size(body).unwrap_or(0))
        }
        Stmt::Let { inst: Inst::Unary(op, _), .. } => Some(total + unroll_weight(*op)),
        _ => Some(total + 1),
    })
}

/// An estimate of what compiling `k` costs, in plain statements: every statement once, a
/// polynomial approximation as what it expands to (see [`weighted_size`]). Compile threads take
/// the costliest kernels first, so that no big kernel is left for the end of a batch.
pub(crate) fn compile_weight(k: &LoopKernel) -> usize {
    fn body(stmts: &[Stmt]) -> usize {
        stmts
            .iter()
            .map(|s| match s {
                Stmt::Loop { body: b, .. } => 1 + body(b),
                Stmt::Let { inst: Inst::Unary(op, _), .. } => unroll_weight(*op),
                _ => 1,
            })
            .sum()
    }
    body(&k.body)
}

/// How many plain statements a unary op's vector expansion is worth (see [`weighted_size`]).
fn unroll_weight(op: UnaryOp) -> usize {
    match op {
        UnaryOp::Exp2 | UnaryOp::Log2 | UnaryOp::Sin | UnaryOp::Erf => 8,
        UnaryOp::Neg | UnaryOp::Sqrt | UnaryOp::Recip | UnaryOp::Not | UnaryOp::Trunc => 1,
    }
}

/// What [`vector_plan`] has seen of a body so far.
struct VecScan<'k> {
    k: &'k LoopKernel,
    info: &'k KernelInfo,
    v: Var,
    /// Accumulators initialized outside the body: reduced across the vectorized variable.
    reductions: Vec<Acc>,
    /// Accumulators initialized inside the body: one per lane.
    local: Vec<Acc>,
    loads: Vec<(u32, &'k IExpr)>,
    stores: Vec<(u32, &'k IExpr)>,
}

impl<'k> VecScan<'k> {
    fn stmts(&mut self, body: &'k [Stmt]) -> Option<()> {
        let (k, info, v) = (self.k, self.info, self.v);
        let reg_ok = |r: &Reg| info.regs.get(r).is_some_and(|d| lane_dtype(*d));
        for s in body {
            match s {
                Stmt::Let { dtype, inst, .. } => {
                    if !lane_dtype(*dtype) {
                        return None;
                    }
                    match inst {
                        Inst::Load { buf, index, mask, .. } => {
                            let pd = k.params.get(*buf as usize)?.dtype;
                            // Coefficient 2 (a stride-2 window, a pooling's columns): two vector
                            // loads and a lane shuffle (`Emitter::load_now`).
                            let strides: &[i64] = if pd.size_bytes() == 4 { &[0, 1, 2] } else { &[0, 1] };
                            if pd != *dtype || pd == DType::Bool || !coeff_is(index, v, strides) {
                                return None;
                            }
                            if mask.as_ref().is_some_and(|m| m.uses(v)) {
                                return None;
                            }
                            self.loads.push((*buf, index));
                        }
                        Inst::Const(_) => {}
                        Inst::Index(e) => {
                            if !coeff_is(e, v, &[0, 1]) {
                                return None;
                            }
                        }
                        Inst::Unary(_, r) | Inst::Cast(r) => {
                            if !reg_ok(r) {
                                return None;
                            }
                        }
                        Inst::Binary(_, a, b) => {
                            if !reg_ok(a) || !reg_ok(b) {
                                return None;
                            }
                        }
                        Inst::Where(c, a, b) => {
                            if !reg_ok(c) || !reg_ok(a) || !reg_ok(b) {
                                return None;
                            }
                        }
                        Inst::ReadAcc(acc) if self.local.contains(acc) && info.accs.get(acc)?.0 == *dtype => {}
                        // Data-dependent addresses and checks stay scalar.
                        Inst::ReadAcc(_) | Inst::Gather { .. } => return None,
                    }
                }
                Stmt::Store { buf, index, value } => {
                    let pd = k.params.get(*buf as usize)?.dtype;
                    if !matches!(pd, DType::F32 | DType::I32) || info.regs.get(value) != Some(&pd) {
                        return None;
                    }
                    if !coeff_is(index, v, &[1]) {
                        return None;
                    }
                    self.stores.push((*buf, index));
                }
                Stmt::AccInit { acc, dtype, op } => {
                    // Lane-wise: a maximum, in the lanes' own type (an f32 sum accumulates in
                    // f64 in scalar code, so it stays scalar).
                    if !matches!((dtype, op), (DType::F32 | DType::I32, ReduceOp::Max) | (DType::I32, ReduceOp::Sum)) {
                        return None;
                    }
                    self.local.push(*acc);
                }
                Stmt::AccUpdate { acc, value } => {
                    let (d, _) = info.accs.get(acc)?;
                    if !matches!(d, DType::F32 | DType::I32) || info.regs.get(value) != Some(d) {
                        return None;
                    }
                    if !self.local.contains(acc) && !self.reductions.contains(acc) {
                        self.reductions.push(*acc);
                    }
                }
                Stmt::Loop { extent, body, .. } => {
                    if !extent.as_const().is_some_and(|n| unrolls_fully(n, body)) {
                        return None;
                    }
                    self.stmts(body)?;
                }
                Stmt::ScatterAdd { .. } | Stmt::Check { .. } => return None,
            }
        }
        Some(())
    }
}

/// Whether a loop of constant extent `n` over `body` is emitted as `n` straight-line copies:
/// a short loop of a small body (a pooling window, a convolution's taps), where the loop's own
/// control and a vector loop's set-up and horizontal reduce would cost more than the work.
/// Nested loops count by their unrolled size, and must unroll too.
pub(crate) fn unrolls_fully(n: i64, body: &[Stmt]) -> bool {
    /// The most iterations a loop unrolls into, and the most statements all its copies hold.
    const MAX_TRIPS: i64 = 16;
    const MAX_STMTS: usize = 64;
    (0..=MAX_TRIPS).contains(&n) && unrolled_size(body).is_some_and(|s| n as usize * s <= MAX_STMTS)
}

/// Statements in `body` once its nested loops are unrolled, or `None` when one of them is not.
fn unrolled_size(body: &[Stmt]) -> Option<usize> {
    body.iter().try_fold(0usize, |total, s| match s {
        Stmt::Loop { extent, body, .. } => {
            let n = extent.as_const()?;
            unrolls_fully(n, body).then(|| total + n as usize * unrolled_size(body).unwrap_or(0))
        }
        _ => Some(total + 1),
    })
}

/// What a tiled inner loop does with one statement of its body (see `tile_plan`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TileStep {
    /// A register that does not depend on the loop variable: computed as a scalar, per tile.
    Uniform,
    /// A contiguous load: the register is the buffer's own tile, read in place.
    Load,
    /// Computed by a tile routine into scratch tile `n`.
    Slot(usize),
    /// Computed by a tile routine straight into the tile of the store at body index `n` (later
    /// readers read it there).
    Direct(usize),
    /// A store whose value its definition already wrote (`Direct`).
    Stored,
    /// A store that copies its value's tile.
    Copy,
    /// A step with a scalar operand that a unary routine applies around its op (`Around`).
    Absorbed,
}

/// The cheap steps a unary routine applies around its op (`tile::around`), in place of the
/// statements that computed them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Around {
    /// The varying register the routine reads (the operand of the first step).
    pub(crate) src: Reg,
    /// The register the routine's result stands for (that of the last step).
    pub(crate) out: Reg,
    /// Per parameter of `tile::around` (`[a1, b1, c1, a2, a3, b3, d]`), where its value comes
    /// from.
    pub(crate) params: [AroundParam; PARAMS],
    /// The routine is `TileUnary::Exp2Recip`: this `recip` took in the `exp2` (and the addition
    /// of `d`) that fed it.
    pub(crate) exp2_recip: bool,
}

impl Around {
    /// The op code of the routine call for unary routine `op`: the routine (`Exp2Recip` where it
    /// took in an exp2) with the `AROUND` bit, and the bits that say which optional steps run.
    pub(crate) fn code(&self, op: TileUnary) -> i32 {
        let op = if self.exp2_recip { TileUnary::Exp2Recip } else { op };
        let set = |k: usize| self.params[k] != AroundParam::Neutral;
        let mut code = op as i32 | AROUND;
        if set(1) || set(3) {
            code |= AROUND_FULL;
        }
        if set(4) || set(5) {
            code |= AROUND_POST;
        }
        code
    }
}

/// The value of one parameter of `tile::around`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum AroundParam {
    /// The value that leaves the step out (`tile::NEUTRAL`).
    Neutral,
    /// A constant (already negated for a subtraction).
    Const(f32),
    /// A uniform register computed before the routine runs, negated for a subtraction.
    Reg { reg: Reg, negate: bool },
}

/// How an inner loop runs over tiles with full-width routines.
pub(crate) struct TilePlan {
    /// One step per statement of the body.
    pub(crate) steps: Vec<TileStep>,
    /// Scratch tiles needed.
    pub(crate) slots: usize,
    /// The unary steps (by body index) that apply steps around their op.
    pub(crate) around: HashMap<usize, Around>,
    /// The `where` steps (by body index) that keep their varying operand where the loop index
    /// is below a uniform bound and take a uniform value elsewhere ([`Select`]).
    pub(crate) selects: HashMap<usize, Select>,
}

/// `where(f32(index) < bound, x, other)` with `index` the loop variable plus a uniform offset
/// (coefficient 1): a causal mask. The routine `TileUnary::SelectBelow` computes it from the
/// index at the tile's first element, element by element exactly as the statements do; the
/// `index` and the comparison are absorbed into it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Select {
    /// The index expression (the loop variable's value at the tile's first element gives the
    /// first element's index).
    pub(crate) index: IExpr,
    /// The uniform f32 register the index is compared with.
    pub(crate) bound: Reg,
    /// The uniform f32 register taken where the index is not below the bound.
    pub(crate) other: Reg,
}

/// The tile routine of a unary op on a varying f32 register, if there is one.
pub(crate) fn tile_unary_op(op: UnaryOp) -> Option<TileUnary> {
    Some(match op {
        UnaryOp::Neg => TileUnary::Neg,
        UnaryOp::Sqrt => TileUnary::Sqrt,
        UnaryOp::Recip => TileUnary::Recip,
        UnaryOp::Exp2 => TileUnary::Exp2,
        UnaryOp::Log2 => TileUnary::Log2,
        _ => return None,
    })
}

/// The tile routine of a binary op on f32 registers, if there is one.
pub(crate) fn tile_binary_op(op: BinaryOp) -> Option<TileBinary> {
    Some(match op {
        BinaryOp::Add => TileBinary::Add,
        BinaryOp::Sub => TileBinary::Sub,
        BinaryOp::Mul => TileBinary::Mul,
        BinaryOp::Div => TileBinary::Div,
        BinaryOp::Max => TileBinary::Max,
        BinaryOp::Min => TileBinary::Min,
        _ => return None,
    })
}

/// Whether a statement of `body` (not of loops inside it) computes `exp2` or `log2`: what `Auto`
/// mode tiles a loop for. A cheap scan that spares the tile analysis most loops.
fn computes_exp2_or_log2(body: &[Stmt]) -> bool {
    body.iter().any(|s| matches!(s, Stmt::Let { inst: Inst::Unary(UnaryOp::Exp2 | UnaryOp::Log2, _), .. }))
}

/// Decides whether the innermost loop `body` over `v` (which `vector_plan` accepted) runs over
/// tiles. Rule: every register the body defines is f32, and is either uniform (independent of
/// `v`: constants, broadcast loads, indices of outer variables and arithmetic on them) or varying
/// with a tile routine (contiguous unmasked loads, the unary/binary ops `tile` implements, and a
/// `where` of the loop index against a uniform bound: a [`Select`]); registers from
/// outside the loop are f32; every store writes a varying register contiguously to an f32
/// buffer that nothing in the body loads and no other statement stores; at most
/// `tile::MAX_SLOTS` scratch tiles are live at once. In `Auto` mode the body must also compute
/// `exp2` or `log2` on a varying register: a loop of cheap ops is bound by memory, and the JIT's
/// in-register loop does not pay the tile's loads and stores.
pub(crate) fn tile_plan(k: &LoopKernel, info: &KernelInfo, v: Var, body: &[Stmt], mode: TileMode) -> Option<TilePlan> {
    tile_plan_with(k, info, v, body, mode, &[], true)
}

/// [`tile_plan`], with the loads at statement indices `per_row` (which do not read `v`) taken as
/// varying: a rows plan fills a scratch tile with each row's value for them. `selects`: whether
/// a masked `where` of the loop index may be a step ([`Select`]; not in a rows plan, whose tile
/// spans several rows of the inner index).
fn tile_plan_with(
    k: &LoopKernel,
    info: &KernelInfo,
    v: Var,
    body: &[Stmt],
    mode: TileMode,
    per_row: &[usize],
    select_ok: bool,
) -> Option<TilePlan> {
    if mode == TileMode::Off || (mode == TileMode::Auto && !computes_exp2_or_log2(body)) {
        return None;
    }
    let f32_buf = |b: u32| k.params.get(b as usize).is_some_and(|p| p.dtype == DType::F32);
    let mut varying: HashMap<Reg, usize> = HashMap::with_capacity_and_hasher(body.len(), Default::default());
    let mut defined: HashMap<Reg, usize> = HashMap::with_capacity_and_hasher(body.len(), Default::default());
    let mut steps = Vec::with_capacity(body.len());
    let mut loaded = Vec::new();
    let mut stored = Vec::new();
    let mut heavy = false;
    // A select's index (register -> expression) and comparison (register -> index expression
    // and bound): read by nothing but the comparison and the `where` respectively.
    let mut indices: HashMap<Reg, IExpr> = HashMap::default();
    let mut compares: HashMap<Reg, (IExpr, Reg)> = HashMap::default();
    let mut selects: HashMap<usize, Select> = HashMap::default();
    let is_varying = |varying: &HashMap<Reg, usize>, r: &Reg| varying.contains_key(r);
    for (i, s) in body.iter().enumerate() {
        let operand = |r: &Reg| -> Option<()> { (info.regs.get(r) == Some(&DType::F32)).then_some(()) };
        // An absorbed index or comparison read anywhere but in its pattern: no plan.
        match s {
            Stmt::Let { dtype: DType::Bool, inst: Inst::Binary(BinaryOp::CmpLt, a, b), .. }
                if indices.contains_key(a) && !indices.contains_key(b) && !compares.contains_key(b) => {}
            Stmt::Let { inst: Inst::Where(c, a, b), .. }
                if compares.contains_key(c)
                    && ![a, b].iter().any(|r| indices.contains_key(r) || compares.contains_key(r)) => {}
            _ => {
                if stmt_reads(s).iter().any(|r| indices.contains_key(r) || compares.contains_key(r)) {
                    return None;
                }
            }
        }
        match s {
            Stmt::Let { reg, dtype: DType::F32, inst: Inst::Index(e) } if select_ok && e.uses(v) => {
                if !coeff_is(e, v, &[1]) {
                    return None;
                }
                indices.insert(*reg, e.clone());
                steps.push(TileStep::Absorbed);
                continue;
            }
            Stmt::Let { reg, dtype: DType::Bool, inst: Inst::Binary(BinaryOp::CmpLt, a, b) } => {
                // Only `index < uniform bound`.
                let index = indices.get(a)?.clone();
                operand(b)?;
                if is_varying(&varying, b) {
                    return None;
                }
                compares.insert(*reg, (index, *b));
                steps.push(TileStep::Absorbed);
                continue;
            }
            Stmt::Let { reg, dtype: DType::F32, inst: Inst::Where(c, a, b) } => {
                let (index, bound) = compares.get(c)?.clone();
                operand(a)?;
                operand(b)?;
                if !is_varying(&varying, a) || is_varying(&varying, b) {
                    return None;
                }
                selects.insert(i, Select { index, bound, other: *b });
                defined.insert(*reg, i);
                varying.insert(*reg, i);
                steps.push(TileStep::Slot(0));
                continue;
            }
            _ => {}
        }
        match s {
            Stmt::Let { reg, dtype: DType::F32, inst } => {
                defined.insert(*reg, i);
                let step = match inst {
                    Inst::Load { buf, index, mask: None, .. } => {
                        if !f32_buf(*buf) {
                            return None;
                        }
                        loaded.push(*buf);
                        if per_row.contains(&i) {
                            TileStep::Load
                        } else if index.uses(v) {
                            if !coeff_is(index, v, &[1]) {
                                return None;
                            }
                            TileStep::Load
                        } else {
                            TileStep::Uniform
                        }
                    }
                    Inst::Const(_) => TileStep::Uniform,
                    Inst::Index(e) if !e.uses(v) => TileStep::Uniform,
                    Inst::Unary(op, r) => {
                        operand(r)?;
                        if is_varying(&varying, r) {
                            tile_unary_op(*op)?;
                            heavy |= matches!(op, UnaryOp::Exp2 | UnaryOp::Log2);
                            TileStep::Slot(0)
                        } else {
                            TileStep::Uniform
                        }
                    }
                    Inst::Binary(op, a, b) => {
                        operand(a)?;
                        operand(b)?;
                        if is_varying(&varying, a) || is_varying(&varying, b) {
                            tile_binary_op(*op)?;
                            TileStep::Slot(0)
                        } else {
                            TileStep::Uniform
                        }
                    }
                    _ => return None,
                };
                if step != TileStep::Uniform {
                    varying.insert(*reg, i);
                }
                steps.push(step);
            }
            Stmt::Store { buf, index, value } => {
                if !f32_buf(*buf) || stored.contains(buf) || !coeff_is(index, v, &[1]) {
                    return None;
                }
                operand(value)?;
                if !is_varying(&varying, value) {
                    return None;
                }
                stored.push(*buf);
                steps.push(TileStep::Copy);
            }
            _ => return None,
        }
    }
    if stored.iter().any(|b| loaded.contains(b)) || (mode == TileMode::Auto && !heavy) {
        return None;
    }
    let around = fold_around(body, &mut steps, &varying, &mut defined);
    // What each statement reads and defines once the folded steps are gone.
    let effect = |i: usize| -> (Option<Reg>, Vec<Reg>) {
        if steps[i] == TileStep::Absorbed {
            return (None, vec![]);
        }
        match &body[i] {
            Stmt::Let { reg, inst: Inst::Unary(_, r), .. } => match around.get(&i) {
                Some(a) => (Some(a.out), vec![a.src]),
                None => (Some(*reg), vec![*r]),
            },
            Stmt::Let { reg, inst: Inst::Binary(_, a, b), .. } => (Some(*reg), vec![*a, *b]),
            // A select reads its varying operand's tile; the bound and the other value are
            // scalars.
            Stmt::Let { reg, inst: Inst::Where(_, a, _), .. } => (Some(*reg), vec![*a]),
            Stmt::Let { reg, .. } => (Some(*reg), vec![]),
            Stmt::Store { value, .. } => (None, vec![*value]),
            _ => (None, vec![]),
        }
    };
    let effects: Vec<(Option<Reg>, Vec<Reg>)> = (0..body.len()).map(effect).collect();
    let mut last_use: HashMap<Reg, usize> = HashMap::default();
    for (i, (_, operands)) in effects.iter().enumerate() {
        for r in operands {
            last_use.insert(*r, i);
        }
    }
    // Computed registers that are stored are written straight into the store's tile.
    for (j, s) in body.iter().enumerate() {
        if let Stmt::Store { value, .. } = s
            && let Some(&i) = defined.get(value)
            && steps[i] == TileStep::Slot(0)
        {
            steps[i] = TileStep::Direct(j);
            steps[j] = TileStep::Stored;
        }
    }
    // Scratch tiles by liveness; an operand's tile that dies here may be the result's (the
    // routines read each element before writing it).
    let mut free: Vec<usize> = Vec::new();
    let mut slots = 0;
    let mut holder: HashMap<Reg, usize> = HashMap::default();
    for (i, (def, operands)) in effects.iter().enumerate() {
        for r in operands {
            if last_use.get(r) == Some(&i)
                && let Some(slot) = holder.remove(r)
            {
                free.push(slot);
            }
        }
        if let (Some(reg), TileStep::Slot(_)) = (def, steps[i]) {
            free.sort_unstable_by(|a, b| b.cmp(a));
            let slot = free.pop().unwrap_or_else(|| {
                slots += 1;
                slots - 1
            });
            steps[i] = TileStep::Slot(slot);
            if last_use.get(reg).is_some_and(|&u| u > i) {
                holder.insert(*reg, slot);
            } else {
                free.push(slot);
            }
        }
    }
    if slots > MAX_SLOTS {
        return None;
    }
    Some(TilePlan { steps, slots, around, selects })
}

/// The registers statement `s` reads (of the statements a tiled body may hold).
fn stmt_reads(s: &Stmt) -> SmallVec<[Reg; 3]> {
    match s {
        Stmt::Let { inst, .. } => inst.operands(),
        Stmt::Store { value, .. } => smallvec![*value],
        _ => SmallVec::new(),
    }
}

/// Folds into each unary routine the steps with one uniform operand that only feed it (up to a
/// multiplication, a `min` with a constant, an addition and a multiplication, in that order)
/// and those that only read its result (a multiplication, then an addition), where `around`
/// computes them exactly as the statements do: each rounded on its own, a subtraction of `s` as
/// the addition of `-s` (the same IEEE operation), and `min` only with a constant that is
/// neither zero nor NaN. Marks the folded statements `Absorbed` and moves the definition of a
/// routine's result to the routine (`defined`).
fn fold_around(
    body: &[Stmt],
    steps: &mut [TileStep],
    varying: &HashMap<Reg, usize>,
    defined: &mut HashMap<Reg, usize>,
) -> HashMap<usize, Around> {
    // Uses per register, and the last statement that reads it.
    let mut uses: HashMap<Reg, (usize, usize)> = HashMap::default();
    let mut consts: HashMap<Reg, f64> = HashMap::default();
    for (i, s) in body.iter().enumerate() {
        for r in &stmt_reads(s) {
            let u = uses.entry(*r).or_insert((0, i));
            *u = (u.0 + 1, i);
        }
        if let Stmt::Let { reg, inst: Inst::Const(Scalar::Float(v)), .. } = s {
            consts.insert(*reg, *v);
        }
    }
    let only_use = |r: &Reg| uses.get(r).and_then(|&(n, i)| (n == 1).then_some(i));
    // The varying and the uniform operand of a computed binary statement, and whether the varying
    // one comes first.
    let split = |s: &Stmt| -> Option<(BinaryOp, Reg, Reg, bool)> {
        let Stmt::Let { inst: Inst::Binary(op, a, b), .. } = s else { return None };
        match (varying.contains_key(a), varying.contains_key(b)) {
            (true, false) => Some((*op, *a, *b, true)),
            (false, true) => Some((*op, *b, *a, false)),
            _ => None,
        }
    };
    let foldable_min = |r: &Reg| consts.get(r).is_some_and(|&c| (c as f32) != 0.0 && !c.is_nan());
    let mut out = HashMap::default();
    for i in 0..body.len() {
        let Stmt::Let { reg, inst: Inst::Unary(op, first), .. } = &body[i] else { continue };
        if steps[i] != TileStep::Slot(0) || tile_unary_op(*op).is_none() {
            continue;
        }
        let mut params = [AroundParam::Neutral; PARAMS];
        let param = |s: Reg, negate: bool| match consts.get(&s) {
            Some(&c) if negate => AroundParam::Const(-(c as f32)),
            Some(&c) => AroundParam::Const(c as f32),
            None => AroundParam::Reg { reg: s, negate },
        };
        // Backwards from the routine's operand: positions a2 (3), c1 (2), b1 (1), a1 (0).
        let mut src = *first;
        let mut next = 4;
        while let Some(&j) = defined.get(&src)
            && steps[j] == TileStep::Slot(0)
            && only_use(&src).is_some()
            && let Some((bop, x, s, x_first)) = split(&body[j])
        {
            let (at, neg) = match bop {
                BinaryOp::Mul if next > 3 => (3, false),
                BinaryOp::Mul if next > 0 => (0, false),
                BinaryOp::Min if next > 2 && foldable_min(&s) => (2, false),
                BinaryOp::Add if next > 1 => (1, false),
                BinaryOp::Sub if next > 1 && x_first => (1, true),
                _ => break,
            };
            params[at] = param(s, neg);
            next = at;
            steps[j] = TileStep::Absorbed;
            src = x;
        }
        // A multiplication alone before the op is `a1`, which needs no `FULL` shape (`x * 1 + -0`
        // then `min(_, inf)` leave `x` as it is, so `a1` and `a2` give the same value).
        if params[..3].iter().all(|p| *p == AroundParam::Neutral) {
            params.swap(0, 3);
        }
        // Forwards from the result: a3 (4), then b3 (5).
        let mut result = *reg;
        let mut next = 4;
        while let Some(k) = only_use(&result)
            && steps[k] == TileStep::Slot(0)
            && let Some((bop, x, s, x_first)) = split(&body[k])
            && x == result
            && (consts.contains_key(&s) || defined.get(&s).is_none_or(|&d| d < i))
            && let Stmt::Let { reg: k_reg, .. } = &body[k]
        {
            let (at, neg) = match bop {
                BinaryOp::Mul if next == 4 => (4, false),
                BinaryOp::Add => (5, false),
                BinaryOp::Sub if x_first => (5, true),
                _ => break,
            };
            params[at] = param(s, neg);
            next = at + 1;
            steps[k] = TileStep::Absorbed;
            result = *k_reg;
            if next > 5 {
                break;
            }
        }
        let neutral = |p: &[AroundParam]| p.iter().all(|p| *p == AroundParam::Neutral);
        // A recip of an exp2 plus `d`: one routine (the exp2's result, or the addition folded
        // after it, is read only here).
        let mut exp2_recip = false;
        if *op == UnaryOp::Recip
            && let Some(&j) = defined.get(&src)
            && j != i
            && steps[j] == TileStep::Slot(0)
            && only_use(&src).is_some()
            && let Stmt::Let { inst: Inst::Unary(UnaryOp::Exp2, e), .. } = &body[j]
        {
            let inner = out.get(&j).cloned().unwrap_or(Around {
                src: *e,
                out: src,
                params: [AroundParam::Neutral; PARAMS],
                exp2_recip: false,
            });
            let d = match (neutral(&inner.params[4..]), neutral(&params[..4])) {
                // The addition folded after the exp2 (`b3`; `a3` must be neutral).
                (false, true) if inner.params[4] == AroundParam::Neutral => Some(inner.params[5]),
                // Or before the recip (`b1` alone).
                (true, false) if neutral(&params[..1]) && neutral(&params[2..4]) => Some(params[1]),
                (true, true) => Some(AroundParam::Neutral),
                _ => None,
            };
            if let Some(d) = d {
                out.remove(&j);
                steps[j] = TileStep::Absorbed;
                params[..4].copy_from_slice(&inner.params[..4]);
                params[6] = d;
                src = inner.src;
                exp2_recip = true;
            }
        }
        if exp2_recip || !neutral(&params) {
            defined.insert(result, i);
            out.insert(i, Around { src, out: result, params, exp2_recip });
        }
    }
    out
}

/// How a loop over rows runs as tiles of whole rows (see [`tile_rows_plan`]).
pub(crate) struct RowsPlan {
    /// The row loop's leading constants, emitted once before the tiles.
    pub(crate) prefix: usize,
    /// The inner loop's variable and its extent (the row width).
    pub(crate) inner: Var,
    pub(crate) width: i64,
    /// The tile plan of the inner body (after the prefix, which it also covers: `steps` has one
    /// step per prefix statement and per inner statement, in that order).
    pub(crate) tiles: TilePlan,
    /// Accesses whose rows are not adjacent (a row stride other than the width), by statement
    /// index into `steps`: each is gathered into, or scattered from, a scratch tile of its own.
    pub(crate) strided: HashMap<usize, (IExpr, usize)>,
    /// Loads of one value per row (a softmax's row maximum), by statement index into `steps`,
    /// with their row stride: each fills a scratch tile of its own, every row with its value.
    pub(crate) per_row: HashMap<usize, (IExpr, usize)>,
}

/// Decides whether the loop over `outer` with `body` (constants and loads of one value per row,
/// then one inner loop of a known width `w < min_trips`) runs as tiles of `TILE / w` whole rows,
/// the tile routines seeing each tile as `rows * w` contiguous elements: an LSTM's gates (16 rows
/// of 32, five exp2s per element) and a softmax over 16 keys (`exp2(x - max)` per row) otherwise
/// stay in 128-bit JIT loops. Every load and store of the inner body must be contiguous along the
/// row (coefficient 1 for the inner variable) and linear in the row; rows that lie `w` apart are
/// read and written in place, others go through scratch tiles, copied row by row. A per-row load
/// before the inner loop must be linear in the row; it fills a scratch tile, each row of it with
/// the row's value. Nothing else in the body may depend on the row.
pub(crate) fn tile_rows_plan(
    k: &LoopKernel,
    info: &KernelInfo,
    outer: Var,
    body: &[Stmt],
    mode: TileMode,
    min_trips: i64,
) -> Option<RowsPlan> {
    let prefix = body
        .iter()
        .take_while(|s| matches!(s, Stmt::Let { inst: Inst::Const(_) | Inst::Load { mask: None, .. }, .. }))
        .count();
    let [Stmt::Loop { var: inner, extent, parallel: false, body: inner_body }] = &body[prefix..] else {
        return None;
    };
    let width = extent.as_const()?;
    if !(8..min_trips).contains(&width) || width % 4 != 0 || TILE % width != 0 {
        return None;
    }
    // Turned down before the body is copied and its accesses analysed, as `tile_plan_with`
    // would turn it down (the prefix computes nothing): most loops over short rows (a
    // convolution's taps, a pool's window) compute neither.
    if mode == TileMode::Auto && !computes_exp2_or_log2(inner_body) {
        return None;
    }
    let mut flat: Vec<Stmt> = body[..prefix].to_vec();
    flat.extend(inner_body.iter().cloned());
    // Each access's row stride (its coefficient for `outer`), which must be a constant or an
    // expression free of both loop variables; an access that does not move along the row may
    // not move with it either.
    let mut strided = HashMap::with_capacity_and_hasher(flat.len(), Default::default());
    let mut per_row = HashMap::with_capacity_and_hasher(flat.len(), Default::default());
    for (i, s) in flat.iter().enumerate() {
        let index = match s {
            Stmt::Let { inst: Inst::Load { index, .. }, .. } | Stmt::Store { index, .. } => index,
            Stmt::Let { inst: Inst::Const(_) | Inst::Unary(..) | Inst::Binary(..), .. } => continue,
            _ => return None,
        };
        if !index.uses(*inner) {
            if index.uses(outer) {
                // One value per row: only a load before the inner loop, linear in the row.
                let stride = index.linear_coeff(outer).filter(|_| i < prefix)?;
                if stride.uses(outer) || stride.uses(*inner) {
                    return None;
                }
                per_row.insert(i, (stride, 0));
            }
            continue;
        }
        let stride = index.linear_coeff(outer)?;
        if stride.uses(outer) || stride.uses(*inner) {
            return None;
        }
        if stride.as_const() != Some(width) {
            strided.insert(i, (stride, 0));
        }
    }
    let row_loads: Vec<usize> = per_row.keys().copied().collect();
    let mut tiles = tile_plan_with(k, info, *inner, &flat, mode, &row_loads, false)?;
    // A strided store gets its value from a scratch tile, never written in place.
    for (j, s) in flat.iter().enumerate() {
        if let (Stmt::Store { .. }, TileStep::Stored) = (s, tiles.steps[j])
            && strided.contains_key(&j)
        {
            let i = tiles.steps.iter().position(|st| *st == TileStep::Direct(j))?;
            tiles.steps[i] = TileStep::Slot(tiles.slots);
            tiles.slots += 1;
            tiles.steps[j] = TileStep::Copy;
        }
    }
    for (i, (_, slot)) in strided.iter_mut() {
        if matches!(flat[*i], Stmt::Let { .. }) {
            *slot = tiles.slots;
            tiles.slots += 1;
        }
    }
    for (_, slot) in per_row.values_mut() {
        *slot = tiles.slots;
        tiles.slots += 1;
    }
    (tiles.slots <= MAX_SLOTS).then_some(RowsPlan { prefix, inner: *inner, width, tiles, strided, per_row })
}
