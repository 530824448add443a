//! Contractions: recognising `reduce sum(mul(x, y))` over affine views as a strided batched
//! GEMM (the axes of the product space split into batch, M, N and K groups that each collapse
//! into one strided dim), and emitting its `MatmulKernel`.

use air::{Dim, Graph, NodeId, Op, Symbol};
use smallvec::SmallVec;

use super::Buffers;
use super::decide::MatmulOperand;
use super::kernel::{max_sym_expr, product};
use crate::error::LowerError;
use crate::kir::{Access, IExpr, Kernel, MatOperand, MatmulKernel, Param};
use crate::program::BufId;
use crate::view::{IndexCx, ViewStack, row_major};

pub(super) fn is_one(d: &Dim) -> bool {
    d.as_const() == Some(1)
}

pub(super) fn is_zero(d: &Dim) -> bool {
    d.as_const() == Some(0)
}

/// Axes of a product space, inline up to a rank of 8: the decision pass matches every candidate
/// reduce, and the allocations of these little lists were a quarter of its time.
type Axes = SmallVec<[usize; 8]>;

/// The GEMM groups of a recognised contraction: axes of the product space (the shape of the
/// `mul` under the reduce), each group outermost first. A group collapses into one strided dim of
/// every view that reads it; an empty group is a dim of size 1.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Contraction {
    /// Kept axes both operands may vary along.
    batch: Axes,
    /// Kept axes only `a` varies along.
    m: Axes,
    /// Kept axes only `b` varies along.
    n: Axes,
    /// Reduced axes; both operands vary along them.
    k: Axes,
}

/// The row-major strides of a reduce's (keepdim) output, indexed by product-space axis.
fn output_strides(space: &[Dim], reduced: &[usize]) -> air::Shape {
    let out: air::Shape =
        space.iter().enumerate().map(|(d, s)| if reduced.contains(&d) { Dim::Const(1) } else { *s }).collect();
    row_major(&out)
}

impl Contraction {
    /// Whether the output's innermost dim (of size > 1) is `n`'s innermost axis: `c` is then
    /// written row by row with unit column stride.
    pub(super) fn row_major_c(&self, space: &[Dim], reduced: &[usize]) -> bool {
        let inner = (0..space.len()).rev().find(|d| !reduced.contains(d) && !is_one(&space[*d]));
        inner.is_some() && self.n.last() == inner.as_ref()
    }
}

/// The stride of `axes` (outermost first) collapsed into one dim of a view with `strides`, 0 for
/// no axes; `None` when they do not collapse.
fn collapse(space: &[Dim], strides: &[Dim], axes: &[usize]) -> Option<Dim> {
    for w in axes.windows(2) {
        if strides[w[0]] != strides[w[1]] * space[w[1]] {
            return None;
        }
    }
    Some(axes.last().map_or(Dim::Const(0), |&d| strides[d]))
}

/// Steps `v` to its next permutation in lexicographic order; false after the last one.
fn next_permutation(v: &mut [usize]) -> bool {
    let Some(i) = (1..v.len()).rev().find(|&i| v[i - 1] < v[i]) else { return false };
    let j = (i..v.len()).rev().find(|&j| v[j] > v[i - 1]).expect("v[i] is larger than v[i - 1]");
    v.swap(i - 1, j);
    v[i..].reverse();
    true
}

/// An order of the (ascending) `axes` in which they collapse in every view of `views`: the space
/// order first, then, for at most `MAX_PERMUTED` axes, every other order.
fn collapse_order(space: &[Dim], views: &[&[Dim]], axes: &[usize]) -> Option<Axes> {
    const MAX_PERMUTED: usize = 5;
    let mut order = Axes::from_slice(axes);
    loop {
        if views.iter().all(|s| collapse(space, s, &order).is_some()) {
            return Some(order);
        }
        if axes.len() > MAX_PERMUTED || !next_permutation(&mut order) {
            return None;
        }
    }
}

/// Splits the product space of `reduce sum(mul(a, b))` over `reduced` (operands read through
/// affine views with strides `sa` and `sb`) into GEMM groups, or `None` when it is no GEMM.
///
/// Size-1 axes belong to no group. A reduced axis is K and both operands must vary along it. A
/// kept axis only `a` varies along is M, one only `b` varies along is N, any other kept axis is
/// batch. The output is written in its own row-major layout, so the kept groups collapse in space
/// order, and K in any order both operands agree on. Where a group does not collapse, the fewest M
/// and N axes possible move to the batch group. A contraction with neither M nor N axes (a batch
/// of dot products) or without K axes is left to loop kernels.
pub(super) fn contraction(space: &[Dim], reduced: &[usize], sa: &[Dim], sb: &[Dim]) -> Option<Contraction> {
    const MAX_MOVABLE: usize = 8;
    let sc = output_strides(space, reduced);
    let mut base = Contraction::default();
    let mut movable = Axes::new();
    for d in (0..space.len()).filter(|&d| !is_one(&space[d])) {
        let (va, vb) = (!is_zero(&sa[d]), !is_zero(&sb[d]));
        if reduced.contains(&d) {
            if !(va && vb) {
                return None;
            }
            base.k.push(d);
            continue;
        }
        match (va, vb) {
            (true, false) => base.m.push(d),
            (false, true) => base.n.push(d),
            _ => {
                base.batch.push(d);
                continue;
            }
        }
        movable.push(d);
    }
    if base.k.is_empty() || (base.m.is_empty() && base.n.is_empty()) {
        return None;
    }
    let k = collapse_order(space, &[sa, sb], &base.k)?;
    let subsets = if movable.len() <= MAX_MOVABLE { 1u32 << movable.len() } else { 1 };
    let mut masks: SmallVec<[u32; 16]> = (0..subsets).collect();
    masks.sort_by_key(|m| m.count_ones());
    for mask in masks {
        let moved = |d: &usize| movable.iter().position(|x| x == d).is_some_and(|i| mask >> i & 1 == 1);
        let mut batch: Axes = base.batch.iter().chain(movable.iter().filter(|d| moved(d))).copied().collect();
        batch.sort_unstable();
        let m: Axes = base.m.iter().filter(|d| !moved(d)).copied().collect();
        let n: Axes = base.n.iter().filter(|d| !moved(d)).copied().collect();
        if m.is_empty() && n.is_empty() {
            continue;
        }
        let fits = |axes: &[usize], views: &[&[Dim]]| views.iter().all(|s| collapse(space, s, axes).is_some());
        if fits(&batch, &[sa, sb, &sc]) && fits(&m, &[sa, &sc]) && fits(&n, &[sb, &sc]) {
            return Some(Contraction { batch, m, n, k });
        }
    }
    None
}

pub(super) fn matmul_kernel(
    g: &Graph,
    bufs: &Buffers,
    symbols: &[Symbol],
    reduce: NodeId,
    operands: [&MatmulOperand; 2],
    target: BufId,
    accumulate: bool,
) -> Result<(Kernel, Vec<BufId>), LowerError> {
    let cx = IndexCx::new(symbols.to_vec());
    let space = g.ty(g.inputs(reduce)[0]).shape.to_vec();
    let reduced: Vec<usize> = match g.op(reduce) {
        Op::Reduce(r) => r.axes.to_vec(),
        _ => return Err(LowerError::InvalidGraph(format!("{reduce}: a matmul root is not a reduce"))),
    };
    let dtype = g.ty(reduce).dtype;
    let mut args = vec![target];
    let mut params = vec![Param { dtype, access: Access::Write }];
    let mut slots = Vec::new();
    let mut views = Vec::new();
    for op in operands {
        let buf = *bufs
            .get(op.base)
            .ok_or_else(|| LowerError::InvalidGraph(format!("{}: matmul operand has no buffer", op.base)))?;
        let p = match args.iter().position(|&b| b == buf) {
            Some(p) => p,
            None => {
                args.push(buf);
                params.push(Param { dtype, access: Access::Read });
                args.len() - 1
            }
        };
        slots.push(p as u32);
        views.push(ViewStack::contiguous(&g.ty(op.base).shape).through(op.chain.iter().rev()).top().clone());
    }
    let (va, vb) = (&views[0], &views[1]);
    let plan = contraction(&space, &reduced, &va.strides, &vb.strides)
        .ok_or_else(|| LowerError::InvalidGraph(format!("{reduce}: the matmul's operands are no contraction")))?;
    let sc = output_strides(&space, &reduced);
    let collapsed = |strides: &[Dim], axes: &[usize]| -> Result<Dim, LowerError> {
        collapse(&space, strides, axes)
            .ok_or_else(|| LowerError::InvalidGraph(format!("{reduce}: matmul axes {axes:?} do not collapse")))
    };
    let stride = |strides: &[Dim], axes: &[usize]| -> Result<IExpr, LowerError> { cx.dim(&collapsed(strides, axes)?) };
    let size = |axes: &[usize]| product(&axes.iter().map(|&d| space[d]).collect::<Vec<_>>());
    let (batch, m, n, k) = (size(&plan.batch), size(&plan.m), size(&plan.n), size(&plan.k));
    let a = MatOperand {
        buf: slots[0],
        offset: cx.dim(&va.offset)?,
        batch_stride: stride(&va.strides, &plan.batch)?,
        row_stride: stride(&va.strides, &plan.m)?,
        col_stride: stride(&va.strides, &plan.k)?,
    };
    let b = MatOperand {
        buf: slots[1],
        offset: cx.dim(&vb.offset)?,
        batch_stride: stride(&vb.strides, &plan.batch)?,
        row_stride: stride(&vb.strides, &plan.k)?,
        col_stride: stride(&vb.strides, &plan.n)?,
    };
    // `c` is the reduce's row-major output; an empty group gets the stride it would have in a
    // row-major `[batch, m, n]` (any value would do for a dim of size 1).
    let c_col = if plan.n.is_empty() { Dim::Const(1) } else { collapsed(&sc, &plan.n)? };
    let c_row = if plan.m.is_empty() { c_col * n } else { collapsed(&sc, &plan.m)? };
    let c_batch = if plan.batch.is_empty() { m * n } else { collapsed(&sc, &plan.batch)? };
    let c = MatOperand {
        buf: 0,
        offset: IExpr::Const(0),
        batch_stride: cx.dim(&c_batch)?,
        row_stride: cx.dim(&c_row)?,
        col_stride: cx.dim(&c_col)?,
    };
    let exprs = [&a.offset, &a.batch_stride, &a.row_stride, &a.col_stride, &b.offset, &b.batch_stride]
        .into_iter()
        .chain([&b.row_stride, &b.col_stride, &c.batch_stride, &c.row_stride, &c.col_stride]);
    let dim_exprs: Vec<IExpr> = [batch, m, n, k].iter().map(|d| cx.dim(d)).collect::<Result<_, _>>()?;
    let n_syms = exprs.chain(&dim_exprs).filter_map(max_sym_expr).max().map_or(0, |m| m + 1);
    let [batch, m, n, k] = <[IExpr; 4]>::try_from(dim_exprs).expect("four dims");
    Ok((Kernel::Matmul(MatmulKernel { params, n_syms, dtype, batch, m, n, k, a, b, c, accumulate }), args))
}
