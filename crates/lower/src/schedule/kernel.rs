//! Loop-kernel building: a materialized node's expression tree (`TreeBuilder`) down to buffers,
//! leaves and at most one fused reduce, lowered to hash-consed kir instructions placed at the
//! outermost loop level their operands allow (`Emitter`), with merged contiguous loop dims; and
//! the scatter-add kernel.

use rustc_hash::FxHashMap as HashMap;
use slotmap::SecondaryMap;
use smallvec::SmallVec;

use air::{BinaryOp, DType, Dim, Graph, NodeId, Op, ReduceOp, Scalar, Symbol, UnaryOp};

use super::{Buffers, STATUS_BUF, is_movement, movement};
use crate::error::LowerError;
use crate::kir::{Acc, Access, IExpr, Inst, Kernel, LoopKernel, Param, Reg, Stmt, Var};
use crate::program::{BufId, CheckKind, DataCheck};
use crate::view::{IndexCx, Movement, ViewStack, common_refinement, row_major};

/// An expression of a loop kernel, with every read resolved to a view of a buffer.
#[derive(Clone, Debug)]
enum KExpr {
    Load {
        buf: BufId,
        dtype: DType,
        view: ViewStack,
        other: Scalar,
        inner: bool,
    },
    Const {
        dtype: DType,
        value: Scalar,
    },
    Iota {
        dtype: DType,
        view: ViewStack,
        axis: usize,
        inner: bool,
    },
    Pad {
        dtype: DType,
        view: ViewStack,
        ranges: Vec<(Dim, Dim)>,
        value: Scalar,
        inner: bool,
        x: Box<KExpr>,
    },
    Unary {
        op: UnaryOp,
        dtype: DType,
        x: Box<KExpr>,
    },
    Binary {
        op: BinaryOp,
        dtype: DType,
        a: Box<KExpr>,
        b: Box<KExpr>,
    },
    Where {
        dtype: DType,
        c: Box<KExpr>,
        a: Box<KExpr>,
        b: Box<KExpr>,
    },
    Cast {
        dtype: DType,
        x: Box<KExpr>,
    },
    Reduce {
        op: ReduceOp,
        dtype: DType,
        x: Box<KExpr>,
    },
    /// A row reduce (`Decisions::rows`): the reduce `node` over the trailing `reduced` dims of
    /// its input, read through `view` (its output's shape, the kept dims then a 1 per reduced
    /// one, seen through the reader's movement ops), computed in loops of its own at the loop level of the row it
    /// reads. `x` is the reduce's input expression, its views indexed by the row's coordinates
    /// and then the reduced dims' own loop variables ([`Frame`]).
    Row {
        node: NodeId,
        op: ReduceOp,
        dtype: DType,
        view: ViewStack,
        inner: bool,
        reduced: Vec<Dim>,
        x: Box<KExpr>,
    },
    Gather {
        buf: BufId,
        dtype: DType,
        src_shape: Vec<Dim>,
        axis: usize,
        view: ViewStack,
        inner: bool,
        index: Box<KExpr>,
    },
}

impl KExpr {
    fn for_each_view(&mut self, f: &mut dyn FnMut(&mut ViewStack, bool)) {
        match self {
            KExpr::Load { view, inner, .. } | KExpr::Iota { view, inner, .. } => f(view, *inner),
            KExpr::Pad { view, inner, x, .. } => {
                f(view, *inner);
                x.for_each_view(f);
            }
            KExpr::Const { .. } => {}
            // The row's own views are indexed by the row's loops, not the kernel's.
            KExpr::Row { view, inner, .. } => f(view, *inner),
            KExpr::Gather { view, inner, index, .. } => {
                f(view, *inner);
                index.for_each_view(f);
            }
            KExpr::Unary { x, .. } | KExpr::Cast { x, .. } | KExpr::Reduce { x, .. } => x.for_each_view(f),
            KExpr::Binary { a, b, .. } => {
                a.for_each_view(f);
                b.for_each_view(f);
            }
            KExpr::Where { c, a, b, .. } => {
                c.for_each_view(f);
                a.for_each_view(f);
                b.for_each_view(f);
            }
        }
    }
}

fn zero_of(dtype: DType) -> Scalar {
    Scalar::Int(0).cast(dtype)
}

/// The fused reduce of a kernel.
struct ReduceInfo {
    axes: Vec<usize>,
    in_shape: Vec<Dim>,
}

/// Builds the expression tree of one kernel root.
struct TreeBuilder<'a> {
    g: &'a Graph,
    bufs: &'a Buffers,
    rows: &'a SecondaryMap<NodeId, ()>,
    reduce: Option<ReduceInfo>,
}

impl TreeBuilder<'_> {
    fn view(&self, n: NodeId, pending: &[Movement]) -> ViewStack {
        ViewStack::contiguous(&self.g.ty(n).shape).through(pending.iter().rev())
    }

    fn pad_foldable(&self, n: NodeId, value: Scalar, fold: Option<Scalar>) -> bool {
        if fold.is_some_and(|f| f != value) {
            return false;
        }
        let mut cur = self.g.inputs(n)[0];
        loop {
            air::work::tick();
            if self.bufs.contains_key(cur) {
                return true;
            }
            match self.g.op(cur) {
                Op::Pad(p) if p.value != value => return false,
                op if is_movement(op) => cur = self.g.inputs(cur)[0],
                _ => return false,
            }
        }
    }

    fn build(
        &mut self,
        n: NodeId,
        pending: &mut Vec<Movement>,
        fold: Option<Scalar>,
        inner: bool,
        expand: bool,
    ) -> Result<KExpr, LowerError> {
        air::work::add(1 + pending.len() as u64);
        let g = self.g;
        let node = g.node(n);
        let dtype = node.ty.dtype;
        let load = |s: &Self, buf: BufId, pending: &[Movement]| KExpr::Load {
            buf,
            dtype,
            view: s.view(n, pending),
            other: fold.unwrap_or(zero_of(dtype)).cast(dtype),
            inner,
        };
        if !expand && let Some(&buf) = self.bufs.get(n) {
            return Ok(load(self, buf, pending));
        }
        let sub =
            |s: &mut Self, i: usize, pending: &mut Vec<Movement>| s.build(node.inputs[i], pending, None, inner, false);
        Ok(match &node.op {
            Op::Input(_) => match self.bufs.get(n) {
                Some(&buf) => load(self, buf, pending),
                None => return Err(LowerError::InvalidGraph(format!("{n}: input has no buffer"))),
            },
            Op::Const(c) => KExpr::Const { dtype, value: c.value.cast(dtype) },
            Op::Iota(i) => KExpr::Iota { dtype, view: self.view(n, pending), axis: i.axis, inner },
            Op::Unary(op) => KExpr::Unary { op: *op, dtype, x: Box::new(sub(self, 0, pending)?) },
            Op::Binary(op) => {
                let a = Box::new(sub(self, 0, pending)?);
                KExpr::Binary { op: *op, dtype, a, b: Box::new(sub(self, 1, pending)?) }
            }
            Op::Where => {
                let c = Box::new(sub(self, 0, pending)?);
                let a = Box::new(sub(self, 1, pending)?);
                KExpr::Where { dtype, c, a, b: Box::new(sub(self, 2, pending)?) }
            }
            Op::Cast(_) => KExpr::Cast { dtype, x: Box::new(sub(self, 0, pending)?) },
            Op::Reduce(r) if self.rows.contains_key(n) => {
                let in_shape = &g.ty(node.inputs[0]).shape;
                let kept = in_shape.len() - r.axes.len();
                if r.axes.iter().enumerate().any(|(i, &a)| a != kept + i) {
                    return Err(LowerError::InvalidGraph(format!("{n}: a row reduce over axes that are not trailing")));
                }
                let x = self.build(node.inputs[0], &mut Vec::new(), None, true, false)?;
                KExpr::Row {
                    node: n,
                    op: r.op,
                    dtype,
                    view: self.view(n, pending),
                    inner,
                    reduced: in_shape[kept..].to_vec(),
                    x: Box::new(x),
                }
            }
            Op::Reduce(r) => {
                if inner || !pending.is_empty() || self.reduce.is_some() {
                    return Err(LowerError::Unsupported(format!("{n}: a reduce read through a view inside a kernel")));
                }
                let in_shape = g.ty(node.inputs[0]).shape.to_vec();
                let mut perm: Vec<usize> = (0..in_shape.len()).filter(|a| !r.axes.contains(a)).collect();
                perm.extend(r.axes.iter().copied());
                self.reduce = Some(ReduceInfo { axes: r.axes.to_vec(), in_shape });
                let mut p = vec![Movement::Permute(perm)];
                let x = self.build(node.inputs[0], &mut p, None, true, false)?;
                KExpr::Reduce { op: r.op, dtype, x: Box::new(x) }
            }
            Op::Pad(p) => {
                let m = Movement::Pad(p.padding.clone());
                if self.pad_foldable(n, p.value, fold) {
                    pending.push(m);
                    let x = self.build(node.inputs[0], pending, Some(p.value), inner, false);
                    pending.pop();
                    return x;
                }
                let view = self.view(n, pending);
                let in_shape = &g.ty(node.inputs[0]).shape;
                let ranges = p.padding.iter().zip(in_shape).map(|((b, _), s)| (*b, b + s)).collect();
                pending.push(m);
                let x = self.build(node.inputs[0], pending, fold, inner, false);
                pending.pop();
                KExpr::Pad { dtype, view, ranges, value: p.value.cast(dtype), inner, x: Box::new(x?) }
            }
            Op::Gather(gather) => {
                let src = node.inputs[0];
                let Some(&buf) = self.bufs.get(src) else {
                    return Err(LowerError::InvalidGraph(format!("{n}: the source of a gather has no buffer")));
                };
                let index = Box::new(sub(self, 1, pending)?);
                let src_shape = g.ty(src).shape.to_vec();
                KExpr::Gather { buf, dtype, src_shape, axis: gather.axis, view: self.view(n, pending), inner, index }
            }
            Op::ScatterAdd(_) => {
                return Err(LowerError::InvalidGraph(format!("{n}: a scatter_add is only computed by its own kernel")));
            }
            op => {
                let m = movement(op).expect("the remaining ops are movement ops");
                pending.push(m);
                let x = self.build(node.inputs[0], pending, fold, inner, false);
                pending.pop();
                return x;
            }
        })
    }
}

#[derive(Clone, Copy)]
struct Slot {
    reg: Reg,
    level: usize,
    post: bool,
}

/// A `Let` of [`Emitter::cse`]: its register's slot and its statement's position in
/// `pre[slot.level]` or `post[slot.level]` (statements are only appended while emitting).
#[derive(Clone, Copy)]
struct CseEntry {
    slot: Slot,
    at: usize,
}

/// The hash [`Emitter::cse`] files `(dtype, inst)` under.
fn cse_hash(dtype: DType, inst: &Inst) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h = rustc_hash::FxBuildHasher.build_hasher();
    dtype.hash(&mut h);
    inst.hash(&mut h);
    h.finish()
}

/// The innermost loop level the index expressions an instruction holds read (0 for none).
fn index_level(inst: &Inst) -> usize {
    match inst {
        Inst::Load { index, mask, .. } => var_level(index).max(mask.as_ref().map_or(0, var_level)),
        Inst::Index(e) => var_level(e),
        Inst::Gather { base, stride, size, .. } => var_level(base).max(var_level(stride)).max(var_level(size)),
        _ => 0,
    }
}

/// Emits kir statements for an expression tree into a loop nest, level by level.
struct Emitter {
    cx: IndexCx,
    params: Vec<(BufId, Param)>,
    pre: Vec<Vec<Stmt>>,
    post: Vec<Vec<Stmt>>,
    /// Hash-consing: the `Let`s emitted so far by the hash of their dtype and instruction (a
    /// hash is computed once per instruction, and the instruction itself lives only in its
    /// statement: each entry says where that statement is).
    cse: HashMap<u64, SmallVec<[CseEntry; 1]>>,
    next_reg: u32,
    next_acc: u32,
    min_level: usize,
    n_outer: usize,
    n_total: usize,
    checks: Vec<DataCheck>,
    /// The in-bounds conditions of the pads enclosing the expression being emitted: a check
    /// there fires only where they hold, because the padded positions are never computed in the
    /// graph (the kernel computes them with masked loads and selects the pad value afterwards).
    guards: Vec<IExpr>,
    /// The row reduces being emitted, innermost last.
    frames: Vec<Frame>,
    /// The row reduces emitted so far, by node and row: each is computed once per row however
    /// many reads of it the kernel has.
    row_slots: HashMap<(NodeId, IExpr), Slot>,
}

/// The index space of a row reduce's input expression ([`KExpr::Row`]): its views, over the
/// reduce's input shape, are indexed by the row's coordinates and then `vars`, the reduced dims'
/// loop variables; or, where a view takes the reshape `rows` (the kept dims as one) without a
/// view of its own, by the row's position `row` and `vars`. The kernel's loops may have merged
/// the row's dims (`row` is one variable, its coordinates divisions of it) or not (`row` is a
/// sum over the coordinates): each view is indexed the way that is plain for it.
struct Frame {
    row: IExpr,
    coords: Vec<IExpr>,
    rows: Movement,
    vars: Vec<IExpr>,
}

fn var_level(e: &IExpr) -> usize {
    match e {
        IExpr::Var(v) => v.0 as usize + 1,
        IExpr::Const(_) | IExpr::Sym(_) => 0,
        IExpr::Add(a, b)
        | IExpr::Mul(a, b)
        | IExpr::Div(a, b)
        | IExpr::Mod(a, b)
        | IExpr::Lt(a, b)
        | IExpr::And(a, b) => var_level(a).max(var_level(b)),
    }
}

impl Emitter {
    fn param(&mut self, buf: BufId, dtype: DType, access: Access) -> u32 {
        air::work::add(1 + self.params.len() as u64);
        if let Some(p) = self.params.iter().position(|(b, _)| *b == buf) {
            return p as u32;
        }
        self.params.push((buf, Param { dtype, access }));
        (self.params.len() - 1) as u32
    }

    /// A new check of the program and the status buffer's parameter position.
    fn check(&mut self, op: &str, kind: CheckKind) -> (u32, u32) {
        self.checks.push(DataCheck { op: op.to_string(), kind });
        let status = self.param(STATUS_BUF, DType::I32, Access::Write);
        (self.checks.len() as u32 - 1, status)
    }

    fn vars(&self, inner: bool) -> Vec<IExpr> {
        let n = if inner { self.n_total } else { self.n_outer };
        (0..n as u32).map(|v| IExpr::Var(Var(v))).collect()
    }

    /// `view`'s buffer index and mask at the loop point ([`ViewStack::index`]; in a row
    /// reduce's input, see [`Frame`]).
    fn index(&self, view: &ViewStack, inner: bool) -> Result<(IExpr, Option<IExpr>), LowerError> {
        let Some(frame) = self.frames.last() else { return view.index(&self.vars(inner), &self.cx) };
        let rows = view.clone().through([&frame.rows]);
        if rows.views.len() == view.views.len() {
            let at: Vec<IExpr> = std::iter::once(frame.row.clone()).chain(frame.vars.iter().cloned()).collect();
            rows.index(&at, &self.cx)
        } else {
            let at: Vec<IExpr> = frame.coords.iter().chain(&frame.vars).cloned().collect();
            view.index(&at, &self.cx)
        }
    }

    /// `view`'s indices along its base dims and mask at the loop point ([`ViewStack::indices`]).
    fn indices(&self, view: &ViewStack, inner: bool) -> Result<(Vec<IExpr>, Option<IExpr>), LowerError> {
        let (lin, valid) = self.index(view, inner)?;
        Ok((self.cx.delinearize(&lin, &view.base)?, valid))
    }

    /// The slot of an equal `Let` emitted before, if any (`hash` is `cse_hash(dtype, inst)`).
    fn find(&self, hash: u64, dtype: DType, inst: &Inst) -> Option<Slot> {
        self.cse.get(&hash)?.iter().find_map(|e| {
            let stmts = if e.slot.post { &self.post[e.slot.level] } else { &self.pre[e.slot.level] };
            match &stmts[e.at] {
                Stmt::Let { dtype: d, inst: i, .. } if *d == dtype && i == inst => Some(e.slot),
                _ => None,
            }
        })
    }

    /// The register holding `inst` of `dtype` (reading `operands`): an equal instruction's
    /// when one was emitted before, else a new `Let` at the outermost loop level that its
    /// operands and index expressions allow.
    fn let_(&mut self, dtype: DType, inst: Inst, operands: &[Slot]) -> Slot {
        air::work::add(1 + operands.len() as u64);
        let hash = cse_hash(dtype, &inst);
        if let Some(s) = self.find(hash, dtype, &inst) {
            return s;
        }
        let mut level = self.min_level.max(index_level(&inst));
        for s in operands {
            level = level.max(s.level);
        }
        let post = operands.iter().any(|s| s.post && s.level == level);
        let reg = Reg(self.next_reg);
        self.next_reg += 1;
        let slot = Slot { reg, level, post };
        let stmts = if post { &mut self.post[level] } else { &mut self.pre[level] };
        stmts.push(Stmt::Let { reg, dtype, inst });
        let at = stmts.len() - 1;
        self.cse.entry(hash).or_default().push(CseEntry { slot, at });
        slot
    }

    fn emit(&mut self, e: &KExpr) -> Result<Slot, LowerError> {
        Ok(match e {
            KExpr::Load { buf, dtype, view, other, inner } => {
                let (index, mask) = self.index(view, *inner)?;
                let p = self.param(*buf, *dtype, Access::Read);
                let other = if mask.is_some() { *other } else { zero_of(*dtype) };
                self.let_(*dtype, Inst::Load { buf: p, index, mask, other }, &[])
            }
            KExpr::Const { dtype, value } => self.let_(*dtype, Inst::Const(*value), &[]),
            KExpr::Iota { dtype, view, axis, inner } => {
                let (idx, _) = self.indices(view, *inner)?;
                self.let_(*dtype, Inst::Index(idx[*axis].clone()), &[])
            }
            KExpr::Pad { dtype, view, ranges, value, inner, x } => {
                let (idx, _) = self.indices(view, *inner)?;
                let mut cond: Option<IExpr> = None;
                for (d, range) in ranges.iter().enumerate() {
                    if let Some(c) = self.cx.range_cond(&idx[d], range, &view.base[d])? {
                        cond = Some(match cond {
                            None => c,
                            Some(p) => IExpr::and(p, c),
                        });
                    }
                }
                self.guards.extend(cond.clone());
                let x = self.emit(x);
                if cond.is_some() {
                    self.guards.pop();
                }
                let x = x?;
                match cond {
                    None => x,
                    Some(c) => {
                        let c = self.let_(DType::Bool, Inst::Index(c), &[]);
                        let v = self.let_(*dtype, Inst::Const(*value), &[]);
                        self.let_(*dtype, Inst::Where(c.reg, x.reg, v.reg), &[c, x, v])
                    }
                }
            }
            KExpr::Unary { op, dtype, x } => {
                let x = self.emit(x)?;
                self.let_(*dtype, Inst::Unary(*op, x.reg), &[x])
            }
            KExpr::Binary { op, dtype, a, b } => {
                let (a, b) = (self.emit(a)?, self.emit(b)?);
                let inst = Inst::Binary(*op, a.reg, b.reg);
                let checked = matches!(op, BinaryOp::Div | BinaryOp::Mod) && dtype.is_int();
                if checked && self.find(cse_hash(*dtype, &inst), *dtype, &inst).is_none() {
                    let zero = self.let_(*dtype, Inst::Const(zero_of(*dtype)), &[]);
                    let mut bad = self.let_(DType::Bool, Inst::Binary(BinaryOp::CmpEq, b.reg, zero.reg), &[b, zero]);
                    if let Some(g) = self.guards.iter().cloned().reduce(IExpr::and) {
                        let inside = self.let_(DType::Bool, Inst::Index(g), &[]);
                        bad = self.let_(DType::Bool, Inst::Binary(BinaryOp::And, bad.reg, inside.reg), &[bad, inside]);
                    }
                    let (check, status) = self.check(op.name(), CheckKind::DivByZero);
                    let stmt = Stmt::Check { cond: bad.reg, value: b.reg, status, check };
                    if bad.post { self.post[bad.level].push(stmt) } else { self.pre[bad.level].push(stmt) }
                }
                self.let_(*dtype, inst, &[a, b])
            }
            KExpr::Gather { buf, dtype, src_shape, axis, view, inner, index } => {
                let i = self.emit(index)?;
                let (coords, _) = self.indices(view, *inner)?;
                let strides = row_major(src_shape);
                let mut base = IExpr::Const(0);
                for (d, c) in coords.iter().enumerate().filter(|&(d, _)| d != *axis) {
                    base = IExpr::add(base, IExpr::mul(c.clone(), self.cx.dim(&strides[d])?));
                }
                let base = self.cx.canon(base);
                let stride = self.cx.dim(&strides[*axis])?;
                let size = self.cx.dim(&src_shape[*axis])?;
                let p = self.param(*buf, *dtype, Access::Read);
                let (check, status) = self.check("gather", CheckKind::Index { size: src_shape[*axis] });
                let inst = Inst::Gather { buf: p, base, index: i.reg, stride, size, status, check };
                self.let_(*dtype, inst, &[i])
            }
            KExpr::Where { dtype, c, a, b } => {
                let (c, a, b) = (self.emit(c)?, self.emit(a)?, self.emit(b)?);
                self.let_(*dtype, Inst::Where(c.reg, a.reg, b.reg), &[c, a, b])
            }
            KExpr::Cast { dtype, x } => {
                let x = self.emit(x)?;
                self.let_(*dtype, Inst::Cast(x.reg), &[x])
            }
            KExpr::Reduce { op, dtype, x } => {
                let half = dtype.is_half();
                let acc_dtype = if half { DType::F32 } else { *dtype };
                let acc = Acc(self.next_acc);
                self.next_acc += 1;
                self.pre[self.n_outer].push(Stmt::AccInit { acc, dtype: acc_dtype, op: *op });
                // Over an empty reduced axis (a constant extent 0), the body stays inside the
                // loops that never run: its loads read an empty input, whose indices the
                // extent-0 ranges may have folded to constants that would otherwise hoist them
                // out (and read memory that is not there). Its values are not shared with the
                // code after the loop (they are never computed).
                let empty = self.cx.empty_loop(self.n_outer..self.n_total);
                let min_level = self.min_level;
                if empty {
                    self.min_level = self.n_total;
                }
                let v = self.emit(x);
                if empty {
                    self.min_level = min_level;
                    let inner = self.n_total;
                    self.cse.retain(|_, entries| {
                        entries.retain(|e| e.slot.level < inner);
                        !entries.is_empty()
                    });
                }
                let mut v = v?;
                if half {
                    v = self.let_(DType::F32, Inst::Cast(v.reg), &[v]);
                }
                self.pre[self.n_total].push(Stmt::AccUpdate { acc, value: v.reg });
                let reg = Reg(self.next_reg);
                self.next_reg += 1;
                self.post[self.n_outer].push(Stmt::Let { reg, dtype: acc_dtype, inst: Inst::ReadAcc(acc) });
                let read = Slot { reg, level: self.n_outer, post: true };
                if half { self.let_(*dtype, Inst::Cast(read.reg), &[read]) } else { read }
            }
            KExpr::Row { node, op, dtype, view, inner, reduced, x } => {
                self.row(*node, *op, *dtype, view, *inner, reduced, x)?
            }
        })
    }

    /// Emits a row reduce (see [`KExpr::Row`]): its accumulator, its loops (each reduced dim
    /// a loop variable of its own, numbered after every variable so far) and its read, at the
    /// loop level of the row's coordinates, before anything at that level reads it.
    #[allow(clippy::too_many_arguments)]
    fn row(
        &mut self,
        node: NodeId,
        op: ReduceOp,
        dtype: DType,
        view: &ViewStack,
        inner: bool,
        reduced: &[Dim],
        x: &KExpr,
    ) -> Result<Slot, LowerError> {
        let (row, _) = self.index(view, inner)?;
        let key = (node, row);
        if let Some(&slot) = self.row_slots.get(&key) {
            return Ok(slot);
        }
        let level = var_level(&key.1).max(self.min_level);
        let half = dtype.is_half();
        let acc_dtype = if half { DType::F32 } else { dtype };
        let acc = Acc(self.next_acc);
        self.next_acc += 1;
        self.pre[level].push(Stmt::AccInit { acc, dtype: acc_dtype, op });
        // The reduced dims' loop variables and the levels inside them: `first + 1 ..= last`.
        let first = self.cx.extents.len();
        // The row's coordinates: its output's (whose reduced dims, the trailing ones, are 1).
        let kept = &view.base[..view.base.len() - reduced.len()];
        let mut coords = self.cx.delinearize(&key.1, &view.base)?;
        coords.truncate(kept.len());
        let mut frame = Frame {
            row: key.1.clone(),
            coords,
            rows: Movement::Reshape(std::iter::once(product(kept)).chain(reduced.iter().cloned()).collect()),
            vars: Vec::with_capacity(reduced.len()),
        };
        let mut extents = Vec::with_capacity(reduced.len());
        for d in reduced {
            let e = self.cx.dim(d)?;
            frame.vars.push(IExpr::Var(Var(self.cx.extents.len() as u32)));
            self.cx.extents.push(d.as_const());
            self.cx.extent_exprs.push(e.clone());
            extents.push(e);
        }
        let last = first + reduced.len();
        self.pre.resize_with(self.pre.len().max(last + 1), Vec::new);
        self.post.resize_with(self.post.len().max(last + 1), Vec::new);
        self.frames.push(frame);
        let v = self.emit(x);
        self.frames.pop();
        let mut v = v?;
        if half {
            v = self.let_(DType::F32, Inst::Cast(v.reg), &[v]);
        }
        self.pre[last].push(Stmt::AccUpdate { acc, value: v.reg });
        let loops = self.nest(first, &extents);
        self.pre[level].push(loops);
        // What the row's loops hold is gone from the levels: nothing after may reuse it.
        self.cse.retain(|_, entries| {
            entries.retain(|e| e.slot.level <= first);
            !entries.is_empty()
        });
        self.row_slots.retain(|_, slot| slot.level <= first);
        let reg = Reg(self.next_reg);
        self.next_reg += 1;
        self.pre[level].push(Stmt::Let { reg, dtype: acc_dtype, inst: Inst::ReadAcc(acc) });
        let read = Slot { reg, level, post: false };
        let slot = if half { self.let_(dtype, Inst::Cast(read.reg), &[read]) } else { read };
        self.row_slots.insert(key, slot);
        Ok(slot)
    }

    /// The loop of variable `var` (its statements at level `var + 1`) over `extents[0]`, around
    /// those of the next variables over the rest.
    fn nest(&mut self, var: usize, extents: &[IExpr]) -> Stmt {
        let mut body = std::mem::take(&mut self.pre[var + 1]);
        if extents.len() > 1 {
            let inner = self.nest(var + 1, &extents[1..]);
            body.push(inner);
        }
        body.append(&mut self.post[var + 1]);
        Stmt::Loop { var: Var(var as u32), extent: extents[0].clone(), parallel: false, body }
    }

    fn assemble(&mut self, level: usize, extents: &[IExpr]) -> Vec<Stmt> {
        let mut body = std::mem::take(&mut self.pre[level]);
        if level < self.n_total {
            let inner = self.assemble(level + 1, extents);
            body.push(Stmt::Loop {
                var: Var(level as u32),
                extent: extents[level].clone(),
                parallel: level == 0 && self.n_outer > 0,
                body: inner,
            });
        }
        body.append(&mut self.post[level]);
        body
    }
}

/// The loop shape of an element-wise kernel over `outer`: `outer` without its size-1 dims (a
/// size-1 dim between two dims would otherwise let merging join dims that are not contiguous with
/// each other), split further wherever a read is a plain reshape of a view that strides
/// differently (see [`ViewStack::reshaped_from`]), when every read can take that shape without a
/// new view. The reads are reshaped to it.
fn refined_loops(tree: &mut KExpr, outer: Vec<Dim>) -> Vec<Dim> {
    let mut loops: Vec<Dim> = outer.iter().filter(|d| d.as_const() != Some(1)).cloned().collect();
    tree.for_each_view(&mut |v, _| {
        if let Some(below) = v.reshaped_from()
            && let Some(finer) = common_refinement(&loops, below)
        {
            loops = finer;
        }
    });
    if loops == outer {
        return outer;
    }
    let mut fits = true;
    tree.for_each_view(&mut |v, _| fits &= v.top().reshape(&loops).is_some());
    if !fits {
        return outer;
    }
    tree.for_each_view(&mut |v, _| v.apply(&Movement::Reshape(loops.iter().cloned().collect())));
    loops
}

/// Groups adjacent dims `lo..hi` that every view can merge; returns the group boundaries.
fn merge_groups(lo: usize, hi: usize, can_merge: impl Fn(usize) -> bool) -> Vec<(usize, usize)> {
    let mut groups = Vec::new();
    let mut start = lo;
    for d in lo..hi {
        if d + 1 == hi || !can_merge(d) {
            groups.push((start, d + 1));
            start = d + 1;
        }
    }
    groups
}

pub(super) fn product(dims: &[Dim]) -> Dim {
    dims.iter().fold(Dim::Const(1), |a, d| &a * d)
}

pub(super) fn max_sym_expr(e: &IExpr) -> Option<u32> {
    match e {
        IExpr::Sym(n) => Some(*n),
        IExpr::Const(_) | IExpr::Var(_) => None,
        IExpr::Add(a, b)
        | IExpr::Mul(a, b)
        | IExpr::Div(a, b)
        | IExpr::Mod(a, b)
        | IExpr::Lt(a, b)
        | IExpr::And(a, b) => max_sym_expr(a).max(max_sym_expr(b)),
    }
}

fn max_sym_stmts(stmts: &[Stmt]) -> Option<u32> {
    let mut m = None;
    for s in stmts {
        let here = match s {
            Stmt::Let { inst: Inst::Gather { base, stride, size, .. }, .. }
            | Stmt::ScatterAdd { base, stride, size, .. } => {
                max_sym_expr(base).max(max_sym_expr(stride)).max(max_sym_expr(size))
            }
            Stmt::Let { inst: Inst::Load { index, mask, .. }, .. } => {
                max_sym_expr(index).max(mask.as_ref().and_then(max_sym_expr))
            }
            Stmt::Let { inst: Inst::Index(e), .. } => max_sym_expr(e),
            Stmt::Loop { extent, body, .. } => max_sym_expr(extent).max(max_sym_stmts(body)),
            Stmt::Store { index, .. } => max_sym_expr(index),
            _ => None,
        };
        m = m.max(here);
    }
    m
}

/// One piece of a concatenation: the node it comes from and its `[lo, hi)` range along the axis.
pub(super) type CatPiece = (NodeId, Dim, Dim);

/// The pieces of a concatenation `n`: a chain of `add` (`or` for bool) nodes without buffers
/// whose leaves are zero-padded along one axis to ranges that tile it (the facade's `cat`).
/// Returns the axis and, per piece, its leaf and its `[lo, hi)` range along the axis; `None` if
/// `n` is not such a chain.
pub(super) fn cat_pieces(g: &Graph, bufs: &Buffers, n: NodeId) -> Option<(usize, Vec<CatPiece>)> {
    let combine = match g.op(n) {
        Op::Binary(op @ (BinaryOp::Add | BinaryOp::Or)) => *op,
        _ => return None,
    };
    let dtype = g.ty(n).dtype;
    let shape = g.ty(n).shape.to_vec();
    let mut leaves = Vec::new();
    let mut stack = vec![n];
    while let Some(m) = stack.pop() {
        air::work::tick();
        match g.op(m) {
            Op::Binary(op) if *op == combine && (m == n || !bufs.contains_key(m)) => {
                stack.extend(g.inputs(m).iter().rev().copied());
            }
            Op::Pad(p) if p.value.cast(dtype) == zero_of(dtype) && g.ty(m).shape.as_ref() == shape.as_slice() => {
                leaves.push((m, p.padding.clone()));
            }
            _ => return None,
        }
    }
    // The axis along which every leaf is padded to a range, the ranges tiling it in some order.
    (0..shape.len()).find_map(|axis| {
        let mut left: Vec<CatPiece> =
            leaves.iter().map(|(m, pad)| (*m, pad[axis].0, shape[axis] - pad[axis].1)).collect();
        // Follow the ranges from 0: each piece starts where the previous one ended.
        let mut pieces = Vec::with_capacity(left.len());
        let mut at = Dim::Const(0);
        while !left.is_empty() {
            air::work::add(left.len() as u64);
            let next = left.iter().position(|(_, lo, hi)| *lo == at && lo != hi)?;
            let piece = left.swap_remove(next);
            at = piece.2;
            pieces.push(piece);
        }
        (pieces.len() > 1 && at == shape[axis]).then_some((axis, pieces))
    })
}

/// Builds the loop kernel that computes `root` (expanded even if it has a buffer when `expand`)
/// into the contiguous buffer `target`. Returns the kernel and its argument buffers. With
/// `window` (a `[start, end)` range per axis of `root`) the kernel computes only that part of
/// `root`, into the same positions of `target`: one piece of a concatenation written into its
/// slice of the output.
#[allow(clippy::too_many_arguments)]
pub(super) fn loop_kernel(
    g: &Graph,
    bufs: &Buffers,
    symbols: &[Symbol],
    root: NodeId,
    expand: bool,
    target: BufId,
    window: Option<&[(Dim, Dim)]>,
    rows: &SecondaryMap<NodeId, ()>,
    checks: &mut Vec<DataCheck>,
) -> Result<(Kernel, Vec<BufId>), LowerError> {
    let mut tb = TreeBuilder { g, bufs, rows, reduce: None };
    let mut pending: Vec<Movement> = window.iter().map(|w| Movement::Shrink(w.to_vec())).collect();
    let mut tree = tb.build(root, &mut pending, None, false, expand)?;
    let root_shape: Vec<Dim> = match window {
        None => g.ty(root).shape.to_vec(),
        Some(w) => w.iter().map(|(a, b)| b - a).collect(),
    };
    let (outer, red): (Vec<Dim>, Vec<Dim>) = match &tb.reduce {
        None => (root_shape.clone(), Vec::new()),
        Some(r) => (
            (0..r.in_shape.len()).filter(|a| !r.axes.contains(a)).map(|a| r.in_shape[a]).collect(),
            r.axes.iter().map(|&a| r.in_shape[a]).collect(),
        ),
    };
    // An element-wise kernel whose reads are plain reshapes of strided views (a flattened
    // window) loops over the finer shape below them, so those reads index without div/mod.
    let outer = match &tb.reduce {
        None => refined_loops(&mut tree, outer),
        Some(_) => outer,
    };
    let mut store = match window {
        None => ViewStack::contiguous(&outer),
        Some(w) => ViewStack::contiguous(&g.ty(root).shape)
            .through(&[Movement::Shrink(w.to_vec()), Movement::Reshape(outer.iter().cloned().collect())]),
    };
    if tb.reduce.is_some() {
        let reshape = Movement::Reshape(outer.iter().cloned().collect());
        tree.for_each_view(&mut |v, inner| {
            if !inner {
                v.apply(&reshape);
            }
        });
    }
    // Merge adjacent loop dims that every view is contiguous across.
    let (n_o, n_r) = (outer.len(), red.len());
    // Dim `d` merges with `d + 1` where every view allows it (a reduced dim: every view read
    // inside the reduce loops), found in one walk of the tree's views.
    let mut merges: Vec<bool> =
        (0..n_o + n_r).map(|d| if d < n_o { d + 1 < n_o && store.mergeable(d) } else { d + 1 < n_o + n_r }).collect();
    tree.for_each_view(&mut |v, inner| {
        for (d, m) in merges.iter_mut().enumerate() {
            if *m && (d < n_o || inner) {
                *m = v.mergeable(d);
            }
        }
    });
    let (outer_groups, red_groups) = (merge_groups(0, n_o, |d| merges[d]), merge_groups(n_o, n_o + n_r, |d| merges[d]));
    let full: Vec<Dim> = outer.iter().chain(&red).cloned().collect();
    let sizes = |groups: &[(usize, usize)]| -> Vec<Dim> {
        groups.iter().map(|&(a, b)| product(&full[a..b])).filter(|d| d.as_const() != Some(1)).collect()
    };
    let (outer_sizes, red_sizes) = (sizes(&outer_groups), sizes(&red_groups));
    let all_sizes: Vec<Dim> = outer_sizes.iter().chain(&red_sizes).cloned().collect();
    let to_outer = Movement::Reshape(outer_sizes.iter().cloned().collect());
    let to_all = Movement::Reshape(all_sizes.iter().cloned().collect());
    store.apply(&to_outer);
    tree.for_each_view(&mut |v, inner| v.apply(if inner { &to_all } else { &to_outer }));

    let (n_outer, n_total) = (outer_sizes.len(), all_sizes.len());
    let mut cx = IndexCx::new(symbols.to_vec());
    cx.extents = all_sizes.iter().map(|d| d.as_const()).collect();
    let extents: Vec<IExpr> = all_sizes.iter().map(|d| cx.dim(d)).collect::<Result<_, _>>()?;
    cx.extent_exprs = extents.clone();
    // Statements never go above the outermost loop, nor above an outer loop of constant extent
    // 0 (which makes the whole kernel a no-op: its hoisted loads would read an empty input; see
    // `KExpr::Reduce` for an empty reduced axis).
    let min_level = if cx.empty_loop(0..n_outer) { n_outer } else { usize::from(n_outer > 0) };
    let mut em = Emitter {
        cx,
        params: Vec::new(),
        pre: vec![Vec::new(); n_total + 1],
        post: vec![Vec::new(); n_total + 1],
        // Sized for a fused body of a few dozen instructions, so that it rarely grows.
        cse: HashMap::with_capacity_and_hasher(64, Default::default()),
        next_reg: 0,
        next_acc: 0,
        min_level,
        n_outer,
        n_total,
        checks: std::mem::take(checks),
        guards: Vec::new(),
        frames: Vec::new(),
        row_slots: HashMap::default(),
    };
    let dtype = g.ty(root).dtype;
    em.param(target, dtype, Access::Write);
    let value = em.emit(&tree)?;
    let (index, _) = store.index(&em.vars(false), &em.cx)?;
    em.post[n_outer].push(Stmt::Store { buf: 0, index, value: value.reg });
    let mut body = em.assemble(0, &extents);
    crate::kir::drop_empty_loops(&mut body);
    renumber(&mut body, &mut vec![Reg(u32::MAX); em.next_reg as usize], &mut 0);
    let n_syms = max_sym_stmts(&body).map_or(0, |m| m + 1);
    *checks = em.checks;
    let (args, params): (Vec<BufId>, Vec<Param>) = em.params.into_iter().unzip();
    Ok((Kernel::Loops(LoopKernel { params, n_syms, body }), args))
}

/// The kernel of a `scatter_add` node `n` over the buffers of its index and values, writing
/// `target` (see the module docs): `out` has shape `[O, A, I]` around the axis and the index
/// `[O, K, I]`; `for p in 0..O*I parallel { out[o, .., i] = 0; for k in 0..K: out[o, index[o, k,
/// i], i] += values[o, k, i] }`.
pub(super) fn scatter_kernel(
    g: &Graph,
    bufs: &Buffers,
    symbols: &[Symbol],
    n: NodeId,
    target: BufId,
    checks: &mut Vec<DataCheck>,
) -> Result<(Kernel, Vec<BufId>), LowerError> {
    let Op::ScatterAdd(sa) = g.op(n) else {
        return Err(LowerError::InvalidGraph(format!("{n}: not a scatter_add")));
    };
    let (index_node, values_node) = (g.inputs(n)[0], g.inputs(n)[1]);
    let (Some(&index_buf), Some(&values_buf)) = (bufs.get(index_node), bufs.get(values_node)) else {
        return Err(LowerError::InvalidGraph(format!("{n}: the operands of a scatter_add have no buffers")));
    };
    let cx = IndexCx::new(symbols.to_vec());
    let ax = sa.axis;
    let outer = cx.dim(&product(&sa.shape[..ax]))?;
    let size_dim = sa.shape[ax];
    let size = cx.dim(&size_dim)?;
    let k = cx.dim(&g.ty(index_node).shape[ax])?;
    let inner = cx.dim(&product(&sa.shape[ax + 1..]))?;
    let (index_dtype, dtype) = (g.ty(index_node).dtype, g.ty(n).dtype);
    checks.push(DataCheck { op: "scatter_add".into(), kind: CheckKind::Index { size: size_dim } });
    let check = checks.len() as u32 - 1;
    // Parameters: b0 the output, b1 the index, b2 the values, b3 the status buffer.
    let params = vec![
        Param { dtype, access: Access::Write },
        Param { dtype: index_dtype, access: Access::Read },
        Param { dtype, access: Access::Read },
        Param { dtype: DType::I32, access: Access::Write },
    ];
    let p = IExpr::var(Var(0));
    let (o, i) = (IExpr::div(p.clone(), inner.clone()), IExpr::rem(p, inner.clone()));
    // out[o, a, i] = o*A*I + a*I + i; index[o, k, i] = o*K*I + k*I + i.
    let out_base = IExpr::add(IExpr::mul(o.clone(), IExpr::mul(size.clone(), inner.clone())), i.clone());
    let in_base = IExpr::add(IExpr::mul(o, IExpr::mul(k.clone(), inner.clone())), i);
    let zero_loop = Stmt::Loop {
        var: Var(1),
        extent: size.clone(),
        parallel: false,
        body: vec![
            Stmt::Let { reg: Reg(0), dtype, inst: Inst::Const(zero_of(dtype)) },
            Stmt::Store {
                buf: 0,
                index: IExpr::add(out_base.clone(), IExpr::mul(IExpr::var(Var(1)), inner.clone())),
                value: Reg(0),
            },
        ],
    };
    let at = IExpr::add(in_base, IExpr::mul(IExpr::var(Var(2)), inner.clone()));
    let add_loop = Stmt::Loop {
        var: Var(2),
        extent: k,
        parallel: false,
        body: vec![
            Stmt::Let {
                reg: Reg(1),
                dtype: index_dtype,
                inst: Inst::Load { buf: 1, index: at.clone(), mask: None, other: zero_of(index_dtype) },
            },
            Stmt::Let { reg: Reg(2), dtype, inst: Inst::Load { buf: 2, index: at, mask: None, other: zero_of(dtype) } },
            Stmt::ScatterAdd {
                buf: 0,
                base: out_base,
                index: Reg(1),
                stride: inner.clone(),
                size,
                value: Reg(2),
                status: 3,
                check,
            },
        ],
    };
    let body = vec![Stmt::Loop {
        var: Var(0),
        extent: IExpr::mul(outer, inner),
        parallel: true,
        body: vec![zero_loop, add_loop],
    }];
    let n_syms = max_sym_stmts(&body).map_or(0, |m| m + 1);
    Ok((Kernel::Loops(LoopKernel { params, n_syms, body }), vec![target, index_buf, values_buf, STATUS_BUF]))
}

/// Renumbers registers in statement order, so that dumps read top to bottom and equal kernels
/// built in different orders compare equal.
fn renumber(stmts: &mut [Stmt], map: &mut [Reg], next: &mut u32) {
    let get = |map: &[Reg], r: &mut Reg| {
        *r = map[r.0 as usize];
        assert_ne!(r.0, u32::MAX, "a register is read before it is defined");
    };
    for s in stmts {
        match s {
            Stmt::Let { reg, inst, .. } => {
                match inst {
                    Inst::Unary(_, a) | Inst::Cast(a) => get(map, a),
                    Inst::Binary(_, a, b) => {
                        get(map, a);
                        get(map, b);
                    }
                    Inst::Where(c, a, b) => {
                        get(map, c);
                        get(map, a);
                        get(map, b);
                    }
                    Inst::Gather { index, .. } => get(map, index),
                    Inst::Load { .. } | Inst::Const(_) | Inst::Index(_) | Inst::ReadAcc(_) => {}
                }
                map[reg.0 as usize] = Reg(*next);
                *reg = Reg(*next);
                *next += 1;
            }
            Stmt::Loop { body, .. } => renumber(body, map, next),
            Stmt::AccUpdate { value, .. } | Stmt::Store { value, .. } => get(map, value),
            Stmt::ScatterAdd { index, value, .. } => {
                get(map, index);
                get(map, value);
            }
            Stmt::Check { cond, value, .. } => {
                get(map, cond);
                get(map, value);
            }
            Stmt::AccInit { .. } => {}
        }
    }
}
