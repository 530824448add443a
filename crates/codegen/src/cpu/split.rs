//! Border splitting: a loop whose masks compare its variable with constants (a padded copy's
//! `0 < i && i < 17`) runs as consecutive segments of its range, each with those comparisons
//! folded to constants. The interior segment is then unmasked along the loop (so an innermost
//! loop vectorizes) and the border segments lose their branches. The masks may sit in nested
//! loops: splitting a padded plane's row loop leaves the interior rows with masks of the column
//! alone, which the column loop splits in turn.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap as HashMap;

use air::{DType, Scalar};
use lower::kir::{IExpr, Inst, Reg, Stmt, Var};

/// The most cut points a loop is split at (a padded dim has two: one segment per border and the
/// interior).
const MAX_CUTS: usize = 4;

/// Where the range of `v` splits: the sorted values `t` at which a mask or index condition of
/// `body` (nested loops included) of the form `c < v` or `v < c` changes truth, inside
/// `1..extent` when the extent is a constant. Empty when nothing is to be gained: there are no
/// such comparisons, or too many.
pub(crate) fn cuts(body: &[Stmt], v: Var, extent: Option<i64>) -> Vec<i64> {
    let mut out = BTreeSet::new();
    scan(body, v, &mut out);
    out.retain(|&t| t > 0 && extent.is_none_or(|n| t < n));
    if out.len() > MAX_CUTS { Vec::new() } else { out.into_iter().collect() }
}

fn scan(body: &[Stmt], v: Var, out: &mut BTreeSet<i64>) {
    for s in body {
        match s {
            Stmt::Loop { body, .. } => scan(body, v, out),
            Stmt::Let { inst: Inst::Load { mask: Some(m), .. }, .. } | Stmt::Let { inst: Inst::Index(m), .. } => {
                collect(m, v, out)
            }
            _ => {}
        }
    }
}

fn collect(e: &IExpr, v: Var, out: &mut BTreeSet<i64>) {
    match e {
        IExpr::Lt(a, b) => match (a.as_ref(), b.as_ref()) {
            (IExpr::Const(c), IExpr::Var(w)) if *w == v => {
                out.insert(c.saturating_add(1));
            }
            (IExpr::Var(w), IExpr::Const(c)) if *w == v => {
                out.insert(*c);
            }
            _ => {}
        },
        IExpr::And(a, b) => {
            collect(a, v, out);
            collect(b, v, out);
        }
        _ => {}
    }
}

/// `body` for `v` in `lo..hi` (`hi` `None`: to the loop's end), where no cut lies strictly
/// inside: every `c < v` and `v < c` is a constant there (in nested loops too). What then has a
/// known value is simplified: a mask that folds to true is dropped, a load whose mask folds to
/// false is its `other` value (no branch around a load that never runs), an index that folds is
/// a constant, and a `where` on such a constant is the operand it picks (a padded copy's border
/// is stores of zeros, its interior the copy alone).
pub(crate) fn segment(body: &[Stmt], v: Var, lo: i64, hi: Option<i64>) -> Vec<Stmt> {
    segment_known(body, v, lo, hi, &mut HashMap::default())
}

/// [`segment`], with `known` the registers folded to constants so far (in enclosing bodies).
fn segment_known(body: &[Stmt], v: Var, lo: i64, hi: Option<i64>, known: &mut HashMap<Reg, bool>) -> Vec<Stmt> {
    body.iter()
        .map(|s| match s {
            Stmt::Let { reg, dtype, inst: Inst::Load { buf, index, mask: Some(m), other } } => {
                let m = fold(m, v, lo, hi);
                let inst = match m.as_const() {
                    Some(0) => Inst::Const(*other),
                    Some(_) => Inst::Load { buf: *buf, index: index.clone(), mask: None, other: *other },
                    None => Inst::Load { buf: *buf, index: index.clone(), mask: Some(m), other: *other },
                };
                Stmt::Let { reg: *reg, dtype: *dtype, inst }
            }
            Stmt::Let { reg, dtype, inst: Inst::Index(e) } => {
                let e = fold(e, v, lo, hi);
                let inst = match (e.as_const(), dtype) {
                    (Some(c), DType::Bool) => {
                        known.insert(*reg, c != 0);
                        Inst::Const(Scalar::Bool(c != 0))
                    }
                    _ => Inst::Index(e),
                };
                Stmt::Let { reg: *reg, dtype: *dtype, inst }
            }
            Stmt::Let { reg, dtype, inst: Inst::Where(c, a, b) } => {
                let inst = match known.get(c) {
                    Some(&pick) => Inst::Cast(if pick { *a } else { *b }),
                    None => Inst::Where(*c, *a, *b),
                };
                Stmt::Let { reg: *reg, dtype: *dtype, inst }
            }
            Stmt::Loop { var, extent, parallel, body } => Stmt::Loop {
                var: *var,
                extent: extent.clone(),
                parallel: *parallel,
                body: segment_known(body, v, lo, hi, known),
            },
            other => other.clone(),
        })
        .collect()
}

/// `e` with its comparisons of `v` against constants evaluated for `v` in `lo..hi`.
fn fold(e: &IExpr, v: Var, lo: i64, hi: Option<i64>) -> IExpr {
    let f = |x: &IExpr| fold(x, v, lo, hi);
    match e {
        IExpr::Lt(a, b) => match (a.as_ref(), b.as_ref()) {
            // `c < v` for every `v >= lo` exactly when `c < lo` (no cut inside the segment).
            (IExpr::Const(c), IExpr::Var(w)) if *w == v => IExpr::Const((*c < lo) as i64),
            // `v < c` for every `v < hi` exactly when `hi <= c`.
            (IExpr::Var(w), IExpr::Const(c)) if *w == v => IExpr::Const(hi.is_some_and(|h| h <= *c) as i64),
            _ => IExpr::lt(f(a), f(b)),
        },
        IExpr::And(a, b) => IExpr::and(f(a), f(b)),
        other => other.clone(),
    }
}
