//! Scheduling: decides which nodes of a graph get a buffer (kernel boundaries), then emits one
//! kernel per such node, in topological order, over planned buffers.
//!
//! # Fusion heuristics (`decide`)
//!
//! A node is *materialized* (computed by its own kernel into a buffer) when
//! - it is a graph output (outputs are always contiguous `Output` buffers; an output that is an
//!   input, or a view of one, gets a copy kernel);
//! - it is a reduce, unless its only consumer is an element-wise node reading it directly (then the
//!   reduce loop runs inside that consumer's kernel and the consumer's other element-wise work
//!   becomes the reduce's epilogue: `sum(x) * (1/n)` is one kernel);
//! - it is a recognised contraction, which becomes a `Kernel::Matmul`: a `reduce sum` of
//!   `mul(x, y)` with `x` and `y` affine views (broadcast, permuted, reshaped) of buffers, whose
//!   product-space axes split into batch (kept, both operands vary or neither), M (kept, only `x`
//!   varies), N (kept, only `y` varies) and K (reduced, both vary) groups that each collapse into
//!   one strided dim (see `contraction`). This covers the front end's matmul, its gradients (a sum
//!   over the first or a middle axis) and einsum-style contractions. The result is written in the
//!   reduce's own row-major layout; its operands' base nodes are materialized too. An `add`
//!   consuming the matmul (through reshapes only) takes the matmul over: the other addend is
//!   written into the result buffer first and the matmul accumulates onto it;
//! - it is element-wise with several consumers and its fused expression costs more than
//!   `RECOMPUTE_MAX` ops (else every consumer recomputes it: cheaper than a round trip through
//!   memory), or it is read through a broadcasting `expand` and costs more than `BROADCAST_MAX`
//!   (recomputing it per broadcast element would multiply the work);
//! - it is element-wise and carries a fused reduce but has several consumers or is read through a
//!   view (a reduce result cannot be recomputed or re-indexed inside another loop);
//! - its fused expression tree would be deeper than `MAX_DEPTH` (bounds kernel size and the
//!   recursion that builds it).
//!
//! Movement ops are never materialized (except as outputs or to give a matmul an affine operand
//! that fits a GEMM): they become index arithmetic (`view::ViewStack`) in the kernels that read
//! them. `const` and `iota` leaves are never buffers: they become `Inst::Const`/`Inst::Index`. With
//! `fuse = false` every element-wise and reduce node is its own kernel (movement ops still fuse as
//! views), which gives the memory planner the most buffers to place.
//!
//! # Kernel emission (`KernelBuilder`)
//!
//! The root's expression tree is built down to materialized nodes (loads through views), leaves
//! and at most one fused reduce. The loop space is the root's shape (for a reduce kernel: the kept
//! dims, then the reduced dims); adjacent loop dims are merged whenever every view of the kernel
//! is contiguous across them, so element-wise kernels over contiguous data loop once over numel.
//! Instructions are hash-consed (CSE) and placed at the outermost loop level their operands allow
//! (loop-invariant loads of a reduce kernel sit outside the reduce loop). The outermost loop over
//! independent output elements is marked `parallel`. Identical kernels are stored once.
//!
//! # Data-dependent indexing and checks
//!
//! A `gather` is always materialized, with its `src` a buffer: its kernel computes the index
//! expression (fused) and reads `src` with an `Inst::Gather` (row-major `src`, the gathered axis's
//! stride times the index). A `scatter_add` is its own kernel over buffers (`scatter_kernel`):
//! the top-level parallel loop runs over the output positions off the axis, which no two index
//! positions can share, and for each zeroes the output line along the axis, then accumulates the
//! index positions of that line in order. Integer `div`/`mod` get an `Stmt::Check` of their
//! divisor. Every check is numbered in `Program::checks`; kernels that check take the program's
//! one `BufferKind::Status` buffer as a parameter.

use std::collections::{HashMap, HashSet};

use air::{BinaryOp, DType, Dim, Graph, NodeId, Op, OpClass, ReduceOp, Scalar, Symbol, UnaryOp};

use crate::error::LowerError;
use crate::kir::{Acc, Access, IExpr, Inst, Kernel, LoopKernel, MatOperand, MatmulKernel, Param, Reg, Stmt, Var};
use crate::program::{BufId, BufferInfo, BufferKind, CheckKind, DataCheck, Program, Step};
use crate::view::{IndexCx, Movement, View, ViewStack, row_major};

/// Element-wise nodes with several consumers are recomputed by each while their fused expression
/// has at most this many ops.
pub const RECOMPUTE_MAX: u32 = 8;
/// Element-wise nodes read through a broadcasting expand are recomputed while they cost at most
/// this many ops.
pub const BROADCAST_MAX: u32 = 4;

/// The placeholder of the status buffer while kernels are emitted (replaced at the end of `emit`).
const STATUS_BUF: BufId = BufId(u32::MAX);

/// Expression trees deeper than this are cut by a buffer, which bounds the recursion of kernel
/// building (and the size of one kernel) for very long element-wise chains.
pub const MAX_DEPTH: u32 = 64;

/// What to fuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuseOptions {
    /// Fuse element-wise chains, reductions and epilogues (false: one kernel per non-view op).
    pub fuse: bool,
    /// Recognise matmuls (only when fusing).
    pub matmul: bool,
}

/// One operand of a recognised matmul: `base`'s buffer seen through `chain` (top op first).
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulOperand {
    /// The materialized node whose buffer the operand reads.
    pub base: NodeId,
    /// The movement ops between `base` and the matmul, top op first (empty: `base` itself).
    pub chain: Vec<Movement>,
}

/// How a materialized node is computed.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// A loop kernel rooted at the node.
    Loops,
    /// A matmul kernel for the reduce node `reduce` (the node itself, or, with `bias`, the node is
    /// `add(reshape*(reduce), bias)` and `bias` is written into the result first).
    Matmul {
        /// The `reduce sum` node that the matmul computes.
        reduce: NodeId,
        /// The left operand (`[.., M, K]`).
        a: MatmulOperand,
        /// The right operand (`[.., K, N]`).
        b: MatmulOperand,
        /// The node added to the product, if the matmul absorbed a bias add.
        bias: Option<NodeId>,
    },
}

/// The fusion decisions for a graph.
#[derive(Clone, Debug, Default)]
pub struct Decisions {
    /// Materialized nodes and how each is computed.
    pub plans: HashMap<NodeId, Plan>,
    /// The live nodes in topological order.
    pub order: Vec<NodeId>,
    /// `base -> output`: the materialized `base` is written straight into the buffer of the graph
    /// output, a reshape (chain) of it that nothing else reads, instead of being copied there.
    pub aliases: HashMap<NodeId, NodeId>,
}

fn is_movement(op: &Op) -> bool {
    op.class() == OpClass::Movement
}

/// The movement op of a node, if it is one.
pub fn movement(op: &Op) -> Option<Movement> {
    Some(match op {
        Op::Reshape(r) => Movement::Reshape(r.shape.to_vec()),
        Op::Permute(p) => Movement::Permute(p.perm.to_vec()),
        Op::Expand(e) => Movement::Expand(e.shape.to_vec()),
        Op::Pad(p) => Movement::Pad(p.padding.clone()),
        Op::Shrink(s) => Movement::Shrink(s.ranges.clone()),
        _ => return None,
    })
}

/// Every symbol the graph's live nodes mention, sorted by name: `Program::symbols`.
pub fn graph_symbols(g: &Graph, order: &[NodeId]) -> Vec<Symbol> {
    let mut syms: Vec<Symbol> = Vec::new();
    let mut add = |d: &Dim| syms.extend(d.symbols());
    for &n in order {
        let node = g.node(n);
        node.ty.shape.iter().for_each(&mut add);
        match &node.op {
            Op::Reshape(r) => r.shape.iter().for_each(&mut add),
            Op::Expand(e) => e.shape.iter().for_each(&mut add),
            Op::Pad(p) => p.padding.iter().for_each(|(a, b)| {
                add(a);
                add(b)
            }),
            Op::Shrink(s) => s.ranges.iter().for_each(|(a, b)| {
                add(a);
                add(b)
            }),
            _ => {}
        }
    }
    syms.sort();
    syms.dedup();
    syms
}

struct Decider<'a> {
    g: &'a Graph,
    opts: FuseOptions,
    live: HashSet<NodeId>,
    outputs: HashSet<NodeId>,
    /// Consumers counted through movement ops, plus output uses.
    consumers: HashMap<NodeId, u32>,
    /// Whether some consumer reads the node through a numel-increasing expand.
    broadcast: HashMap<NodeId, bool>,
    /// The cost of reading a node inside a kernel (1 for a buffer).
    cost: HashMap<NodeId, u32>,
    /// The depth of a non-materialized node's expression tree (0 for a buffer).
    depth: HashMap<NodeId, u32>,
    /// The fused reduce a non-materialized node's expression contains.
    carries: HashMap<NodeId, NodeId>,
    plans: HashMap<NodeId, Plan>,
}

impl Decider<'_> {
    fn users(&self, n: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        air::work::add(self.g.users(n).len() as u64);
        self.g.users(n).iter().copied().filter(|u| self.live.contains(u))
    }

    fn materialize(&mut self, n: NodeId) {
        if matches!(self.g.op(n), Op::Input(_)) {
            return;
        }
        self.plans.entry(n).or_insert(Plan::Loops);
        self.cost.insert(n, 1);
        self.depth.insert(n, 0);
        self.carries.remove(&n);
    }

    fn is_buffer(&self, n: NodeId) -> bool {
        self.plans.contains_key(&n) || matches!(self.g.op(n), Op::Input(_))
    }

    fn read_cost(&self, n: NodeId) -> u32 {
        self.cost.get(&n).copied().unwrap_or(1)
    }

    fn run(&mut self, order: &[NodeId]) {
        for &n in order.iter().rev() {
            air::work::add(1 + self.g.outputs().len() as u64);
            let mut count = self.g.outputs().iter().filter(|&&o| o == n).count() as u32;
            let mut bcast = false;
            for u in self.users(n).collect::<Vec<_>>() {
                let op = self.g.op(u);
                if is_movement(op) {
                    count += self.consumers[&u];
                    bcast |= self.broadcast[&u];
                    if let Op::Expand(_) = op {
                        bcast |= self.g.ty(u).numel() != self.g.ty(n).numel();
                    }
                } else {
                    count += 1;
                }
            }
            self.consumers.insert(n, count);
            self.broadcast.insert(n, bcast);
        }
        for &n in order {
            air::work::add(1 + self.g.inputs(n).len() as u64);
            self.visit(n);
            if !self.plans.contains_key(&n) {
                let d = 1 + self.g.inputs(n).iter().map(|i| self.depth.get(i).copied().unwrap_or(0)).max().unwrap_or(0);
                self.depth.insert(n, d);
                if d > MAX_DEPTH {
                    self.materialize(n);
                }
            }
            if self.outputs.contains(&n) {
                self.materialize(n);
            }
        }
    }

    fn visit(&mut self, n: NodeId) {
        let g = self.g;
        let inputs = g.inputs(n).to_vec();
        match g.op(n).class() {
            OpClass::Leaf => {
                let c = if matches!(g.op(n), Op::Const(_)) { 0 } else { 1 };
                self.cost.insert(n, c);
            }
            OpClass::Movement => {
                if self.carries.contains_key(&inputs[0]) {
                    self.materialize(inputs[0]);
                }
                self.cost.insert(n, self.read_cost(inputs[0]));
            }
            OpClass::Elementwise => {
                if !self.opts.fuse {
                    self.materialize(n);
                    return;
                }
                let mut carried: Option<NodeId> = None;
                for &i in &inputs {
                    if let Some(&r) = self.carries.get(&i) {
                        match carried {
                            None => carried = Some(r),
                            Some(c) if c == r => {}
                            Some(_) => self.materialize(i),
                        }
                    }
                }
                let cost = 1 + inputs.iter().map(|&i| self.read_cost(i)).sum::<u32>();
                self.cost.insert(n, cost);
                if let Some(r) = carried {
                    self.carries.insert(n, r);
                }
                if self.try_matmul_bias(n) {
                    return;
                }
                let many = self.consumers[&n] > 1;
                if (many && (carried.is_some() || cost > RECOMPUTE_MAX)) || (self.broadcast[&n] && cost > BROADCAST_MAX)
                {
                    self.materialize(n);
                }
            }
            OpClass::Reduce => {
                if self.carries.contains_key(&inputs[0]) {
                    self.materialize(inputs[0]);
                }
                if self.opts.fuse && self.opts.matmul && self.try_matmul(n) {
                    return;
                }
                let users: Vec<NodeId> = self.users(n).collect();
                let fusable = self.opts.fuse
                    && self.consumers[&n] == 1
                    && users.len() == 1
                    && g.op(users[0]).class() == OpClass::Elementwise
                    && !self.outputs.contains(&n);
                if fusable {
                    self.cost.insert(n, 1);
                    self.carries.insert(n, n);
                } else {
                    self.materialize(n);
                }
            }
            OpClass::Index => {
                // `gather` reads a row-major `src` buffer and fuses its index expression;
                // `scatter_add` reads two buffers. Both are kernels of their own.
                self.materialize(inputs[0]);
                match g.op(n) {
                    Op::Gather(_) if self.carries.contains_key(&inputs[1]) => self.materialize(inputs[1]),
                    Op::Gather(_) => {}
                    _ => self.materialize(inputs[1]),
                }
                self.materialize(n);
            }
        }
    }

    /// The candidate operands of a matmul read through `top`, fewest copies first: each is a node
    /// to be a buffer (the caller materializes it) and the chain of movement ops above it, whose
    /// composed view is affine. The first keeps the longest chain; later ones cut it lower, so
    /// that a movement node gets a buffer in its own row-major layout (a copy) where the longer
    /// view does not fit a GEMM. No cut lands above a broadcasting expand, which would
    /// materialize the broadcast.
    fn matmul_operands(&self, top: NodeId) -> Vec<(MatmulOperand, ViewStack)> {
        let g = self.g;
        let mut nodes = Vec::new();
        let mut cur = top;
        while is_movement(g.op(cur)) && !self.is_buffer(cur) {
            air::work::tick();
            nodes.push(cur);
            cur = g.inputs(cur)[0];
        }
        let view_at = |cut: usize| {
            air::work::add(1 + cut as u64);
            let base = if cut == nodes.len() { cur } else { nodes[cut] };
            let chain: Vec<Movement> = nodes[..cut].iter().filter_map(|&m| movement(g.op(m))).collect();
            let view = ViewStack::contiguous(&g.ty(base).shape).through(chain.iter().rev());
            (MatmulOperand { base, chain }, view)
        };
        let shape = &g.ty(top).shape;
        let (_, full) = view_at(nodes.len());
        let broadcast = |v: &ViewStack, d: usize| !is_one(&shape[d]) && is_zero(&v.top().strides[d]);
        let mut out = Vec::new();
        for cut in (0..=nodes.len()).rev() {
            let (op, view) = view_at(cut);
            let lost = (0..shape.len()).any(|d| broadcast(&full, d) && !broadcast(&view, d));
            if lost {
                break;
            }
            if !matches!(g.op(op.base), Op::Const(_) | Op::Iota(_)) && view.is_affine() {
                out.push((op, view));
            }
        }
        out
    }

    /// `reduce sum(mul(x, y))` over affine views of buffers whose axes split into GEMM groups
    /// (see `contraction`) becomes a matmul; its operands' bases are materialized. Where the
    /// longest views do not fit, an operand is read from a copy of a movement node in between.
    fn try_matmul(&mut self, n: NodeId) -> bool {
        let g = self.g;
        let Op::Reduce(r) = g.op(n) else { return false };
        let x = g.inputs(n)[0];
        if r.op != ReduceOp::Sum || g.ty(n).dtype != DType::F32 || g.op(x) != &Op::Binary(BinaryOp::Mul) {
            return false;
        }
        let space = g.ty(x).shape.to_vec();
        let (cands_p, cands_q) = (self.matmul_operands(g.inputs(x)[0]), self.matmul_operands(g.inputs(x)[1]));
        let mut pairs: Vec<(usize, usize)> =
            (0..cands_p.len()).flat_map(|i| (0..cands_q.len()).map(move |j| (i, j))).collect();
        pairs.sort_by_key(|&(i, j)| (usize::from(i > 0) + usize::from(j > 0), i + j));
        let mut plan = None;
        for (i, j) in pairs {
            air::work::tick();
            let ((op_p, vp), (op_q, vq)) = (&cands_p[i], &cands_q[j]);
            let (sp, sq) = (&vp.top().strides, &vq.top().strides);
            plan = match (contraction(&space, &r.axes, sp, sq), contraction(&space, &r.axes, sq, sp)) {
                (Some(c), Some(swapped)) if !c.row_major_c(&space, &r.axes) && swapped.row_major_c(&space, &r.axes) => {
                    Some((op_q.clone(), op_p.clone()))
                }
                (Some(_), _) => Some((op_p.clone(), op_q.clone())),
                (None, Some(_)) => Some((op_q.clone(), op_p.clone())),
                (None, None) => None,
            };
            if plan.is_some() {
                break;
            }
        }
        let Some((a, b)) = plan else { return false };
        for op in [&a, &b] {
            if !matches!(g.op(op.base), Op::Input(_)) {
                self.materialize(op.base);
            }
        }
        self.plans.insert(n, Plan::Matmul { reduce: n, a, b, bias: None });
        self.cost.insert(n, 1);
        true
    }

    /// Outputs that are reshapes of a materialized node read nowhere else take that node's place.
    fn alias_outputs(&mut self) -> HashMap<NodeId, NodeId> {
        let g = self.g;
        let mut aliases = HashMap::new();
        for &o in g.outputs() {
            air::work::tick();
            if self.plans.get(&o) != Some(&Plan::Loops) || !matches!(g.op(o), Op::Reshape(_)) {
                continue;
            }
            let mut cur = g.inputs(o)[0];
            while matches!(g.op(cur), Op::Reshape(_))
                && !self.plans.contains_key(&cur)
                && !self.outputs.contains(&cur)
                && self.users(cur).count() == 1
            {
                air::work::tick();
                cur = g.inputs(cur)[0];
            }
            if self.plans.contains_key(&cur)
                && !self.outputs.contains(&cur)
                && self.users(cur).count() == 1
                && !aliases.contains_key(&cur)
            {
                self.plans.remove(&o);
                aliases.insert(cur, o);
            }
        }
        aliases
    }

    /// `add(reshape*(matmul), bias)` with the matmul read only there: the add becomes the matmul,
    /// accumulating onto `bias`.
    fn try_matmul_bias(&mut self, n: NodeId) -> bool {
        let g = self.g;
        if g.op(n) != &Op::Binary(BinaryOp::Add) || g.ty(n).dtype != DType::F32 {
            return false;
        }
        for (k, &start) in g.inputs(n).iter().enumerate() {
            let mut cur = start;
            let mut ok = true;
            while matches!(g.op(cur), Op::Reshape(_)) && !self.plans.contains_key(&cur) {
                air::work::tick();
                ok &= self.users(cur).count() == 1;
                cur = g.inputs(cur)[0];
            }
            let other = g.inputs(n)[1 - k];
            // Only a matmul can take the bias; test that first, since counting the users of a
            // widely shared node (a constant read by every add) per add would be O(N^2).
            if !matches!(self.plans.get(&cur), Some(Plan::Matmul { bias: None, .. })) {
                continue;
            }
            if !ok || other == start || self.users(cur).count() != 1 || self.outputs.contains(&cur) {
                continue;
            }
            if let Some(Plan::Matmul { reduce, a, b, bias: None }) = self.plans.get(&cur).cloned() {
                self.plans.remove(&cur);
                self.plans.insert(n, Plan::Matmul { reduce, a, b, bias: Some(other) });
                self.cost.insert(n, 1);
                self.carries.remove(&n);
                return true;
            }
        }
        false
    }
}

/// Decides kernel boundaries (see the module docs).
pub fn decide(g: &Graph, opts: FuseOptions) -> Decisions {
    let order = g.live_order();
    let mut d = Decider {
        g,
        opts,
        live: order.iter().copied().collect(),
        outputs: g.outputs().iter().copied().collect(),
        consumers: HashMap::new(),
        broadcast: HashMap::new(),
        cost: HashMap::new(),
        depth: HashMap::new(),
        carries: HashMap::new(),
        plans: HashMap::new(),
    };
    d.run(&order);
    let aliases = d.alias_outputs();
    Decisions { plans: d.plans, order, aliases }
}

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
    bufs: &'a HashMap<NodeId, BufId>,
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
            if self.bufs.contains_key(&cur) {
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
        if !expand && let Some(&buf) = self.bufs.get(&n) {
            return Ok(load(self, buf, pending));
        }
        let sub =
            |s: &mut Self, i: usize, pending: &mut Vec<Movement>| s.build(node.inputs[i], pending, None, inner, false);
        Ok(match &node.op {
            Op::Input(_) => match self.bufs.get(&n) {
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
                let ranges = p.padding.iter().zip(in_shape).map(|((b, _), s)| (b.clone(), b + s)).collect();
                pending.push(m);
                let x = self.build(node.inputs[0], pending, fold, inner, false);
                pending.pop();
                KExpr::Pad { dtype, view, ranges, value: p.value.cast(dtype), inner, x: Box::new(x?) }
            }
            Op::Gather(gather) => {
                let src = node.inputs[0];
                let Some(&buf) = self.bufs.get(&src) else {
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

/// Emits kir statements for an expression tree into a loop nest, level by level.
struct Emitter {
    cx: IndexCx,
    params: Vec<(BufId, Param)>,
    pre: Vec<Vec<Stmt>>,
    post: Vec<Vec<Stmt>>,
    cse: HashMap<(DType, Inst), Slot>,
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

    fn let_(&mut self, dtype: DType, inst: Inst, operands: &[Slot], exprs: &[&IExpr]) -> Slot {
        air::work::add(1 + operands.len() as u64);
        let key = (dtype, inst);
        if let Some(&s) = self.cse.get(&key) {
            return s;
        }
        let mut level = self.min_level;
        for e in exprs {
            level = level.max(var_level(e));
        }
        for s in operands {
            level = level.max(s.level);
        }
        let post = operands.iter().any(|s| s.post && s.level == level);
        let reg = Reg(self.next_reg);
        self.next_reg += 1;
        let slot = Slot { reg, level, post };
        let stmt = Stmt::Let { reg, dtype, inst: key.1.clone() };
        if post {
            self.post[level].push(stmt)
        } else {
            self.pre[level].push(stmt)
        }
        self.cse.insert(key, slot);
        slot
    }

    fn emit(&mut self, e: &KExpr) -> Result<Slot, LowerError> {
        Ok(match e {
            KExpr::Load { buf, dtype, view, other, inner } => {
                let (index, mask) = view.index(&self.vars(*inner), &self.cx)?;
                let p = self.param(*buf, *dtype, Access::Read);
                let exprs: Vec<IExpr> = std::iter::once(index.clone()).chain(mask.clone()).collect();
                let refs: Vec<&IExpr> = exprs.iter().collect();
                let other = if mask.is_some() { *other } else { zero_of(*dtype) };
                self.let_(*dtype, Inst::Load { buf: p, index, mask, other }, &[], &refs)
            }
            KExpr::Const { dtype, value } => self.let_(*dtype, Inst::Const(*value), &[], &[]),
            KExpr::Iota { dtype, view, axis, inner } => {
                let (idx, _) = view.indices(&self.vars(*inner), &self.cx)?;
                let e = idx[*axis].clone();
                self.let_(*dtype, Inst::Index(e.clone()), &[], &[&e])
            }
            KExpr::Pad { dtype, view, ranges, value, inner, x } => {
                let (idx, _) = view.indices(&self.vars(*inner), &self.cx)?;
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
                        let c = self.let_(DType::Bool, Inst::Index(c.clone()), &[], &[&c]);
                        let v = self.let_(*dtype, Inst::Const(*value), &[], &[]);
                        self.let_(*dtype, Inst::Where(c.reg, x.reg, v.reg), &[c, x, v], &[])
                    }
                }
            }
            KExpr::Unary { op, dtype, x } => {
                let x = self.emit(x)?;
                self.let_(*dtype, Inst::Unary(*op, x.reg), &[x], &[])
            }
            KExpr::Binary { op, dtype, a, b } => {
                let (a, b) = (self.emit(a)?, self.emit(b)?);
                let inst = Inst::Binary(*op, a.reg, b.reg);
                let checked = matches!(op, BinaryOp::Div | BinaryOp::Mod) && dtype.is_int();
                if checked && !self.cse.contains_key(&(*dtype, inst.clone())) {
                    let zero = self.let_(*dtype, Inst::Const(zero_of(*dtype)), &[], &[]);
                    let mut bad =
                        self.let_(DType::Bool, Inst::Binary(BinaryOp::CmpEq, b.reg, zero.reg), &[b, zero], &[]);
                    if let Some(g) = self.guards.iter().cloned().reduce(IExpr::and) {
                        let inside = self.let_(DType::Bool, Inst::Index(g.clone()), &[], &[&g]);
                        bad = self.let_(
                            DType::Bool,
                            Inst::Binary(BinaryOp::And, bad.reg, inside.reg),
                            &[bad, inside],
                            &[],
                        );
                    }
                    let (check, status) = self.check(op.name(), CheckKind::DivByZero);
                    let stmt = Stmt::Check { cond: bad.reg, value: b.reg, status, check };
                    if bad.post { self.post[bad.level].push(stmt) } else { self.pre[bad.level].push(stmt) }
                }
                self.let_(*dtype, inst, &[a, b], &[])
            }
            KExpr::Gather { buf, dtype, src_shape, axis, view, inner, index } => {
                let i = self.emit(index)?;
                let (coords, _) = view.indices(&self.vars(*inner), &self.cx)?;
                let strides = row_major(src_shape);
                let mut base = IExpr::Const(0);
                for (d, c) in coords.iter().enumerate().filter(|&(d, _)| d != *axis) {
                    base = IExpr::add(base, IExpr::mul(c.clone(), self.cx.dim(&strides[d])?));
                }
                let base = self.cx.canon(base);
                let stride = self.cx.dim(&strides[*axis])?;
                let size = self.cx.dim(&src_shape[*axis])?;
                let p = self.param(*buf, *dtype, Access::Read);
                let (check, status) = self.check("gather", CheckKind::Index { size: src_shape[*axis].clone() });
                let inst = Inst::Gather {
                    buf: p,
                    base: base.clone(),
                    index: i.reg,
                    stride: stride.clone(),
                    size: size.clone(),
                    status,
                    check,
                };
                self.let_(*dtype, inst, &[i], &[&base, &stride, &size])
            }
            KExpr::Where { dtype, c, a, b } => {
                let (c, a, b) = (self.emit(c)?, self.emit(a)?, self.emit(b)?);
                self.let_(*dtype, Inst::Where(c.reg, a.reg, b.reg), &[c, a, b], &[])
            }
            KExpr::Cast { dtype, x } => {
                let x = self.emit(x)?;
                self.let_(*dtype, Inst::Cast(x.reg), &[x], &[])
            }
            KExpr::Reduce { op, dtype, x } => {
                let half = matches!(dtype, DType::F16 | DType::BF16);
                let acc_dtype = if half { DType::F32 } else { *dtype };
                let acc = Acc(self.next_acc);
                self.next_acc += 1;
                self.pre[self.n_outer].push(Stmt::AccInit { acc, dtype: acc_dtype, op: *op });
                let mut v = self.emit(x)?;
                if half {
                    v = self.let_(DType::F32, Inst::Cast(v.reg), &[v], &[]);
                }
                self.pre[self.n_total].push(Stmt::AccUpdate { acc, value: v.reg });
                let reg = Reg(self.next_reg);
                self.next_reg += 1;
                self.post[self.n_outer].push(Stmt::Let { reg, dtype: acc_dtype, inst: Inst::ReadAcc(acc) });
                let read = Slot { reg, level: self.n_outer, post: true };
                if half { self.let_(*dtype, Inst::Cast(read.reg), &[read], &[]) } else { read }
            }
        })
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

fn product(dims: &[Dim]) -> Dim {
    dims.iter().fold(Dim::Const(1), |a, d| &a * d)
}

fn max_sym_expr(e: &IExpr) -> Option<u32> {
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

/// Builds the loop kernel that computes `root` (expanded even if it has a buffer when `expand`)
/// into the contiguous buffer `target`. Returns the kernel and its argument buffers.
fn loop_kernel(
    g: &Graph,
    bufs: &HashMap<NodeId, BufId>,
    symbols: &[Symbol],
    root: NodeId,
    expand: bool,
    target: BufId,
    checks: &mut Vec<DataCheck>,
) -> Result<(Kernel, Vec<BufId>), LowerError> {
    let mut tb = TreeBuilder { g, bufs, reduce: None };
    let mut tree = tb.build(root, &mut Vec::new(), None, false, expand)?;
    let root_shape: Vec<Dim> = g.ty(root).shape.to_vec();
    let (outer, red): (Vec<Dim>, Vec<Dim>) = match &tb.reduce {
        None => (root_shape.clone(), Vec::new()),
        Some(r) => (
            (0..r.in_shape.len()).filter(|a| !r.axes.contains(a)).map(|a| r.in_shape[a].clone()).collect(),
            r.axes.iter().map(|&a| r.in_shape[a].clone()).collect(),
        ),
    };
    let mut store = ViewStack::contiguous(&outer);
    if tb.reduce.is_some() {
        tree.for_each_view(&mut |v, inner| {
            if !inner {
                v.apply(&Movement::Reshape(outer.clone()));
            }
        });
    }
    // Merge adjacent loop dims that every view is contiguous across.
    let (n_o, n_r) = (outer.len(), red.len());
    let mut tops: Vec<(View, bool)> = vec![(store.top().clone(), false)];
    tree.for_each_view(&mut |v, inner| tops.push((v.top().clone(), inner)));
    let outer_groups = merge_groups(0, n_o, |d| tops.iter().all(|(v, _)| v.mergeable(d)));
    let red_groups =
        merge_groups(n_o, n_o + n_r, |d| tops.iter().filter(|(_, inner)| *inner).all(|(v, _)| v.mergeable(d)));
    let full: Vec<Dim> = outer.iter().chain(&red).cloned().collect();
    let sizes = |groups: &[(usize, usize)]| -> Vec<Dim> {
        groups.iter().map(|&(a, b)| product(&full[a..b])).filter(|d| d.as_const() != Some(1)).collect()
    };
    let (outer_sizes, red_sizes) = (sizes(&outer_groups), sizes(&red_groups));
    let all_sizes: Vec<Dim> = outer_sizes.iter().chain(&red_sizes).cloned().collect();
    store.apply(&Movement::Reshape(outer_sizes.clone()));
    tree.for_each_view(&mut |v, inner| {
        v.apply(&Movement::Reshape(if inner { all_sizes.clone() } else { outer_sizes.clone() }));
    });

    let (n_outer, n_total) = (outer_sizes.len(), all_sizes.len());
    let mut cx = IndexCx::new(symbols.to_vec());
    cx.extents = all_sizes.iter().map(|d| d.as_const()).collect();
    let extents: Vec<IExpr> = all_sizes.iter().map(|d| cx.dim(d)).collect::<Result<_, _>>()?;
    let mut em = Emitter {
        cx,
        params: Vec::new(),
        pre: vec![Vec::new(); n_total + 1],
        post: vec![Vec::new(); n_total + 1],
        cse: HashMap::new(),
        next_reg: 0,
        next_acc: 0,
        min_level: usize::from(n_outer > 0),
        n_outer,
        n_total,
        checks: std::mem::take(checks),
        guards: Vec::new(),
    };
    let dtype = g.ty(root).dtype;
    em.param(target, dtype, Access::Write);
    let value = em.emit(&tree)?;
    let (index, _) = store.index(&em.vars(false), &em.cx)?;
    em.post[n_outer].push(Stmt::Store { buf: 0, index, value: value.reg });
    let mut body = em.assemble(0, &extents);
    renumber(&mut body, &mut HashMap::new());
    let n_syms = max_sym_stmts(&body).map_or(0, |m| m + 1);
    *checks = em.checks;
    let (args, params): (Vec<BufId>, Vec<Param>) = em.params.into_iter().unzip();
    Ok((Kernel::Loops(LoopKernel { params, n_syms, body }), args))
}

/// The kernel of a `scatter_add` node `n` over the buffers of its index and values, writing
/// `target` (see the module docs): `out` has shape `[O, A, I]` around the axis and the index
/// `[O, K, I]`; `for p in 0..O*I parallel { out[o, .., i] = 0; for k in 0..K: out[o, index[o, k,
/// i], i] += values[o, k, i] }`.
fn scatter_kernel(
    g: &Graph,
    bufs: &HashMap<NodeId, BufId>,
    symbols: &[Symbol],
    n: NodeId,
    target: BufId,
    checks: &mut Vec<DataCheck>,
) -> Result<(Kernel, Vec<BufId>), LowerError> {
    let Op::ScatterAdd(sa) = g.op(n) else {
        return Err(LowerError::InvalidGraph(format!("{n}: not a scatter_add")));
    };
    let (index_node, values_node) = (g.inputs(n)[0], g.inputs(n)[1]);
    let (Some(&index_buf), Some(&values_buf)) = (bufs.get(&index_node), bufs.get(&values_node)) else {
        return Err(LowerError::InvalidGraph(format!("{n}: the operands of a scatter_add have no buffers")));
    };
    let cx = IndexCx::new(symbols.to_vec());
    let ax = sa.axis;
    let outer = cx.dim(&product(&sa.shape[..ax]))?;
    let size_dim = sa.shape[ax].clone();
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
fn renumber(stmts: &mut [Stmt], map: &mut HashMap<Reg, Reg>) {
    let get = |map: &HashMap<Reg, Reg>, r: &mut Reg| *r = map[r];
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
                let new = Reg(map.len() as u32);
                map.insert(*reg, new);
                *reg = new;
            }
            Stmt::Loop { body, .. } => renumber(body, map),
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

fn is_one(d: &Dim) -> bool {
    d.as_const() == Some(1)
}

fn is_zero(d: &Dim) -> bool {
    d.as_const() == Some(0)
}

/// The GEMM groups of a recognised contraction: axes of the product space (the shape of the
/// `mul` under the reduce), each group outermost first. A group collapses into one strided dim of
/// every view that reads it; an empty group is a dim of size 1.
#[derive(Clone, Debug, Default, PartialEq)]
struct Contraction {
    /// Kept axes both operands may vary along.
    batch: Vec<usize>,
    /// Kept axes only `a` varies along.
    m: Vec<usize>,
    /// Kept axes only `b` varies along.
    n: Vec<usize>,
    /// Reduced axes; both operands vary along them.
    k: Vec<usize>,
}

/// The row-major strides of a reduce's (keepdim) output, indexed by product-space axis.
fn output_strides(space: &[Dim], reduced: &[usize]) -> Vec<Dim> {
    let out: Vec<Dim> =
        space.iter().enumerate().map(|(d, s)| if reduced.contains(&d) { Dim::Const(1) } else { s.clone() }).collect();
    row_major(&out)
}

impl Contraction {
    /// Whether the output's innermost dim (of size > 1) is `n`'s innermost axis: `c` is then
    /// written row by row with unit column stride.
    fn row_major_c(&self, space: &[Dim], reduced: &[usize]) -> bool {
        let inner = (0..space.len()).rev().find(|d| !reduced.contains(d) && !is_one(&space[*d]));
        inner.is_some() && self.n.last() == inner.as_ref()
    }
}

/// The stride of `axes` (outermost first) collapsed into one dim of a view with `strides`, 0 for
/// no axes; `None` when they do not collapse.
fn collapse(space: &[Dim], strides: &[Dim], axes: &[usize]) -> Option<Dim> {
    for w in axes.windows(2) {
        if strides[w[0]] != &strides[w[1]] * &space[w[1]] {
            return None;
        }
    }
    Some(axes.last().map_or(Dim::Const(0), |&d| strides[d].clone()))
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
fn collapse_order(space: &[Dim], views: &[&[Dim]], axes: &[usize]) -> Option<Vec<usize>> {
    const MAX_PERMUTED: usize = 5;
    let mut order = axes.to_vec();
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
fn contraction(space: &[Dim], reduced: &[usize], sa: &[Dim], sb: &[Dim]) -> Option<Contraction> {
    const MAX_MOVABLE: usize = 8;
    let sc = output_strides(space, reduced);
    let mut base = Contraction::default();
    let mut movable = Vec::new();
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
    let mut masks: Vec<u32> = (0..subsets).collect();
    masks.sort_by_key(|m| m.count_ones());
    for mask in masks {
        let moved = |d: &usize| movable.iter().position(|x| x == d).is_some_and(|i| mask >> i & 1 == 1);
        let mut batch: Vec<usize> = base.batch.iter().chain(movable.iter().filter(|d| moved(d))).copied().collect();
        batch.sort_unstable();
        let m: Vec<usize> = base.m.iter().filter(|d| !moved(d)).copied().collect();
        let n: Vec<usize> = base.n.iter().filter(|d| !moved(d)).copied().collect();
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

fn matmul_kernel(
    g: &Graph,
    bufs: &HashMap<NodeId, BufId>,
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
            .get(&op.base)
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
    let size = |axes: &[usize]| product(&axes.iter().map(|&d| space[d].clone()).collect::<Vec<_>>());
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
    let c_row = if plan.m.is_empty() { &c_col * &n } else { collapsed(&sc, &plan.m)? };
    let c_batch = if plan.batch.is_empty() { &m * &n } else { collapsed(&sc, &plan.batch)? };
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

/// Emits the program for decided boundaries.
pub fn emit(g: &Graph, dec: &Decisions) -> Result<Program, LowerError> {
    let symbols = graph_symbols(g, &dec.order);
    let mut buffers: Vec<BufferInfo> = Vec::new();
    let mut bufs: HashMap<NodeId, BufId> = HashMap::new();
    let new_buf = |buffers: &mut Vec<BufferInfo>, n: NodeId, kind: BufferKind| {
        let t = g.ty(n);
        buffers.push(BufferInfo { dtype: t.dtype, numel: t.numel(), kind });
        BufId(buffers.len() as u32 - 1)
    };
    let mut inputs: Vec<(u32, NodeId)> = dec
        .order
        .iter()
        .filter_map(|&n| match g.op(n) {
            Op::Input(i) => Some((i.slot, n)),
            _ => None,
        })
        .collect();
    inputs.sort();
    for (slot, n) in inputs {
        let b = new_buf(&mut buffers, n, BufferKind::Input(slot));
        bufs.insert(n, b);
    }
    let mut outputs = Vec::new();
    let mut out_bufs: HashMap<NodeId, BufId> = HashMap::new();
    let mut copies = Vec::new();
    for (i, &o) in g.outputs().iter().enumerate() {
        let b = match out_bufs.get(&o) {
            Some(&b) => b,
            None => {
                let b = new_buf(&mut buffers, o, BufferKind::Output(i as u32));
                out_bufs.insert(o, b);
                if matches!(g.op(o), Op::Input(_)) {
                    copies.push((o, b));
                } else {
                    bufs.insert(o, b);
                }
                b
            }
        };
        outputs.push((b, g.ty(o).clone()));
    }
    for &n in &dec.order {
        air::work::tick();
        if dec.plans.contains_key(&n) && !bufs.contains_key(&n) {
            if let Some(o) = dec.aliases.get(&n) {
                bufs.insert(n, out_bufs[o]);
                continue;
            }
            let b = new_buf(&mut buffers, n, BufferKind::Temp);
            bufs.insert(n, b);
        }
    }

    let mut kernels: Vec<Kernel> = Vec::new();
    let mut kernel_ids: HashMap<Kernel, u32> = HashMap::new();
    let mut steps = Vec::new();
    let mut launch = |(k, args): (Kernel, Vec<BufId>)| {
        air::work::add(1 + args.len() as u64);
        let id = *kernel_ids.entry(k.clone()).or_insert_with(|| {
            kernels.push(k);
            kernels.len() as u32 - 1
        });
        steps.push(Step { kernel: id, args });
    };
    let mut checks = Vec::new();
    for (o, b) in copies {
        launch(loop_kernel(g, &bufs, &symbols, o, true, b, &mut checks)?);
    }
    for &n in &dec.order {
        air::work::tick();
        let Some(plan) = dec.plans.get(&n) else { continue };
        let target = bufs[&n];
        match plan {
            Plan::Loops if matches!(g.op(n), Op::ScatterAdd(_)) => {
                launch(scatter_kernel(g, &bufs, &symbols, n, target, &mut checks)?)
            }
            Plan::Loops => launch(loop_kernel(g, &bufs, &symbols, n, true, target, &mut checks)?),
            Plan::Matmul { reduce, a, b, bias } => {
                if let Some(bias) = bias {
                    launch(loop_kernel(g, &bufs, &symbols, *bias, false, target, &mut checks)?);
                }
                launch(matmul_kernel(g, &bufs, &symbols, *reduce, [a, b], target, bias.is_some())?);
            }
        }
    }
    // The status buffer exists only when some kernel checks something.
    if !checks.is_empty() {
        let status = BufId(buffers.len() as u32);
        buffers.push(BufferInfo {
            dtype: DType::I32,
            numel: Dim::Const(crate::kir::STATUS_WORDS as i64),
            kind: BufferKind::Status,
        });
        for arg in steps.iter_mut().flat_map(|s| s.args.iter_mut()).filter(|a| **a == STATUS_BUF) {
            *arg = status;
        }
    }
    Ok(Program { symbols, kernels, steps, buffers, outputs, checks: Vec::new(), data_checks: checks })
}
