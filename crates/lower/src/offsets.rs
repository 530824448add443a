//! Base offsets taken out of a loop kernel's memory accesses, so that kernels differing only in
//! where they start reading or writing their buffers become one kernel.
//!
//! An RNN unrolled over time reads step `t`'s slice of one projection buffer at
//! `b1[i0*128 + i1 + s0*128*t + 64]`, and a concatenation writes each piece at its own window:
//! the same loop nest once per step or piece, each compiled separately. [`split_offsets`] moves
//! the loop-invariant part that all of a buffer's accesses share (the symbolic terms common to
//! all of them, plus the least constant) into a per-parameter *offset*; a backend that can start
//! a buffer argument at an element offset (the CPU VM adds it to the pointer) compiles the
//! remaining kernel once for every launch that shares it. The memory touched is unchanged:
//! every access is `offset + rest` for the same `offset + rest` as before, term for term.

use smallvec::SmallVec;

use crate::kir::{IExpr, Inst, LoopKernel, Stmt};

/// `k` with each buffer parameter's shared base offset removed from its accesses, and those
/// offsets in elements, one per parameter (`Const(0)` where there is none). Every access index
/// of a parameter is rewritten into one canonical sum (its terms that read loop variables in
/// their order, then the others, then the constant), so kernels that differ only in those
/// offsets or in how their sums were nested come out equal. Status buffers keep offset 0.
pub fn split_offsets(k: &LoopKernel) -> (LoopKernel, Vec<IExpr>) {
    let n = k.params.len();
    let mut shares: Vec<Option<Share>> = vec![None; n];
    let mut status = vec![false; n];
    visit(&k.body, &mut |buf, e| match buf {
        Use::Access(b) => {
            let parts = Parts::of(e);
            let Some(s) = shares.get_mut(b as usize) else { return };
            match s {
                None => *s = Some(Share { terms: parts.invariant, least: parts.constant }),
                Some(s) => s.meet(&parts),
            }
        }
        Use::Status(b) => {
            if let Some(s) = status.get_mut(b as usize) {
                *s = true;
            }
        }
    });
    let offsets: Vec<(Terms, i64)> = shares
        .into_iter()
        .zip(&status)
        .map(|(s, &is_status)| match s {
            Some(s) if !is_status => (s.terms, s.least),
            _ => (Terms::new(), 0),
        })
        .collect();
    let body = rewrite(&k.body, &|buf, e| {
        let (terms, least) = &offsets[buf as usize];
        Parts::of(e).without(terms, *least)
    });
    let exprs =
        offsets.into_iter().map(|(terms, c)| sum(terms.into_iter().cloned().chain([IExpr::Const(c)]))).collect();
    (LoopKernel { params: k.params.clone(), n_syms: k.n_syms, body }, exprs)
}

/// Terms of an index's top-level sum, borrowed from the kernel: nothing is cloned until the
/// canonical sum is built.
type Terms<'a> = SmallVec<[&'a IExpr; 4]>;

/// What a buffer's accesses have in common so far: the invariant terms every one of them has
/// (with multiplicity) and the least constant.
#[derive(Clone)]
struct Share<'a> {
    terms: Terms<'a>,
    least: i64,
}

impl Share<'_> {
    fn meet(&mut self, parts: &Parts) {
        let mut theirs = parts.invariant.clone();
        self.terms.retain(|t| match theirs.iter().position(|u| u == t) {
            Some(i) => {
                theirs.swap_remove(i);
                true
            }
            None => false,
        });
        self.least = self.least.min(parts.constant);
    }
}

/// An index split into the terms of its top-level sum.
struct Parts<'a> {
    /// Terms that read a loop variable, in order.
    variant: Terms<'a>,
    /// Other non-constant terms (symbols), in order.
    invariant: Terms<'a>,
    /// The sum of the constant terms (wrapping, as the index arithmetic is).
    constant: i64,
}

impl<'a> Parts<'a> {
    fn of(e: &'a IExpr) -> Parts<'a> {
        let mut p = Parts { variant: Terms::new(), invariant: Terms::new(), constant: 0 };
        p.add(e);
        p
    }

    fn add(&mut self, e: &'a IExpr) {
        match e {
            IExpr::Add(a, b) => {
                self.add(a);
                self.add(b);
            }
            IExpr::Const(c) => self.constant = self.constant.wrapping_add(*c),
            e if e.reads_vars() => self.variant.push(e),
            e => self.invariant.push(e),
        }
    }

    /// The index less `terms` (each present in `self.invariant`) and `least`, in canonical order.
    fn without(mut self, terms: &[&IExpr], least: i64) -> IExpr {
        for t in terms {
            if let Some(i) = self.invariant.iter().position(|u| u == t) {
                self.invariant.remove(i);
            }
        }
        let c = self.constant.wrapping_sub(least);
        sum(self.variant.into_iter().chain(self.invariant).cloned().chain([IExpr::Const(c)]))
    }
}

/// The left-nested sum of `terms` (constants folded by `IExpr::add`; `0` when empty).
fn sum(terms: impl IntoIterator<Item = IExpr>) -> IExpr {
    terms.into_iter().fold(IExpr::Const(0), IExpr::add)
}

/// How a statement names a buffer parameter.
enum Use {
    /// Its index (or gather/scatter base) addresses the buffer's elements.
    Access(u32),
    /// As the status buffer of a check.
    Status(u32),
}

/// Calls `f` for every buffer use in `stmts`, with the address expression of an access.
fn visit<'a>(stmts: &'a [Stmt], f: &mut impl FnMut(Use, &'a IExpr)) {
    const NONE: &IExpr = &IExpr::Const(0);
    for s in stmts {
        match s {
            Stmt::Let { inst: Inst::Load { buf, index, .. }, .. } | Stmt::Store { buf, index, .. } => {
                f(Use::Access(*buf), index)
            }
            Stmt::Let { inst: Inst::Gather { buf, base, status, .. }, .. }
            | Stmt::ScatterAdd { buf, base, status, .. } => {
                f(Use::Access(*buf), base);
                f(Use::Status(*status), NONE);
            }
            Stmt::Check { status, .. } => f(Use::Status(*status), NONE),
            Stmt::Loop { body, .. } => visit(body, f),
            Stmt::Let { .. } | Stmt::AccInit { .. } | Stmt::AccUpdate { .. } => {}
        }
    }
}

/// `k` with every access of parameter `p` moved `by[p]` elements further into its buffer (a
/// kernel built for one step of an unrolled loop, made into the same kernel for another step
/// without building it again: see `schedule::memo`). The caller counts any symbol `by` adds in
/// `n_syms`.
pub fn shift_accesses(k: &LoopKernel, by: &[IExpr]) -> LoopKernel {
    let body = rewrite(&k.body, &|buf, e| match by.get(buf as usize) {
        Some(IExpr::Const(0)) | None => e.clone(),
        Some(d) => {
            let mut parts = Parts::of(e);
            parts.add(d);
            parts.without(&[], 0)
        }
    });
    LoopKernel { params: k.params.clone(), n_syms: k.n_syms, body }
}

/// `stmts` with every access address `e` of parameter `buf` rewritten to `at(buf, e)`.
fn rewrite(stmts: &[Stmt], at: &impl Fn(u32, &IExpr) -> IExpr) -> Vec<Stmt> {
    stmts
        .iter()
        .map(|s| match s {
            Stmt::Let { reg, dtype, inst: Inst::Load { buf, index, mask, other } } => Stmt::Let {
                reg: *reg,
                dtype: *dtype,
                inst: Inst::Load { buf: *buf, index: at(*buf, index), mask: mask.clone(), other: *other },
            },
            Stmt::Let { reg, dtype, inst: Inst::Gather { buf, base, index, stride, size, status, check } } => {
                Stmt::Let {
                    reg: *reg,
                    dtype: *dtype,
                    inst: Inst::Gather {
                        buf: *buf,
                        base: at(*buf, base),
                        index: *index,
                        stride: stride.clone(),
                        size: size.clone(),
                        status: *status,
                        check: *check,
                    },
                }
            }
            Stmt::Store { buf, index, value } => Stmt::Store { buf: *buf, index: at(*buf, index), value: *value },
            Stmt::ScatterAdd { buf, base, index, stride, size, value, status, check } => Stmt::ScatterAdd {
                buf: *buf,
                base: at(*buf, base),
                index: *index,
                stride: stride.clone(),
                size: size.clone(),
                value: *value,
                status: *status,
                check: *check,
            },
            Stmt::Loop { var, extent, parallel, body } => {
                Stmt::Loop { var: *var, extent: extent.clone(), parallel: *parallel, body: rewrite(body, at) }
            }
            s => s.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use air::{DType, Scalar};

    use super::*;
    use crate::kir::{Access, Param, Reg, Var};

    fn v(n: u32) -> IExpr {
        IExpr::Var(Var(n))
    }
    fn c(n: i64) -> IExpr {
        IExpr::Const(n)
    }
    fn add(a: IExpr, b: IExpr) -> IExpr {
        IExpr::add(a, b)
    }
    fn mul(a: IExpr, b: IExpr) -> IExpr {
        IExpr::mul(a, b)
    }
    fn load(reg: u32, buf: u32, index: IExpr) -> Stmt {
        Stmt::Let {
            reg: Reg(reg),
            dtype: DType::F32,
            inst: Inst::Load { buf, index, mask: None, other: Scalar::Float(0.0) },
        }
    }
    fn kernel(params: usize, body: Vec<Stmt>) -> LoopKernel {
        let mut params = vec![Param { dtype: DType::F32, access: Access::Read }; params];
        params[0].access = Access::Write;
        let body = vec![Stmt::Loop { var: Var(0), extent: c(4), parallel: true, body }];
        LoopKernel { params, n_syms: 1, body }
    }
    /// Every access index of `k`, with its buffer, in order.
    fn accesses(k: &LoopKernel) -> Vec<(u32, IExpr)> {
        let mut out = Vec::new();
        visit(&k.body, &mut |u, e| {
            if let Use::Access(b) = u {
                out.push((b, e.clone()));
            }
        });
        out
    }
    /// `offset + rest` equals the original index at every point of a small grid.
    fn assert_same_addresses(k: &LoopKernel) {
        let (split, offsets) = split_offsets(k);
        for ((b, orig), (b2, rest)) in accesses(k).into_iter().zip(accesses(&split)) {
            assert_eq!(b, b2);
            for (i0, i1, s0) in [(0, 0, 1), (3, 5, 7), (2, 31, 16)] {
                let (vars, syms) = ([i0, i1], [s0]);
                let whole = offsets[b as usize].eval(&[], &syms) + rest.eval(&vars, &syms);
                assert_eq!(whole, orig.eval(&vars, &syms), "b{b}[{orig}] = {} + {rest}", offsets[b as usize]);
            }
        }
    }

    /// An unrolled recurrent step: gate `g` of step `t` reads `b1` at `i0*128 + i1 + s0*128*t + 32*g`.
    fn step(t: i64) -> LoopKernel {
        let row = add(mul(v(0), c(128)), v(1));
        let base = mul(IExpr::Sym(0), c(128 * t));
        let body = vec![
            load(0, 1, add(row.clone(), add(base.clone(), c(64)))),
            load(1, 1, add(row.clone(), base.clone())),
            load(2, 2, add(row, c(96))),
            Stmt::Store { buf: 0, index: add(mul(v(0), c(32)), v(1)), value: Reg(0) },
        ];
        kernel(3, body)
    }

    #[test]
    fn steps_of_an_unrolled_loop_become_one_kernel() {
        let (k0, o0) = split_offsets(&step(0));
        let (k1, o1) = split_offsets(&step(1));
        let (k2, o2) = split_offsets(&step(2));
        assert_eq!(k0, k1);
        assert_eq!(k1, k2);
        assert_eq!(o0, vec![c(0), c(0), c(96)]);
        let s0 = |n| mul(IExpr::Sym(0), c(n));
        assert_eq!(o1, vec![c(0), s0(128), c(96)]);
        assert_eq!(o2, vec![c(0), s0(256), c(96)]);
        for t in 0..3 {
            assert_same_addresses(&step(t));
        }
    }

    #[test]
    fn the_least_constant_moves_and_the_rest_stays() {
        let k = kernel(2, vec![load(0, 1, add(v(0), c(517))), load(1, 1, add(c(512), v(0)))]);
        let (split, offsets) = split_offsets(&k);
        assert_eq!(offsets, vec![c(0), c(512)]);
        assert_eq!(accesses(&split), vec![(1, add(v(0), c(5))), (1, v(0))]);
        assert_same_addresses(&k);
    }

    #[test]
    fn a_term_only_some_accesses_have_stays_in_the_kernel() {
        let s = IExpr::Sym(0);
        let k = kernel(2, vec![load(0, 1, add(v(0), s.clone())), load(1, 1, v(1))]);
        let (split, offsets) = split_offsets(&k);
        assert_eq!(offsets, vec![c(0), c(0)]);
        assert_eq!(accesses(&split), vec![(1, add(v(0), s)), (1, v(1))]);
        assert_same_addresses(&k);
    }

    #[test]
    fn status_buffers_keep_offset_zero_and_gather_bases_move() {
        let gather = Inst::Gather {
            buf: 1,
            base: add(mul(v(0), c(8)), c(40)),
            index: Reg(0),
            stride: c(1),
            size: c(8),
            status: 2,
            check: 0,
        };
        let body = vec![
            Stmt::Let { reg: Reg(0), dtype: DType::I64, inst: Inst::Index(v(0)) },
            Stmt::Let { reg: Reg(1), dtype: DType::F32, inst: gather },
            Stmt::Store { buf: 0, index: add(v(0), c(3)), value: Reg(1) },
        ];
        let k = kernel(3, body);
        let (split, offsets) = split_offsets(&k);
        assert_eq!(offsets, vec![c(3), c(40), c(0)]);
        assert_eq!(accesses(&split), vec![(1, mul(v(0), c(8))), (0, v(0))]);
        assert_same_addresses(&k);
    }
}
