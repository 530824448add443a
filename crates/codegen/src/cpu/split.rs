//! Border splitting: a loop whose masks compare its variable with constants (a padded copy's
//! `0 < i && i < 17`) runs as consecutive segments of its range, each with those comparisons
//! folded to constants. The interior segment is then unmasked along the loop (so an innermost
//! loop vectorizes) and the border segments lose their branches. The masks may sit in nested
//! loops: splitting a padded plane's row loop leaves the interior rows with masks of the column
//! alone, which the column loop splits in turn.

use std::collections::BTreeSet;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

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
    let mut seg = segment_known(body, v, lo, hi, &mut HashMap::default());
    drop_unused(&mut seg, &mut HashSet::default());
    seg
}

/// Removes from `body` (nested loops included) every `let` whose register nothing after it
/// reads, `used` holding the registers read after `body`. What folding leaves in a border
/// segment is mostly such: the `where` that picks the border's value leaves the interior's
/// arithmetic (a bias added to a padded zero, its ReLU) unread, and each `let` costs the code
/// generator instructions to emit and compile. Every `let` but a gather (which records a bad
/// index) computes a value and nothing else.
fn drop_unused(body: &mut Vec<Stmt>, used: &mut HashSet<Reg>) {
    let mut keep = vec![true; body.len()];
    for (s, keep) in body.iter_mut().zip(&mut keep).rev() {
        match s {
            Stmt::Let { reg, inst, .. } => {
                if used.contains(reg) || matches!(inst, Inst::Gather { .. }) {
                    used.extend(inst.operands());
                } else {
                    *keep = false;
                }
            }
            Stmt::Loop { body, .. } => drop_unused(body, used),
            Stmt::AccUpdate { value, .. } | Stmt::Store { value, .. } => {
                used.insert(*value);
            }
            Stmt::ScatterAdd { index, value, .. } => used.extend([*index, *value]),
            Stmt::Check { cond, value, .. } => used.extend([*cond, *value]),
            Stmt::AccInit { .. } => {}
        }
    }
    let mut keep = keep.into_iter();
    body.retain(|_| keep.next().unwrap_or(true));
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

#[cfg(test)]
mod tests {
    use air::BinaryOp;

    use super::*;

    fn let_(reg: u32, dtype: DType, inst: Inst) -> Stmt {
        Stmt::Let { reg: Reg(reg), dtype, inst }
    }

    /// `out[i] = 0 < i < 4 ? max(in[i - 1] * s + t, 0) : -5` (a padded BatchNorm+ReLU), as
    /// the statements of the loop over `i` (variable 0).
    fn padded_relu() -> Vec<Stmt> {
        let i = || IExpr::Var(Var(0));
        let inside = IExpr::and(IExpr::lt(IExpr::Const(0), i()), IExpr::lt(i(), IExpr::Const(4)));
        let masked =
            |buf: u32, index: IExpr| Inst::Load { buf, index, mask: Some(inside.clone()), other: Scalar::Float(0.0) };
        vec![
            let_(0, DType::F32, masked(0, IExpr::add(i(), IExpr::Const(-1)))),
            let_(1, DType::F32, masked(1, IExpr::Const(0))),
            let_(2, DType::F32, masked(1, IExpr::Const(1))),
            let_(3, DType::F32, Inst::Binary(BinaryOp::Mul, Reg(0), Reg(1))),
            let_(4, DType::F32, Inst::Binary(BinaryOp::Add, Reg(3), Reg(2))),
            let_(5, DType::F32, Inst::Const(Scalar::Float(0.0))),
            let_(6, DType::F32, Inst::Binary(BinaryOp::Max, Reg(4), Reg(5))),
            let_(7, DType::Bool, Inst::Index(inside.clone())),
            let_(8, DType::F32, Inst::Const(Scalar::Float(-5.0))),
            let_(9, DType::F32, Inst::Where(Reg(7), Reg(6), Reg(8))),
            Stmt::Store { buf: 2, index: i(), value: Reg(9) },
        ]
    }

    #[test]
    fn a_border_segment_keeps_only_what_its_stores_read() {
        let body = padded_relu();
        assert_eq!(cuts(&body, Var(0), Some(5)), vec![1, 4]);
        // On the border the `where` picks -5: the loads and the arithmetic are unread.
        let border = segment(&body, Var(0), 0, Some(1));
        assert_eq!(
            border,
            vec![
                let_(8, DType::F32, Inst::Const(Scalar::Float(-5.0))),
                let_(9, DType::F32, Inst::Cast(Reg(8))),
                Stmt::Store { buf: 2, index: IExpr::Var(Var(0)), value: Reg(9) },
            ]
        );
        assert_eq!(segment(&body, Var(0), 4, None), border);
        // Inside, the masks fold to true and the `where` to the ReLU: only the -5 and the
        // folded condition go unread.
        let interior = segment(&body, Var(0), 1, Some(4));
        let regs: Vec<u32> = interior
            .iter()
            .filter_map(|s| match s {
                Stmt::Let { reg, .. } => Some(reg.0),
                _ => None,
            })
            .collect();
        assert_eq!(regs, vec![0, 1, 2, 3, 4, 5, 6, 9]);
        assert!(interior.iter().all(|s| !matches!(s, Stmt::Let { inst: Inst::Load { mask: Some(_), .. }, .. })));
    }
}
