//! The rewrites of saturation: the greedy table (`rewrite::RULES`) translated mechanically, and
//! the matmul rules the greedy engine cannot use (they make the graph bigger first, or are only
//! worth it when a cost model chooses among alternatives).
//!
//! # Translating the greedy table
//!
//! Each rule of [`RULES`] keeps its pattern, guard and replacement: the
//! searcher matches the rule's parsed pattern against e-classes (heads by `OpKind`, consts by
//! literal, captures by dtype class, commutative ops both ways, as the greedy matcher does); the
//! applier copies the matched e-nodes into a small `air::Graph` (captures become inputs of their
//! class's type), runs the rule's own guard and replacement there through the greedy engine's
//! matcher and builder, and adds what the replacement built back to the e-graph, merged with the
//! matched class. So the table is the one source of truth, guards and computed rules included.
//!
//! # Matmul rules
//!
//! - `matmul-transpose` (exact): `T(a @ b) = T(b) @ T(a)` (`T` swaps the last two axes).
//! - `matmul-assoc-left`, `matmul-assoc-right`: `(a @ b) @ c = a @ (b @ c)`, both ways.
//! - `matmul-scale-left`, `matmul-scale-right`: `(x * k) @ w = (x @ w) * k` and
//!   `x @ (w * k) = (x @ w) * k` for a const `k`; `matmul-scale-in` the other way.
//! - `merge-shared-lhs` (exact, multi-root): matmuls `x @ w1, ..., x @ wn` sharing their left
//!   operand (each `wi` of rank 2) become slices of one `x @ cat(w1, ..., wn)`; the new e-nodes
//!   are recorded as one group, which extraction takes or leaves as a whole.
//!
//! Reassociation and scaling change float rounding: for floats they are fast-math rules
//! (`SaturateOptions::fast_math`, `OptLevel::O3`); for integers (wrapping arithmetic) they are
//! exact and always on. The multi-root rule is a custom searcher rather than pairwise egg
//! `MultiPattern`s: merging pairs and then pairs of merges builds every concatenation order of
//! every subset, where one n-way merge per shared operand builds one.

use air::op::{Const, Pad, Shrink};
use air::{BinaryOp, Dim, Graph, NodeId, Op, Scalar, TensorType};
use egg::{Applier, Id, Language, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};
use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;

use super::lang::{ANode, EG, add_leaf, add_matmul, add_op, add_transpose, exact_algebra, is_transpose};
use crate::rewrite::pattern::{Match, Pat, Template, match_at, parse_pattern, parse_template};
use crate::rewrite::rules::{Builder, Rhs, Rule};
use crate::rewrite::{RULES, instantiate};

/// Matches a rule may have at one class (patterns are shallow; this bounds the product of
/// alternatives across a pattern's inputs).
const MATCHES_PER_CLASS: usize = 16;
/// Most matmuls one merge concatenates.
const MAX_MERGE: usize = 8;

fn var(name: &str) -> Var {
    format!("?{name}").parse().expect("a valid egg variable")
}

/// The value of a const e-node in `class`, if it has one.
pub fn const_value(eg: &EG, class: Id) -> Option<Scalar> {
    eg[class].nodes.iter().find_map(|n| match n {
        ANode::Op(r, _) => match &eg.analysis.get(*r).0 {
            Op::Const(c) => Some(c.value),
            _ => None,
        },
        ANode::MatMul(_) => None,
    })
}

fn op_of<'a>(eg: &'a EG, node: &ANode) -> Option<&'a Op> {
    match node {
        ANode::Op(r, _) => Some(&eg.analysis.get(*r).0),
        ANode::MatMul(_) => None,
    }
}

/// The concrete e-nodes a table pattern matched: `node` is `None` for a capture.
#[derive(Clone, Debug)]
struct MTree {
    class: Id,
    node: Option<ANode>,
    /// One entry per child of `node`, in the node's own input order.
    kids: Vec<Option<MTree>>,
}

type Caps = SmallVec<[Option<Id>; 4]>;

/// Whether `pat` may match `class`, ignoring whether repeated captures agree: a check that
/// allocates nothing, run before [`matches`] (which builds every match) so that the classes a
/// search visits and rejects cost little.
fn may_match(eg: &EG, pat: &Pat, class: Id) -> bool {
    match pat {
        Pat::Capture { class: dclass, .. } => dclass.accepts(eg[class].data.ty.dtype),
        Pat::Const(lit) => eg[class]
            .nodes
            .iter()
            .any(|n| matches!(op_of(eg, n), Some(Op::Const(c)) if lit.is_none_or(|l| l.matches(c.value)))),
        Pat::Op { head, inputs } => eg[class].nodes.iter().any(|n| {
            let Some(op) = op_of(eg, n) else { return false };
            let args = n.children();
            if !head.accepts(op) || args.len() != inputs.len() {
                return false;
            }
            let direct = inputs.iter().zip(args).all(|(p, &a)| may_match(eg, p, a));
            direct
                || (args.len() == 2
                    && matches!(op, Op::Binary(b) if b.is_commutative())
                    && may_match(eg, &inputs[0], args[1])
                    && may_match(eg, &inputs[1], args[0]))
        }),
    }
}

/// Every way `pat` matches `class` given the captures so far (at most `MATCHES_PER_CLASS`).
fn matches(eg: &EG, pat: &Pat, class: Id, caps: &Caps) -> Vec<(Caps, MTree)> {
    let class = eg.find(class);
    let leaf = |caps: Caps| (caps, MTree { class, node: None, kids: Vec::new() });
    match pat {
        Pat::Capture { var, class: dclass } => {
            if !dclass.accepts(eg[class].data.ty.dtype) {
                return Vec::new();
            }
            let mut caps = caps.clone();
            match var {
                None => {}
                Some(v) => match caps[*v] {
                    Some(bound) if eg.find(bound) != class => return Vec::new(),
                    Some(_) => {}
                    None => caps[*v] = Some(class),
                },
            }
            vec![leaf(caps)]
        }
        Pat::Const(lit) => eg[class]
            .nodes
            .iter()
            .filter(|n| matches!(op_of(eg, n), Some(Op::Const(c)) if lit.is_none_or(|l| l.matches(c.value))))
            .take(1)
            .map(|n| (caps.clone(), MTree { class, node: Some(n.clone()), kids: Vec::new() }))
            .collect(),
        Pat::Op { head, inputs } => {
            let mut out = Vec::new();
            for n in &eg[class].nodes {
                let Some(op) = op_of(eg, n) else { continue };
                let args = n.children();
                if !head.accepts(op) || args.len() != inputs.len() {
                    continue;
                }
                let orders: &[[usize; 2]] =
                    if matches!(op, Op::Binary(b) if b.is_commutative()) { &[[0, 1], [1, 0]] } else { &[[0, 1]] };
                for order in orders {
                    let mut partial: Vec<(Caps, Vec<Option<MTree>>)> = vec![(caps.clone(), vec![None; args.len()])];
                    for (i, p) in inputs.iter().enumerate() {
                        let at = if args.len() == 2 { order[i] } else { i };
                        let mut next = Vec::new();
                        for (c, kids) in &partial {
                            for (c2, t) in matches(eg, p, args[at], c) {
                                let mut kids = kids.clone();
                                kids[at] = Some(t);
                                next.push((c2, kids));
                            }
                        }
                        partial = next;
                        partial.truncate(MATCHES_PER_CLASS);
                    }
                    out.extend(partial.into_iter().map(|(c, kids)| (c, MTree { class, node: Some(n.clone()), kids })));
                    if out.len() >= MATCHES_PER_CLASS {
                        return out;
                    }
                }
            }
            out
        }
    }
}

/// The classes (canonical, ascending) holding an air op that satisfies `f`, through egg's index
/// of classes by discriminant (each interned op is one): searching only these, rather than every
/// class for every rule, is what keeps a search linear in the matches instead of rules x classes.
fn classes_where(eg: &EG, f: impl Fn(&Op) -> bool) -> Vec<Id> {
    let mut out = Vec::new();
    for (r, (op, _)) in eg.analysis.ops() {
        if f(op)
            && let Some(classes) = eg.classes_for_op(&Some(r))
        {
            out.extend(classes);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The classes (canonical, ascending) holding a `MatMul`.
fn matmul_classes(eg: &EG) -> Vec<Id> {
    let mut out: Vec<Id> = eg.classes_for_op(&None).map(|c| c.collect()).unwrap_or_default();
    out.sort_unstable();
    out
}

/// Searches `classes` in order with `search` until `limit` substitutions are found.
fn search_classes<'a>(
    classes: impl IntoIterator<Item = Id>,
    limit: usize,
    mut search: impl FnMut(Id, usize) -> Option<SearchMatches<'a, ANode>>,
) -> Vec<SearchMatches<'a, ANode>> {
    let mut out = Vec::new();
    let mut left = limit;
    for c in classes {
        if left == 0 {
            break;
        }
        if let Some(m) = search(c, left) {
            left = left.saturating_sub(m.substs.len());
            out.push(m);
        }
    }
    out
}

/// One row of the greedy table, ready for the e-graph.
#[derive(Clone)]
struct TableRule {
    rule: &'static Rule,
    names: Vec<&'static str>,
    vars: Vec<Var>,
    lhs: Pat,
    rhs: Option<Template>,
}

impl TableRule {
    fn new(rule: &'static Rule) -> TableRule {
        let mut names = Vec::new();
        let lhs = parse_pattern(rule.lhs, &mut names).expect("the rule table parses");
        let rhs = match rule.rhs {
            Rhs::Template(t) => Some(parse_template(t, &names).expect("the rule table parses")),
            Rhs::Compute(_) => None,
        };
        let vars = names.iter().map(|n| var(n)).collect();
        TableRule { rule, names, vars, lhs, rhs }
    }

    fn subst(&self, caps: &Caps) -> Subst {
        let mut s = Subst::with_capacity(caps.len());
        for (v, c) in self.vars.iter().zip(caps) {
            if let Some(c) = c {
                s.insert(*v, *c);
            }
        }
        s
    }
}

impl Searcher<ANode, super::lang::Types> for TableRule {
    fn search_eclass_with_limit(&self, eg: &EG, eclass: Id, limit: usize) -> Option<SearchMatches<'_, ANode>> {
        if !may_match(eg, &self.lhs, eclass) {
            return None;
        }
        let empty: Caps = smallvec::smallvec![None; self.names.len()];
        let mut substs: Vec<Subst> =
            matches(eg, &self.lhs, eclass, &empty).iter().map(|(c, _)| self.subst(c)).collect();
        substs.dedup();
        substs.truncate(limit);
        (!substs.is_empty()).then_some(SearchMatches { eclass, substs, ast: None })
    }

    fn search_with_limit(&self, eg: &EG, limit: usize) -> Vec<SearchMatches<'_, ANode>> {
        // Only classes near a fresh one can match (see `Types::near_fresh`).
        let near = eg.analysis.near_fresh.get(self.lhs.depth().wrapping_sub(1));
        let owned: Vec<Id>;
        let classes: &[Id] = match (&self.lhs, near) {
            (Pat::Capture { .. }, _) => {
                owned = eg.classes().map(|c| c.id).collect();
                &owned
            }
            (_, Some(near)) => near,
            (Pat::Op { head, .. }, None) => {
                owned = classes_where(eg, |op| head.accepts(op));
                &owned
            }
            (Pat::Const(_), None) => {
                owned = classes_where(eg, |op| matches!(op, Op::Const(_)));
                &owned
            }
        };
        search_classes(classes.iter().copied(), limit, |c, left| self.search_eclass_with_limit(eg, c, left))
    }

    fn vars(&self) -> Vec<Var> {
        self.vars.clone()
    }
}

/// Copies a matched tree into `g`: captures become inputs of their class's type (one per class).
fn mini(
    eg: &EG,
    t: &MTree,
    g: &mut Graph,
    origin: &mut HashMap<NodeId, Id>,
    leaves: &mut HashMap<Id, NodeId>,
) -> Option<NodeId> {
    let Some(node) = &t.node else {
        if let Some(&n) = leaves.get(&t.class) {
            return Some(n);
        }
        let slot = u32::try_from(leaves.len()).ok()?;
        let n = g.add_leaf(Op::Input(air::op::Input { slot }), eg[t.class].data.ty.clone()).ok()?;
        leaves.insert(t.class, n);
        origin.insert(n, t.class);
        return Some(n);
    };
    let ANode::Op(r, children) = node else { return None };
    let (op, ty) = eg.analysis.get(*r).clone();
    let mut kids: SmallVec<[NodeId; 3]> = SmallVec::new();
    for (i, k) in t.kids.iter().enumerate() {
        let sub = match k {
            Some(k) => k.clone(),
            None => MTree { class: eg.find(children[i]), node: None, kids: Vec::new() },
        };
        kids.push(mini(eg, &sub, g, origin, leaves)?);
    }
    let n = if kids.is_empty() { g.add_leaf(op, ty).ok()? } else { g.add(op, &kids).ok()? };
    origin.insert(n, t.class);
    Some(n)
}

/// Adds the e-nodes for mini-graph node `n` (and what it reads) that are not matched classes.
fn back(eg: &mut EG, g: &Graph, n: NodeId, origin: &HashMap<NodeId, Id>) -> Id {
    if let Some(&c) = origin.get(&n) {
        return c;
    }
    let kids: SmallVec<[Id; 3]> = g.inputs(n).iter().map(|&k| back(eg, g, k, origin)).collect();
    let r = eg.analysis.intern(g.op(n).clone(), g.ty(n).clone());
    eg.add(ANode::Op(r, kids))
}

impl Applier<ANode, super::lang::Types> for TableRule {
    fn apply_one(
        &self,
        eg: &mut EG,
        eclass: Id,
        subst: &Subst,
        _: Option<&egg::PatternAst<ANode>>,
        _: Symbol,
    ) -> Vec<Id> {
        let memo = (
            self.rule as *const Rule as usize,
            eg.find(eclass),
            self.vars.iter().map(|v| subst.get(*v).map_or(Id::from(usize::MAX), |&c| eg.find(c))).collect(),
        );
        if !eg.analysis.applied.insert(memo) {
            return Vec::new();
        }
        let empty: Caps = smallvec::smallvec![None; self.names.len()];
        let found = matches(eg, &self.lhs, eclass, &empty);
        let Some((_, tree)) = found.iter().find(|(c, _)| self.subst(c) == *subst) else { return Vec::new() };
        let mut g = Graph::new();
        let mut origin = HashMap::default();
        let Some(root) = mini(eg, tree, &mut g, &mut origin, &mut HashMap::default()) else { return Vec::new() };
        let mut m = Match::new(&self.names);
        if !match_at(&g, &self.lhs, root, &mut m) || self.rule.guard.is_some_and(|guard| !(guard.f)(&g, root, &m)) {
            return Vec::new();
        }
        let mut b = Builder::new(&mut g);
        let new = match (&self.rhs, self.rule.rhs) {
            (Some(t), _) => instantiate(&mut b, t, root, &m),
            (None, Rhs::Compute(f)) => (f.f)(&mut b, root, &m),
            (None, Rhs::Template(_)) => None,
        };
        let Some(new) = new else { return Vec::new() };
        if new == root || g.ty(new) != g.ty(root) {
            return Vec::new();
        }
        let class = back(eg, &g, new, &origin);
        if eg.union(eclass, class) { vec![eclass] } else { Vec::new() }
    }
}

/// The matmul rules (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Transpose,
    AssocLeft,
    AssocRight,
    ScaleLeft,
    ScaleRight,
    ScaleIn,
    MergeSharedLhs,
}

#[derive(Clone)]
struct MatRule {
    kind: Kind,
    fast_math: bool,
}

fn matmuls(eg: &EG, class: Id) -> impl Iterator<Item = [Id; 2]> + '_ {
    eg[class].nodes.iter().filter_map(|n| match n {
        ANode::MatMul(c) => Some(*c),
        ANode::Op(..) => None,
    })
}

/// `(x, k)` for each `mul(x, k)` e-node of `class` whose `k` is a const (either order).
fn scaled(eg: &EG, class: Id) -> Vec<(Id, Id)> {
    let mut out = Vec::new();
    for n in &eg[class].nodes {
        if let (Some(Op::Binary(BinaryOp::Mul)), [p, q]) = (op_of(eg, n), n.children()) {
            if const_value(eg, *q).is_some() {
                out.push((*p, *q));
            } else if const_value(eg, *p).is_some() {
                out.push((*q, *p));
            }
        }
    }
    out
}

/// A const of type `ty` holding `class`'s const value.
fn const_like(eg: &mut EG, class: Id, ty: TensorType) -> Option<Id> {
    let value = const_value(eg, class)?.cast(ty.dtype);
    Some(add_leaf(eg, Op::Const(Const { value }), ty))
}

impl MatRule {
    fn allowed(&self, eg: &EG, class: Id) -> bool {
        match self.kind {
            Kind::Transpose | Kind::MergeSharedLhs => true,
            _ => self.fast_math || exact_algebra(eg[class].data.ty.dtype),
        }
    }

    fn search_class(&self, eg: &EG, class: Id) -> Vec<Subst> {
        let mut out = Vec::new();
        let mk = |pairs: &[(&str, Id)]| {
            let mut s = Subst::with_capacity(pairs.len());
            for (n, c) in pairs {
                s.insert(var(n), eg.find(*c));
            }
            s
        };
        if !self.allowed(eg, class) {
            return out;
        }
        match self.kind {
            Kind::Transpose => {
                for n in &eg[class].nodes {
                    if op_of(eg, n).is_some_and(is_transpose) {
                        for [a, b] in matmuls(eg, n.children()[0]) {
                            out.push(mk(&[("a", a), ("b", b)]));
                        }
                    }
                }
            }
            Kind::AssocLeft => {
                for [ab, c] in matmuls(eg, class) {
                    for [a, b] in matmuls(eg, ab) {
                        out.push(mk(&[("a", a), ("b", b), ("c", c)]));
                    }
                }
            }
            Kind::AssocRight => {
                for [a, bc] in matmuls(eg, class) {
                    for [b, c] in matmuls(eg, bc) {
                        out.push(mk(&[("a", a), ("b", b), ("c", c)]));
                    }
                }
            }
            Kind::ScaleLeft => {
                for [xs, w] in matmuls(eg, class) {
                    for (x, k) in scaled(eg, xs) {
                        out.push(mk(&[("a", x), ("b", w), ("k", k)]));
                    }
                }
            }
            Kind::ScaleRight => {
                for [x, ws] in matmuls(eg, class) {
                    for (w, k) in scaled(eg, ws) {
                        out.push(mk(&[("a", x), ("b", w), ("k", k)]));
                    }
                }
            }
            Kind::ScaleIn => {
                for (y, k) in scaled(eg, class) {
                    for [a, b] in matmuls(eg, y) {
                        out.push(mk(&[("a", a), ("b", b), ("k", k)]));
                    }
                }
            }
            Kind::MergeSharedLhs => {}
        }
        out.truncate(MATCHES_PER_CLASS);
        out
    }

    fn apply(&self, eg: &mut EG, class: Id, s: &Subst) -> Option<Id> {
        let get = |n: &str| s.get(var(n)).copied();
        let new = match self.kind {
            Kind::Transpose => {
                let (tb, ta) = (add_transpose(eg, get("b")?)?, add_transpose(eg, get("a")?)?);
                add_matmul(eg, tb, ta)?
            }
            Kind::AssocLeft => {
                let bc = add_matmul(eg, get("b")?, get("c")?)?;
                add_matmul(eg, get("a")?, bc)?
            }
            Kind::AssocRight => {
                let ab = add_matmul(eg, get("a")?, get("b")?)?;
                add_matmul(eg, ab, get("c")?)?
            }
            Kind::ScaleLeft | Kind::ScaleRight => {
                let mm = add_matmul(eg, get("a")?, get("b")?)?;
                let k = const_like(eg, get("k")?, eg[mm].data.ty.clone())?;
                add_op(eg, Op::Binary(BinaryOp::Mul), &[mm, k])?
            }
            Kind::ScaleIn => {
                let a = get("a")?;
                let k = const_like(eg, get("k")?, eg[a].data.ty.clone())?;
                let ak = add_op(eg, Op::Binary(BinaryOp::Mul), &[a, k])?;
                add_matmul(eg, ak, get("b")?)?
            }
            Kind::MergeSharedLhs => return None,
        };
        (eg[new].data.ty == eg[class].data.ty).then_some(new)
    }
}

impl Searcher<ANode, super::lang::Types> for MatRule {
    fn search_eclass_with_limit(&self, eg: &EG, eclass: Id, limit: usize) -> Option<SearchMatches<'_, ANode>> {
        let mut substs = self.search_class(eg, eclass);
        substs.truncate(limit);
        (!substs.is_empty()).then_some(SearchMatches { eclass, substs, ast: None })
    }

    fn search_with_limit(&self, eg: &EG, limit: usize) -> Vec<SearchMatches<'_, ANode>> {
        let roots = match self.kind {
            Kind::Transpose => classes_where(eg, is_transpose),
            Kind::ScaleIn => classes_where(eg, |op| matches!(op, Op::Binary(BinaryOp::Mul))),
            Kind::AssocLeft | Kind::AssocRight | Kind::ScaleLeft | Kind::ScaleRight | Kind::MergeSharedLhs => {
                matmul_classes(eg)
            }
        };
        if self.kind != Kind::MergeSharedLhs {
            return search_classes(roots, limit, |c, left| self.search_eclass_with_limit(eg, c, left));
        }
        // Buckets of matmul classes by their (shared) left operand, in class order.
        let mut by_lhs: HashMap<Id, Vec<(Id, Id)>> = HashMap::default();
        let mut order = Vec::new();
        for c in roots {
            for [a, b] in matmuls(eg, c) {
                let (a, b) = (eg.find(a), eg.find(b));
                if eg[b].data.ty.shape.len() != 2 || eg.analysis.concats.iter().any(|&k| eg.find(k) == b) {
                    continue;
                }
                let bucket = by_lhs.entry(a).or_insert_with(|| {
                    order.push(a);
                    Vec::new()
                });
                if !bucket.iter().any(|&(m, w)| m == c || w == b) && bucket.len() < MAX_MERGE {
                    bucket.push((c, b));
                }
            }
        }
        let mut out = Vec::new();
        for a in order {
            let bucket = &by_lhs[&a];
            if bucket.len() < 2 || out.len() >= limit {
                continue;
            }
            let mut s = Subst::with_capacity(2 * bucket.len() + 1);
            s.insert(var("x"), a);
            for (i, &(m, w)) in bucket.iter().enumerate() {
                s.insert(var(&format!("m{i}")), m);
                s.insert(var(&format!("w{i}")), w);
            }
            out.push(SearchMatches { eclass: bucket[0].0, substs: vec![s], ast: None });
        }
        out
    }

    fn vars(&self) -> Vec<Var> {
        Vec::new()
    }
}

/// The multi-root merge: `x @ w_i` for every `i` become slices of `x @ cat(w_1, ..., w_n)`
/// (concatenated along `N` by zero pads and adds, as the facade's `cat` is built).
fn merge(eg: &mut EG, s: &Subst) -> Vec<Id> {
    let x = s.get(var("x")).copied();
    let mut members = Vec::new();
    for i in 0..MAX_MERGE {
        match (s.get(var(&format!("m{i}"))), s.get(var(&format!("w{i}")))) {
            (Some(&m), Some(&w)) => members.push((m, w)),
            _ => break,
        }
    }
    let Some(x) = x else { return Vec::new() };
    let ns: Vec<Dim> = members.iter().map(|&(_, w)| eg[w].data.ty.shape[1]).collect();
    let total = ns.iter().fold(Dim::Const(0), |acc, n| &acc + n);
    let dtype = eg[x].data.ty.dtype;
    let zero = if dtype.is_float() { Scalar::Float(0.0) } else { Scalar::Int(0) };
    let mut cat: Option<Id> = None;
    let mut offset = Dim::Const(0);
    let mut ranges = Vec::new();
    for (&(_, w), n) in members.iter().zip(&ns) {
        let end = &offset + n;
        let after = total - end;
        let padding = vec![(Dim::Const(0), Dim::Const(0)), (offset, after)];
        let Some(piece) = add_op(eg, Op::Pad(Pad { padding, value: zero }), &[w]) else { return Vec::new() };
        cat = Some(match cat {
            None => piece,
            Some(c) => match add_op(eg, Op::Binary(BinaryOp::Add), &[c, piece]) {
                Some(sum) => sum,
                None => return Vec::new(),
            },
        });
        ranges.push((offset, end));
        offset = end;
    }
    let Some(cat) = cat else { return Vec::new() };
    eg.analysis.concats.push(cat);
    let Some(mm) = add_matmul(eg, x, cat) else { return Vec::new() };
    let shape = eg[mm].data.ty.shape.clone();
    let mut group = Vec::new();
    let mut changed = Vec::new();
    for (&(m, _), range) in members.iter().zip(ranges) {
        let mut rs: Vec<(Dim, Dim)> = shape.iter().map(|d| (Dim::Const(0), *d)).collect();
        *rs.last_mut().expect("a matmul has rank >= 2") = range;
        let Some(slice) = add_op(eg, Op::Shrink(Shrink { ranges: rs }), &[mm]) else { return Vec::new() };
        if eg[slice].data.ty != eg[m].data.ty {
            return Vec::new();
        }
        let node = eg[slice].nodes.iter().find(|n| matches!(op_of(eg, n), Some(Op::Shrink(_)))).cloned();
        if let Some(node) = node {
            group.push((m, node));
        }
        if eg.union(m, slice) {
            changed.push(m);
        }
    }
    if !changed.is_empty() {
        eg.analysis.groups.push(group);
    }
    changed
}

impl Applier<ANode, super::lang::Types> for MatRule {
    fn apply_one(
        &self,
        eg: &mut EG,
        eclass: Id,
        subst: &Subst,
        _: Option<&egg::PatternAst<ANode>>,
        _: Symbol,
    ) -> Vec<Id> {
        if self.kind == Kind::MergeSharedLhs {
            return merge(eg, subst);
        }
        match self.apply(eg, eclass, subst) {
            Some(new) if eg.union(eclass, new) => vec![eclass],
            _ => Vec::new(),
        }
    }
}

/// The rewrites of saturation: every exact rule of the greedy table (and the inexact ones with
/// `fast_math`), then the matmul rules.
pub fn rewrites(fast_math: bool) -> Vec<Rewrite<ANode, super::lang::Types>> {
    let mut out = Vec::new();
    for rule in RULES.iter().filter(|r| r.exact || fast_math) {
        let t = TableRule::new(rule);
        out.push(Rewrite::new(rule.name, t.clone(), t).expect("a valid rewrite"));
    }
    let kinds = [
        ("matmul-transpose", Kind::Transpose),
        ("matmul-assoc-left", Kind::AssocLeft),
        ("matmul-assoc-right", Kind::AssocRight),
        ("matmul-scale-left", Kind::ScaleLeft),
        ("matmul-scale-right", Kind::ScaleRight),
        ("matmul-scale-in", Kind::ScaleIn),
        ("merge-shared-lhs", Kind::MergeSharedLhs),
    ];
    for (name, kind) in kinds {
        let r = MatRule { kind, fast_math };
        out.push(Rewrite::new(name, r.clone(), r).expect("a valid rewrite"));
    }
    out
}
