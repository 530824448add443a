//! Merging the copy kernels of a concatenation's pieces: pieces over the same loop nest that
//! only load, compute and store (im2col's shifted windows of one input) become one kernel with
//! one store per piece, one launch instead of one per piece.

use crate::kir::{Inst, Kernel, Reg, Stmt};
use crate::program::BufId;

/// Appends `(kernel, args)` to `pieces`, merged into the last piece when both are loop kernels
/// over the same parameters, arguments and symbols whose bodies are the same chain of single
/// loops around straight-line element-wise statements ([`mergeable`]). The pieces write
/// disjoint slices of one buffer and read only other buffers (a piece's kernel never reads its
/// target), so running one's statements after the other's in each iteration computes what the
/// two launches did.
pub(super) fn push_piece(pieces: &mut Vec<(Kernel, Vec<BufId>)>, (kernel, args): (Kernel, Vec<BufId>)) {
    if let (Some((Kernel::Loops(last), last_args)), Kernel::Loops(next)) = (pieces.last_mut(), &kernel)
        && *last_args == args
        && last.params == next.params
        && last.n_syms == next.n_syms
        && same_nest(&last.body, &next.body)
        && let (Some(into), Some(from)) = (innermost(&mut last.body), innermost_ref(&next.body))
        && mergeable(into)
        && mergeable(from)
    {
        let offset = into.iter().filter_map(defined).max().map_or(0, |r| r.0 + 1);
        into.extend(from.iter().map(|s| renumbered(s, offset)));
        return;
    }
    pieces.push((kernel, args));
}

/// Whether `a` and `b` are the same chain of single loops (variables, extents and `parallel`
/// flags) down to their innermost bodies.
fn same_nest(a: &[Stmt], b: &[Stmt]) -> bool {
    match (a, b) {
        (
            [Stmt::Loop { var: va, extent: ea, parallel: pa, body: ba }],
            [Stmt::Loop { var: vb, extent: eb, parallel: pb, body: bb }],
        ) => va == vb && ea == eb && pa == pb && same_nest(ba, bb),
        ([Stmt::Loop { .. }], _) | (_, [Stmt::Loop { .. }]) => false,
        _ => true,
    }
}

/// The body inside a chain of single loops (`None` when the kernel is not at least one loop).
fn innermost(body: &mut Vec<Stmt>) -> Option<&mut Vec<Stmt>> {
    let [Stmt::Loop { body: inner, .. }] = body.as_mut_slice() else { return None };
    if matches!(inner.as_slice(), [Stmt::Loop { .. }]) { innermost(inner) } else { Some(inner) }
}

/// [`innermost`], shared.
fn innermost_ref(body: &[Stmt]) -> Option<&[Stmt]> {
    match body {
        [Stmt::Loop { body: inner, .. }] if matches!(inner.as_slice(), [Stmt::Loop { .. }]) => innermost_ref(inner),
        [Stmt::Loop { body: inner, .. }] => Some(inner),
        _ => None,
    }
}

/// Whether `body` is straight-line element-wise work: registers defined from loads (unchecked),
/// constants, indices and element-wise ops, and stores.
fn mergeable(body: &[Stmt]) -> bool {
    body.iter().all(|s| match s {
        Stmt::Let { inst, .. } => !matches!(inst, Inst::Gather { .. } | Inst::ReadAcc(_)),
        Stmt::Store { .. } => true,
        _ => false,
    })
}

/// The register `s` defines.
fn defined(s: &Stmt) -> Option<Reg> {
    match s {
        Stmt::Let { reg, .. } => Some(*reg),
        _ => None,
    }
}

/// `s` (a statement [`mergeable`] accepts) with every register `r` renamed `r + offset`.
fn renumbered(s: &Stmt, offset: u32) -> Stmt {
    let r = |reg: &Reg| Reg(reg.0 + offset);
    match s {
        Stmt::Let { reg, dtype, inst } => {
            let inst = match inst {
                Inst::Unary(op, a) => Inst::Unary(*op, r(a)),
                Inst::Binary(op, a, b) => Inst::Binary(*op, r(a), r(b)),
                Inst::Where(c, a, b) => Inst::Where(r(c), r(a), r(b)),
                Inst::Cast(a) => Inst::Cast(r(a)),
                Inst::Load { .. } | Inst::Const(_) | Inst::Index(_) => inst.clone(),
                Inst::Gather { .. } | Inst::ReadAcc(_) => unreachable!("not mergeable: {inst:?}"),
            };
            Stmt::Let { reg: r(reg), dtype: *dtype, inst }
        }
        Stmt::Store { buf, index, value } => Stmt::Store { buf: *buf, index: index.clone(), value: r(value) },
        _ => unreachable!("not mergeable: {s:?}"),
    }
}
