//! Fusion decisions: which nodes get a buffer and how each is computed (a loop kernel or a
//! matmul), from one backward pass counting consumers and one forward pass over the topological
//! order (see the module docs of `schedule`).

use air::{BinaryOp, DType, Graph, NodeId, Op, OpClass, ReduceOp, TensorType};
use rustc_hash::FxHashMap as HashMap;
use slotmap::SecondaryMap;
use smallvec::SmallVec;

use super::contraction::{contraction, is_one, is_zero};
use super::{
    BROADCAST_MAX, MAX_DEPTH, RECOMPUTE_MAX, ROW_READERS, STENCIL_READS, TILE_ROWS_MIN, is_movement, movement,
};
use crate::view::{Movement, ViewStack};

/// What to fuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuseOptions {
    /// Fuse element-wise chains, reductions and epilogues (false: one kernel per non-view op).
    pub fuse: bool,
    /// Recognise matmuls (only when fusing).
    pub matmul: bool,
    /// The most distinct buffers one kernel may read (a device's binding limit, less what a
    /// kernel binds besides its inputs); `None`: any number. A fused expression that would read
    /// more is cut: its largest operand expression gets a buffer of its own.
    pub max_reads: Option<u32>,
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
    pub plans: SecondaryMap<NodeId, Plan>,
    /// The live nodes in topological order.
    pub order: Vec<NodeId>,
    /// `base -> output`: the materialized `base` is written straight into the buffer of the graph
    /// output, a reshape (chain) of it that nothing else reads, instead of being copied there.
    pub aliases: SecondaryMap<NodeId, NodeId>,
    /// Row reduces: reduces over trailing axes whose result (through its element-wise
    /// epilogue) is broadcast back over those axes, computed per row inside each kernel that
    /// reads them instead of in a kernel of their own ([`Decider::fuse_rows`]).
    pub rows: SecondaryMap<NodeId, ()>,
}

struct Decider<'a> {
    g: &'a Graph,
    opts: FuseOptions,
    /// The live nodes (a set).
    live: SecondaryMap<NodeId, ()>,
    /// How many times each graph output is listed among the outputs (built once, so counting a
    /// node's output uses is O(1)).
    outputs: SecondaryMap<NodeId, u32>,
    /// Consumers counted through movement ops, plus output uses.
    consumers: SecondaryMap<NodeId, u32>,
    /// Whether some consumer reads the node through a numel-increasing expand.
    broadcast: SecondaryMap<NodeId, bool>,
    /// The cost of reading a node inside a kernel (1 for a buffer).
    cost: SecondaryMap<NodeId, u32>,
    /// The depth of a non-materialized node's expression tree (0 for a buffer).
    depth: SecondaryMap<NodeId, u32>,
    /// The fused reduce a non-materialized node's expression contains.
    carries: SecondaryMap<NodeId, NodeId>,
    /// Non-materialized nodes whose fused expression evaluates a transcendental (`exp2`, `log2`,
    /// `sin`, `erf`).
    transcendental: SecondaryMap<NodeId, ()>,
    plans: SecondaryMap<NodeId, Plan>,
    /// With `max_reads`: the buffers a non-materialized node's expression reads (at most
    /// `max_reads` of them).
    reads: SecondaryMap<NodeId, Reads>,
    /// What [`Decider::plan_matmul`] found for a product, by its signature: the layers of a
    /// model repeat their products, and only the first of each is searched.
    products: HashMap<Signature<'a>, Option<Cuts>>,
    /// Materialized loop-kernel roots that compute a fused reduce: root -> the reduce.
    reduce_roots: SecondaryMap<NodeId, NodeId>,
    rows: SecondaryMap<NodeId, ()>,
}

/// The distinct buffers an expression reads.
type Reads = SmallVec<[NodeId; 8]>;

/// See [`Decider::signature`].
type Signature<'a> = SmallVec<[(&'a Op, &'a TensorType); 16]>;

/// A matmul operand, the view it is read through, and its cut of its chain.
type Candidate = (MatmulOperand, ViewStack, usize);

/// An operand's movement nodes, from the product's input down (none where the input is not a
/// movement node or has a buffer), and the node below them.
struct Chain {
    nodes: SmallVec<[NodeId; 8]>,
    below: NodeId,
}

impl Chain {
    /// The node the product reads.
    fn top(&self) -> NodeId {
        self.nodes.first().copied().unwrap_or(self.below)
    }
}

/// A matmul's operands as cuts of their chains (see [`Decider::operand`]): `(p, q, swapped)`,
/// `a` read through `p`'s chain and `b` through `q`'s, or the other way round when `swapped`.
type Cuts = (usize, usize, bool);

/// Whether a matmul can read `op` through `view`: from a buffer (not a constant or an index
/// ramp, which have none), at affine positions.
fn usable(g: &Graph, op: &MatmulOperand, view: &ViewStack) -> bool {
    !matches!(g.op(op.base), Op::Const(_) | Op::Iota(_)) && view.is_affine()
}

impl<'a> Decider<'a> {
    fn users(&self, n: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        air::work::add(self.g.users(n).len() as u64);
        self.g.users(n).iter().copied().filter(|u| self.live.contains_key(*u))
    }

    fn materialize(&mut self, n: NodeId) {
        if matches!(self.g.op(n), Op::Input(_)) {
            return;
        }
        if !self.plans.contains_key(n) {
            self.plans.insert(n, Plan::Loops);
        }
        if let Some(&r) = self.carries.get(n) {
            self.reduce_roots.insert(n, r);
        }
        self.cost.insert(n, 1);
        self.depth.insert(n, 0);
        self.carries.remove(n);
        self.transcendental.remove(n);
        self.reads.remove(n);
    }

    /// The buffers reading `n` inside a kernel reads: `n`'s own, or its expression's.
    fn reads_of(&self, n: NodeId) -> Reads {
        if self.is_buffer(n) {
            return smallvec::smallvec![n];
        }
        self.reads.get(n).cloned().unwrap_or_default()
    }

    /// With `max_reads`: notes the buffers `n`'s expression reads, first giving the largest
    /// operand expressions buffers of their own until they are at most `max_reads`.
    fn bound_reads(&mut self, n: NodeId) {
        let Some(limit) = self.opts.max_reads else { return };
        loop {
            let mut set = Reads::new();
            for &i in self.g.inputs(n) {
                for b in self.reads_of(i) {
                    air::work::tick();
                    if !set.contains(&b) {
                        set.push(b);
                    }
                }
            }
            if set.len() <= limit as usize {
                self.reads.insert(n, set);
                return;
            }
            let widest = self
                .g
                .inputs(n)
                .iter()
                .copied()
                .filter(|&i| !self.is_buffer(i))
                .max_by_key(|&i| self.reads_of(i).len());
            match widest {
                Some(i) => self.materialize(i),
                // Every operand a buffer already: an op cannot read more than its operands.
                None => {
                    self.reads.insert(n, set);
                    return;
                }
            }
        }
    }

    fn is_buffer(&self, n: NodeId) -> bool {
        self.plans.contains_key(n) || matches!(self.g.op(n), Op::Input(_))
    }

    fn read_cost(&self, n: NodeId) -> u32 {
        self.cost.get(n).copied().unwrap_or(1)
    }

    fn run(&mut self, order: &[NodeId]) {
        for &n in order.iter().rev() {
            air::work::tick();
            let mut count = self.outputs.get(n).copied().unwrap_or(0);
            let mut bcast = false;
            for u in self.users(n) {
                let op = self.g.op(u);
                if is_movement(op) {
                    count += self.consumers[u];
                    bcast |= self.broadcast[u];
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
            if !self.plans.contains_key(n) {
                let d =
                    1 + self.g.inputs(n).iter().map(|i| self.depth.get(*i).copied().unwrap_or(0)).max().unwrap_or(0);
                self.depth.insert(n, d);
                if d > MAX_DEPTH {
                    self.materialize(n);
                }
            }
            if self.outputs.contains_key(n) {
                self.materialize(n);
            }
        }
    }

    fn visit(&mut self, n: NodeId) {
        let g = self.g;
        let inputs = g.inputs(n);
        match g.op(n).class() {
            OpClass::Leaf => {
                let c = if matches!(g.op(n), Op::Const(_)) { 0 } else { 1 };
                self.cost.insert(n, c);
            }
            OpClass::Movement => {
                if self.carries.contains_key(inputs[0]) {
                    self.materialize(inputs[0]);
                }
                self.bound_reads(n);
                self.cost.insert(n, self.read_cost(inputs[0]));
                if self.transcendental.contains_key(inputs[0]) {
                    self.transcendental.insert(n, ());
                }
                if self.opts.fuse && matches!(g.op(n), Op::Pad(_)) && self.consumers[n] >= STENCIL_READS {
                    self.materialize(n);
                }
            }
            OpClass::Elementwise => {
                if !self.opts.fuse {
                    self.materialize(n);
                    return;
                }
                let mut carried: Option<NodeId> = None;
                for &i in inputs {
                    if let Some(&r) = self.carries.get(i) {
                        match carried {
                            None => carried = Some(r),
                            Some(c) if c == r => {}
                            Some(_) => self.materialize(i),
                        }
                    }
                }
                self.bound_reads(n);
                // A cut operand no longer carries its reduce.
                if carried.is_some_and(|r| !inputs.iter().any(|&i| self.carries.get(i) == Some(&r))) {
                    carried = None;
                }
                let cost = 1 + inputs.iter().map(|&i| self.read_cost(i)).sum::<u32>();
                self.cost.insert(n, cost);
                let own = matches!(
                    g.op(n),
                    Op::Unary(air::UnaryOp::Exp2 | air::UnaryOp::Log2 | air::UnaryOp::Sin | air::UnaryOp::Erf)
                );
                if own || inputs.iter().any(|&i| self.transcendental.contains_key(i)) {
                    self.transcendental.insert(n, ());
                }
                if let Some(r) = carried {
                    self.carries.insert(n, r);
                }
                if self.try_matmul_bias(n) {
                    return;
                }
                let many = self.consumers[n] > 1;
                // A transcendental that a reduce reads and something else reads too (softmax's
                // `exp`, read by its sum and by the division): one element-wise kernel computes
                // it at full vector width (`codegen`'s tiles), where every reader would evaluate
                // it again in its own loop. Only over rows of a known length of at least
                // `TILE_ROWS_MIN`: shorter or symbolic rows (a decoder's attention over its past)
                // would pay a launch and a round trip to save little.
                let reduced_and_more = many
                    && self.transcendental.contains_key(n)
                    && self.users(n).any(|u| match g.op(u) {
                        Op::Reduce(r) => {
                            let shape = &g.ty(n).shape;
                            let row = r.axes.iter().try_fold(1i64, |p, &a| Some(p * shape[a].as_const()?));
                            row.is_some_and(|w| w >= TILE_ROWS_MIN)
                        }
                        _ => false,
                    });
                if (many && (carried.is_some() || cost > RECOMPUTE_MAX))
                    || (self.broadcast[n] && cost > BROADCAST_MAX)
                    || reduced_and_more
                {
                    self.materialize(n);
                }
            }
            OpClass::Reduce => {
                if self.carries.contains_key(inputs[0]) {
                    self.materialize(inputs[0]);
                }
                self.bound_reads(n);
                if self.opts.fuse && self.opts.matmul && self.try_matmul(n) {
                    return;
                }
                let users: Vec<NodeId> = self.users(n).collect();
                let fusable = self.opts.fuse
                    && self.consumers[n] == 1
                    && users.len() == 1
                    && g.op(users[0]).class() == OpClass::Elementwise
                    && !self.outputs.contains_key(n);
                if fusable {
                    self.cost.insert(n, 1);
                    self.carries.insert(n, n);
                } else {
                    self.materialize(n);
                    self.reduce_roots.insert(n, n);
                }
            }
            OpClass::Index => {
                // `gather` reads a row-major `src` buffer and fuses its index expression;
                // `scatter_add` reads two buffers. Both are kernels of their own.
                self.materialize(inputs[0]);
                match g.op(n) {
                    Op::Gather(_) if self.carries.contains_key(inputs[1]) => self.materialize(inputs[1]),
                    Op::Gather(_) => {}
                    _ => self.materialize(inputs[1]),
                }
                self.bound_reads(n);
                self.materialize(n);
            }
        }
    }

    /// The movement nodes from `top` down to the first node that is not one or has a buffer.
    fn operand_chain(&self, top: NodeId) -> Chain {
        let g = self.g;
        let mut nodes = SmallVec::new();
        let mut below = top;
        while is_movement(g.op(below)) && !self.is_buffer(below) {
            air::work::tick();
            nodes.push(below);
            below = g.inputs(below)[0];
        }
        Chain { nodes, below }
    }

    /// The operand that reads `chain.nodes[cut]` (or `chain.below`, for the whole chain) through
    /// the movement ops above it.
    fn operand(&self, chain: &Chain, cut: usize) -> MatmulOperand {
        let g = self.g;
        air::work::add(1 + cut as u64);
        let base = chain.nodes.get(cut).copied().unwrap_or(chain.below);
        let moves: Vec<Movement> = chain.nodes[..cut].iter().filter_map(|&m| movement(g.op(m))).collect();
        MatmulOperand { base, chain: moves }
    }

    /// [`Decider::operand`] and its view.
    fn operand_at(&self, chain: &Chain, cut: usize) -> Candidate {
        let op = self.operand(chain, cut);
        let view = ViewStack::contiguous(&self.g.ty(op.base).shape).through(op.chain.iter().rev());
        (op, view, cut)
    }

    /// What decides a matmul's plan ([`Decider::plan_matmul`]): the reduce, the product's type,
    /// and each operand's chain of ops and types down to its buffer or first non-movement node
    /// (inputs' slots left out). Equal signatures have equal candidates, views and contractions,
    /// so equal cuts.
    fn signature(&self, n: NodeId, x: NodeId, chains: &[Chain; 2]) -> Signature<'a> {
        let g = self.g;
        let mut sig: Signature<'a> = smallvec::smallvec![(g.op(n), g.ty(x))];
        // Which input slot an operand reads does not change its views.
        static INPUT: Op = Op::Input(air::op::Input { slot: 0 });
        let op = |m: NodeId| if matches!(g.op(m), Op::Input(_)) { &INPUT } else { g.op(m) };
        for chain in chains {
            sig.extend(chain.nodes.iter().chain([&chain.below]).map(|&m| (op(m), g.ty(m))));
            sig.push((g.op(x), g.ty(x)));
        }
        sig
    }

    /// The candidate operands of a matmul read through `chain`, fewest copies first: each is a node
    /// to be a buffer (the caller materializes it) and the chain of movement ops above it, whose
    /// composed view is affine. The first keeps the longest chain; later ones cut it lower, so
    /// that a movement node gets a buffer in its own row-major layout (a copy) where the longer
    /// view does not fit a GEMM. No cut lands above a broadcasting expand, which would
    /// materialize the broadcast.
    /// With `first_only`, stops at the first usable one (the one a product tries first).
    fn matmul_operands(&self, chain: &Chain, first_only: bool) -> Vec<Candidate> {
        let g = self.g;
        let view_at = |cut: usize| self.operand_at(chain, cut);
        let shape = &g.ty(chain.top()).shape;
        let broadcast = |v: &ViewStack, d: usize| !is_one(&shape[d]) && is_zero(&v.top().strides[d]);
        // The longest chain first; shorter ones while they keep every broadcast axis of it.
        let longest = view_at(chain.nodes.len());
        let mut out = Vec::new();
        let full = longest.1.clone();
        if usable(g, &longest.0, &longest.1) {
            out.push(longest);
            if first_only {
                return out;
            }
        }
        for cut in (0..chain.nodes.len()).rev() {
            if first_only && !out.is_empty() {
                break;
            }
            let candidate = view_at(cut);
            let lost = (0..shape.len()).any(|d| broadcast(&full, d) && !broadcast(&candidate.1, d));
            if lost {
                break;
            }
            if usable(g, &candidate.0, &candidate.1) {
                out.push(candidate);
            }
        }
        out
    }

    /// `reduce sum(mul(x, y))` over affine views of buffers whose axes split into GEMM groups
    /// (see `contraction`) becomes a matmul; its operands' bases are materialized. Where the
    /// longest views do not fit, an operand is read from a copy of a movement node in between.
    /// A product with the signature of one planned before (the same product in the layer
    /// before) takes its cuts without building a view ([`Decider::signature`]).
    fn try_matmul(&mut self, n: NodeId) -> bool {
        let g = self.g;
        let Op::Reduce(r) = g.op(n) else { return false };
        let x = g.inputs(n)[0];
        if r.op != ReduceOp::Sum || g.ty(n).dtype != DType::F32 || g.op(x) != &Op::Binary(BinaryOp::Mul) {
            return false;
        }
        let chains = [self.operand_chain(g.inputs(x)[0]), self.operand_chain(g.inputs(x)[1])];
        let sig = self.signature(n, x, &chains);
        let cuts = match self.products.get(&sig) {
            Some(&cuts) => cuts,
            None => {
                let cuts = self.plan_matmul(&r.axes, x, &chains);
                self.products.insert(sig, cuts);
                cuts
            }
        };
        let Some((cut_p, cut_q, swapped)) = cuts else { return false };
        let (p, q) = (self.operand(&chains[0], cut_p), self.operand(&chains[1], cut_q));
        let (a, b) = if swapped { (q, p) } else { (p, q) };
        for op in [&a, &b] {
            if !matches!(g.op(op.base), Op::Input(_)) {
                self.materialize(op.base);
            }
        }
        self.plans.insert(n, Plan::Matmul { reduce: n, a, b, bias: None });
        self.cost.insert(n, 1);
        true
    }

    /// The cuts of a product summing `axes` of `x = mul(p, q)` whose views split into GEMM
    /// groups, fewest copies first: the longest views alone (they nearly always fit, and the
    /// shorter cuts cost a view each to build), then every pair of candidates.
    fn plan_matmul(&self, axes: &[usize], x: NodeId, chains: &[Chain; 2]) -> Option<Cuts> {
        let g = self.g;
        let space = g.ty(x).shape.to_vec();
        let try_pair = |(_, vp, cut_p): &Candidate, (_, vq, cut_q): &Candidate| {
            air::work::tick();
            let (sp, sq) = (&vp.top().strides, &vq.top().strides);
            let swapped = match (contraction(&space, axes, sp, sq), contraction(&space, axes, sq, sp)) {
                (Some(c), Some(swapped)) => !c.row_major_c(&space, axes) && swapped.row_major_c(&space, axes),
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (None, None) => return None,
            };
            Some((*cut_p, *cut_q, swapped))
        };
        let (first_p, first_q) = (self.matmul_operands(&chains[0], true), self.matmul_operands(&chains[1], true));
        let (p0, q0) = (first_p.first()?, first_q.first()?);
        if let Some(cuts) = try_pair(p0, q0) {
            return Some(cuts);
        }
        // Shorter cuts exist only in a chain of movement nodes (a layer norm's `sum(d * d)` has
        // none).
        if chains.iter().all(|c| c.nodes.is_empty()) {
            return None;
        }
        let (cands_p, cands_q) = (self.matmul_operands(&chains[0], false), self.matmul_operands(&chains[1], false));
        let mut pairs: Vec<(usize, usize)> =
            (0..cands_p.len()).flat_map(|i| (0..cands_q.len()).map(move |j| (i, j))).collect();
        pairs.sort_by_key(|&(i, j)| (usize::from(i > 0) + usize::from(j > 0), i + j));
        // (0, 0), the pair tried above, sorts first.
        pairs.into_iter().skip(1).find_map(|(i, j)| try_pair(&cands_p[i], &cands_q[j]))
    }

    /// Row fusion: a loop kernel computing a reduce over trailing axes (with its element-wise
    /// epilogue), read by the rest of the graph only broadcast back over those axes (softmax's
    /// maximum and its sum's reciprocal, a layer norm's mean and its inverse deviation), gets no
    /// kernel of its own: each kernel that reads it computes it per row, in loops of its own
    /// before the loops over the row's elements (`kernel`'s `KExpr::Row`). That saves a launch
    /// and a buffer's round trip per reduce, and costs each reading kernel one pass over the
    /// row, so it is done only where at most [`ROW_READERS`] kernels read it and each reads it
    /// with the row's axes innermost: an element-wise kernel of the broadcast shape, or one
    /// reducing exactly the broadcast axes. Only over rows of a symbolic length (a decoder's
    /// attention over its past): rows of a known length keep their kernels, which codegen's row
    /// plans run faster than a fused kernel's generic loops. Not under a binding limit
    /// (`max_reads`): the reading kernel binds the reduce's inputs too.
    fn fuse_rows(&mut self, order: &[NodeId]) {
        if !self.opts.fuse || self.opts.max_reads.is_some() {
            return;
        }
        // A matmul reads its operands from their buffers, not through a reading kernel: a node
        // that is one keeps its kernel.
        let operands: rustc_hash::FxHashSet<NodeId> = self
            .plans
            .values()
            .filter_map(|p| match p {
                Plan::Matmul { a, b, .. } => Some([a.base, b.base]),
                Plan::Loops => None,
            })
            .flatten()
            .collect();
        for &c in order {
            air::work::tick();
            let Some(&r) = self.reduce_roots.get(c) else { continue };
            if self.plans.get(c) != Some(&Plan::Loops) || self.outputs.contains_key(c) || operands.contains(&c) {
                continue;
            }
            if self.row_readers(c, r).is_some_and(|k| k <= ROW_READERS) {
                self.plans.remove(c);
                self.rows.insert(r, ());
            }
        }
    }

    /// The number of kernels that read `c` (carrying the reduce `r`), if every one reads it
    /// in a row's geometry (see [`Decider::fuse_rows`]).
    fn row_readers(&self, c: NodeId, r: NodeId) -> Option<u32> {
        let g = self.g;
        let Op::Reduce(red) = g.op(r) else { return None };
        let shape = &g.ty(c).shape;
        let rank = shape.len();
        let trailing = red.axes.iter().enumerate().all(|(i, &a)| a + red.axes.len() == rank + i);
        let in_shape = &g.ty(g.inputs(r)[0]).shape;
        // Rows of a known length keep kernels of their own, which codegen runs with row plans
        // of their own (whole short rows in one vector, long ones through full-width tiles).
        // A reduced dim of constant extent 0 does too: folding indices over its empty range
        // could hoist a load of the empty input out of the row's loops (see `KExpr::Reduce`).
        let known = |a: &usize| in_shape[*a].as_const();
        if !trailing || red.axes.iter().all(|a| known(a).is_some()) || red.axes.iter().any(|a| known(a) == Some(0)) {
            return None;
        }
        let mut seen: rustc_hash::FxHashSet<NodeId> = Default::default();
        let mut kernels = 0;
        let mut stack = vec![(c, ViewStack::contiguous(shape))];
        while let Some((m, view)) = stack.pop() {
            for u in self.users(m) {
                let op = g.op(u);
                if m == c && !is_movement(op) {
                    // Read at its own shape: not a broadcast over a row.
                    return None;
                }
                if is_movement(op) {
                    if self.is_buffer(u) {
                        return None;
                    }
                    stack.push((u, view.clone().through([&movement(op)?])));
                    continue;
                }
                if op.class() != OpClass::Elementwise || !view.is_affine() {
                    return None;
                }
                // The read's broadcast axes, which must all come after the axes it varies along.
                let top = view.top();
                let mut bcast: SmallVec<[usize; 4]> = SmallVec::new();
                for d in 0..top.shape.len() {
                    if is_one(&top.shape[d]) {
                        continue;
                    }
                    if is_zero(&top.strides[d]) {
                        bcast.push(d);
                    } else if !bcast.is_empty() {
                        return None;
                    }
                }
                if bcast.is_empty() {
                    return None;
                }
                kernels += self.row_kernels(u, &bcast, &mut seen)?;
            }
        }
        Some(kernels)
    }

    /// The kernels that compute the element-wise `u` (an operand of which is read broadcast over
    /// the axes `bcast`), if each loops over `u`'s axes in order: `u` or an element-wise node
    /// fed by it with a loop kernel of its own, or a reduce over exactly `bcast` fused into its
    /// reader's kernel.
    fn row_kernels(&self, u: NodeId, bcast: &[usize], seen: &mut rustc_hash::FxHashSet<NodeId>) -> Option<u32> {
        let g = self.g;
        if !seen.insert(u) {
            return Some(0);
        }
        if self.is_buffer(u) {
            return (self.plans.get(u) == Some(&Plan::Loops) && !matches!(g.op(u), Op::ScatterAdd(_))).then_some(1);
        }
        let mut kernels = 0;
        for w in self.users(u) {
            match g.op(w) {
                op if op.class() == OpClass::Elementwise => kernels += self.row_kernels(w, bcast, seen)?,
                Op::Reduce(red)
                    if red.axes.as_slice() == bcast && !matches!(self.plans.get(w), Some(Plan::Matmul { .. })) =>
                {
                    if seen.insert(w) {
                        kernels += 1;
                    }
                }
                _ => return None,
            }
        }
        Some(kernels)
    }

    /// Outputs that are reshapes of a materialized node read nowhere else take that node's place.
    fn alias_outputs(&mut self) -> SecondaryMap<NodeId, NodeId> {
        let g = self.g;
        let mut aliases = SecondaryMap::new();
        for &o in g.outputs() {
            air::work::tick();
            if self.plans.get(o) != Some(&Plan::Loops) || !matches!(g.op(o), Op::Reshape(_)) {
                continue;
            }
            let mut cur = g.inputs(o)[0];
            while matches!(g.op(cur), Op::Reshape(_))
                && !self.plans.contains_key(cur)
                && !self.outputs.contains_key(cur)
                && self.users(cur).count() == 1
            {
                air::work::tick();
                cur = g.inputs(cur)[0];
            }
            if self.plans.contains_key(cur)
                && !self.outputs.contains_key(cur)
                && self.users(cur).count() == 1
                && !aliases.contains_key(cur)
            {
                self.plans.remove(o);
                aliases.insert(cur, o);
            }
        }
        aliases
    }

    /// `add(reshape*(matmul), bias)` with the matmul read only there: the add becomes the matmul,
    /// accumulating onto `bias`. Not where one loop kernel reads the add anyway
    /// ([`Self::read_by_one_loop`]): that kernel adds the bias as it loads the product, where
    /// accumulating costs a pass writing the bias into the product's buffer and a read of it in
    /// the GEMM (conv-32's bias: 16 us of a 90 us predict).
    fn try_matmul_bias(&mut self, n: NodeId) -> bool {
        let g = self.g;
        if g.op(n) != &Op::Binary(BinaryOp::Add) || g.ty(n).dtype != DType::F32 || self.read_by_one_loop(n) {
            return false;
        }
        for (k, &start) in g.inputs(n).iter().enumerate() {
            let mut cur = start;
            let mut ok = true;
            while matches!(g.op(cur), Op::Reshape(_)) && !self.plans.contains_key(cur) {
                air::work::tick();
                ok &= self.users(cur).count() == 1;
                cur = g.inputs(cur)[0];
            }
            let other = g.inputs(n)[1 - k];
            // Only a matmul can take the bias; test that first, since counting the users of a
            // widely shared node (a constant read by every add) per add would be O(N^2).
            if !matches!(self.plans.get(cur), Some(Plan::Matmul { bias: None, .. })) {
                continue;
            }
            if !ok || other == start || self.users(cur).count() != 1 || self.outputs.contains_key(cur) {
                continue;
            }
            if let Some(Plan::Matmul { reduce, a, b, bias: None }) = self.plans.get(cur).cloned() {
                self.plans.remove(cur);
                self.plans.insert(n, Plan::Matmul { reduce, a, b, bias: Some(other) });
                self.cost.insert(n, 1);
                self.carries.remove(n);
                return true;
            }
        }
        false
    }

    /// Whether `n` is not an output and its one reader, through reshapes and permutes that are
    /// each read once, is an element-wise op other than `mul` (which may be a contraction's
    /// operand, needing `n` in memory) or a reduce: a loop kernel that reads `n` anyway.
    fn read_by_one_loop(&self, n: NodeId) -> bool {
        let g = self.g;
        let mut cur = n;
        loop {
            if self.outputs.contains_key(cur) {
                return false;
            }
            let mut users = self.users(cur);
            let (Some(u), None) = (users.next(), users.next()) else { return false };
            match g.op(u) {
                Op::Reshape(_) | Op::Permute(_) => cur = u,
                Op::Unary(_) | Op::Reduce(_) => return true,
                Op::Binary(op) => return *op != BinaryOp::Mul,
                _ => return false,
            }
        }
    }
}

/// Decides kernel boundaries (see the module docs).
pub fn decide(g: &Graph, opts: FuseOptions) -> Decisions {
    let order = g.live_order();
    // Side tables sized once for the highest slot, not grown as the nodes are met (a node's slot
    // is its index + 1, slotmap's slot 0 being a sentinel; the tables hold slots 0..=that).
    let slots = order.iter().map(|id| id.index() as usize + 2).max().unwrap_or(0);
    let mut outputs = SecondaryMap::new();
    for &o in g.outputs() {
        air::work::tick();
        if let Some(count) = outputs.entry(o) {
            *count.or_insert(0) += 1;
        }
    }
    let mut d = Decider {
        g,
        opts,
        live: order.iter().map(|&n| (n, ())).collect(),
        outputs,
        consumers: SecondaryMap::with_capacity(slots),
        broadcast: SecondaryMap::with_capacity(slots),
        cost: SecondaryMap::with_capacity(slots),
        depth: SecondaryMap::with_capacity(slots),
        carries: SecondaryMap::with_capacity(slots),
        transcendental: SecondaryMap::with_capacity(slots),
        plans: SecondaryMap::with_capacity(slots),
        reads: SecondaryMap::new(),
        products: HashMap::default(),
        reduce_roots: SecondaryMap::new(),
        rows: SecondaryMap::new(),
    };
    d.run(&order);
    d.fuse_rows(&order);
    let aliases = d.alias_outputs();
    Decisions { plans: d.plans, order, aliases, rows: d.rows }
}
