//! A loop nest that is a stencil (`stencil::stencil_plan`, `stencil::plane_plan`) as one call of
//! the stencil routine: its arguments stored into a `StencilArgs` on the stack, as
//! `StencilPlan::args` fills them for a native run.

use cranelift_codegen::ir::{InstBuilder, StackSlotData, StackSlotKind, Value, types};

use super::Emitter;
use crate::cpu::helpers::Helper;
use crate::cpu::stencil::{Operand, PerPlane, StencilPlan, Weights, at};
use crate::cpu::tile::TileLevel;
use crate::error::Result;

impl<'f> Emitter<'_, 'f> {
    /// Every plane and row of `plan` by one routine call.
    pub(super) fn stencil_loop(&mut self, plan: &StencilPlan) -> Result<()> {
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, at::SIZE, 3));
        let f32 = air::DType::F32;
        let mut words: Vec<(i32, Value)> = vec![
            (at::DST, self.addr(plan.dst_buf, &plan.dst_base, f32)?),
            (at::SRC, self.addr(plan.src_buf, &plan.src_base, f32)?),
            (at::DST_ROW, self.iexpr(&plan.dst_row)?),
            (at::SRC_ROW, self.iexpr(&plan.src_row)?),
            (at::ROWS, self.iexpr(&plan.rows)?),
            (at::PLANES, self.iexpr(&plan.planes)?),
            (at::DST_PLANE, self.iexpr(&plan.dst_plane)?),
            (at::SRC_PLANE, self.iexpr(&plan.src_plane)?),
        ];
        let mut consts = vec![
            (at::WIDTH, plan.width),
            (at::STRIDE, plan.stride),
            (at::TAPS, plan.offsets.len() as i64),
            (at::FLAGS, plan.flags()),
            (at::BIAS_AT, 0),
            (at::SCALE_AT, 0),
            (at::WEIGHTS_AT, 0),
        ];
        for (t, &off) in plan.offsets.iter().enumerate() {
            consts.push((at::OFFSETS + 8 * t as i32, off));
        }
        let mut floats: Vec<(i32, Value)> = Vec::new();
        for (value, (at_value, at_ptr, at_plane)) in [
            (&plan.bias, (at::BIAS, at::BIAS_AT, at::BIAS_PLANE)),
            (&plan.scale, (at::SCALE, at::SCALE_AT, at::SCALE_PLANE)),
        ] {
            match value {
                Some(PerPlane::Value(o)) => floats.push((at_value, self.operand(*o)?)),
                Some(PerPlane::Loaded { buf, base, plane }) => {
                    words.push((at_ptr, self.addr(*buf, base, f32)?));
                    words.push((at_plane, self.iexpr(plane)?));
                }
                None => {}
            }
        }
        if let Some(o) = plan.post {
            floats.push((at::POST, self.operand(o)?));
        }
        match &plan.weights {
            Weights::None => {}
            Weights::Values(ws) => {
                for (t, &w) in ws.iter().enumerate() {
                    floats.push((at::WEIGHTS + 4 * t as i32, self.operand(w)?));
                }
            }
            Weights::Loaded { buf, base, plane, offsets } => {
                words.push((at::WEIGHTS_AT, self.addr(*buf, base, f32)?));
                words.push((at::WEIGHTS_PLANE, self.iexpr(plane)?));
                for (t, &off) in offsets.iter().enumerate() {
                    consts.push((at::WEIGHT_OFFSETS + 8 * t as i32, off));
                }
            }
        }
        // Constants first: a pointer given below replaces its null.
        for (offset, c) in consts {
            let v = self.iconst(types::I64, c);
            self.b.ins().stack_store(types::I64, v, slot, offset);
        }
        for (offset, v) in words.into_iter().chain(floats) {
            self.b.ins().stack_store(types::I64, v, slot, offset);
        }
        let args = self.b.ins().stack_addr(types::I64, slot, 0);
        let helper = if self.tiling.level == TileLevel::Avx512 { Helper::StencilAvx512 } else { Helper::StencilBase };
        self.call_void(helper, &[args]);
        Ok(())
    }

    fn operand(&mut self, o: Operand) -> Result<Value> {
        match o {
            Operand::Reg(r) => self.scalar_reg(r),
            Operand::Const(x) => Ok(self.b.ins().f32const(x)),
        }
    }
}
