//! Reductions: accumulator identities and updates, scalar and vector partials.

use air::ReduceOp;
use cranelift_codegen::ir::{ConstantData, Endianness, InstBuilder, MemFlagsData, Type, Value, types};
use lower::kir::{Acc, Reg};

use super::{Emitter, acc_ty};
use crate::error::{CodegenError, Result};

impl<'f> Emitter<'_, 'f> {
    pub(super) fn identity(&mut self, ty: Type, op: ReduceOp) -> Value {
        let lane = ty.lane_type();
        match (op, lane.is_float()) {
            (ReduceOp::Sum, true) => self.fconst(ty, 0.0),
            (ReduceOp::Sum, false) => self.iconst(ty, 0),
            (ReduceOp::Max, true) => self.fconst(ty, f64::NEG_INFINITY),
            (ReduceOp::Max, false) => {
                let min = if lane == types::I32 { i32::MIN as i64 } else { i64::MIN };
                self.iconst(ty, min)
            }
        }
    }

    pub(super) fn reduce_op(&mut self, op: ReduceOp, a: Value, b: Value) -> Value {
        let ty = self.b.func.dfg.value_type(a);
        match (op, ty.lane_type().is_float()) {
            (ReduceOp::Sum, true) => self.b.ins().fadd(a, b),
            (ReduceOp::Sum, false) => self.b.ins().iadd(a, b),
            (ReduceOp::Max, true) => self.math(ty).min_max(a, b, true),
            (ReduceOp::Max, false) => self.b.ins().smax(a, b),
        }
    }

    pub(super) fn emit_acc_update(&mut self, acc: Acc, value: Reg) -> Result<()> {
        let (ad, op) = self.info.acc(acc)?;
        let vd = self.info.reg(value)?;
        let val = self.reg(value)?;
        if self.vector() && !self.partials.contains_key(&acc) {
            // A lane-wise accumulator, initialized inside the vector body.
            let var =
                *self.accs.get(&acc).ok_or_else(|| CodegenError::Invalid(format!("{acc} used before its init")))?;
            let cur = self.b.use_var(var);
            let next = self.reduce_op(op, cur, val.v);
            self.b.def_var(var, next);
            return Ok(());
        }
        if self.vector() {
            let parts = self
                .partials
                .get(&acc)
                .and_then(|p| p.get(self.copy))
                .cloned()
                .ok_or_else(|| CodegenError::Invalid(format!("{acc} updated in a vector loop without partials")))?;
            if parts.len() == 2 {
                // f32 sum into two f64x2 partials.
                let lo = self.b.ins().fvpromote_low(val.v);
                let hi_half = self.swap_halves(val.v);
                let hi = self.b.ins().fvpromote_low(hi_half);
                for (var, x) in parts.iter().zip([lo, hi]) {
                    let cur = self.b.use_var(*var);
                    let next = self.b.ins().fadd(cur, x);
                    self.b.def_var(*var, next);
                }
            } else {
                let cur = self.b.use_var(parts[0]);
                let next = self.reduce_op(op, cur, val.v);
                self.b.def_var(parts[0], next);
            }
            return Ok(());
        }
        let var = *self.accs.get(&acc).ok_or_else(|| CodegenError::Invalid(format!("{acc} used before its init")))?;
        let mut x = if vd != ad { self.cast(vd, ad, val.v)? } else { val.v };
        let ty = acc_ty(ad, op);
        if ty == types::F64 && self.b.func.dfg.value_type(x) == types::F32 {
            x = self.b.ins().fpromote(types::F64, x);
        }
        let cur = self.b.use_var(var);
        let next = self.reduce_op(op, cur, x);
        self.b.def_var(var, next);
        Ok(())
    }

    /// Lanes 2, 3 of an `f32x4` moved to lanes 0, 1.
    pub(super) fn swap_halves(&mut self, v: Value) -> Value {
        self.pick_lanes(v, v, [2, 3, 2, 3])
    }

    /// The 4-byte lanes `lanes` of `a` (0-3) and `b` (4-7), as a vector of `a`'s type.
    pub(super) fn pick_lanes(&mut self, a: Value, b: Value, lanes: [u8; 4]) -> Value {
        let ty = self.b.func.dfg.value_type(a);
        let le = MemFlagsData::new().with_endianness(Endianness::Little);
        let (a, b) = (self.b.ins().bitcast(types::I8X16, le, a), self.b.ins().bitcast(types::I8X16, le, b));
        let mask: Vec<u8> = lanes.iter().flat_map(|&l| (0..4).map(move |k| 4 * l + k)).collect();
        let imm = self.b.func.dfg.immediates.push(ConstantData::from(mask));
        let sh = self.b.ins().shuffle(a, b, imm);
        self.b.ins().bitcast(ty, le, sh)
    }
}
