//! Vector lowering: the F32X4/I32X4 unrolled inner loop, splats, lane-wise fallbacks and vector
//! casts.

use air::{DType, ReduceOp};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{InstBuilder, Value, types};
use lower::kir::{Stmt, Var};

use super::{Emitter, LANES, unroll_factor, unsupported, vector_ty};
use crate::cpu::analysis::VecPlan;
use crate::error::{CodegenError, Result};

impl<'f> Emitter<'_, 'f> {
    /// Main loop of `unroll` vector bodies, then a scalar tail (fewer than `4 * unroll`
    /// iterations; none when the trip count is known to be a multiple of `4 * unroll`). There
    /// is no one-vector loop between them: each body costs compile time (about a third of a
    /// kernel's, for sigmoid), and the tail is short. A loop of a known,
    /// short trip count (`trips`: a pooling row of 13 outputs) unrolls less where that leaves
    /// fewer than 4 iterations to the scalar tail; one expected to be short (`short`: the
    /// vector side of a symbolic loop that `emit_loop` sends to the tiles when long) does not
    /// unroll.
    pub(super) fn vector_loop(
        &mut self,
        var: Var,
        (lo, hi): (Value, Value),
        trips: Option<i64>,
        body: &[Stmt],
        plan: &VecPlan,
        short: bool,
    ) -> Result<()> {
        // A loop known to be short runs one vector per step: unrolled, a row of 8 would run
        // entirely in the scalar remainder.
        let mut unroll = if short { 1 } else { unroll_factor(plan.size) };
        if let Some(n) = trips {
            while unroll > 1 && n % (LANES * unroll) >= LANES {
                unroll /= 2;
            }
        }
        let step = LANES * unroll;
        let i = self.b.declare_var(types::I64);
        self.b.def_var(i, lo);
        let n = self.b.ins().isub(hi, lo);
        let zero = self.b.ins().iconst(types::I64, 0);
        let n = self.b.ins().smax(n, zero);
        let n_main = self.b.ins().band_imm_s(n, -step);
        let main_limit = self.b.ins().iadd(lo, n_main);

        // Vector partial accumulators, one set per unrolled copy.
        self.partials.clear();
        for acc in &plan.reductions {
            let (d, op) = self.info.acc(*acc)?;
            let (ty, parts) = match (d, op) {
                (DType::F32, ReduceOp::Sum) => (types::F64X2, 2),
                _ => (vector_ty(d)?, 1),
            };
            let mut copies = Vec::new();
            for _ in 0..unroll {
                let mut vars = Vec::new();
                for _ in 0..parts {
                    let v = self.b.declare_var(ty);
                    let init = self.identity(ty, op);
                    self.b.def_var(v, init);
                    vars.push(v);
                }
                copies.push(vars);
            }
            self.partials.insert(*acc, copies);
        }

        self.vec_var = Some(var);
        let outer_regs = self.regs.clone();
        let result = (|| {
            self.counted_loop(i, main_limit, step, |s, iv| {
                s.vars.insert(var, iv);
                // The copies are interleaved statement by statement, each with its own
                // registers, so that their independent dependency chains sit side by side
                // in the instruction stream (see `unroll_factor`).
                // Lane-wise accumulators are per copy too.
                let mut copy_regs = vec![(s.regs.clone(), s.accs.clone()); unroll as usize];
                for stmt in body {
                    for (u, (regs, accs)) in copy_regs.iter_mut().enumerate() {
                        s.copy = u;
                        s.lane_offset = u as i64 * LANES;
                        std::mem::swap(&mut s.regs, regs);
                        std::mem::swap(&mut s.accs, accs);
                        let r = s.emit_stmts(std::slice::from_ref(stmt));
                        std::mem::swap(&mut s.regs, regs);
                        std::mem::swap(&mut s.accs, accs);
                        r?;
                    }
                }
                Ok(())
            })?;
            Ok(())
        })();
        self.lane_offset = 0;
        self.vec_var = None;
        self.copy = 0;
        result?;
        self.regs = outer_regs;

        // Fold the partials into the scalar accumulators.
        let partials = std::mem::take(&mut self.partials);
        for acc in &plan.reductions {
            let (_, op) = self.info.acc(*acc)?;
            let mut total: Option<Value> = None;
            for var in partials[acc].iter().flatten() {
                let v = self.b.use_var(*var);
                let ty = self.b.func.dfg.value_type(v);
                for lane in 0..ty.lane_count() {
                    let x = self.b.ins().extractlane(v, lane as u8);
                    total = Some(match total {
                        None => x,
                        Some(t) => self.reduce_op(op, t, x),
                    });
                }
            }
            if let (Some(t), Some(var)) = (total, self.accs.get(acc).copied()) {
                let cur = self.b.use_var(var);
                let next = self.reduce_op(op, cur, t);
                self.b.def_var(var, next);
            }
        }

        // A known trip count that the main loop covers leaves no tail to emit.
        if trips.is_some_and(|n| n % step == 0) {
            return Ok(());
        }
        self.counted_loop(i, hi, 1, |s, iv| {
            s.vars.insert(var, iv);
            s.emit_stmts(body)
        })
    }

    /// A scalar register value as a vector (bools become lane masks).
    pub(super) fn splat(&mut self, d: DType, v: Value) -> Result<Value> {
        let ty = vector_ty(d)?;
        Ok(if d == DType::Bool {
            let w = self.b.ins().uextend(types::I32, v);
            let m = self.b.ins().ineg(w);
            self.b.ins().splat(ty, m)
        } else {
            self.b.ins().splat(ty, v)
        })
    }

    pub(super) fn vector_cast(&mut self, from: DType, to: DType, v: Value) -> Result<Value> {
        Ok(match (from, to) {
            (DType::F32, DType::I32) => self.b.ins().fcvt_to_sint_sat(types::I32X4, v),
            (DType::I32, DType::F32) => self.b.ins().fcvt_from_sint(types::F32X4, v),
            (DType::F32, DType::Bool) => {
                let zero = self.fconst(types::F32X4, 0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, v, zero)
            }
            (DType::I32, DType::Bool) => {
                let zero = self.iconst(types::I32X4, 0);
                self.b.ins().icmp(IntCC::NotEqual, v, zero)
            }
            (DType::Bool, DType::I32) => self.b.ins().ineg(v),
            (DType::Bool, DType::F32) => {
                let i = self.b.ins().ineg(v);
                self.b.ins().fcvt_from_sint(types::F32X4, i)
            }
            _ => return unsupported(format!("vector cast {from} -> {to}")),
        })
    }

    /// Applies `f` to each lane of 32-bit vectors `args` (scalar code), rebuilding a vector.
    pub(super) fn lanewise(
        &mut self,
        args: &[Value],
        mut f: impl FnMut(&mut Self, &[Value]) -> Result<Value>,
    ) -> Result<Value> {
        let mut out: Option<Value> = None;
        for lane in 0..LANES as u8 {
            let xs: Vec<Value> = args.iter().map(|&a| self.b.ins().extractlane(a, lane)).collect();
            let r = f(self, &xs)?;
            out = Some(match out {
                None => {
                    let ty = self.b.func.dfg.value_type(r).by(LANES as u32).unwrap_or(types::F32X4);
                    self.b.ins().splat(ty, r)
                }
                Some(o) => self.b.ins().insertlane(o, r, lane),
            });
        }
        out.ok_or_else(|| CodegenError::Invalid("no lanes".into()))
    }
}
