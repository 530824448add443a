//! Stencils over rows at the machine's full vector width: a depthwise convolution's taps (a sum
//! of shifted rows, each times a per-channel weight) and a pooling window's maximum, recognized in
//! a kernel's loop nest ([`stencil_plan`]) and run by one ahead-of-time compiled routine per
//! plane of rows ([`stencil_avx512`], [`stencil_base`]).
//!
//! Why: the JIT's vectors are 128 bits (see `tile`), and a stencil is all loads, multiplies, adds
//! and maxima on registers, so the element-wise tile routines (a pass over L1 per op) gain nothing
//! over it. A routine that holds the whole row computation in 512-bit registers does: the taps of
//! 16 outputs are 9 loads, 9 multiplies and 9 adds. The routine repeats the loop body's
//! operations in its order (a multiply and an add rounded on their own, never fused; the sum
//! folded from the first tap), so results are the JIT's bit for bit, NaN aside (any NaN for a NaN).
//!
//! The pattern, inside a loop over rows `r` (any extent) whose body is one loop over columns `c`
//! of a constant width (see [`stencil_plan`] for the exact conditions):
//! - taps: unmasked f32 loads of one buffer at `base + offset_t + r * row + c * s` (`s` 1 or 2,
//!   `offset_t` constant, nested constant loops unrolled into taps);
//! - `Sum`: `(((x_0 * w_0 + x_1 * w_1) + ...) * s) + b` (`s` and `b` optional: an eval-mode
//!   BatchNorm after the convolution), the weights, `s` and `b` uniform (registers defined
//!   outside the row loop, or constants); `Max`: the maximum over the taps of `x_t + b` (an
//!   accumulator);
//! - optionally `max(value, p)` for a uniform `p` (a ReLU);
//! - one contiguous f32 store at `base' + r * row' + c` into another buffer.

use std::rc::Rc;

use rustc_hash::FxHashMap as HashMap;

use air::{BinaryOp, DType, ReduceOp, Scalar};
use lower::kir::{Acc, IExpr, Inst, Reg, Stmt, Var};

use super::tile::fmax;

/// The most taps a stencil routine takes (a 5x5 window has 25).
pub(crate) const MAX_TAPS: usize = 32;

/// The fewest taps worth a routine call (a 2x2 pooling window).
const MIN_TAPS: usize = 4;

/// Flag: the stencil is a maximum over its taps (else a weighted sum).
pub(crate) const FLAG_MAX: i64 = 1;
/// Flag: `bias` is added (after the sum, or to each tap before the maximum).
pub(crate) const FLAG_BIAS: i64 = 2;
/// Flag: the result is `max(value, post)`.
pub(crate) const FLAG_POST: i64 = 4;
/// Flag: a sum is multiplied by `scale` before the bias (a BatchNorm in eval mode).
pub(crate) const FLAG_SCALE: i64 = 8;

/// What a stencil routine reads: the generated code fills one on its stack per call.
#[repr(C)]
pub(crate) struct StencilArgs {
    pub(crate) dst: *mut f32,
    pub(crate) src: *const f32,
    /// Elements between output rows and between input rows.
    pub(crate) dst_row: i64,
    pub(crate) src_row: i64,
    pub(crate) rows: i64,
    /// Outputs per row.
    pub(crate) width: i64,
    /// Input elements between neighbouring outputs' taps (1 or 2).
    pub(crate) stride: i64,
    pub(crate) taps: i64,
    /// [`FLAG_MAX`], [`FLAG_BIAS`], [`FLAG_POST`].
    pub(crate) flags: i64,
    /// Planes (each `rows` rows), and the elements between planes of the output and the input.
    pub(crate) planes: i64,
    pub(crate) dst_plane: i64,
    pub(crate) src_plane: i64,
    /// The bias, or when `bias_at` is not null, plane `p`'s bias at `bias_at[p * bias_plane]`.
    pub(crate) bias: f32,
    pub(crate) bias_at: *const f32,
    pub(crate) bias_plane: i64,
    /// The scale, or when `scale_at` is not null, plane `p`'s at `scale_at[p * scale_plane]`.
    pub(crate) scale: f32,
    pub(crate) scale_at: *const f32,
    pub(crate) scale_plane: i64,
    pub(crate) post: f32,
    /// Each tap's element offset from `src`.
    pub(crate) offsets: [i64; MAX_TAPS],
    /// Each tap's weight (a sum only), or when `weights_at` is not null, plane `p`'s weight of
    /// tap `t` at `weights_at[p * weights_plane + weight_offsets[t]]`.
    pub(crate) weights: [f32; MAX_TAPS],
    pub(crate) weights_at: *const f32,
    pub(crate) weights_plane: i64,
    pub(crate) weight_offsets: [i64; MAX_TAPS],
}

impl StencilArgs {
    /// Plane `p`'s scale, bias and weights (`weights[..taps]` filled).
    fn plane(&self, p: i64, weights: &mut [f32; MAX_TAPS]) -> (f32, f32) {
        let taps = (self.taps as usize).min(MAX_TAPS);
        if self.weights_at.is_null() {
            weights[..taps].copy_from_slice(&self.weights[..taps]);
        } else {
            for (w, &off) in weights.iter_mut().zip(&self.weight_offsets).take(taps) {
                // SAFETY: the kernel reads these weights (the caller's contract of the routines).
                *w = unsafe { *self.weights_at.wrapping_offset((p * self.weights_plane + off) as isize) };
            }
        }
        let value = |v: f32, at: *const f32, plane: i64| {
            if at.is_null() {
                v
            } else {
                // SAFETY: as above.
                unsafe { *at.wrapping_offset((p * plane) as isize) }
            }
        };
        (value(self.scale, self.scale_at, self.scale_plane), value(self.bias, self.bias_at, self.bias_plane))
    }
}

/// Byte offsets of [`StencilArgs`]' fields, for the code generator's stores.
pub(crate) mod at {
    use std::mem::offset_of;

    use super::StencilArgs;

    pub(crate) const DST: i32 = offset_of!(StencilArgs, dst) as i32;
    pub(crate) const SRC: i32 = offset_of!(StencilArgs, src) as i32;
    pub(crate) const DST_ROW: i32 = offset_of!(StencilArgs, dst_row) as i32;
    pub(crate) const SRC_ROW: i32 = offset_of!(StencilArgs, src_row) as i32;
    pub(crate) const ROWS: i32 = offset_of!(StencilArgs, rows) as i32;
    pub(crate) const WIDTH: i32 = offset_of!(StencilArgs, width) as i32;
    pub(crate) const STRIDE: i32 = offset_of!(StencilArgs, stride) as i32;
    pub(crate) const TAPS: i32 = offset_of!(StencilArgs, taps) as i32;
    pub(crate) const FLAGS: i32 = offset_of!(StencilArgs, flags) as i32;
    pub(crate) const PLANES: i32 = offset_of!(StencilArgs, planes) as i32;
    pub(crate) const DST_PLANE: i32 = offset_of!(StencilArgs, dst_plane) as i32;
    pub(crate) const SRC_PLANE: i32 = offset_of!(StencilArgs, src_plane) as i32;
    pub(crate) const BIAS: i32 = offset_of!(StencilArgs, bias) as i32;
    pub(crate) const BIAS_AT: i32 = offset_of!(StencilArgs, bias_at) as i32;
    pub(crate) const BIAS_PLANE: i32 = offset_of!(StencilArgs, bias_plane) as i32;
    pub(crate) const SCALE: i32 = offset_of!(StencilArgs, scale) as i32;
    pub(crate) const SCALE_AT: i32 = offset_of!(StencilArgs, scale_at) as i32;
    pub(crate) const SCALE_PLANE: i32 = offset_of!(StencilArgs, scale_plane) as i32;
    pub(crate) const POST: i32 = offset_of!(StencilArgs, post) as i32;
    pub(crate) const OFFSETS: i32 = offset_of!(StencilArgs, offsets) as i32;
    pub(crate) const WEIGHTS: i32 = offset_of!(StencilArgs, weights) as i32;
    pub(crate) const WEIGHTS_AT: i32 = offset_of!(StencilArgs, weights_at) as i32;
    pub(crate) const WEIGHTS_PLANE: i32 = offset_of!(StencilArgs, weights_plane) as i32;
    pub(crate) const WEIGHT_OFFSETS: i32 = offset_of!(StencilArgs, weight_offsets) as i32;
    pub(crate) const SIZE: u32 = size_of::<StencilArgs>() as u32;
}

/// A uniform operand: a register defined outside the row loop, or a constant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Operand {
    Reg(Reg),
    Const(f32),
}

/// One value per plane: uniform, or loaded at `buf[base + p * plane]` for plane `p`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PerPlane {
    Value(Operand),
    Loaded { buf: u32, base: IExpr, plane: IExpr },
}

/// The weights of a sum's taps.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Weights {
    /// A maximum has none.
    None,
    /// Uniform, one per tap.
    Values(Vec<Operand>),
    /// Plane `p`'s weight of tap `t` at `buf[base + p * plane + offsets[t]]` (a depthwise
    /// convolution's filter of channel `p`).
    Loaded { buf: u32, base: IExpr, plane: IExpr, offsets: Vec<i64> },
}

/// A loop nest that runs as one stencil routine call (see the module docs): `planes` planes of
/// `rows` rows of `width` outputs.
#[derive(Debug)]
pub(crate) struct StencilPlan {
    pub(crate) max: bool,
    pub(crate) src_buf: u32,
    /// The taps' common element index at the first output, without its constant term.
    pub(crate) src_base: IExpr,
    pub(crate) src_row: IExpr,
    pub(crate) src_plane: IExpr,
    pub(crate) stride: i64,
    /// Each tap's constant offset from `src_base`.
    pub(crate) offsets: Vec<i64>,
    pub(crate) weights: Weights,
    pub(crate) scale: Option<PerPlane>,
    pub(crate) bias: Option<PerPlane>,
    pub(crate) post: Option<Operand>,
    pub(crate) dst_buf: u32,
    pub(crate) dst_base: IExpr,
    pub(crate) dst_row: IExpr,
    pub(crate) dst_plane: IExpr,
    pub(crate) width: i64,
    pub(crate) rows: IExpr,
    pub(crate) planes: IExpr,
}

impl StencilPlan {
    /// The routine's [`StencilArgs::flags`].
    pub(crate) fn flags(&self) -> i64 {
        (if self.max { FLAG_MAX } else { 0 })
            | if self.bias.is_some() { FLAG_BIAS } else { 0 }
            | if self.post.is_some() { FLAG_POST } else { 0 }
            | if self.scale.is_some() { FLAG_SCALE } else { 0 }
    }

    /// The arguments of one call, as the code generator's stores fill them (`emit/stencil.rs`):
    /// `value` evaluates an index expression, `addr` gives the address of element `e` of
    /// parameter `buf`, `operand` a uniform operand's value. What the flags leave unread is zero.
    pub(crate) fn args(
        &self,
        value: &dyn Fn(&IExpr) -> i64,
        addr: &dyn Fn(u32, &IExpr) -> *mut f32,
        operand: &dyn Fn(Operand) -> f32,
    ) -> StencilArgs {
        let mut a = StencilArgs {
            dst: addr(self.dst_buf, &self.dst_base),
            src: addr(self.src_buf, &self.src_base),
            dst_row: value(&self.dst_row),
            src_row: value(&self.src_row),
            rows: value(&self.rows),
            width: self.width,
            stride: self.stride,
            taps: self.offsets.len() as i64,
            flags: self.flags(),
            planes: value(&self.planes),
            dst_plane: value(&self.dst_plane),
            src_plane: value(&self.src_plane),
            bias: 0.0,
            bias_at: std::ptr::null(),
            bias_plane: 0,
            scale: 0.0,
            scale_at: std::ptr::null(),
            scale_plane: 0,
            post: self.post.map_or(0.0, operand),
            offsets: [0; MAX_TAPS],
            weights: [0.0; MAX_TAPS],
            weights_at: std::ptr::null(),
            weights_plane: 0,
            weight_offsets: [0; MAX_TAPS],
        };
        a.offsets[..self.offsets.len()].copy_from_slice(&self.offsets);
        for (per_plane, (v, at, plane)) in [
            (&self.bias, (&mut a.bias, &mut a.bias_at, &mut a.bias_plane)),
            (&self.scale, (&mut a.scale, &mut a.scale_at, &mut a.scale_plane)),
        ] {
            match per_plane {
                Some(PerPlane::Value(o)) => *v = operand(*o),
                Some(PerPlane::Loaded { buf, base, plane: p }) => (*at, *plane) = (addr(*buf, base), value(p)),
                None => {}
            }
        }
        match &self.weights {
            Weights::None => {}
            Weights::Values(ws) => {
                for (w, &o) in a.weights.iter_mut().zip(ws) {
                    *w = operand(o);
                }
            }
            Weights::Loaded { buf, base, plane, offsets } => {
                (a.weights_at, a.weights_plane) = (addr(*buf, base), value(plane));
                a.weight_offsets[..offsets.len()].copy_from_slice(offsets);
            }
        }
        a
    }

    /// Every index expression the plan holds (for the loop variables they may read).
    pub(crate) fn exprs(&self) -> Vec<&IExpr> {
        let mut out = vec![
            &self.src_base,
            &self.src_row,
            &self.src_plane,
            &self.dst_base,
            &self.dst_row,
            &self.dst_plane,
            &self.rows,
            &self.planes,
        ];
        for per_plane in [&self.bias, &self.scale] {
            if let Some(PerPlane::Loaded { base, plane, .. }) = per_plane {
                out.extend([base, plane]);
            }
        }
        if let Weights::Loaded { base, plane, .. } = &self.weights {
            out.extend([base, plane]);
        }
        out
    }

    /// Every uniform operand the plan reads.
    pub(crate) fn operands(&self) -> Vec<Operand> {
        let mut out: Vec<Operand> = self.post.into_iter().collect();
        for per_plane in [&self.bias, &self.scale] {
            if let Some(PerPlane::Value(o)) = per_plane {
                out.push(*o);
            }
        }
        if let Weights::Values(ws) = &self.weights {
            out.extend(ws.iter().copied());
        }
        out
    }
}

/// The value of a register inside the column loop, as far as the pattern needs it (shared, not
/// copied, by the registers that read it: a sum of nine taps is a chain of nine adds).
#[derive(Clone, Debug)]
enum Val {
    Tap(usize),
    Uniform(Operand),
    Bin(BinaryOp, Rc<Val>, Rc<Val>),
    MaxOf(Vec<Rc<Val>>),
}

/// One load of the column body, before it is checked against the others.
struct Load<'k> {
    buf: u32,
    index: &'k IExpr,
    /// The values of the unrolled loop variables at this copy of the load.
    unrolled: Vec<(Var, i64)>,
}

/// Symbolic execution of the column body, nested constant loops unrolled.
struct Walk<'k> {
    regs: HashMap<Reg, Rc<Val>>,
    accs: HashMap<Acc, Vec<Rc<Val>>>,
    loads: Vec<Load<'k>>,
    unrolled: Vec<(Var, i64)>,
    store: Option<(u32, &'k IExpr, Rc<Val>)>,
}

impl<'k> Walk<'k> {
    fn val(&self, r: Reg) -> Rc<Val> {
        self.regs.get(&r).cloned().unwrap_or_else(|| Rc::new(Val::Uniform(Operand::Reg(r))))
    }

    fn stmts(&mut self, body: &'k [Stmt]) -> Option<()> {
        for s in body {
            if self.store.is_some() {
                return None;
            }
            match s {
                Stmt::Let { reg, dtype: DType::F32, inst } => {
                    let v = match inst {
                        Inst::Load { buf, index, mask: None, .. } => {
                            self.loads.push(Load { buf: *buf, index, unrolled: self.unrolled.clone() });
                            if self.loads.len() > MAX_TAPS {
                                return None;
                            }
                            Val::Tap(self.loads.len() - 1)
                        }
                        Inst::Const(Scalar::Float(x)) => Val::Uniform(Operand::Const(*x as f32)),
                        Inst::Binary(op @ (BinaryOp::Add | BinaryOp::Mul | BinaryOp::Max), a, b) => {
                            Val::Bin(*op, self.val(*a), self.val(*b))
                        }
                        Inst::ReadAcc(a) => Val::MaxOf(self.accs.get(a)?.clone()),
                        _ => return None,
                    };
                    self.regs.insert(*reg, Rc::new(v));
                }
                Stmt::AccInit { acc, dtype: DType::F32, op: ReduceOp::Max } => {
                    self.accs.insert(*acc, Vec::new());
                }
                Stmt::AccUpdate { acc, value } => {
                    let v = self.val(*value);
                    self.accs.get_mut(acc)?.push(v);
                }
                Stmt::Loop { var, extent, parallel: false, body } => {
                    let n = extent.as_const()?;
                    if !(1..=MAX_TAPS as i64).contains(&n) {
                        return None;
                    }
                    for j in 0..n {
                        self.unrolled.push((*var, j));
                        self.stmts(body)?;
                        self.unrolled.pop();
                    }
                }
                Stmt::Store { buf, index, value } => self.store = Some((*buf, index, self.val(*value))),
                _ => return None,
            }
        }
        Some(())
    }
}

/// `e` with the variables `vars` set to 0 (constants folded).
fn zeroed(e: &IExpr, vars: &[Var]) -> IExpr {
    match e {
        IExpr::Var(v) if vars.contains(v) => IExpr::Const(0),
        IExpr::Const(_) | IExpr::Var(_) | IExpr::Sym(_) => e.clone(),
        IExpr::Add(a, b) => IExpr::add(zeroed(a, vars), zeroed(b, vars)),
        IExpr::Mul(a, b) => IExpr::mul(zeroed(a, vars), zeroed(b, vars)),
        IExpr::Div(a, b) => IExpr::div(zeroed(a, vars), zeroed(b, vars)),
        IExpr::Mod(a, b) => IExpr::rem(zeroed(a, vars), zeroed(b, vars)),
        IExpr::Lt(a, b) => IExpr::lt(zeroed(a, vars), zeroed(b, vars)),
        IExpr::And(a, b) => IExpr::and(zeroed(a, vars), zeroed(b, vars)),
    }
}

/// `e` split into its terms without constants (the constant addends of its top-level sum
/// removed) and the sum of those constants.
fn split_const(e: &IExpr) -> (IExpr, i64) {
    match e {
        IExpr::Const(c) => (IExpr::Const(0), *c),
        IExpr::Add(a, b) => {
            let ((a, x), (b, y)) = (split_const(a), split_const(b));
            (IExpr::add(a, b), x.wrapping_add(y))
        }
        _ => (e.clone(), 0),
    }
}

/// The constant coefficient of `v` in `e`, when `e` is linear in `v` with one.
fn const_coeff(e: &IExpr, v: Var) -> Option<i64> {
    e.linear_coeff(v)?.as_const()
}

/// The coefficient of the row variable in `e`: linear, free of every loop variable of the
/// pattern (it is evaluated once per call).
fn row_coeff(e: &IExpr, row: Var, col: Var, unrolled: &[Var]) -> Option<IExpr> {
    let c = e.linear_coeff(row)?;
    (!c.uses(row) && !c.uses(col) && !unrolled.iter().any(|&v| c.uses(v))).then_some(c)
}

/// A uniform value, or `None` for anything computed in the loop.
fn uniform(v: &Val) -> Option<Operand> {
    match v {
        Val::Uniform(o) => Some(*o),
        _ => None,
    }
}

/// `x_t * w` (either order) as `(t, w)`.
fn product(v: &Val) -> Option<(usize, Operand)> {
    let Val::Bin(BinaryOp::Mul, a, b) = v else { return None };
    match (&**a, &**b) {
        (Val::Tap(t), w) | (w, Val::Tap(t)) => Some((*t, uniform(w)?)),
        _ => None,
    }
}

/// The products of a sum folded from its first term, in order.
fn folded_sum(v: &Val, out: &mut Vec<(usize, Operand)>) -> Option<()> {
    if let Some(p) = product(v) {
        out.push(p);
        return Some(());
    }
    let Val::Bin(BinaryOp::Add, a, b) = v else { return None };
    // `running + product`, in either order (an add of two values is the same either way).
    let (running, term) = match (product(b), product(a)) {
        (Some(p), _) => (a, p),
        (None, Some(p)) => (b, p),
        (None, None) => return None,
    };
    folded_sum(running, out)?;
    out.push(term);
    Some(())
}

/// `x_t + b` (either order) or `x_t` as `(t, b)`.
fn biased_tap(v: &Val) -> Option<(usize, Option<Operand>)> {
    match v {
        Val::Tap(t) => Some((*t, None)),
        Val::Bin(BinaryOp::Add, a, b) => match (&**a, &**b) {
            (Val::Tap(t), u) | (u, Val::Tap(t)) => Some((*t, Some(uniform(u)?))),
            _ => None,
        },
        _ => None,
    }
}

/// Decides whether the loop over `row` with `body` is a stencil the routines run (see the module
/// docs): `body` is one loop over `col` of a constant width, whose body (nested constant loops
/// unrolled, at most [`MAX_TAPS`] loads) computes one of the two shapes from unmasked f32 loads
/// of one buffer and stores it, contiguous along `col`, into another.
pub(crate) fn stencil_plan(row: Var, rows: &IExpr, body: &[Stmt]) -> Option<StencilPlan> {
    let [Stmt::Loop { var: col, extent, parallel: false, body: col_body }] = body else {
        return None;
    };
    let width = extent.as_const().filter(|&w| w >= 4)?;
    let mut walk = Walk {
        regs: HashMap::default(),
        accs: HashMap::default(),
        loads: Vec::new(),
        unrolled: Vec::new(),
        store: None,
    };
    walk.stmts(col_body)?;
    let (dst_buf, dst_index, value) = walk.store.take()?;

    // The shape of the stored value.
    let (value, post) = match &*value {
        Val::Bin(BinaryOp::Max, a, b) => match (uniform(b), uniform(a)) {
            (Some(p), _) => (a.clone(), Some(p)),
            (None, Some(p)) => (b.clone(), Some(p)),
            (None, None) => (value.clone(), None),
        },
        _ => (value.clone(), None),
    };
    let (max, order, weights, scale, bias) = match &*value {
        Val::MaxOf(items) => {
            let taps: Vec<(usize, Option<Operand>)> = items.iter().map(|v| biased_tap(v)).collect::<Option<_>>()?;
            let bias = taps.first()?.1;
            if taps.iter().any(|t| t.1 != bias) {
                return None;
            }
            (true, taps.iter().map(|t| t.0).collect::<Vec<_>>(), None, None, bias)
        }
        _ => {
            let value: &Val = &value;
            let (sum, bias) = match value {
                Val::Bin(BinaryOp::Add, a, b) if product(a).is_none() && product(b).is_none() => {
                    match (uniform(b), uniform(a)) {
                        (Some(u), _) => (&**a, Some(u)),
                        (None, Some(u)) => (&**b, Some(u)),
                        (None, None) => (value, None),
                    }
                }
                _ => (value, None),
            };
            // `sum * scale` (either order), where `sum` is a sum of products, not one.
            let (sum, scale) = match sum {
                Val::Bin(BinaryOp::Mul, a, b) if product(sum).is_none() => match (uniform(b), uniform(a)) {
                    (Some(u), _) => (&**a, Some(u)),
                    (None, Some(u)) => (&**b, Some(u)),
                    (None, None) => return None,
                },
                _ => (sum, None),
            };
            let mut terms = Vec::new();
            folded_sum(sum, &mut terms)?;
            let (order, weights): (Vec<usize>, Vec<Operand>) = terms.into_iter().unzip();
            (false, order, Some(weights), scale, bias)
        }
    };
    if order.len() < MIN_TAPS || order.len() != walk.loads.len() {
        return None;
    }
    let mut seen = vec![false; walk.loads.len()];
    for &t in &order {
        if std::mem::replace(&mut seen[t], true) {
            return None;
        }
    }

    // Every tap: one buffer, one base and row stride, the same step along the row.
    let first = &walk.loads[0];
    let (src_buf, stride) = (first.buf, const_coeff(first.index, *col)?);
    if !matches!(stride, 1 | 2) || src_buf == dst_buf {
        return None;
    }
    let unrolled_vars: Vec<Var> = first.unrolled.iter().map(|u| u.0).collect();
    let src_row = row_coeff(first.index, row, *col, &unrolled_vars)?;
    let mut all = unrolled_vars.clone();
    all.extend([row, *col]);
    let (src_base, first_constant) = split_const(&zeroed(first.index, &all));
    // The first tap's coefficient of each unrolled variable: a tap whose index is the first's,
    // or the first's plus a constant (a window's taps written out), has its coefficients, so
    // only its offset is new (the general checks below build and compare expressions per tap,
    // most of a depthwise convolution's plan: 22-59 us for nine taps).
    let unrolled_coefs: Vec<i64> = unrolled_vars.iter().map(|&v| const_coeff(first.index, v)).collect::<Option<_>>()?;
    let plus_first = |e: &IExpr| match e {
        _ if std::ptr::eq(e, first.index) || e == first.index => Some(0),
        IExpr::Add(a, b) => match **b {
            IExpr::Const(c) if **a == *first.index => Some(c),
            _ => None,
        },
        _ => None,
    };
    let mut offsets = vec![0i64; walk.loads.len()];
    for (t, l) in walk.loads.iter().enumerate() {
        let vars: Vec<Var> = l.unrolled.iter().map(|u| u.0).collect();
        if let Some(c) = plus_first(l.index)
            && l.buf == src_buf
            && vars == unrolled_vars
        {
            let mut off = first_constant.checked_add(c)?;
            for (&(_, j), &coef) in l.unrolled.iter().zip(&unrolled_coefs) {
                off = off.checked_add(coef.checked_mul(j)?)?;
            }
            offsets[t] = off;
            continue;
        }
        if l.buf != src_buf
            || vars != unrolled_vars
            || const_coeff(l.index, *col)? != stride
            || row_coeff(l.index, row, *col, &vars)? != src_row
        {
            return None;
        }
        let (base, constant) = split_const(&zeroed(l.index, &all));
        if base != src_base {
            return None;
        }
        let mut off = constant;
        for &(v, j) in &l.unrolled {
            off = off.checked_add(const_coeff(l.index, v)?.checked_mul(j)?)?;
        }
        offsets[t] = off;
    }

    // The store: contiguous along the row, nothing of the unrolled loops in it.
    if const_coeff(dst_index, *col)? != 1 || unrolled_vars.iter().any(|&v| dst_index.uses(v)) {
        return None;
    }
    let dst_row = row_coeff(dst_index, row, *col, &[])?;
    let dst_base = zeroed(dst_index, &[row, *col]);
    let offsets = order.iter().map(|&t| offsets[t]).collect();
    let weights = match weights {
        Some(w) => Weights::Values(w),
        None => Weights::None,
    };
    Some(StencilPlan {
        max,
        src_buf,
        src_base,
        src_row,
        src_plane: IExpr::Const(0),
        stride,
        offsets,
        weights,
        scale: scale.map(PerPlane::Value),
        bias: bias.map(PerPlane::Value),
        post,
        dst_buf,
        dst_base,
        dst_row,
        dst_plane: IExpr::Const(0),
        width,
        rows: rows.clone(),
        planes: IExpr::Const(1),
    })
}

/// The value of `o` per plane of the loop over `plane`, whose leading statements `prefix`
/// (constants and loads) define some registers: a constant or a register defined outside is one
/// value, a load linear in the plane one value per plane.
fn per_plane(o: Operand, plane: Var, prefix: &HashMap<Reg, &Inst>) -> Option<PerPlane> {
    let Operand::Reg(r) = o else { return Some(PerPlane::Value(o)) };
    match prefix.get(&r) {
        None => Some(PerPlane::Value(o)),
        Some(Inst::Const(Scalar::Float(x))) => Some(PerPlane::Value(Operand::Const(*x as f32))),
        Some(Inst::Load { buf, index, mask: None, .. }) => {
            let stride = index.linear_coeff(plane).filter(|c| !c.uses(plane))?;
            Some(PerPlane::Loaded { buf: *buf, base: zeroed(index, &[plane]), plane: stride })
        }
        Some(_) => None,
    }
}

/// [`stencil_plan`] one loop further out: a loop over planes `plane` whose body is constants and
/// loads (a channel's filter and bias) and then a stencil's row loop, where the stencil's
/// buffers move by a fixed stride per plane and its weights (all of them loads of one buffer at
/// constant offsets) and bias are uniform or one load per plane. One call then runs every plane
/// (a depthwise convolution's channels), not one call per plane.
pub(crate) fn plane_plan(plane: Var, planes: &IExpr, body: &[Stmt]) -> Option<StencilPlan> {
    let (last, prefix) = body.split_last()?;
    let Stmt::Loop { var: row, extent: rows, parallel: false, body: row_body } = last else { return None };
    let mut defs = HashMap::default();
    for s in prefix {
        match s {
            Stmt::Let { reg, dtype: DType::F32, inst: inst @ (Inst::Const(_) | Inst::Load { mask: None, .. }) } => {
                defs.insert(*reg, inst);
            }
            _ => return None,
        }
    }
    let mut p = stencil_plan(*row, rows, row_body)?;
    let lift = |e: &IExpr| -> Option<(IExpr, IExpr)> {
        let stride = e.linear_coeff(plane).filter(|c| !c.uses(plane))?;
        Some((zeroed(e, &[plane]), stride))
    };
    if rows.uses(plane) || p.src_row.uses(plane) || p.dst_row.uses(plane) {
        return None;
    }
    (p.src_base, p.src_plane) = lift(&p.src_base)?;
    (p.dst_base, p.dst_plane) = lift(&p.dst_base)?;
    for v in [&mut p.scale, &mut p.bias] {
        if let Some(PerPlane::Value(o)) = v {
            *v = Some(per_plane(*o, plane, &defs)?);
        }
    }
    p.post = match p.post {
        Some(o) => match per_plane(o, plane, &defs)? {
            PerPlane::Value(v) => Some(v),
            PerPlane::Loaded { .. } => return None,
        },
        None => None,
    };
    if let Weights::Values(ws) = &p.weights {
        let each: Vec<PerPlane> = ws.iter().map(|&w| per_plane(w, plane, &defs)).collect::<Option<_>>()?;
        if each.iter().all(|w| matches!(w, PerPlane::Value(_))) {
            let values = each.into_iter().filter_map(|w| if let PerPlane::Value(v) = w { Some(v) } else { None });
            p.weights = Weights::Values(values.collect());
        } else {
            let PerPlane::Loaded { buf, base, plane: stride } = &each[0] else { return None };
            let (base, _) = split_const(base);
            let mut offsets = Vec::with_capacity(each.len());
            for w in &each {
                let PerPlane::Loaded { buf: b, base: wb, plane: s } = w else { return None };
                let (wb, off) = split_const(wb);
                if b != buf || s != stride || wb != base {
                    return None;
                }
                offsets.push(off);
            }
            p.weights = Weights::Loaded { buf: *buf, base, plane: stride.clone(), offsets };
        }
    }
    p.planes = planes.clone();
    Some(p)
}

/// The routine for every host: the loop body's operations in its order, one element at a time.
///
/// # Safety
/// `args` describes a stencil whose every tap and output element lies inside its buffer (the
/// kernel's own accesses, which the code generator passes unchanged).
pub(crate) unsafe extern "C" fn stencil_base(args: *const StencilArgs) {
    // SAFETY: the generated code passes a filled `StencilArgs` on its stack.
    let a = unsafe { &*args };
    let (taps, flags) = ((a.taps as usize).clamp(1, MAX_TAPS), a.flags);
    let mut weights = [0.0f32; MAX_TAPS];
    for p in 0..a.planes {
        let (scale, bias) = a.plane(p, &mut weights);
        for r in 0..a.rows {
            let d = a.dst.wrapping_offset((p * a.dst_plane + r * a.dst_row) as isize);
            let s = a.src.wrapping_offset((p * a.src_plane + r * a.src_row) as isize);
            for j in 0..a.width {
                // SAFETY: the caller's contract: every element read here is one the kernel reads.
                let tap = |t: usize| unsafe { *s.wrapping_offset((a.offsets[t] + j * a.stride) as isize) };
                let mut v = if flags & FLAG_MAX != 0 {
                    let biased = |t: usize| if flags & FLAG_BIAS != 0 { tap(t) + bias } else { tap(t) };
                    (1..taps).fold(biased(0), |m, t| fmax(m, biased(t)))
                } else {
                    let sum = (1..taps).fold(tap(0) * weights[0], |acc, t| acc + tap(t) * weights[t]);
                    let sum = if flags & FLAG_SCALE != 0 { sum * scale } else { sum };
                    if flags & FLAG_BIAS != 0 { sum + bias } else { sum }
                };
                if flags & FLAG_POST != 0 {
                    v = fmax(v, a.post);
                }
                // SAFETY: as above, for the output.
                unsafe { *d.wrapping_offset(j as isize) = v };
            }
        }
    }
}

/// The AVX-512 routine: 16 outputs at a time (a masked tail), each tap one load, or for a
/// stride of 2 two loads and one lane permutation. Called only on hosts with AVX-512F
/// (`TileLevel::detect`).
///
/// # Safety
/// As for [`stencil_base`], on a host with AVX-512F.
pub(crate) unsafe extern "C" fn stencil_avx512(args: *const StencilArgs) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded to the caller.
    unsafe {
        avx512::run(&*args)
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded to the caller.
    unsafe {
        stencil_base(args)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{FLAG_BIAS, FLAG_MAX, FLAG_POST, FLAG_SCALE, MAX_TAPS, StencilArgs};

    /// Kiln's `max` on 16 lanes: NaN where either is NaN, and `+0 > -0` (the two `vmaxps`
    /// orders agree except on NaNs and on equal values, where the AND picks `+0` over `-0`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn fmax(a: __m512, b: __m512) -> __m512 {
        let m = _mm512_and_si512(_mm512_castps_si512(_mm512_max_ps(a, b)), _mm512_castps_si512(_mm512_max_ps(b, a)));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, b);
        _mm512_mask_add_ps(_mm512_castsi512_ps(m), nan, a, b)
    }

    /// The lanes below `n` (at most 16).
    #[inline]
    fn lanes(n: i64) -> __mmask16 {
        if n >= 16 { 0xffff } else { ((1u32 << n.max(0)) - 1) as u16 }
    }

    /// Tap `t`'s 16 lanes for outputs `j..` of the row at `s` (`n` of them valid, `m` their
    /// mask): one masked load, or for a stride of 2, elements 0, 2, .., 2(n - 1) of the 2n - 1
    /// from there by two masked loads and one permutation. Masked-off lanes are not read.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tap<const S2: bool>(s: *const f32, off: i64, j: i64, m: __mmask16, n: i64) -> __m512 {
        // SAFETY: the caller's contract: the lanes loaded are taps the kernel reads.
        unsafe {
            if S2 {
                let p = s.wrapping_offset((off + 2 * j) as isize);
                let lo = _mm512_maskz_loadu_ps(lanes(2 * n - 1), p);
                let hi = _mm512_maskz_loadu_ps(lanes(2 * n - 17), p.wrapping_add(16));
                let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
                _mm512_permutex2var_ps(lo, even, hi)
            } else {
                _mm512_maskz_loadu_ps(m, s.wrapping_offset((off + j) as isize))
            }
        }
    }

    /// Outputs `j..j + 16` (the first `n`) of `R` rows from `r`, their accumulators independent
    /// so that the serial chain of one output's taps overlaps the others'.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn block<const S2: bool, const MAX: bool, const R: usize>(a: &StencilArgs, plane: &Plane, r: i64, j: i64) {
        let n = (a.width - j).min(16);
        let m = lanes(n);
        let weights = &plane.weights[..plane.taps];
        let taps = weights.len();
        let src: [*const f32; R] =
            std::array::from_fn(|q| plane.src.wrapping_offset(((r + q as i64) * a.src_row) as isize));
        let (has_bias, bias) = (a.flags & FLAG_BIAS != 0, plane.bias);
        // SAFETY (all loads): forwarded to the caller.
        let mut acc: [__m512; R] = std::array::from_fn(|q| unsafe {
            let x = tap::<S2>(src[q], a.offsets[0], j, m, n);
            if MAX { if has_bias { _mm512_add_ps(x, bias) } else { x } } else { _mm512_mul_ps(x, weights[0]) }
        });
        // Indexed, not zipped: with `zip(..).take(..).skip(1)` LLVM kept the iterator's state
        // in memory and the routine ran twice as long (conv-1's 3x3 stencil, 2.6 -> 6.5 us).
        #[allow(clippy::needless_range_loop)]
        for t in 1..taps {
            let (off, w) = (a.offsets[t], weights[t]);
            for q in 0..R {
                // SAFETY: as above.
                let x = unsafe { tap::<S2>(src[q], off, j, m, n) };
                acc[q] = if MAX {
                    fmax(acc[q], if has_bias { _mm512_add_ps(x, bias) } else { x })
                } else {
                    _mm512_add_ps(acc[q], _mm512_mul_ps(x, w))
                };
            }
        }
        let post = _mm512_set1_ps(a.post);
        for (q, v) in acc.into_iter().enumerate() {
            let v = if !MAX && a.flags & FLAG_SCALE != 0 { _mm512_mul_ps(v, plane.scale) } else { v };
            let v = if !MAX && has_bias { _mm512_add_ps(v, bias) } else { v };
            let v = if a.flags & FLAG_POST != 0 { fmax(v, post) } else { v };
            let d = plane.dst.wrapping_offset(((r + q as i64) * a.dst_row + j) as isize);
            // SAFETY: the lanes below the width of the row are outputs the kernel writes.
            unsafe { _mm512_mask_storeu_ps(d, m, v) };
        }
    }

    /// Rows of at most 8 outputs, two to a vector: outputs of rows `r + 2q` in lanes 0..8 and of
    /// rows `r + 2q + 1` in lanes 8..16, for `q < R` (half the multiplies and adds of one row
    /// per vector; a depthwise convolution over 8x8 planes). Its accumulation repeats
    /// [`block`]'s: one function taking the loads as a closure ran 1.6x slower (with
    /// `#[target_feature]`) or 3x (inlined without it: the intrinsics were left as calls).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn pair_block<const S2: bool, const MAX: bool, const R: usize>(a: &StencilArgs, plane: &Plane, r: i64) {
        let n = a.width.min(8);
        let lo = lanes(n);
        let hi = lo << 8;
        let weights = &plane.weights[..plane.taps];
        let taps = weights.len();
        let (has_bias, bias) = (a.flags & FLAG_BIAS != 0, plane.bias);
        let row = |k: i64| plane.src.wrapping_offset(((r + k) * a.src_row) as isize);
        let first: [*const f32; R] = std::array::from_fn(|q| row(2 * q as i64));
        let second: [*const f32; R] = std::array::from_fn(|q| row(2 * q as i64 + 1));
        // SAFETY (both branches): the lanes loaded are taps of the two rows' outputs, which the
        // kernel reads (the caller's contract); masked-off lanes are not read.
        let tap = |q: usize, off: i64| unsafe {
            let (p0, p1) = (first[q].wrapping_offset(off as isize), second[q].wrapping_offset(off as isize));
            if S2 {
                let both = lanes(2 * n - 1);
                let idx = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
                _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(both, p0), idx, _mm512_maskz_loadu_ps(both, p1))
            } else {
                _mm512_mask_loadu_ps(_mm512_maskz_loadu_ps(lo, p0), hi, p1.wrapping_sub(8))
            }
        };
        let mut acc: [__m512; R] = std::array::from_fn(|q| {
            let x = tap(q, a.offsets[0]);
            if MAX { if has_bias { _mm512_add_ps(x, bias) } else { x } } else { _mm512_mul_ps(x, weights[0]) }
        });
        // Indexed, as in `block`.
        #[allow(clippy::needless_range_loop)]
        for t in 1..taps {
            let (off, w) = (a.offsets[t], weights[t]);
            for q in 0..R {
                let x = tap(q, off);
                acc[q] = if MAX {
                    fmax(acc[q], if has_bias { _mm512_add_ps(x, bias) } else { x })
                } else {
                    _mm512_add_ps(acc[q], _mm512_mul_ps(x, w))
                };
            }
        }
        let post = _mm512_set1_ps(a.post);
        for (q, v) in acc.into_iter().enumerate() {
            let v = if !MAX && a.flags & FLAG_SCALE != 0 { _mm512_mul_ps(v, plane.scale) } else { v };
            let v = if !MAX && has_bias { _mm512_add_ps(v, bias) } else { v };
            let v = if a.flags & FLAG_POST != 0 { fmax(v, post) } else { v };
            let d = plane.dst.wrapping_offset(((r + 2 * q as i64) * a.dst_row) as isize);
            // SAFETY: the lanes below the width of the two rows are outputs the kernel writes.
            unsafe {
                _mm512_mask_storeu_ps(d, lo, v);
                _mm512_mask_storeu_ps(d.wrapping_offset(a.dst_row as isize).wrapping_sub(8), hi, v);
            }
        }
    }

    /// What one plane's blocks share.
    struct Plane {
        src: *const f32,
        dst: *mut f32,
        taps: usize,
        weights: [__m512; MAX_TAPS],
        bias: __m512,
        scale: __m512,
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn planes<const S2: bool, const MAX: bool>(a: &StencilArgs) {
        let taps = (a.taps as usize).clamp(1, MAX_TAPS);
        let mut w = [0.0f32; MAX_TAPS];
        let mut plane = Plane {
            src: a.src,
            dst: a.dst,
            taps,
            weights: [_mm512_setzero_ps(); MAX_TAPS],
            bias: _mm512_setzero_ps(),
            scale: _mm512_setzero_ps(),
        };
        for p in 0..a.planes {
            let (scale, bias) = a.plane(p, &mut w);
            plane.src = a.src.wrapping_offset((p * a.src_plane) as isize);
            plane.dst = a.dst.wrapping_offset((p * a.dst_plane) as isize);
            for (v, &x) in plane.weights.iter_mut().zip(&w).take(taps) {
                *v = _mm512_set1_ps(x);
            }
            plane.bias = _mm512_set1_ps(bias);
            plane.scale = _mm512_set1_ps(scale);
            let mut r = 0;
            if a.width <= 8 {
                while r + 8 <= a.rows {
                    // SAFETY: forwarded to the caller.
                    unsafe { pair_block::<S2, MAX, 4>(a, &plane, r) };
                    r += 8;
                }
                while r + 2 <= a.rows {
                    // SAFETY: forwarded to the caller.
                    unsafe { pair_block::<S2, MAX, 1>(a, &plane, r) };
                    r += 2;
                }
            }
            while r + 4 <= a.rows {
                let mut j = 0;
                while j < a.width {
                    // SAFETY: forwarded to the caller.
                    unsafe { block::<S2, MAX, 4>(a, &plane, r, j) };
                    j += 16;
                }
                r += 4;
            }
            while r < a.rows {
                let mut j = 0;
                while j < a.width {
                    // SAFETY: forwarded to the caller.
                    unsafe { block::<S2, MAX, 1>(a, &plane, r, j) };
                    j += 16;
                }
                r += 1;
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn run(a: &StencilArgs) {
        // SAFETY (all four): forwarded to the caller.
        unsafe {
            match (a.stride == 2, a.flags & FLAG_MAX != 0) {
                (false, false) => planes::<false, false>(a),
                (false, true) => planes::<false, true>(a),
                (true, false) => planes::<true, false>(a),
                (true, true) => planes::<true, true>(a),
            }
        }
    }
}
