//! Tiled inner loops: the JIT-ed loop over tiles of `tile::TILE` elements that calls one
//! full-width routine per varying statement (see `analysis::tile_plan` and `tile`).

use std::collections::HashMap;

use cranelift_codegen::ir::{InstBuilder, StackSlotData, StackSlotKind, Value, types};
use lower::kir::{Inst, Reg, Stmt, Var};

use super::Emitter;
use crate::cpu::analysis::{AroundParam, TilePlan, TileStep, tile_binary_op, tile_unary_op};
use crate::cpu::helpers::Helper;
use crate::cpu::tile::{A_SCALAR, B_SCALAR, NEUTRAL, PARAMS, TILE, TileLevel, TileUnary};
use crate::error::{CodegenError, Result};

/// Bytes of one scratch tile.
const TILE_BYTES: i64 = TILE * 4;

impl<'f> Emitter<'_, 'f> {
    /// `for t in (lo..hi).step_by(TILE)`: the uniform statements as scalars, then each varying
    /// statement as one call over `min(TILE, hi - t)` elements.
    pub(super) fn tile_loop(&mut self, var: Var, lo: Value, hi: Value, body: &[Stmt], plan: &TilePlan) -> Result<()> {
        let (unary, binary) = match self.tiling.level {
            TileLevel::Avx512 => (Helper::TileUnaryAvx512, Helper::TileBinaryAvx512),
            TileLevel::Avx2Fma => (Helper::TileUnaryAvx2, Helper::TileBinaryAvx2),
            TileLevel::Base => (Helper::TileUnaryBase, Helper::TileBinaryBase),
        };
        // The scratch tiles, then 4 bytes for a scalar operand and the parameters of `around`;
        // 32-byte aligned.
        let size = (plan.slots as i64 * TILE_BYTES + 4 * (1 + PARAMS as i64)) as u32;
        let scratch = self.b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, size, 5));
        let scalar_at = (plan.slots as i64 * TILE_BYTES) as i32;
        let params_at = scalar_at + 4;
        let t = self.b.declare_var(types::I64);
        self.b.def_var(t, lo);
        self.counted_loop(t, hi, TILE, |s, tv| {
            s.vars.insert(var, tv);
            let left = s.b.ins().isub(hi, tv);
            let tile = s.b.ins().iconst(types::I64, TILE);
            let n = s.b.ins().smin(left, tile);
            // Where each varying register's tile is.
            let mut at: HashMap<Reg, Value> = HashMap::new();
            for (i, (stmt, step)) in body.iter().zip(&plan.steps).enumerate() {
                match (stmt, *step) {
                    (Stmt::Let { .. }, TileStep::Uniform) => s.emit_stmts(std::slice::from_ref(stmt))?,
                    (Stmt::Let { reg, inst: Inst::Load { buf, index, .. }, .. }, TileStep::Load) => {
                        let a = s.addr(*buf, index, air::DType::F32)?;
                        at.insert(*reg, a);
                    }
                    (Stmt::Let { reg, inst, .. }, TileStep::Slot(_) | TileStep::Direct(_)) => {
                        let mut reg = *reg;
                        let dst = match *step {
                            TileStep::Slot(n) => {
                                s.b.ins().stack_addr(types::I64, scratch, n as i32 * TILE_BYTES as i32)
                            }
                            TileStep::Direct(j) => match &body[j] {
                                Stmt::Store { buf, index, .. } => s.addr(*buf, index, air::DType::F32)?,
                                _ => return Err(CodegenError::Invalid("tile plan: direct target is no store".into())),
                            },
                            _ => return Err(bad_plan("destination")),
                        };
                        match inst {
                            Inst::Unary(op, r) => {
                                let op = tile_unary_op(*op).ok_or_else(|| bad_plan("unary op"))?;
                                let (code, src) = match plan.around.get(&i) {
                                    Some(around) => {
                                        for (k, (param, neutral)) in around.params.iter().zip(NEUTRAL).enumerate() {
                                            let v = match *param {
                                                AroundParam::Neutral => s.b.ins().f32const(neutral),
                                                AroundParam::Const(c) => s.b.ins().f32const(c),
                                                AroundParam::Reg { reg, negate } => {
                                                    let v = s.scalar_reg(reg)?;
                                                    if negate { s.b.ins().fneg(v) } else { v }
                                                }
                                            };
                                            s.b.ins().stack_store(types::I64, v, scratch, params_at + 4 * k as i32);
                                        }
                                        reg = around.out;
                                        let src = at.get(&around.src).ok_or_else(|| bad_plan("operand around"))?;
                                        (around.code(op), *src)
                                    }
                                    None => (op as i32, *at.get(r).ok_or_else(|| bad_plan("unary operand"))?),
                                };
                                let code = s.b.ins().iconst(types::I32, code as i64);
                                let params = s.b.ins().stack_addr(types::I64, scratch, params_at);
                                s.call_void(unary, &[code, dst, src, n, params]);
                            }
                            Inst::Binary(op, a, b) => {
                                let op = tile_binary_op(*op).ok_or_else(|| bad_plan("binary op"))?;
                                let mut mode = op as i64;
                                let mut operand = |s: &mut Self, r: &Reg, bit: i32| -> Result<Value> {
                                    if let Some(p) = at.get(r) {
                                        return Ok(*p);
                                    }
                                    let v = s.scalar_reg(*r)?;
                                    s.b.ins().stack_store(types::I64, v, scratch, scalar_at);
                                    mode |= bit as i64;
                                    Ok(s.b.ins().stack_addr(types::I64, scratch, scalar_at))
                                };
                                let pa = operand(s, a, A_SCALAR)?;
                                let pb = operand(s, b, B_SCALAR)?;
                                let code = s.b.ins().iconst(types::I32, mode);
                                s.call_void(binary, &[code, dst, pa, pb, n]);
                            }
                            _ => return Err(bad_plan("computed instruction")),
                        }
                        at.insert(reg, dst);
                    }
                    (Stmt::Store { .. }, TileStep::Stored) | (_, TileStep::Absorbed) => {}
                    (Stmt::Store { buf, index, value }, TileStep::Copy) => {
                        let src = *at.get(value).ok_or_else(|| bad_plan("stored value"))?;
                        let dst = s.addr(*buf, index, air::DType::F32)?;
                        let code = s.b.ins().iconst(types::I32, TileUnary::Copy as i64);
                        let params = s.b.ins().stack_addr(types::I64, scratch, params_at);
                        s.call_void(unary, &[code, dst, src, n, params]);
                    }
                    _ => return Err(bad_plan("statement")),
                }
            }
            Ok(())
        })
    }
}

fn bad_plan(what: &str) -> CodegenError {
    CodegenError::Invalid(format!("tile plan does not match the loop body ({what})"))
}
