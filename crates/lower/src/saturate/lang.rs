//! The e-graph language of saturation: air's ops (interned with their result type, attributes
//! and all) plus one composite `MatMul` node, the type analysis, and the conversions between an
//! `air::Graph` and an `EGraph` (recognising the canonical matmul pattern on the way in and
//! expanding it back on the way out).

use std::collections::HashMap;
use std::fmt;

use air::op::{Permute, Reduce, Reshape};
use air::{BinaryOp, DType, Dim, Graph, NodeId, Op, ReduceOp, Shape, TensorType};
use egg::{Id, Language};
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
}

impl Types {
    /// The interned form of `op` with result type `ty`.
    pub fn intern(&mut self, op: Op, ty: TensorType) -> OpRef {
        if let Some(r) = self.index.get(&(op.clone(), ty.clone())) {
            return *r;
        }
        let r = OpRef(u32::try_from(self.ops.len()).expect("fewer than 2^32 distinct ops"));
        self.ops.push((op.clone(), ty.clone()));
        self.index.insert((op, ty), r);
        r
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

impl egg::Analysis<ANode> for Types {
    type Data = TensorType;

    fn make(egraph: &mut EG, enode: &ANode, _: Id) -> TensorType {
        match enode {
            ANode::Op(r, _) => egraph.analysis.get(*r).1.clone(),
            ANode::MatMul([a, b]) => {
                matmul_type(&egraph[*a].data, &egraph[*b].data).expect("matmul nodes are type-checked when added")
            }
        }
    }

    fn merge(&mut self, a: &mut TensorType, b: TensorType) -> egg::DidMerge {
        debug_assert_eq!(*a, b, "only values of one type are merged");
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
    let shape = batch.into_iter().chain([a.shape[ra - 2].clone(), b.shape[rb - 1].clone()]).collect();
    Some(TensorType { dtype: a.dtype, shape })
}

/// Right-aligned broadcast of two batch shapes (each pair equal, or one of them 1).
fn broadcast(x: &[Dim], y: &[Dim]) -> Option<Shape> {
    let rank = x.len().max(y.len());
    let one = Dim::Const(1);
    let at = |s: &[Dim], i: usize| if i + s.len() >= rank { s[i + s.len() - rank].clone() } else { one.clone() };
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
    let types: Vec<TensorType> = children.iter().map(|&c| eg[c].data.clone()).collect();
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
    matmul_type(&eg[a].data, &eg[b].data)?;
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

/// Adds the transpose (last two axes swapped) of class `x`.
pub fn add_transpose(eg: &mut EG, x: Id) -> Option<Id> {
    let rank = eg[x].data.shape.len();
    if rank < 2 {
        return None;
    }
    add_op(eg, Op::Permute(Permute { perm: swap_last_two(rank) }), &[x])
}

/// A matmul found in a graph: its operands' views of the product space (before any expand).
struct Found {
    a_view: NodeId,
    b_view: NodeId,
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
    Some(Found { a_view, b_view })
}

/// Whether `n` is the root of a canonical matmul pattern (see `find_matmul`).
pub(crate) fn is_matmul(g: &Graph, n: NodeId) -> bool {
    find_matmul(g, n).is_some()
}

/// Class of `view` reshaped to `shape`: the view's own input when that already has the shape
/// (the facade's `reshape` under the expand), else a new reshape node.
/// When that input is a recognised matmul whose result has the shape (a matmul reading another's
/// result), the matmul's class itself.
fn squeeze(
    g: &Graph,
    eg: &mut EG,
    ids: &HashMap<NodeId, Id>,
    mm_of: &HashMap<NodeId, Id>,
    view: NodeId,
    shape: Shape,
) -> Option<Id> {
    if let Op::Reshape(_) = g.op(view) {
        let inner = g.inputs(view)[0];
        if g.ty(inner).shape == shape {
            return ids.get(&inner).copied();
        }
        if let Some(&mm) = mm_of.get(&inner)
            && eg[mm].data.shape == shape
        {
            return Some(mm);
        }
    }
    add_op(eg, Op::Reshape(Reshape { shape }), &[*ids.get(&view)?])
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
pub fn to_egraph(g: &Graph) -> Option<(EG, Converted)> {
    let order = g.live_order();
    let mut found = HashMap::new();
    for &id in &order {
        if let Some(f) = find_matmul(g, id) {
            found.insert(id, f);
        }
    }
    // What the outputs need, reading each recognised matmul through its two operand views only.
    let mut needed = std::collections::HashSet::new();
    let mut stack: Vec<NodeId> = g.outputs().to_vec();
    while let Some(n) = stack.pop() {
        if needed.insert(n) {
            match found.get(&n) {
                Some(f) => stack.extend([f.a_view, f.b_view]),
                None => stack.extend(g.inputs(n).iter().copied()),
            }
        }
    }
    let mut eg = EG::new(Types::default());
    let mut ids: HashMap<NodeId, Id> = HashMap::with_capacity(order.len());
    let mut mm_of: HashMap<NodeId, Id> = HashMap::new();
    let mut inputs = Vec::new();
    for (slot, id) in g.input_nodes() {
        let r = eg.analysis.intern(g.op(id).clone(), g.ty(id).clone());
        let class = eg.add(ANode::Op(r, SmallVec::new()));
        ids.insert(id, class);
        inputs.push((slot, r, class));
    }
    for &id in &order {
        if !needed.contains(&id) || ids.contains_key(&id) {
            continue;
        }
        let node = g.node(id);
        let enode = if let Some(f) = found.get(&id) {
            let (av, bv) = (&g.ty(f.a_view).shape, &g.ty(f.b_view).shape);
            let r = av.len();
            let mut a_shape: Shape =
                av.iter().enumerate().filter(|&(i, _)| i != r - 2).map(|(_, d)| d.clone()).collect();
            let mut bt_shape: Shape =
                bv.iter().enumerate().filter(|&(i, _)| i != r - 3).map(|(_, d)| d.clone()).collect();
            // Leading 1s only broadcast: drop them from one operand while the other keeps the
            // result's rank (a weight shared by a batch stays a matrix).
            let one = Dim::Const(1);
            while bt_shape.len() > 2 && bt_shape[0] == one {
                bt_shape.remove(0);
            }
            while a_shape.len() > 2 && a_shape[0] == one && bt_shape.len() == r - 1 {
                a_shape.remove(0);
            }
            let a = squeeze(g, &mut eg, &ids, &mm_of, f.a_view, a_shape)?;
            let bt = squeeze(g, &mut eg, &ids, &mm_of, f.b_view, bt_shape)?;
            let b = add_transpose(&mut eg, bt)?;
            let mm = add_matmul(&mut eg, a, b)?;
            mm_of.insert(id, mm);
            // The reduce keeps the summed axis as size 1.
            let mut keep = eg[mm].data.clone();
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
            ANode::Op(eg.analysis.intern(node.op.clone(), node.ty.clone()), children)
        };
        let class = eg.add(enode);
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
    let mut built: HashMap<Id, NodeId> = HashMap::new();
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
    if g.ty(id) != &eg[class].data {
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
    let (m, k, n) = (sa[ra - 2].clone(), sa[ra - 1].clone(), sb[rb - 1].clone());
    let batch = &out.shape[..r - 2];
    let full: Shape = batch.iter().cloned().chain([m.clone(), n.clone(), k.clone()]).collect();
    let pad = |rank: usize| std::iter::repeat_n(one.clone(), r - rank);
    let a_shape: Shape = pad(ra).chain(sa[..ra - 2].iter().cloned()).chain([m, one.clone(), k.clone()]).collect();
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
