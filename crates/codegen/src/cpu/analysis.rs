//! What the emitter needs to know about a kernel before it emits anything: the dtype of every
//! register and accumulator, and, per innermost loop, whether it can run four lanes at a time.
//!
//! Vectorization rule (an innermost loop over `v`):
//! - every register it reads or defines is `f32`, `i32` or `bool` (bools become lane masks);
//! - every load is from an `f32`/`i32` buffer of the register's dtype, at an index whose linear
//!   coefficient in `v` is the constant 1 (contiguous: a vector load) or 0 (broadcast: a scalar
//!   load and a splat), and any mask does not depend on `v`;
//! - every store writes an `f32`/`i32` buffer contiguously (coefficient 1), and no buffer that is
//!   stored is also loaded at another index in the loop (that could be a recurrence);
//! - `index` values have coefficient 0 or 1;
//! - accumulator updates are `sum`/`max` of `f32`/`i32` into accumulators declared outside the
//!   loop, and nothing in the loop reads an accumulator (a reduction: partial sums per lane).

use std::collections::HashMap;

use air::{DType, ReduceOp};
use lower::kir::{Acc, IExpr, Inst, LoopKernel, Reg, Stmt, Var};

use crate::error::{CodegenError, Result};

/// Dtypes of the kernel's registers and accumulators.
pub(crate) struct KernelInfo {
    pub(crate) regs: HashMap<Reg, DType>,
    pub(crate) accs: HashMap<Acc, (DType, ReduceOp)>,
}

impl KernelInfo {
    pub(crate) fn new(k: &LoopKernel) -> Result<KernelInfo> {
        let mut info = KernelInfo { regs: HashMap::new(), accs: HashMap::new() };
        info.collect(k, &k.body)?;
        Ok(info)
    }

    fn collect(&mut self, k: &LoopKernel, stmts: &[Stmt]) -> Result<()> {
        for s in stmts {
            match s {
                Stmt::Let { reg, dtype, inst } => {
                    if self.regs.insert(*reg, *dtype).is_some() {
                        return Err(CodegenError::Invalid(format!("register {reg} defined twice")));
                    }
                    match inst {
                        Inst::Load { buf, .. } => check_buf(k, *buf)?,
                        Inst::Gather { buf, status, .. } => {
                            check_buf(k, *buf)?;
                            check_buf(k, *status)?;
                        }
                        _ => {}
                    }
                }
                Stmt::Loop { body, .. } => self.collect(k, body)?,
                Stmt::AccInit { acc, dtype, op } => {
                    if dtype.is_bool() {
                        return Err(CodegenError::Unsupported(format!("accumulator {acc} of dtype bool")));
                    }
                    if self.accs.insert(*acc, (*dtype, *op)).is_some() {
                        return Err(CodegenError::Invalid(format!("accumulator {acc} declared twice")));
                    }
                }
                Stmt::Store { buf, .. } => check_buf(k, *buf)?,
                Stmt::ScatterAdd { buf, status, .. } => {
                    check_buf(k, *buf)?;
                    check_buf(k, *status)?;
                }
                Stmt::Check { status, .. } => check_buf(k, *status)?,
                Stmt::AccUpdate { .. } => {}
            }
        }
        Ok(())
    }

    pub(crate) fn reg(&self, r: Reg) -> Result<DType> {
        self.regs.get(&r).copied().ok_or_else(|| CodegenError::Invalid(format!("register {r} is never defined")))
    }

    pub(crate) fn acc(&self, a: Acc) -> Result<(DType, ReduceOp)> {
        self.accs.get(&a).copied().ok_or_else(|| CodegenError::Invalid(format!("accumulator {a} is never declared")))
    }
}

fn check_buf(k: &LoopKernel, buf: u32) -> Result<()> {
    if (buf as usize) < k.params.len() {
        Ok(())
    } else {
        Err(CodegenError::Invalid(format!("buffer b{buf} out of range ({} params)", k.params.len())))
    }
}

/// How an innermost loop is vectorized.
pub(crate) struct VecPlan {
    /// Accumulators updated in the loop, in first-update order.
    pub(crate) reductions: Vec<Acc>,
    /// Instructions in the body (a rough size, to pick the unroll factor).
    pub(crate) size: usize,
}

fn lane_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::I32 | DType::Bool)
}

fn coeff_is(e: &IExpr, v: Var, allowed: &[i64]) -> bool {
    matches!(e.linear_coeff(v), Some(IExpr::Const(c)) if allowed.contains(&c))
}

/// Decides whether the innermost loop `body` over `v` can be vectorized.
pub(crate) fn vector_plan(k: &LoopKernel, info: &KernelInfo, v: Var, body: &[Stmt]) -> Option<VecPlan> {
    let mut reductions = Vec::new();
    let mut loads: Vec<(u32, &IExpr)> = Vec::new();
    let mut stores: Vec<(u32, &IExpr)> = Vec::new();
    let reg_ok = |r: &Reg| info.regs.get(r).is_some_and(|d| lane_dtype(*d));
    for s in body {
        match s {
            Stmt::Let { dtype, inst, .. } => {
                if !lane_dtype(*dtype) {
                    return None;
                }
                match inst {
                    Inst::Load { buf, index, mask, .. } => {
                        let pd = k.params.get(*buf as usize)?.dtype;
                        if pd != *dtype || pd == DType::Bool || !coeff_is(index, v, &[0, 1]) {
                            return None;
                        }
                        if mask.as_ref().is_some_and(|m| m.uses(v)) {
                            return None;
                        }
                        loads.push((*buf, index));
                    }
                    Inst::Const(_) => {}
                    Inst::Index(e) => {
                        if !coeff_is(e, v, &[0, 1]) {
                            return None;
                        }
                    }
                    Inst::Unary(_, r) | Inst::Cast(r) => {
                        if !reg_ok(r) {
                            return None;
                        }
                    }
                    Inst::Binary(_, a, b) => {
                        if !reg_ok(a) || !reg_ok(b) {
                            return None;
                        }
                    }
                    Inst::Where(c, a, b) => {
                        if !reg_ok(c) || !reg_ok(a) || !reg_ok(b) {
                            return None;
                        }
                    }
                    // Data-dependent addresses and checks stay scalar.
                    Inst::ReadAcc(_) | Inst::Gather { .. } => return None,
                }
            }
            Stmt::Store { buf, index, value } => {
                let pd = k.params.get(*buf as usize)?.dtype;
                if !matches!(pd, DType::F32 | DType::I32) || info.regs.get(value) != Some(&pd) {
                    return None;
                }
                if !coeff_is(index, v, &[1]) {
                    return None;
                }
                stores.push((*buf, index));
            }
            Stmt::AccUpdate { acc, value } => {
                let (d, _) = info.accs.get(acc)?;
                if !matches!(d, DType::F32 | DType::I32) || info.regs.get(value) != Some(d) {
                    return None;
                }
                if !reductions.contains(acc) {
                    reductions.push(*acc);
                }
            }
            Stmt::Loop { .. } | Stmt::AccInit { .. } | Stmt::ScatterAdd { .. } | Stmt::Check { .. } => return None,
        }
    }
    for (sb, si) in &stores {
        if loads.iter().any(|(lb, li)| lb == sb && li != si) {
            return None;
        }
    }
    Some(VecPlan { reductions, size: body.len() })
}
