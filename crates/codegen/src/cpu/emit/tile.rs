//! Tiled inner loops: the JIT-ed loop over tiles of `tile::TILE` elements that calls one
//! full-width routine per varying statement (see `analysis::tile_plan` and `tile`), and loops
//! over short rows tiled as whole rows (`analysis::tile_rows_plan`).

use rustc_hash::FxHashMap as HashMap;

use cranelift_codegen::ir::{InstBuilder, StackSlot, StackSlotData, StackSlotKind, Value, types};
use lower::kir::{IExpr, Inst, Reg, Stmt, Var};

use super::Emitter;
use crate::cpu::analysis::{AroundParam, RowsPlan, TilePlan, TileStep, tile_binary_op, tile_unary_op};
use crate::cpu::helpers::Helper;
use crate::cpu::tile::{
    A_SCALAR, B_SCALAR, NEUTRAL, PARAMS, SELECT_BOUND, SELECT_FIRST, SELECT_OTHER, TILE, TileLevel, TileUnary,
};
use crate::error::{CodegenError, Result};

/// Bytes of one scratch tile.
const TILE_BYTES: i64 = TILE * 4;

impl<'f> Emitter<'_, 'f> {
    /// `for t in (lo..hi).step_by(TILE)`: the uniform statements as scalars, then each varying
    /// statement as one call over `min(TILE, hi - t)` elements.
    pub(super) fn tile_loop(&mut self, var: Var, lo: Value, hi: Value, body: &[Stmt], plan: &TilePlan) -> Result<()> {
        let scratch = self.scratch(plan);
        let t = self.b.declare_var(types::I64);
        self.b.def_var(t, lo);
        self.counted_loop(t, hi, TILE, |s, tv| {
            s.vars.insert(var, tv);
            let left = s.b.ins().isub(hi, tv);
            let tile = s.b.ins().iconst(types::I64, TILE);
            let n = s.b.ins().smin(left, tile);
            // Where each varying register's tile is.
            let mut at: HashMap<Reg, Value> = HashMap::default();
            for (i, (stmt, step)) in body.iter().zip(&plan.steps).enumerate() {
                if let (Stmt::Let { reg, inst: Inst::Load { buf, index, .. }, .. }, TileStep::Load) = (stmt, *step) {
                    let a = s.addr(*buf, index, air::DType::F32)?;
                    at.insert(*reg, a);
                    continue;
                }
                if let (Stmt::Store { buf, index, value }, TileStep::Copy) = (stmt, *step) {
                    let src = *at.get(value).ok_or_else(|| bad_plan("stored value"))?;
                    let dst = s.addr(*buf, index, air::DType::F32)?;
                    s.tile_copy(&scratch, dst, src, n);
                    continue;
                }
                s.tile_step(i, body, plan, &scratch, &mut at, n)?;
            }
            Ok(())
        })
    }

    /// The loop over rows `lo..hi` of `outer` as tiles of whole rows ([`RowsPlan`]): the leading
    /// constants once, then per tile of `rows` rows, the strided loads gathered row by row into
    /// their scratch tiles, one routine call per computed step over `rows * width` elements,
    /// and the strided stores scattered back.
    pub(super) fn tile_rows_loop(
        &mut self,
        outer: Var,
        (lo, hi): (Value, Value),
        body: &[Stmt],
        rows: &RowsPlan,
    ) -> Result<()> {
        let Some(Stmt::Loop { body: inner_body, .. }) = body.get(rows.prefix) else {
            return Err(bad_plan("row loop"));
        };
        let mut flat: Vec<Stmt> = body[..rows.prefix].to_vec();
        flat.extend(inner_body.iter().cloned());
        let plan = &rows.tiles;
        let scratch = self.scratch(plan);
        let per_tile = TILE / rows.width;
        let t = self.b.declare_var(types::I64);
        self.b.def_var(t, lo);
        let zero = self.iconst(types::I64, 0);
        self.vars.insert(rows.inner, zero);
        self.counted_loop(t, hi, per_tile, |s, tv| {
            // Addresses are those of the tile's first element: its first row, at column 0.
            s.vars.insert(outer, tv);
            let left = s.b.ins().isub(hi, tv);
            let count = s.b.ins().iconst(types::I64, per_tile);
            let count = s.b.ins().smin(left, count);
            let n = s.b.ins().imul_imm_s(count, rows.width);
            let mut at: HashMap<Reg, Value> = HashMap::default();
            for (i, (stmt, step)) in flat.iter().zip(&plan.steps).enumerate() {
                let strided = rows.strided.get(&i);
                if let (Stmt::Let { reg, inst: Inst::Load { buf, index, .. }, .. }, TileStep::Load) = (stmt, *step) {
                    let a = s.addr(*buf, index, air::DType::F32)?;
                    let a = match (strided, rows.per_row.get(&i)) {
                        (Some((stride, slot)), _) => {
                            let tile = s.b.ins().stack_addr(types::I64, scratch.slot, *slot as i32 * TILE_BYTES as i32);
                            s.copy_rows(count, rows.width, (a, stride), (tile, &IExpr::Const(rows.width)))?;
                            tile
                        }
                        (None, Some((stride, slot))) => {
                            let tile = s.b.ins().stack_addr(types::I64, scratch.slot, *slot as i32 * TILE_BYTES as i32);
                            s.fill_rows(count, rows.width, (a, stride), tile)?;
                            tile
                        }
                        (None, None) => a,
                    };
                    at.insert(*reg, a);
                    continue;
                }
                if let (Stmt::Store { buf, index, value }, TileStep::Copy) = (stmt, *step) {
                    let src = *at.get(value).ok_or_else(|| bad_plan("stored value"))?;
                    let dst = s.addr(*buf, index, air::DType::F32)?;
                    match strided {
                        Some((stride, _)) => {
                            s.copy_rows(count, rows.width, (src, &IExpr::Const(rows.width)), (dst, stride))?
                        }
                        None => s.tile_copy(&scratch, dst, src, n),
                    }
                    continue;
                }
                s.tile_step(i, &flat, plan, &scratch, &mut at, n)?;
            }
            Ok(())
        })
    }

    /// Fills `count` rows of `width` f32 at `dst` (adjacent rows), each with one value read from
    /// `src`, `stride` elements apart per row, four lanes at a time.
    fn fill_rows(&mut self, count: Value, width: i64, src: (Value, &IExpr), dst: Value) -> Result<()> {
        let flags = self.flags;
        self.for_rows(count, src, (dst, &IExpr::Const(width)), |s, from, to| {
            let x = s.b.ins().load(types::F32, flags, from, 0);
            let v = s.b.ins().splat(types::F32X4, x);
            for c in (0..width as i32).step_by(4) {
                s.b.ins().store(flags, v, to, 4 * c);
            }
        })
    }

    /// Copies `count` rows of `width` f32 from `src` to `dst`, rows `stride` elements apart on
    /// each side: one call of the `copy_rows` helper, whose loop is compiled once, where an
    /// unrolled copy per row was about 25 CLIF instructions per operand of every kernel.
    fn copy_rows(&mut self, count: Value, width: i64, src: (Value, &IExpr), dst: (Value, &IExpr)) -> Result<()> {
        let src_step = self.byte_step(src.1)?;
        let dst_step = self.byte_step(dst.1)?;
        let bytes = self.iconst(types::I64, 4 * width);
        self.call_void(Helper::CopyRows, &[dst.0, dst_step, src.0, src_step, count, bytes]);
        Ok(())
    }

    /// A row stride of f32 elements in bytes: a constant folded here (the quick tier folds
    /// nothing), else the stride's value shifted.
    fn byte_step(&mut self, stride: &IExpr) -> Result<Value> {
        if let IExpr::Const(c) = stride {
            return Ok(self.iconst(types::I64, 4 * c));
        }
        let v = self.iexpr(stride)?;
        Ok(self.b.ins().ishl_imm_u(v, 2))
    }

    /// Runs `each(from, to)` for `count` rows, `from` starting at `src` and `to` at `dst`, each
    /// advancing by its stride (in f32 elements) per row.
    fn for_rows(
        &mut self,
        count: Value,
        (src, src_stride): (Value, &IExpr),
        (dst, dst_stride): (Value, &IExpr),
        mut each: impl FnMut(&mut Self, Value, Value),
    ) -> Result<()> {
        let src_step = self.byte_step(src_stride)?;
        let dst_step = self.byte_step(dst_stride)?;
        let q = self.b.declare_var(types::I64);
        let p = self.b.declare_var(types::I64);
        let d = self.b.declare_var(types::I64);
        let zero = self.iconst(types::I64, 0);
        self.b.def_var(q, zero);
        self.b.def_var(p, src);
        self.b.def_var(d, dst);
        self.counted_loop(q, count, 1, |s, _| {
            let (from, to) = (s.b.use_var(p), s.b.use_var(d));
            each(s, from, to);
            let from = s.b.ins().iadd(from, src_step);
            let to = s.b.ins().iadd(to, dst_step);
            s.b.def_var(p, from);
            s.b.def_var(d, to);
            Ok(())
        })
    }

    /// A tiled loop's scratch, made before the loop: `plan.slots` tiles, then 4 bytes for a
    /// scalar operand and the parameters of one routine call, then one parameter block per
    /// distinct set of constant `around` parameters, written here once. The `around` steps with
    /// only constant parameters read their set's block: a gated cell's three sigmoids share
    /// one, and none writes seven parameters before its call on every tile (LSTM's largest
    /// kernel had 42 `f32const` and as many stores for them).
    fn scratch(&mut self, plan: &TilePlan) -> Scratch {
        // The sets in body order, so that a kernel always lays its scratch out alike.
        let mut steps: Vec<usize> = plan
            .around
            .iter()
            .filter(|(_, a)| a.params.iter().all(|p| !matches!(p, AroundParam::Reg { .. })))
            .map(|(&i, _)| i)
            .collect();
        steps.sort_unstable();
        let scalar_at = (plan.slots as i64 * TILE_BYTES) as i32;
        let blocks_at = scalar_at + 4 * (1 + PARAMS as i32);
        let mut sets: Vec<[u32; PARAMS]> = Vec::new();
        let mut around_at = HashMap::default();
        for &i in &steps {
            let mut set = NEUTRAL.map(f32::to_bits);
            for (value, param) in set.iter_mut().zip(&plan.around[&i].params) {
                if let AroundParam::Const(c) = param {
                    *value = c.to_bits();
                }
            }
            let j = sets.iter().position(|s| *s == set).unwrap_or_else(|| {
                sets.push(set);
                sets.len() - 1
            });
            around_at.insert(i, blocks_at + 4 * (PARAMS * j) as i32);
        }
        let size = (blocks_at + 4 * (PARAMS * sets.len()) as i32) as u32;
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, size, 5));
        for (j, set) in sets.iter().enumerate() {
            for (k, &bits) in set.iter().enumerate() {
                let v = self.b.ins().f32const(f32::from_bits(bits));
                self.b.ins().stack_store(types::I64, v, slot, blocks_at + 4 * (PARAMS * j + k) as i32);
            }
        }
        let (unary, binary) = match self.tiling.level {
            TileLevel::Avx512 => (Helper::TileUnaryAvx512, Helper::TileBinaryAvx512),
            TileLevel::Avx2Fma => (Helper::TileUnaryAvx2, Helper::TileBinaryAvx2),
            TileLevel::Base => (Helper::TileUnaryBase, Helper::TileBinaryBase),
        };
        Scratch { slot, scalar_at, params_at: scalar_at + 4, around_at, unary, binary }
    }

    /// `n` elements from `src` to `dst` by the copy routine.
    fn tile_copy(&mut self, scratch: &Scratch, dst: Value, src: Value, n: Value) {
        let code = self.b.ins().iconst(types::I32, TileUnary::Copy as i64);
        let params = self.b.ins().stack_addr(types::I64, scratch.slot, scratch.params_at);
        self.call_void(scratch.unary, &[code, dst, src, n, params]);
    }

    /// Statement `i` of a tiled body (other than a varying load and a copying store, which the
    /// loops place themselves): a uniform statement as a scalar, a computed one as one routine
    /// call over `n` elements into its scratch tile or its store's destination.
    fn tile_step(
        &mut self,
        i: usize,
        body: &[Stmt],
        plan: &TilePlan,
        scratch: &Scratch,
        at: &mut HashMap<Reg, Value>,
        n: Value,
    ) -> Result<()> {
        let s = self;
        let (stmt, step) = (&body[i], plan.steps[i]);
        match (stmt, step) {
            (Stmt::Let { .. }, TileStep::Uniform) => s.emit_stmts(std::slice::from_ref(stmt))?,
            (Stmt::Let { reg, inst, .. }, TileStep::Slot(_) | TileStep::Direct(_)) => {
                let mut reg = *reg;
                let dst = match step {
                    TileStep::Slot(n) => s.b.ins().stack_addr(types::I64, scratch.slot, n as i32 * TILE_BYTES as i32),
                    TileStep::Direct(j) => match &body[j] {
                        Stmt::Store { buf, index, .. } => s.addr(*buf, index, air::DType::F32)?,
                        _ => return Err(CodegenError::Invalid("tile plan: direct target is no store".into())),
                    },
                    _ => return Err(bad_plan("destination")),
                };
                match inst {
                    Inst::Unary(op, r) => {
                        let op = tile_unary_op(*op).ok_or_else(|| bad_plan("unary op"))?;
                        let mut params_at = scratch.params_at;
                        let (code, src) = match plan.around.get(&i) {
                            Some(around) => {
                                // Constant parameters were written before the loop (`scratch`);
                                // the others are written here, before every call.
                                let written = scratch.around_at.get(&i);
                                params_at = written.copied().unwrap_or(params_at);
                                let each_call = if written.is_some() { &[][..] } else { &around.params[..] };
                                for (k, (param, neutral)) in each_call.iter().zip(NEUTRAL).enumerate() {
                                    let v = match *param {
                                        AroundParam::Neutral => s.b.ins().f32const(neutral),
                                        AroundParam::Const(c) => s.b.ins().f32const(c),
                                        AroundParam::Reg { reg, negate } => {
                                            let v = s.scalar_reg(reg)?;
                                            if negate { s.b.ins().fneg(v) } else { v }
                                        }
                                    };
                                    s.b.ins().stack_store(
                                        types::I64,
                                        v,
                                        scratch.slot,
                                        scratch.params_at + 4 * k as i32,
                                    );
                                }
                                reg = around.out;
                                let src = at.get(&around.src).ok_or_else(|| bad_plan("operand around"))?;
                                (around.code(op), *src)
                            }
                            None => (op as i32, *at.get(r).ok_or_else(|| bad_plan("unary operand"))?),
                        };
                        let code = s.b.ins().iconst(types::I32, code as i64);
                        let params = s.b.ins().stack_addr(types::I64, scratch.slot, params_at);
                        s.call_void(scratch.unary, &[code, dst, src, n, params]);
                    }
                    Inst::Binary(op, a, b) => {
                        let op = tile_binary_op(*op).ok_or_else(|| bad_plan("binary op"))?;
                        let mut mode = op as i64;
                        let mut operand = |s: &mut Self, r: &Reg, bit: i32| -> Result<Value> {
                            if let Some(p) = at.get(r) {
                                return Ok(*p);
                            }
                            let v = s.scalar_reg(*r)?;
                            s.b.ins().stack_store(types::I64, v, scratch.slot, scratch.scalar_at);
                            mode |= bit as i64;
                            Ok(s.b.ins().stack_addr(types::I64, scratch.slot, scratch.scalar_at))
                        };
                        let pa = operand(s, a, A_SCALAR)?;
                        let pb = operand(s, b, B_SCALAR)?;
                        let code = s.b.ins().iconst(types::I32, mode);
                        s.call_void(scratch.binary, &[code, dst, pa, pb, n]);
                    }
                    Inst::Where(_, x, _) => {
                        let sel = plan.selects.get(&i).ok_or_else(|| bad_plan("select"))?;
                        let src = *at.get(x).ok_or_else(|| bad_plan("select operand"))?;
                        // The index of the tile's first element (the loop variable is bound to
                        // it), then the bound and the other value, as the routine reads them.
                        let first = s.iexpr(&sel.index)?;
                        let bound = s.scalar_reg(sel.bound)?;
                        let other = s.scalar_reg(sel.other)?;
                        let slot = |k: usize| scratch.params_at + 4 * k as i32;
                        s.b.ins().stack_store(types::I64, bound, scratch.slot, slot(SELECT_BOUND));
                        s.b.ins().stack_store(types::I64, other, scratch.slot, slot(SELECT_OTHER));
                        s.b.ins().stack_store(types::I64, first, scratch.slot, slot(SELECT_FIRST));
                        let code = s.b.ins().iconst(types::I32, TileUnary::SelectBelow as i64);
                        let params = s.b.ins().stack_addr(types::I64, scratch.slot, scratch.params_at);
                        s.call_void(scratch.unary, &[code, dst, src, n, params]);
                    }
                    _ => return Err(bad_plan("computed instruction")),
                }
                at.insert(reg, dst);
            }
            (Stmt::Store { .. }, TileStep::Stored) | (_, TileStep::Absorbed) => {}
            _ => return Err(bad_plan("statement")),
        }
        Ok(())
    }
}

/// A tiled kernel's stack scratch and the routines it calls.
struct Scratch {
    slot: StackSlot,
    scalar_at: i32,
    params_at: i32,
    /// Where the `around` steps (by body index) with only constant parameters read them.
    around_at: HashMap<usize, i32>,
    unary: Helper,
    binary: Helper,
}

fn bad_plan(what: &str) -> CodegenError {
    CodegenError::Invalid(format!("tile plan does not match the loop body ({what})"))
}
