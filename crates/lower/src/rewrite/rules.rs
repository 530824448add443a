//! The rule table: every rewrite rule Kiln knows, as data (name, pattern, replacement, guard,
//! exactness), plus the handful of named guards and replacement functions the table refers to.
//!
//! # Exactness
//!
//! A rule is *exact* when, under the interpreter's semantics (`air::interp`), the replacement
//! computes the same bits as the original for every input, NaN payloads aside. [`optimize`](crate::rewrite::optimize)
//! (crate::rewrite::optimize) uses only exact rules. The reasoning, rule by rule:
//!
//! - `x * 1`, `x / 1`, `x - 0` (`+0.0` for floats): IEEE multiplication and division by one and
//!   subtraction of `+0` return `x` itself, `-0` and NaN included; integers trivially.
//! - `x + 0` only for integers: for floats `-0.0 + 0.0` is `+0.0`. The float form that is exact is
//!   `x + (-0.0)` (`add-neg-zero`): `-0 + -0 = -0` and `+0 + -0 = +0`.
//! - `x * 0 -> 0` and `x - x -> 0` only for integers: for floats `inf * 0` and `inf - inf` are NaN
//!   and `-1 * 0` is `-0`.
//! - `neg(neg x)` flips the sign bit twice (integers: wrapping negation is an involution, `MIN`
//!   included); `not(not x)` likewise.
//! - `max(x, x)`, `min(x, x)`, `and(x, x)`, `or(x, x)`, `where(c, x, x)`: the interpreter's
//!   IEEE 754-2019 `maximum`/`minimum` return an operand, so they are exact for NaN and `-0` too.
//! - `x < x` is false for every value, NaN included; `x == x` and `x != x` fold only for ints and
//!   bools, since NaN is not equal to itself.
//! - `cast` to the same dtype, and `cast(cast(x, B), A)` when `B` holds every value of `A`
//!   (bool to anything, i32 to i64/f64, f16/bf16 to f32/f64, f32 to f64).
//! - A reduction over size-1 axes is the identity for `max` (`maximum(-inf, x) = x`) and for
//!   integer `sum`, but not for float `sum`: the interpreter accumulates from `+0.0`, which turns
//!   `-0.0` into `+0.0`.
//! - `reduce max` over non-empty axes of `max(x, c)` (through reshapes, permutes and shrinks)
//!   is `max(reduce max x, c)`: IEEE `maximum` is associative and commutative, NaN and signed
//!   zeros included.
//! - Movement ops only move elements, so composing them, dropping identities, and moving a
//!   uniform const through them (a const is the same value at every index) are exact. `reduce max`
//!   of a const is the const only when no reduced axis can be empty (all reduced dims are known
//!   constants of at least 1); `pad` of a const is a const only when the pad value is the const.
//! - Constant folding evaluates the op with the interpreter's own scalar functions
//!   (`air::scalar`) on the operands converted to their dtypes, so the folded value has the bits
//!   the unfolded graph computes. An integer `div` or `mod` by a zero const is not folded: it is
//!   an error of the run.
//!
//! Inexact rules (`exact: false`, in [`RuleSet::fast_math`](crate::rewrite::RuleSet::fast_math)
//! only):
//!
//! - `exp2(log2 x) -> x`: `log2` of a negative number is NaN, and for positive `x` the two
//!   roundings need not cancel.
//! - `recip(recip x) -> x`: `1 / (1 / x)` rounds twice, and is `0` for a subnormal `x` (whose
//!   reciprocal overflows to infinity).
//!
//! Deliberately absent: `log2(exp2 x) -> x` (`exp2` overflows to infinity for large `x` and
//! underflows to `0` for very negative `x`), float `x * 0 -> 0`, float `x + 0.0 -> x`.

use air::op::{Const, Pad, Permute, Shrink};
use air::scalar;
use air::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Scalar, TensorType, UnaryOp};
use smallvec::SmallVec;

use super::pattern::Match;

/// A rewrite rule: a pattern and a replacement, both as data.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    /// Kebab-case, unique (`mul-one`). Statistics are reported under it.
    pub name: &'static str,
    /// The pattern (see the `pattern` module for the language). Its root must be an op.
    pub lhs: &'static str,
    /// What replaces the matched root.
    pub rhs: Rhs,
    /// A condition on the match that the pattern cannot say (attributes, types).
    pub guard: Option<Guard>,
    /// Whether the replacement computes the same bits for every input (see the module docs).
    pub exact: bool,
}

/// What replaces the matched root.
#[derive(Clone, Copy, Debug)]
pub enum Rhs {
    /// A template in the pattern language (`?x`, `(const 0)`, `(root ?x)`).
    Template(&'static str),
    /// A named function, for the few rules that compute attributes or values.
    Compute(Compute),
}

/// A named replacement function. It adds nodes through the builder and returns the node that
/// replaces `root`, or `None` to decline (having added nothing that matters: unused nodes are
/// removed later).
#[derive(Clone, Copy, Debug)]
pub struct Compute {
    /// The function's name, for debug output.
    pub name: &'static str,
    /// The function: given the builder, the matched root and the match, the replacement node or
    /// `None` to decline.
    pub f: fn(&mut Builder<'_>, NodeId, &Match<'_>) -> Option<NodeId>,
}

/// A named condition on a match.
#[derive(Clone, Copy, Debug)]
pub struct Guard {
    /// The condition's name, for debug output.
    pub name: &'static str,
    /// The condition: given the graph, the matched root and the match, whether the rule may fire.
    pub f: fn(&Graph, NodeId, &Match<'_>) -> bool,
}

/// Adds replacement nodes to the graph and remembers them, so that the engine can visit them.
pub struct Builder<'g> {
    graph: &'g mut Graph,
    pub(crate) created: SmallVec<[NodeId; 4]>,
}

impl<'g> Builder<'g> {
    pub(crate) fn new(graph: &'g mut Graph) -> Builder<'g> {
        Builder { graph, created: SmallVec::new() }
    }

    /// The graph being rewritten, for reading types and attributes.
    pub fn graph(&self) -> &Graph {
        self.graph
    }

    /// Adds a node with an inferred type; `None` if the type rule rejects it.
    pub fn add(&mut self, op: Op, inputs: &[NodeId]) -> Option<NodeId> {
        let id = self.graph.add(op, inputs).ok()?;
        self.created.push(id);
        Some(id)
    }

    /// Adds a leaf of the given type; `None` if the leaf does not fit the type.
    pub fn add_leaf(&mut self, op: Op, ty: TensorType) -> Option<NodeId> {
        let id = self.graph.add_leaf(op, ty).ok()?;
        self.created.push(id);
        Some(id)
    }
}

const fn exact(name: &'static str, lhs: &'static str, rhs: &'static str) -> Rule {
    Rule { name, lhs, rhs: Rhs::Template(rhs), guard: None, exact: true }
}

const fn computed(name: &'static str, lhs: &'static str, compute: Compute) -> Rule {
    Rule { name, lhs, rhs: Rhs::Compute(compute), guard: None, exact: true }
}

impl Rule {
    const fn when(self, guard: Guard) -> Rule {
        Rule { guard: Some(guard), ..self }
    }

    const fn inexact(self) -> Rule {
        Rule { exact: false, ..self }
    }
}

const FOLD: Compute = Compute { name: "fold", f: fold };
const REFILL: Compute = Compute { name: "refill-const", f: refill_const };
const COMPOSE_PERMUTE: Compute = Compute { name: "compose-permute", f: compose_permute };
const COMPOSE_SHRINK: Compute = Compute { name: "compose-shrink", f: compose_shrink };
const COMPOSE_PAD: Compute = Compute { name: "compose-pad", f: compose_pad };

const HOIST_MAX_CONST: Compute = Compute { name: "hoist-max-const", f: hoist_max_const };
const SAME_TYPE: Guard = Guard { name: "same-type", f: same_type };
const LOSSLESS_ROUNDTRIP: Guard = Guard { name: "lossless-roundtrip", f: lossless_roundtrip };
const LOSSLESS_INNER: Guard = Guard { name: "lossless-inner", f: lossless_inner };
const IDENTITY_PERM: Guard = Guard { name: "identity-perm", f: identity_perm };
const ZERO_PADDING: Guard = Guard { name: "zero-padding", f: zero_padding };
const FULL_RANGE: Guard = Guard { name: "full-range", f: full_range };
const SIZE_ONE_EXACT: Guard = Guard { name: "size-one-exact", f: size_one_exact };
const PAD_VALUE_IS_CONST: Guard = Guard { name: "pad-value-is-const", f: pad_value_is_const };
const MAX_OVER_NONEMPTY: Guard = Guard { name: "max-over-nonempty", f: max_over_nonempty };
const SAME_PAD_VALUE: Guard = Guard { name: "same-pad-value", f: same_pad_value };

/// Every rule, in the order they are tried at a node (the first that applies wins).
pub static RULES: &[Rule] = &[
    // Constant folding: an element-wise op whose operands are all consts is a const.
    computed("const-fold-unary", "(unary (const))", FOLD),
    computed("const-fold-binary", "(binary (const) (const))", FOLD),
    computed("const-fold-cast", "(cast (const))", FOLD),
    exact("where-true", "(where (const true) ?x ?_)", "?x"),
    exact("where-false", "(where (const false) ?_ ?y)", "?y"),
    // A const is uniform, so moving it is a const of the new shape.
    computed("reshape-const", "(reshape (const))", REFILL),
    computed("permute-const", "(permute (const))", REFILL),
    computed("expand-const", "(expand (const))", REFILL),
    computed("shrink-const", "(shrink (const))", REFILL),
    computed("pad-const", "(pad (const))", REFILL).when(PAD_VALUE_IS_CONST),
    computed("reduce-max-const", "(reduce (const))", REFILL).when(MAX_OVER_NONEMPTY),
    computed("reduce-max-of-max-const", "(reduce ?x)", HOIST_MAX_CONST).when(MAX_OVER_NONEMPTY),
    // Algebraic identities.
    exact("mul-one", "(mul ?x (const 1))", "?x"),
    exact("mul-zero-int", "(mul ?x:int (const 0))", "(const 0)"),
    exact("add-zero-int", "(add ?x:int (const 0))", "?x"),
    exact("add-neg-zero", "(add ?x:float (const -0.0))", "?x"),
    exact("sub-zero", "(sub ?x (const 0))", "?x"),
    exact("sub-self-int", "(sub ?x:int ?x)", "(const 0)"),
    exact("div-one", "(div ?x (const 1))", "?x"),
    exact("neg-neg", "(neg (neg ?x))", "?x"),
    exact("not-not", "(not (not ?x))", "?x"),
    exact("max-self", "(max ?x ?x)", "?x"),
    exact("min-self", "(min ?x ?x)", "?x"),
    exact("and-self", "(and ?x ?x)", "?x"),
    exact("or-self", "(or ?x ?x)", "?x"),
    exact("where-same", "(where ?_ ?x ?x)", "?x"),
    exact("cmplt-self", "(cmplt ?x ?x)", "(const false)"),
    exact("cmpeq-self", "(cmpeq ?x:notfloat ?x)", "(const true)"),
    exact("cmpne-self", "(cmpne ?x:notfloat ?x)", "(const false)"),
    exact("cast-same", "(cast ?x)", "?x").when(SAME_TYPE),
    exact("cast-cast-lossless", "(cast (cast ?x))", "?x").when(LOSSLESS_ROUNDTRIP),
    exact("cast-cast-widening", "(cast (cast ?x))", "(root ?x)").when(LOSSLESS_INNER),
    exact("reduce-size-one", "(reduce ?x)", "?x").when(SIZE_ONE_EXACT),
    // Movement ops that do nothing.
    exact("reshape-same", "(reshape ?x)", "?x").when(SAME_TYPE),
    exact("expand-same", "(expand ?x)", "?x").when(SAME_TYPE),
    exact("permute-identity", "(permute ?x)", "?x").when(IDENTITY_PERM),
    exact("pad-zero", "(pad ?x)", "?x").when(ZERO_PADDING),
    exact("shrink-full", "(shrink ?x)", "?x").when(FULL_RANGE),
    // Movement ops that compose.
    exact("reshape-reshape", "(reshape (reshape ?x))", "(root ?x)"),
    exact("expand-expand", "(expand (expand ?x))", "(root ?x)"),
    computed("permute-permute", "(permute (permute ?x))", COMPOSE_PERMUTE),
    computed("shrink-shrink", "(shrink (shrink ?x))", COMPOSE_SHRINK),
    computed("pad-pad", "(pad (pad ?x))", COMPOSE_PAD).when(SAME_PAD_VALUE),
    // Fast-math only (see the module docs for why these are not exact).
    exact("exp2-log2", "(exp2 (log2 ?x))", "?x").inexact(),
    exact("recip-recip", "(recip (recip ?x))", "?x").inexact(),
];

/// The value of a const leaf, if `id` is one.
fn const_value(g: &Graph, id: NodeId) -> Option<air::Scalar> {
    match g.op(id) {
        Op::Const(c) => Some(c.value),
        _ => None,
    }
}

/// Folds an element-wise op on const operands with `air::scalar` (the interpreter's semantics),
/// so the folded value is exactly what the graph would compute. Not the transcendentals, which
/// the CPU backend's kernels approximate within an ulp or two (`codegen`'s `math.rs`): folded
/// with `libm` there, a program's result would depend on whether an operand is a constant.
fn fold(b: &mut Builder<'_>, root: NodeId, _: &Match<'_>) -> Option<NodeId> {
    let g = b.graph();
    if matches!(g.op(root), Op::Unary(UnaryOp::Exp2 | UnaryOp::Log2 | UnaryOp::Sin | UnaryOp::Erf)) {
        return None;
    }
    let mut args: SmallVec<[Scalar; 2]> = SmallVec::new();
    for &input in g.inputs(root) {
        args.push(scalar::cast(const_value(g, input)?, g.ty(input).dtype));
    }
    let dtype = g.ty(*g.inputs(root).first()?).dtype;
    let value = match (g.op(root), args.as_slice()) {
        (Op::Unary(op), &[x]) => scalar::unary(*op, x, dtype)?,
        (Op::Binary(op), &[x, y]) => {
            // An integer division by zero is an error of the run, not a value.
            if matches!(op, BinaryOp::Div | BinaryOp::Mod) && dtype.is_int() && y == Scalar::Int(0) {
                return None;
            }
            scalar::binary(*op, x, y, dtype)?
        }
        (Op::Cast(c), &[x]) => scalar::cast(x, c.to),
        _ => return None,
    };
    let root_ty = g.ty(root).clone();
    b.add_leaf(Op::Const(Const { value }), root_ty)
}

/// A const of the root's type holding the value of the root's const input.
fn refill_const(b: &mut Builder<'_>, root: NodeId, _: &Match<'_>) -> Option<NodeId> {
    let g = b.graph();
    let value = const_value(g, *g.inputs(root).first()?)?;
    let ty = g.ty(root).clone();
    b.add_leaf(Op::Const(Const { value }), ty)
}

/// `permute(permute(x, inner), outer)` is `permute(x, p)` with `p[i] = inner[outer[i]]`.
fn compose_permute(b: &mut Builder<'_>, root: NodeId, m: &Match<'_>) -> Option<NodeId> {
    let g = b.graph();
    let (Op::Permute(outer), Op::Permute(inner)) = (g.op(root), g.op(g.inputs(root)[0])) else {
        return None;
    };
    let perm = outer.perm.iter().map(|&i| inner.perm.get(i).copied()).collect::<Option<_>>()?;
    b.add(Op::Permute(Permute { perm }), &[m.get("x")?])
}

/// `shrink(shrink(x, inner), outer)` keeps `inner.start + outer.start .. inner.start + outer.end`.
fn compose_shrink(b: &mut Builder<'_>, root: NodeId, m: &Match<'_>) -> Option<NodeId> {
    let g = b.graph();
    let (Op::Shrink(outer), Op::Shrink(inner)) = (g.op(root), g.op(g.inputs(root)[0])) else {
        return None;
    };
    if outer.ranges.len() != inner.ranges.len() {
        return None;
    }
    let ranges = inner.ranges.iter().zip(&outer.ranges).map(|((s1, _), (s2, e2))| (s1 + s2, s1 + e2)).collect();
    b.add(Op::Shrink(Shrink { ranges }), &[m.get("x")?])
}

/// `reduce max(view(max(x, c)))` for a const `c` and a chain of reshapes, permutes and shrinks
/// (which only move elements) is `max(reduce max(view(x)), c)`: one `max` with `c` per result
/// instead of per reduced element (a ReLU before a max pool). The guard keeps every reduced axis
/// non-empty, where the maximum of the `c`s is `c`.
fn hoist_max_const(b: &mut Builder<'_>, root: NodeId, _: &Match<'_>) -> Option<NodeId> {
    let g = b.graph();
    let Op::Reduce(r) = g.op(root) else { return None };
    let mut chain = Vec::new();
    let mut cur = g.inputs(root)[0];
    while matches!(g.op(cur), Op::Reshape(_) | Op::Permute(_) | Op::Shrink(_)) {
        chain.push(cur);
        cur = g.inputs(cur)[0];
    }
    if g.op(cur) != &Op::Binary(BinaryOp::Max) {
        return None;
    }
    let [x, y] = [g.inputs(cur)[0], g.inputs(cur)[1]];
    let (x, value) = match (const_value(g, x), const_value(g, y)) {
        (None, Some(c)) => (x, c),
        (Some(c), None) => (y, c),
        _ => return None,
    };
    let (r, root_ty) = (r.clone(), g.ty(root).clone());
    let ops: Vec<Op> = chain.iter().rev().map(|&m| g.op(m).clone()).collect();
    let mut moved = x;
    for op in ops {
        moved = b.add(op, &[moved])?;
    }
    let reduced = b.add(Op::Reduce(r), &[moved])?;
    let c = b.add_leaf(Op::Const(Const { value }), root_ty)?;
    b.add(Op::Binary(BinaryOp::Max), &[reduced, c])
}

/// `pad(pad(x, inner, v), outer, v)` pads by the sums.
fn compose_pad(b: &mut Builder<'_>, root: NodeId, m: &Match<'_>) -> Option<NodeId> {
    let g = b.graph();
    let (Op::Pad(outer), Op::Pad(inner)) = (g.op(root), g.op(g.inputs(root)[0])) else {
        return None;
    };
    if outer.padding.len() != inner.padding.len() {
        return None;
    }
    let padding = inner.padding.iter().zip(&outer.padding).map(|((a1, b1), (a2, b2))| (a1 + a2, b1 + b2)).collect();
    let value = outer.value;
    b.add(Op::Pad(Pad { padding, value }), &[m.get("x")?])
}

fn same_type(g: &Graph, root: NodeId, m: &Match<'_>) -> bool {
    m.get("x").is_some_and(|x| g.ty(x) == g.ty(root))
}

/// Whether `wide` holds every value of `narrow` exactly, so a cast there and back is the identity.
fn holds_every_value(narrow: DType, wide: DType) -> bool {
    use DType::*;
    narrow == wide
        || match narrow {
            Bool => true,
            I32 => matches!(wide, I64 | F64),
            F16 | BF16 => matches!(wide, F32 | F64),
            F32 => wide == F64,
            I64 | F64 => false,
        }
}

fn lossless_roundtrip(g: &Graph, root: NodeId, m: &Match<'_>) -> bool {
    let Some(x) = m.get("x") else { return false };
    let middle = g.ty(g.inputs(root)[0]).dtype;
    g.ty(x) == g.ty(root) && holds_every_value(g.ty(x).dtype, middle)
}

/// `cast(cast(x, A), B)` equals `cast(x, B)` when `A` holds every value of `x`'s dtype: the inner
/// cast is then exact, and every conversion is a function of the value alone (bool -> i64 -> f32,
/// i32 -> i64 -> f32, f16 -> f32 -> i32; conversions to f16/bf16 go through f32 either way).
fn lossless_inner(g: &Graph, root: NodeId, m: &Match<'_>) -> bool {
    let Some(x) = m.get("x") else { return false };
    let middle = g.ty(g.inputs(root)[0]).dtype;
    holds_every_value(g.ty(x).dtype, middle)
}

fn identity_perm(g: &Graph, root: NodeId, _: &Match<'_>) -> bool {
    matches!(g.op(root), Op::Permute(p) if p.perm.iter().enumerate().all(|(i, &a)| i == a))
}

fn zero_padding(g: &Graph, root: NodeId, _: &Match<'_>) -> bool {
    let zero = air::Dim::Const(0);
    matches!(g.op(root), Op::Pad(p) if p.padding.iter().all(|(a, b)| *a == zero && *b == zero))
}

fn full_range(g: &Graph, root: NodeId, _: &Match<'_>) -> bool {
    let shape = &g.ty(g.inputs(root)[0]).shape;
    let zero = air::Dim::Const(0);
    matches!(g.op(root), Op::Shrink(s)
        if s.ranges.len() == shape.len() && s.ranges.iter().zip(shape).all(|((a, b), d)| *a == zero && b == d))
}

/// A reduction over size-1 axes only, of a kind that returns its one element unchanged.
fn size_one_exact(g: &Graph, root: NodeId, _: &Match<'_>) -> bool {
    let input = &g.ty(g.inputs(root)[0]);
    let Op::Reduce(r) = g.op(root) else { return false };
    let one = air::Dim::Const(1);
    r.axes.iter().all(|&a| input.shape.get(a) == Some(&one)) && (r.op == ReduceOp::Max || !input.dtype.is_float())
}

fn pad_value_is_const(g: &Graph, root: NodeId, _: &Match<'_>) -> bool {
    let value = const_value(g, g.inputs(root)[0]);
    matches!(g.op(root), Op::Pad(p) if Some(p.value) == value)
}

fn max_over_nonempty(g: &Graph, root: NodeId, _: &Match<'_>) -> bool {
    let shape = &g.ty(g.inputs(root)[0]).shape;
    matches!(g.op(root), Op::Reduce(r) if r.op == ReduceOp::Max
        && r.axes.iter().all(|&a| shape.get(a).and_then(air::Dim::as_const).is_some_and(|n| n >= 1)))
}

fn same_pad_value(g: &Graph, root: NodeId, _: &Match<'_>) -> bool {
    match (g.op(root), g.op(g.inputs(root)[0])) {
        (Op::Pad(outer), Op::Pad(inner)) => outer.value == inner.value,
        _ => false,
    }
}
