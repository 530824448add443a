//! Run-time conditions of symbolic shapes: what each op's type rule needs of its dims but cannot
//! prove while they are symbolic, collected once per graph and checked once per binding set.
//!
//! # Why
//!
//! `Op::infer` decides what it can from the dims alone. A `shrink` of `[4]` to `0..n` is well
//! typed for `n = 3` and reads far outside its input for `n = 1000`; nothing in the graph says
//! which. The type rule states its conditions as inequalities `lhs <= rhs` between dims
//! ([`op_conditions`]); `infer` rejects the ones that are false whatever the symbols are, and
//! [`collect`] keeps the ones it cannot decide, so that every backend checks them once per binding
//! set with [`check`] before it sizes anything. That is the one source of truth for both.
//!
//! # What is deferred and what is not
//!
//! - `shrink`: `0 <= start`, `start <= end`, `end <= size` on every axis.
//! - `pad`: every amount `>= 0`.
//! - Every node's type: every dim `>= 0` (a reshape, expand or leaf to `n - 5` with `n = 2`).
//! - `expand`, `reshape` and the operand types of element-wise ops need *proof*: `infer` rejects
//!   an expand of `n` to `m` or a reshape of `[n]` to `[m]` unless the dims are equal as
//!   polynomials (or the expanded dim is 1), because lowering relies on that structural equality
//!   (an expanded axis gets stride 0). So they add no run-time condition beyond the dims above.
//!
//! Conditions are kept in topological order of the nodes, deduplicated (the first node that
//! needs a condition owns it), and each names its node by the node's position in
//! `Graph::topo_order()`: the order the program cache keys graphs by, so a program compiled from
//! one graph names the same node in any structurally identical graph.

use std::collections::HashSet;
use std::fmt;
use std::hash::BuildHasherDefault;

use rustc_hash::FxHasher;
use smallvec::SmallVec;

use crate::dim::{Bindings, Dim, DimError};
use crate::graph::Graph;
use crate::op::{Op, ReduceOp, TensorType};

/// Which dim of a node a condition is about; says how to word a violation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    /// `0 <= start` of a shrink range on `axis`.
    RangeStart {
        /// The axis.
        axis: usize,
    },
    /// `start <= end` of a shrink range on `axis`.
    RangeOrder {
        /// The axis.
        axis: usize,
    },
    /// `end <= size` of a shrink range on `axis`.
    RangeEnd {
        /// The axis.
        axis: usize,
    },
    /// `0 <= amount` of the padding before (`after == false`) or after `axis`.
    Padding {
        /// The axis.
        axis: usize,
        /// Whether this is the amount after the axis.
        after: bool,
    },
    /// `1 <= size` of an axis a reduction without an identity (`max`) reduces.
    ReduceExtent {
        /// The axis.
        axis: usize,
    },
    /// `0 <= dim` of the node's own type on `axis`.
    Dim {
        /// The axis.
        axis: usize,
    },
}

/// One condition `lhs <= rhs` of a type rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Condition {
    /// What the condition is about.
    pub subject: Subject,
    /// The smaller side.
    pub lhs: Dim,
    /// The larger side.
    pub rhs: Dim,
}

impl Condition {
    fn new(subject: Subject, lhs: &Dim, rhs: &Dim) -> Condition {
        Condition { subject, lhs: *lhs, rhs: *rhs }
    }

    /// `Some(true)` if the condition holds for every symbol value, `Some(false)` if it holds for
    /// none, `None` if that depends on the symbols (or the difference overflows).
    pub fn decide(&self) -> Option<bool> {
        match (&self.lhs, &self.rhs) {
            (Dim::Const(a), Dim::Const(b)) => Some(a <= b),
            (a, b) if a == b => Some(true),
            (a, b) => b.checked_sub(a)?.as_const().map(|d| d >= 0),
        }
    }

    /// Why the condition fails for these values: `axis 0: range end n = 1000 > size 4`.
    fn describe(&self, lhs: i64, rhs: i64) -> String {
        let l = Shown(&self.lhs, lhs);
        let r = Shown(&self.rhs, rhs);
        match self.subject {
            Subject::RangeStart { axis } => format!("axis {axis}: range start {r} < 0"),
            Subject::RangeOrder { axis } => format!("axis {axis}: range start {l} > end {r}"),
            Subject::RangeEnd { axis } => format!("axis {axis}: range end {l} > size {r}"),
            Subject::Padding { axis, after } => {
                format!("axis {axis}: padding {} {r} < 0", if after { "after" } else { "before" })
            }
            Subject::ReduceExtent { axis } => {
                format!("axis {axis}: reducing {r} elements, but max has no identity for an empty axis")
            }
            Subject::Dim { axis } => format!("axis {axis} of the result: size {r} < 0"),
        }
    }
}

/// A dim with its value: `1000` or `n = 1000`.
struct Shown<'a>(&'a Dim, i64);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Dim::Const(_) => write!(f, "{}", self.1),
            d => write!(f, "{d} = {}", self.1),
        }
    }
}

/// The dim conditions of `op` on inputs of these types, beyond the ones about its own result
/// (see [`node_conditions`]). `op` must have passed the arity and rank checks of `Op::infer`,
/// which calls this and rejects any condition that can never hold.
pub fn op_conditions(op: &Op, inputs: &[&TensorType]) -> Vec<Condition> {
    let zero = Dim::Const(0);
    let mut out = Vec::new();
    match op {
        Op::Shrink(s) => {
            out.reserve_exact(3 * s.ranges.len());
            for (axis, ((start, end), size)) in s.ranges.iter().zip(&inputs[0].shape).enumerate() {
                out.push(Condition::new(Subject::RangeStart { axis }, &zero, start));
                out.push(Condition::new(Subject::RangeOrder { axis }, start, end));
                out.push(Condition::new(Subject::RangeEnd { axis }, end, size));
            }
        }
        Op::Pad(p) => {
            out.reserve_exact(2 * p.padding.len());
            for (axis, (before, after)) in p.padding.iter().enumerate() {
                out.push(Condition::new(Subject::Padding { axis, after: false }, &zero, before));
                out.push(Condition::new(Subject::Padding { axis, after: true }, &zero, after));
            }
        }
        _ => {}
    }
    out
}

/// Every condition of a node whose type is `ty`: its op's ([`op_conditions`]), a `max` reduction's
/// reduced axes non-empty, then every dim of its type non-negative.
///
/// The reduced axes of a `max` are a run-time condition only: PyTorch raises for `amax` over an
/// empty axis, and the facade rejects a known-empty one when the op is built, but an internal
/// `max` over a known-empty axis (a softmax of an empty axis, whose result is empty too) stays
/// well typed, so `infer` does not reject it.
pub fn node_conditions(op: &Op, inputs: &[&TensorType], ty: &TensorType) -> Vec<Condition> {
    let mut out = op_and_reduce_conditions(op, inputs);
    out.extend(dim_conditions(ty, |_| true));
    out
}

/// [`op_conditions`] and a `max` reduction's reduced axes non-empty.
fn op_and_reduce_conditions(op: &Op, inputs: &[&TensorType]) -> Vec<Condition> {
    let mut out = if op.is_leaf() { Vec::new() } else { op_conditions(op, inputs) };
    if let (Op::Reduce(r), Some(input)) = (op, inputs.first())
        && r.op == ReduceOp::Max
    {
        for &axis in &r.axes {
            if let Some(size) = input.shape.get(axis).filter(|d| !d.is_const()) {
                out.push(Condition::new(Subject::ReduceExtent { axis }, &Dim::Const(1), size));
            }
        }
    }
    out
}

/// `0 <= dim` for each symbolic (or negative) dim of `ty` that `keep` accepts.
fn dim_conditions<'t>(ty: &'t TensorType, mut keep: impl FnMut(&'t Dim) -> bool) -> impl Iterator<Item = Condition> {
    let zero = Dim::Const(0);
    ty.shape
        .iter()
        .enumerate()
        .filter(move |(_, d)| d.as_const().is_none_or(|c| c < 0) && keep(d))
        .map(move |(axis, d)| Condition::new(Subject::Dim { axis }, &zero, d))
}

/// A condition a graph leaves to run time, with the node that needs it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Check {
    /// The node's position in `Graph::topo_order()` of the graph it was collected from.
    pub position: u32,
    /// The node's op (`shrink`, `pad`, ...).
    pub op: &'static str,
    /// The condition.
    pub condition: Condition,
}

/// The conditions of every node the outputs need that hold for some but not every symbol value
/// (and, should a malformed graph have any, those that hold for none), in topological order,
/// each kept once. O(N) over the graph's dims; a graph without symbols gives none.
pub fn collect(graph: &Graph) -> Vec<Check> {
    let order = graph.topo_order();
    let live = graph.live_order();
    let mut is_live = vec![false; order.iter().map(|id| id.index() as usize + 1).max().unwrap_or(0)];
    for id in live {
        is_live[id.index() as usize] = true;
    }
    let mut seen: HashSet<(Dim, Dim), BuildHasherDefault<FxHasher>> = HashSet::default();
    let mut seen_dims: HashSet<&Dim, BuildHasherDefault<FxHasher>> = HashSet::default();
    let mut checks = Vec::new();
    for (position, &id) in order.iter().enumerate() {
        if !is_live[id.index() as usize] {
            continue;
        }
        let node = graph.node(id);
        let symbolic = node.ty.shape.iter().any(|d| !d.is_const())
            || node.inputs.iter().any(|&i| graph.ty(i).shape.iter().any(|d| !d.is_const()))
            || matches!(&node.op, Op::Shrink(s) if s.ranges.iter().any(|(a, b)| !a.is_const() || !b.is_const()))
            || matches!(&node.op, Op::Pad(p) if p.padding.iter().any(|(a, b)| !a.is_const() || !b.is_const()));
        let negative = node.ty.shape.iter().any(|d| d.as_const().is_some_and(|c| c < 0));
        if !symbolic && !negative {
            continue;
        }
        let inputs: SmallVec<[&TensorType; 3]> = node.inputs.iter().map(|&i| graph.ty(i)).collect();
        if !node.op.is_leaf() && inputs.len() != node.op.arity() {
            continue;
        }
        // The same dim's `0 <= d` is kept once: a dim seen before needs no new condition (most
        // nodes share the batch or sequence dims).
        let conditions = op_and_reduce_conditions(&node.op, &inputs)
            .into_iter()
            .chain(dim_conditions(&node.ty, |d| seen_dims.insert(d)));
        for condition in conditions {
            if condition.decide() == Some(true) || !seen.insert((condition.lhs, condition.rhs)) {
                continue;
            }
            checks.push(Check { position: position as u32, op: node.op.mnemonic(), condition });
        }
    }
    checks
}

/// A condition of a graph that does not hold for a binding set: the typed error every backend
/// (the interpreter included) reports for it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct BoundsError {
    /// The op of the node whose condition failed (`shrink`, `pad`, `reshape`, ...).
    pub op: &'static str,
    /// The node's position in `Graph::topo_order()` (see [`Check::position`]).
    pub position: u32,
    /// What failed, with the values: `axis 0: range end n = 1000 > size 4`.
    pub message: String,
}

/// Checks `checks` in order for `bindings`; the first that fails, or that overflows `i64`, is the
/// error. What every backend calls once per binding set.
///
/// A check with an unbound symbol is skipped: it is not a violation, and every backend reports
/// the unbound symbol itself wherever its value matters (the VM and wgpu key their binding-set
/// caches by every symbol of the checks; the interpreter evaluates every dim it uses).
pub fn check(checks: &[Check], bindings: &Bindings) -> Result<(), BoundsError> {
    for c in checks {
        let fail = |message: String| BoundsError { op: c.op, position: c.position, message };
        let value = |d: &Dim| match d.eval(bindings) {
            Ok(v) => Ok(Some(v)),
            Err(DimError::Unbound(_)) => Ok(None),
            Err(e) => Err(fail(format!("cannot evaluate `{d}`: {e}"))),
        };
        if let (Some(lhs), Some(rhs)) = (value(&c.condition.lhs)?, value(&c.condition.rhs)?)
            && lhs > rhs
        {
            return Err(fail(c.condition.describe(lhs, rhs)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dim::Symbol;

    #[test]
    fn decide_is_three_valued() {
        let n = Dim::sym("n");
        let zero = Dim::Const(0);
        let c = |l: &Dim, r: &Dim| Condition::new(Subject::Dim { axis: 0 }, l, r).decide();
        assert_eq!(c(&zero, &Dim::Const(3)), Some(true));
        assert_eq!(c(&Dim::Const(4), &Dim::Const(3)), Some(false));
        assert_eq!(c(&n, &(&n + 2)), Some(true));
        assert_eq!(c(&(&n + 1), &n), Some(false));
        assert_eq!(c(&zero, &n), None);
        assert_eq!(c(&n, &Dim::Const(4)), None);
    }

    #[test]
    fn violations_name_the_values() {
        let n = Dim::sym("n");
        let check_ = Check {
            position: 1,
            op: "shrink",
            condition: Condition::new(Subject::RangeEnd { axis: 0 }, &n, &Dim::Const(4)),
        };
        let mut b = Bindings::new();
        b.insert(Symbol::new("n"), 1000);
        let e = check(std::slice::from_ref(&check_), &b).unwrap_err();
        assert_eq!(e.to_string(), "shrink: axis 0: range end n = 1000 > size 4");
        assert_eq!(e.position, 1);
        b.insert(Symbol::new("n"), 4);
        assert_eq!(check(std::slice::from_ref(&check_), &b), Ok(()));
        assert_eq!(check(std::slice::from_ref(&check_), &Bindings::new()), Ok(()), "unbound: not a violation");
        b.insert(Symbol::new("n"), i64::MAX);
        let twice = Check { condition: Condition::new(Subject::Dim { axis: 0 }, &Dim::Const(0), &(&n * 2)), ..check_ };
        let e = check(&[twice], &b).unwrap_err();
        assert_eq!(e.message, "cannot evaluate `2*n`: dim expression overflowed i64");
    }
}
