//! The e-graph language of saturation: air's ops (interned with their result type, attributes
//! and all) plus one composite `MatMul` node, the type analysis, and the conversions between an
//! `air::Graph` and an `EGraph` (recognising the canonical matmul pattern on the way in and
//! expanding it back on the way out).

use std::fmt;

use air::op::{Permute, Reduce, Reshape};
use air::{BinaryOp, DType, Dim, Graph, NodeId, Op, ReduceOp, Shape, TensorType};
use egg::{Id, Language};
use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;

/// An interned `(Op, TensorType)`: the op with its typed attributes and the type of its value.
/// Interning keeps e-nodes small, hashable and ordered (egg needs `Ord`, which `Op` lacks), and
/// carries leaf types (inputs and consts are typed when created, not inferred).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpRef(u32);

/// An e-node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ANode {
    /// `a @ b` with `torch.matmul` semantics for operands of rank >= 2: `a: [...a, M, K]`,
    /// `b: [...b, K, N]`, batch dims broadcast (right-aligned), the result `[..., M, N]`. It
    /// stands for the canonical expand-multiply-sum pattern and becomes it again on extraction.
    MatMul([Id; 2]),
    /// An air op on its inputs.
    Op(OpRef, SmallVec<[Id; 3]>),
}

impl Language for ANode {
    type Discriminant = Option<OpRef>;

    fn discriminant(&self) -> Option<OpRef> {
        match self {
            ANode::MatMul(_) => None,
            ANode::Op(op, _) => Some(*op),
        }
    }

    fn matches(&self, other: &ANode) -> bool {
        match (self, other) {
            (ANode::MatMul(_), ANode::MatMul(_)) => true,
            (ANode::Op(a, x), ANode::Op(b, y)) => a == b && x.len() == y.len(),
            _ => false,
        }
    }

    fn children(&self) -> &[Id] {
        match self {
            ANode::MatMul(c) => c,
            ANode::Op(_, c) => c,
        }
    }

    fn children_mut(&mut self) -> &mut [Id] {
        match self {
            ANode::MatMul(c) => c,
            ANode::Op(_, c) => c,
        }
    }
}

impl fmt::Display for ANode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ANode::MatMul(_) => f.write_str("matmul"),
            ANode::Op(op, _) => write!(f, "op{}", op.0),
        }
    }
}

/// The e-class analysis: every class has one type (the interned ops' result types, and the
/// matmul type rule for `MatMul`). It also owns the op interner and the merge groups that the
/// multi-root rule records for extraction.
#[derive(Debug, Default)]
pub struct Types {
    ops: Vec<(Op, TensorType)>,
    index: rustc_hash::FxHashMap<(Op, TensorType), OpRef>,
    /// Table-rule applications already made (rule, class, captures; all canonical when made):
    /// egg hands a rewrite every match again each iteration, and re-running a rule's guard and
    /// builder on an unchanged match was most of saturation's time. A class merged since then
    /// has a new canonical id, so its matches run again.
    pub applied: rustc_hash::FxHashSet<(usize, Id, SmallVec<[Id; 4]>)>,
    /// Groups of e-nodes that the multi-root rule made together (each `(class, node)`): they pay
    /// off only when extraction takes all of them, so it tries them as one move.
    pub groups: Vec<Vec<(Id, ANode)>>,
    /// Classes the multi-root rule built as concatenations (never merged again).
    pub concats: Vec<Id>,
    /// Set while the conversion copies the graph's own nodes (see [`ClassData::fresh`]).
    copying: bool,
    /// `near_fresh[d]`: the canonical classes (ascending) at most `d` parent steps above a fresh
    /// class, as of the start of the current iteration ([`index_fresh`]). A table pattern of
    /// depth `d + 1` (ops and consts; captures are opaque to guards) can only match at these.
    pub near_fresh: Vec<Vec<Id>>,
}

/// Levels of [`Types::near_fresh`] kept (the table's deepest pattern has depth 2): a deeper
/// pattern searches every class of its head.
pub const FRESH_LEVELS: usize = 2;

/// Recomputes [`Types::near_fresh`] for the current (rebuilt) e-graph; the runner calls it
/// before each iteration's search.
pub fn index_fresh(eg: &mut EG) {
    let mut fresh: Vec<Id> = eg.classes().filter(|c| c.data.fresh).map(|c| c.id).collect();
    fresh.sort_unstable();
    let mut levels = vec![fresh];
    while levels.len() < FRESH_LEVELS {
        let last = &levels[levels.len() - 1];
        let mut next = last.clone();
        for &c in last {
            next.extend(eg[c].parents().map(|p| eg.find(p)));
        }
        next.sort_unstable();
        next.dedup();
        levels.push(next);
    }
    eg.analysis.near_fresh = levels;
}

impl Types {
    /// The interned form of `op` with result type `ty`.
    pub fn intern(&mut self, op: Op, ty: TensorType) -> OpRef {
        let next = OpRef(u32::try_from(self.ops.len()).expect("fewer than 2^32 distinct ops"));
        match self.index.entry((op, ty)) {
            std::collections::hash_map::Entry::Occupied(e) => *e.get(),
            std::collections::hash_map::Entry::Vacant(e) => {
                self.ops.push(e.key().clone());
                e.insert(next);
                next
            }
        }
    }

    /// The op and result type behind `r`.
    pub fn get(&self, r: OpRef) -> &(Op, TensorType) {
        &self.ops[r.0 as usize]
    }

    /// Every interned op with its result type.
    pub fn ops(&self) -> impl Iterator<Item = (OpRef, &(Op, TensorType))> {
        self.ops.iter().enumerate().map(|(i, o)| (OpRef(i as u32), o))
    }
}

/// The e-graph saturation runs on.
pub type EG = egg::EGraph<ANode, Types>;

/// What the analysis knows of an e-class.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassData {
    /// The type of every value in the class.
    pub ty: TensorType,
    /// Whether the class changed since the conversion copied the graph: it holds an e-node that
    /// is not a plain copy of a graph node (a rule built it, or the conversion did: matmuls and
    /// their operand views), or it was merged with another class. The converted graph is at the
    /// greedy rewriter's fixpoint, so a table rule can only match where it touches a fresh
    /// class (see [`Types::near_fresh`]).
    pub fresh: bool,
}

impl egg::Analysis<ANode> for Types {
    type Data = ClassData;

    fn make(egraph: &mut EG, enode: &ANode, _: Id) -> ClassData {
        let ty = match enode {
            ANode::Op(r, _) => egraph.analysis.get(*r).1.clone(),
            ANode::MatMul([a, b]) => {
                matmul_type(&egraph[*a].data.ty, &egraph[*b].data.ty).expect("matmul nodes are type-checked when added")
            }
        };
        ClassData { ty, fresh: !egraph.analysis.copying }
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> egg::DidMerge {
        debug_assert_eq!(a.ty, b.ty, "only values of one type are merged");
        a.fresh = true;
        // Freshness is read class by class, never derived from children: parents need no
        // re-analysis, so the merge reports no change.
        egg::DidMerge(false, false)
    }
}

/// The type of `a @ b` (see [`ANode::MatMul`]), or `None` when it does not type-check.
pub fn matmul_type(a: &TensorType, b: &TensorType) -> Option<TensorType> {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    if ra < 2 || rb < 2 || a.dtype != b.dtype || a.dtype.is_bool() || a.shape[ra - 1] != b.shape[rb - 2] {
        return None;
    }
    let batch = broadcast(&a.shape[..ra - 2], &b.shape[..rb - 2])?;
    let shape = batch.into_iter().chain([a.shape[ra - 2], b.shape[rb - 1]]).collect();
    Some(TensorType { dtype: a.dtype, shape })
}

/// Right-aligned broadcast of two batch shapes (each pair equal, or one of them 1).
fn broadcast(x: &[Dim], y: &[Dim]) -> Option<Shape> {
    let rank = x.len().max(y.len());
    let one = Dim::Const(1);
    let at = |s: &[Dim], i: usize| if i + s.len() >= rank { s[i + s.len() - rank] } else { one };
    (0..rank)
        .map(|i| {
            let (p, q) = (at(x, i), at(y, i));
            if p == q || q == one {
                Some(p)
            } else if p == one {
                Some(q)
            } else {
                None
            }
        })
        .collect()
}

/// Adds an op node after type-checking it against its children's classes; `None` if the type
/// rule rejects it.
pub fn add_op(eg: &mut EG, op: Op, children: &[Id]) -> Option<Id> {
    let types: Vec<TensorType> = children.iter().map(|&c| eg[c].data.ty.clone()).collect();
    let ty = op.infer(&types.iter().collect::<Vec<_>>()).ok()?;
    let r = eg.analysis.intern(op, ty);
    Some(eg.add(ANode::Op(r, children.iter().copied().collect())))
}

/// Adds a leaf (const, input, iota) of the given type.
pub fn add_leaf(eg: &mut EG, op: Op, ty: TensorType) -> Id {
    let r = eg.analysis.intern(op, ty);
    eg.add(ANode::Op(r, SmallVec::new()))
}

/// Adds `a @ b` after type-checking it; `None` if it does not type-check.
pub fn add_matmul(eg: &mut EG, a: Id, b: Id) -> Option<Id> {
    matmul_type(&eg[a].data.ty, &eg[b].data.ty)?;
    Some(eg.add(ANode::MatMul([a, b])))
}

/// The permutation that swaps the last two of `rank` axes.
pub fn swap_last_two(rank: usize) -> SmallVec<[usize; 4]> {
    let mut perm: SmallVec<[usize; 4]> = (0..rank).collect();
    perm.swap(rank - 2, rank - 1);
    perm
}

/// Whether `op` is a permute swapping the last two axes and nothing else.
pub fn is_transpose(op: &Op) -> bool {
    matches!(op, Op::Permute(p) if p.perm.len() >= 2 && p.perm == swap_last_two(p.perm.len()))
}

/// Adds the transpose (last two axes swapped) of class `x`; the transpose of a transpose is the
/// class it transposes (no node is added, so no rule has to fold the pair).
pub fn add_transpose(eg: &mut EG, x: Id) -> Option<Id> {
    let rank = eg[x].data.ty.shape.len();
    if rank < 2 {
        return None;
    }
    let inner = eg[x].nodes.iter().find_map(|n| match n {
        ANode::Op(r, kids) if is_transpose(&eg.analysis.get(*r).0) => Some(kids[0]),
        _ => None,
    });
    match inner {
        Some(y) => Some(eg.find(y)),
        None => add_op(eg, Op::Permute(Permute { perm: swap_last_two(rank) }), &[x]),
    }
}

/// A matmul found in a graph: its operands' views of the product space (before any expand),
/// and the shapes of its `MatMul`'s operands (`a`, and `b` transposed) and result.
struct Found {
    a_view: NodeId,
    b_view: NodeId,
    a_shape: Shape,
    bt_shape: Shape,
    shape: Shape,
}

/// Where a `MatMul` operand comes from (see [`operand`]).
#[derive(Clone, Copy)]
enum Operand {
    /// This node's value as it is.
    Node(NodeId),
    /// The `MatMul` of this recognised matmul.
    Matmul(NodeId),
    /// This node's value reshaped.
    Reshaped(NodeId),
}

/// The source of a `MatMul` operand of shape `shape` read through `view`: the view's own input
/// when that already has the shape (the facade's `reshape` under the expand), or the `MatMul`
/// of a recognised matmul that the view reshapes when the shapes agree (a matmul reading
/// another's result); else the view reshaped.
fn operand(g: &Graph, found: &HashMap<NodeId, Found>, view: NodeId, shape: &Shape) -> Operand {
    if let Op::Reshape(_) = g.op(view) {
        let inner = g.inputs(view)[0];
        if found.get(&inner).is_some_and(|f| f.shape == *shape) {
            return Operand::Matmul(inner);
        }
        if g.ty(inner).shape == *shape {
            return Operand::Node(inner);
        }
    }
    Operand::Reshaped(view)
}

/// Recognises the canonical matmul pattern (the facade's `canonical_matmul`, after the greedy
/// rules) at the reduce `root`: `reduce sum[last](mul(x', y'))` over the product space
/// `[..., M, N, K]`, where `x'` is `x: [..., M, 1, K]` or its expand and `y'` is
/// `y: [..., 1, N, K]` or its expand. The product and expands stay in the e-graph only if
/// something else reads them.
fn find_matmul(g: &Graph, root: NodeId) -> Option<Found> {
    let Op::Reduce(Reduce { op: ReduceOp::Sum, axes }) = g.op(root) else { return None };
    let prod = g.inputs(root)[0];
    let space = &g.ty(prod).shape;
    let rank = space.len();
    if rank < 3 || axes.as_slice() != [rank - 1] || !matches!(g.op(prod), Op::Binary(BinaryOp::Mul)) {
        return None;
    }
    if !g.ty(root).dtype.is_float() && !g.ty(root).dtype.is_int() {
        return None;
    }
    let view = |v: NodeId| match g.op(v) {
        Op::Expand(_) => g.inputs(v)[0],
        _ => v,
    };
    let (x, y) = (view(g.inputs(prod)[0]), view(g.inputs(prod)[1]));
    let one = Dim::Const(1);
    let a_like = |v: NodeId| g.ty(v).shape.len() == rank && g.ty(v).shape[rank - 2] == one;
    let b_like = |v: NodeId| g.ty(v).shape.len() == rank && g.ty(v).shape[rank - 3] == one;
    let (a_view, b_view) = if a_like(x) && b_like(y) {
        (x, y)
    } else if a_like(y) && b_like(x) {
        (y, x)
    } else {
        return None;
    };
    let (av, bv) = (&g.ty(a_view).shape, &g.ty(b_view).shape);
    let mut a_shape: Shape = av.iter().enumerate().filter(|&(i, _)| i != rank - 2).map(|(_, d)| *d).collect();
    let mut bt_shape: Shape = bv.iter().enumerate().filter(|&(i, _)| i != rank - 3).map(|(_, d)| *d).collect();
    // Leading 1s only broadcast: drop them from one operand while the other keeps the result's
    // rank (a weight shared by a batch stays a matrix).
    while bt_shape.len() > 2 && bt_shape[0] == one {
        bt_shape.remove(0);
    }
    while a_shape.len() > 2 && a_shape[0] == one && bt_shape.len() == rank - 1 {
        a_shape.remove(0);
    }
    let dtype = g.ty(root).dtype;
    let b_shape: Shape = bt_shape[..bt_shape.len() - 2]
        .iter()
        .chain([&bt_shape[bt_shape.len() - 1], &bt_shape[bt_shape.len() - 2]])
        .cloned()
        .collect();
    let shape =
        matmul_type(&TensorType { dtype, shape: a_shape.clone() }, &TensorType { dtype, shape: b_shape })?.shape;
    Some(Found { a_view, b_view, a_shape, bt_shape, shape })
}

/// Whether `n` is the root of a canonical matmul pattern (see `find_matmul`).
pub(crate) fn is_matmul(g: &Graph, n: NodeId) -> bool {
    find_matmul(g, n).is_some()
}

/// The class of a `MatMul` operand of shape `shape` read from `read` (see [`operand`]).
fn operand_class(
    eg: &mut EG,
    ids: &HashMap<NodeId, Id>,
    mm_of: &HashMap<NodeId, Id>,
    read: Operand,
    shape: &Shape,
) -> Option<Id> {
    match read {
        Operand::Node(v) => ids.get(&v).copied(),
        Operand::Matmul(v) => mm_of.get(&v).copied(),
        Operand::Reshaped(v) => add_op(eg, Op::Reshape(Reshape { shape: shape.clone() }), &[*ids.get(&v)?]),
    }
}

/// What the conversion of a graph into an e-graph remembers about the graph.
pub struct Converted {
    /// The class of each output, in order.
    pub roots: Vec<Id>,
    /// Every input node of the graph, by slot, with its op and class (unused inputs included).
    pub inputs: Vec<(u32, OpRef, Id)>,
    /// Matmuls recognised.
    pub matmuls: usize,
}

/// Converts the live part of `g` into an e-graph, each canonical matmul becoming one `MatMul`.
/// Only what the outputs need is converted: a recognised matmul reads its operands as
/// `operand` says (not its product space), and its result with the summed axis kept only when
/// something other than a reshape reads it.
pub fn to_egraph(g: &Graph) -> Option<(EG, Converted)> {
    let order = g.live_order();
    let mut found = HashMap::default();
    for &id in &order {
        if let Some(f) = find_matmul(g, id) {
            found.insert(id, f);
        }
    }
    let reads = |f: &Found| [operand(g, &found, f.a_view, &f.a_shape), operand(g, &found, f.b_view, &f.bt_shape)];
    let mut needed = rustc_hash::FxHashSet::default();
    // Recognised matmuls whose result (with the summed axis) is read as such.
    let mut kept: rustc_hash::FxHashSet<NodeId> =
        g.outputs().iter().copied().filter(|o| found.contains_key(o)).collect();
    let mut stack: Vec<NodeId> = g.outputs().to_vec();
    while let Some(n) = stack.pop() {
        if !needed.insert(n) {
            continue;
        }
        match found.get(&n) {
            Some(f) => {
                for read in reads(f) {
                    let (Operand::Node(v) | Operand::Matmul(v) | Operand::Reshaped(v)) = read;
                    if !matches!(read, Operand::Matmul(_)) && found.contains_key(&v) {
                        kept.insert(v);
                    }
                    stack.push(v);
                }
            }
            None => {
                if !matches!(g.op(n), Op::Reshape(_)) {
                    kept.extend(g.inputs(n).iter().copied().filter(|i| found.contains_key(i)));
                }
                stack.extend(g.inputs(n).iter().copied())
            }
        }
    }
    let mut eg = EG::new(Types::default());
    let mut ids: HashMap<NodeId, Id> = HashMap::with_capacity_and_hasher(order.len(), Default::default());
    let mut mm_of: HashMap<NodeId, Id> = HashMap::default();
    let mut inputs = Vec::new();
    for (slot, id) in g.input_nodes() {
        let r = eg.analysis.intern(g.op(id).clone(), g.ty(id).clone());
        eg.analysis.copying = true;
        let class = eg.add(ANode::Op(r, SmallVec::new()));
        eg.analysis.copying = false;
        ids.insert(id, class);
        inputs.push((slot, r, class));
    }
    for &id in &order {
        if !needed.contains(&id) || ids.contains_key(&id) {
            continue;
        }
        let node = g.node(id);
        // A reshape of a recognised matmul's result reads the `MatMul` directly (it is the
        // matmul's own class when the shapes agree), not the reshape that keeps the summed axis.
        if let Op::Reshape(Reshape { shape }) = &node.op
            && let Some(&mm) = mm_of.get(&node.inputs[0])
        {
            let class = if eg[mm].data.ty.shape == *shape { mm } else { add_op(&mut eg, node.op.clone(), &[mm])? };
            ids.insert(id, class);
            continue;
        }
        let enode = if let Some(f) = found.get(&id) {
            let [ra, rb] = reads(f);
            let a = operand_class(&mut eg, &ids, &mm_of, ra, &f.a_shape)?;
            let bt = operand_class(&mut eg, &ids, &mm_of, rb, &f.bt_shape)?;
            let b = add_transpose(&mut eg, bt)?;
            let mm = add_matmul(&mut eg, a, b)?;
            mm_of.insert(id, mm);
            if !kept.contains(&id) {
                continue;
            }
            // The reduce keeps the summed axis as size 1.
            let mut keep = eg[mm].data.ty.clone();
            keep.shape.push(Dim::Const(1));
            if keep != node.ty {
                return None;
            }
            ANode::Op(
                eg.analysis.intern(Op::Reshape(Reshape { shape: keep.shape }), node.ty.clone()),
                smallvec::smallvec![mm],
            )
        } else {
            let children: SmallVec<[Id; 3]> = node.inputs.iter().map(|i| ids[i]).collect();
            eg.analysis.copying = true;
            ANode::Op(eg.analysis.intern(node.op.clone(), node.ty.clone()), children)
        };
        let class = eg.add(enode);
        eg.analysis.copying = false;
        ids.insert(id, class);
    }
    eg.rebuild();
    let roots = g.outputs().iter().map(|o| eg.find(ids[o])).collect();
    let matmuls = found.len();
    let inputs = inputs.into_iter().map(|(s, r, c)| (s, r, eg.find(c))).collect();
    Some((eg, Converted { roots, inputs, matmuls }))
}

/// Builds the graph that `choice` (the e-node chosen for each reachable class) spells: the
/// inputs of the original graph first, by slot, then the chosen nodes in dependency order; a
/// `MatMul` becomes the canonical expand-multiply-sum pattern again. `None` if a node fails to
/// type-check (a broken invariant of a rule) or the choice is cyclic.
pub fn to_graph(eg: &EG, choice: &HashMap<Id, ANode>, conv: &Converted) -> Option<Graph> {
    let mut g = Graph::new();
    let mut built: HashMap<Id, NodeId> = HashMap::default();
    for &(_, r, class) in &conv.inputs {
        let (op, ty) = eg.analysis.get(r).clone();
        built.insert(eg.find(class), g.add_leaf(op, ty).ok()?);
    }
    let mut out = Vec::with_capacity(conv.roots.len());
    for &root in &conv.roots {
        out.push(build(eg, choice, &mut g, &mut built, eg.find(root), 0)?);
    }
    g.set_outputs(out);
    Some(g)
}

fn build(
    eg: &EG,
    choice: &HashMap<Id, ANode>,
    g: &mut Graph,
    built: &mut HashMap<Id, NodeId>,
    class: Id,
    depth: usize,
) -> Option<NodeId> {
    if let Some(&n) = built.get(&class) {
        return Some(n);
    }
    // A chosen program is acyclic, so its depth is below the number of classes.
    if depth > eg.number_of_classes() {
        return None;
    }
    let node = choice.get(&class)?;
    let mut kids: SmallVec<[NodeId; 3]> = SmallVec::new();
    for &c in node.children() {
        kids.push(build(eg, choice, g, built, eg.find(c), depth + 1)?);
    }
    let id = match node {
        ANode::Op(r, _) => {
            let (op, ty) = eg.analysis.get(*r);
            if kids.is_empty() { g.add_leaf(op.clone(), ty.clone()).ok()? } else { g.add(op.clone(), &kids).ok()? }
        }
        ANode::MatMul(_) => expand_matmul(g, kids[0], kids[1])?,
    };
    if g.ty(id) != &eg[class].data.ty {
        return None;
    }
    built.insert(class, id);
    Some(id)
}

/// The canonical matmul pattern of `a @ b` (as the facade's `canonical_matmul` builds it):
/// `a -> reshape [1.., ...a, M, 1, K] -> expand [..., M, N, K]`,
/// `b -> permute (last two) -> reshape [1.., ...b, 1, N, K] -> expand`, their product summed
/// over the last axis and reshaped to `[..., M, N]`.
pub fn expand_matmul(g: &mut Graph, a: NodeId, b: NodeId) -> Option<NodeId> {
    let out = matmul_type(g.ty(a), g.ty(b))?;
    let (sa, sb) = (g.ty(a).shape.clone(), g.ty(b).shape.clone());
    let (ra, rb, r) = (sa.len(), sb.len(), out.shape.len());
    let one = Dim::Const(1);
    let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
    let batch = &out.shape[..r - 2];
    let full: Shape = batch.iter().cloned().chain([m, n, k]).collect();
    let pad = |rank: usize| std::iter::repeat_n(one, r - rank);
    let a_shape: Shape = pad(ra).chain(sa[..ra - 2].iter().cloned()).chain([m, one, k]).collect();
    let a3 = g.add(Op::Reshape(Reshape { shape: a_shape }), &[a]).ok()?;
    let a3 = g.add(Op::Expand(air::op::Expand { shape: full.clone() }), &[a3]).ok()?;
    let bt = g.add(Op::Permute(Permute { perm: swap_last_two(rb) }), &[b]).ok()?;
    let b_shape: Shape = pad(rb).chain(sb[..rb - 2].iter().cloned()).chain([one, n, k]).collect();
    let b3 = g.add(Op::Reshape(Reshape { shape: b_shape }), &[bt]).ok()?;
    let b3 = g.add(Op::Expand(air::op::Expand { shape: full.clone() }), &[b3]).ok()?;
    let prod = g.add(Op::Binary(BinaryOp::Mul), &[a3, b3]).ok()?;
    let axes = smallvec::smallvec![full.len() - 1];
    let summed = g.add(Op::Reduce(Reduce { op: ReduceOp::Sum, axes }), &[prod]).ok()?;
    g.add(Op::Reshape(Reshape { shape: out.shape }), &[summed]).ok()
}

/// Whether a dtype is one where reassociation and scaling through a matmul are exact (integers
/// wrap, so their sums and products are associative and distributive).
pub fn exact_algebra(dtype: DType) -> bool {
    dtype.is_int()
}
