//! Statements and loops: the statement walk, rotated counted loops, and the scalar loop nest around
//! vectorized inner loops.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{InstBuilder, Value, types};
use cranelift_frontend::Variable;
use rustc_hash::FxHashMap as HashMap;

use lower::kir::{IExpr, Reg, Stmt, Var};

use super::{Emitter, Indexed, LANES, Val, acc_ty, unroll_factor, vector_ty};
use crate::cpu::analysis::{tile_plan, tile_rows_plan, unrolls_fully, vector_plan};
use crate::cpu::split;
use crate::cpu::stencil::{plane_plan, stencil_plan};
use crate::cpu::tile::{TILE_MIN_TRIPS, TileLevel, TileMode};
use crate::error::Result;

/// The fewest iterations of a loop of symbolic trip count for its unrolled vector loop (4
/// vectors of 4 per step); shorter, it runs one vector per step (see `emit_loop`).
const SHORT_TRIPS: i64 = 32;

impl<'f> Emitter<'_, 'f> {
    pub(super) fn emit_stmts(&mut self, stmts: &[Stmt]) -> Result<()> {
        for s in stmts {
            match s {
                Stmt::Let { reg, dtype, inst } => {
                    let v = self.emit_inst(*dtype, inst)?;
                    self.regs.insert(*reg, v);
                }
                Stmt::Loop { var, extent, body, .. } => self.emit_loop(*var, extent, body, None, None)?,
                Stmt::AccInit { acc, dtype, op } => {
                    // In a vector body the accumulator is lane-wise (`analysis::vector_plan`).
                    let ty = if self.vector() { vector_ty(*dtype)? } else { acc_ty(*dtype, *op) };
                    let var = self.b.declare_var(ty);
                    let init = self.identity(ty, *op);
                    self.b.def_var(var, init);
                    self.accs.insert(*acc, var);
                }
                Stmt::AccUpdate { acc, value } => self.emit_acc_update(*acc, *value)?,
                Stmt::Store { buf, index, value } => self.emit_store(*buf, index, *value)?,
                Stmt::ScatterAdd { buf, base, index, stride, size, value, status, check } => {
                    let at = Indexed { buf: *buf, base, index: *index, stride, size, status: *status, check: *check };
                    self.emit_scatter_add(&at, *value)?
                }
                Stmt::Check { cond, value, status, check } => {
                    let c = self.scalar_reg(*cond)?;
                    let v = self.index_value(*value)?;
                    let fail = self.b.create_block();
                    let join = self.b.create_block();
                    self.b.ins().brif(c, fail, &[], join, &[]);
                    self.b.switch_to_block(fail);
                    self.record_failure(*status, *check, v, join)?;
                    self.b.switch_to_block(join);
                }
            }
        }
        Ok(())
    }

    /// The loop over `var` in `0..extent`, or in `range` (a thread's share of a parallel loop,
    /// or a segment of a split loop, whose first value and trip count `segment` gives where
    /// they are constants).
    pub(super) fn emit_loop(
        &mut self,
        var: Var,
        extent: &IExpr,
        body: &[Stmt],
        range: Option<(Value, Value)>,
        segment: Option<(i64, Option<i64>)>,
    ) -> Result<()> {
        // A loop over the planes or the rows of a stencil (a depthwise convolution's taps, a
        // pooling window) runs as one call of the full-width routine, on hosts with AVX-512 (or
        // when tests force tiling, with the portable routine).
        if range.is_none()
            && !self.vector()
            && (self.tiling.mode == TileMode::Always
                || (self.tiling.mode == TileMode::Auto && self.tiling.level == TileLevel::Avx512))
            && let Some(plan) = plane_plan(var, extent, body).or_else(|| stencil_plan(var, extent, body))
        {
            return self.stencil_loop(&plan);
        }
        // Masks that compare `var` with constants (cut points) keep the whole loop scalar, so
        // the vector plan is only worth making without them.
        let cuts =
            if range.is_none() && !self.vector() { split::cuts(body, var, extent.as_const()) } else { Vec::new() };
        let plan = if self.vector() || !cuts.is_empty() { None } else { vector_plan(self.k, self.info, var, body) };
        // The first value and trip count, where both are constants.
        let known = match (range, segment) {
            (None, _) => extent.as_const().map(|n| (0, n)),
            (Some(_), Some((lo, Some(n)))) => Some((lo, n)),
            _ => None,
        };
        // A short loop unrolls fully, unless it holds at least one full vector of iterations
        // that the vector loop would run (inside a vector body, nested loops always unroll).
        if let Some((lo, n)) = known
            && unrolls_fully(n, body)
            && (plan.is_none() || n < LANES)
        {
            return self.unrolled_loop(var, lo, n, body);
        }
        if !cuts.is_empty() {
            return self.split_loop(var, extent, body, &cuts);
        }
        let ext = self.iexpr(extent)?;
        let (lo, hi) = match range {
            Some((s, e)) => {
                let zero = self.b.ins().iconst(types::I64, 0);
                (self.b.ins().smax(s, zero), self.b.ins().smin(e, ext))
            }
            None => (self.b.ins().iconst(types::I64, 0), ext),
        };
        let saved_regs = self.regs.clone();
        let saved_vars = self.vars.clone();
        // A loop over short rows of heavy work (each row below `TILE_MIN_TRIPS`) runs as tiles
        // of whole rows when every access allows it.
        let rows = (!self.vector() && extent.as_const().is_none_or(|n| n * 8 >= TILE_MIN_TRIPS))
            .then(|| tile_rows_plan(self.k, self.info, var, body, self.tiling.mode, TILE_MIN_TRIPS))
            .flatten();
        if let Some(rows) = rows {
            self.tile_rows_loop(var, (lo, hi), body, &rows)?;
            self.regs = saved_regs;
            self.vars = saved_vars;
            return Ok(());
        }
        let trips = known.map(|(_, n)| n);
        // A loop known to be shorter than `TILE_MIN_TRIPS` stays in registers (in `Auto` mode):
        // a tile routine's call per op would cost more than the loop (a softmax over 16 keys).
        let long_enough = trips.is_none_or(|n| n >= TILE_MIN_TRIPS) || self.tiling.mode == TileMode::Always;
        let tiles = plan
            .as_ref()
            .filter(|_| long_enough)
            .and_then(|_| tile_plan(self.k, self.info, var, body, self.tiling.mode));
        match (plan, tiles) {
            // A symbolic extent may be short when the kernel runs (an attention row over the
            // first 8 positions of a cache), where a routine's call per op per row costs ~10x
            // the loop: such a loop picks the tiles or the vector loop by its trip count.
            (Some(plan), Some(tiles)) if trips.is_none() && range.is_none() => self.by_trips(
                (lo, hi, TILE_MIN_TRIPS),
                (&saved_regs, &saved_vars),
                |s| s.tile_loop(var, lo, hi, body, &tiles),
                |s| s.vector_loop(var, (lo, hi), trips, body, &plan, true),
            )?,
            // Likewise, an unrolled vector loop runs a row shorter than its step (16) in the
            // scalar remainder: rows below `SHORT_TRIPS` run one vector per step.
            (Some(plan), None) if trips.is_none() && range.is_none() && unroll_factor(plan.size) == 4 => self
                .by_trips(
                    (lo, hi, SHORT_TRIPS),
                    (&saved_regs, &saved_vars),
                    |s| s.vector_loop(var, (lo, hi), trips, body, &plan, false),
                    |s| s.vector_loop(var, (lo, hi), trips, body, &plan, true),
                )?,
            (Some(_), Some(tiles)) => self.tile_loop(var, lo, hi, body, &tiles)?,
            (Some(plan), None) => self.vector_loop(var, (lo, hi), trips, body, &plan, false)?,
            (None, _) => {
                let i = self.b.declare_var(types::I64);
                self.b.def_var(i, lo);
                self.counted_loop(i, hi, 1, |s, iv| {
                    s.vars.insert(var, iv);
                    s.emit_stmts(body)
                })?;
            }
        }
        self.regs = saved_regs;
        self.vars = saved_vars;
        Ok(())
    }

    /// `long` when `hi - lo >= at_least` at run time, else `short`: two versions of one loop,
    /// each emitted from the registers and variables in `saved` (the loop's surroundings).
    fn by_trips(
        &mut self,
        (lo, hi, at_least): (Value, Value, i64),
        saved: (&HashMap<Reg, Val>, &HashMap<Var, Value>),
        long: impl FnOnce(&mut Self) -> Result<()>,
        short: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let (long_block, short_block, join) = (self.b.create_block(), self.b.create_block(), self.b.create_block());
        let n = self.b.ins().isub(hi, lo);
        let is_long = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThanOrEqual, n, at_least);
        self.b.ins().brif(is_long, long_block, &[], short_block, &[]);
        self.b.switch_to_block(long_block);
        long(self)?;
        self.b.ins().jump(join, &[]);
        self.regs.clone_from(saved.0);
        self.vars.clone_from(saved.1);
        self.b.switch_to_block(short_block);
        short(self)?;
        self.b.ins().jump(join, &[]);
        self.b.switch_to_block(join);
        Ok(())
    }

    /// The loop over `var` as consecutive segments between `cuts` (see `split`), each emitted
    /// as a loop over its sub-range with the comparisons of `var` folded.
    fn split_loop(&mut self, var: Var, extent: &IExpr, body: &[Stmt], cuts: &[i64]) -> Result<()> {
        let ext = self.iexpr(extent)?;
        let mut lo = 0;
        for hi in cuts.iter().copied().map(Some).chain([None]) {
            let seg = split::segment(body, var, lo, hi);
            let start = self.iconst(types::I64, lo);
            let end = match hi {
                Some(h) => self.iconst(types::I64, h),
                None => ext,
            };
            // Known only under a constant extent: a symbolic one may end the loop before a cut.
            let trips = extent.as_const().map(|n| hi.unwrap_or(n).min(n) - lo);
            self.emit_loop(var, extent, &seg, Some((start, end)), Some((lo, trips)))?;
            lo = hi.unwrap_or(lo);
        }
        Ok(())
    }

    /// `body` once per value `lo..lo + n` of `var`, in straight-line code: the variable is a
    /// constant in each copy, so its index arithmetic and its comparisons with constants (see
    /// `split::segment`) fold away and no loop control is left.
    fn unrolled_loop(&mut self, var: Var, lo: i64, n: i64, body: &[Stmt]) -> Result<()> {
        let saved_regs = self.regs.clone();
        let saved_vars = self.vars.clone();
        // Comparisons of the variable with constants (a padded border's masks) fold in each copy.
        let folds = !split::cuts(body, var, None).is_empty();
        for j in lo..lo + n {
            let iv = self.iconst(types::I64, j);
            self.vars.insert(var, iv);
            if folds {
                self.emit_stmts(&split::segment(body, var, j, Some(j + 1)))?;
            } else {
                self.emit_stmts(body)?;
            }
        }
        self.regs = saved_regs;
        self.vars = saved_vars;
        Ok(())
    }

    /// `while i < limit { body(i); i += step }`, rotated.
    pub(super) fn counted_loop(
        &mut self,
        i: Variable,
        limit: Value,
        step: i64,
        mut body: impl FnMut(&mut Self, Value) -> Result<()>,
    ) -> Result<()> {
        let body_block = self.b.create_block();
        let exit = self.b.create_block();
        let i0 = self.b.use_var(i);
        let go = self.b.ins().icmp(IntCC::SignedLessThan, i0, limit);
        self.b.ins().brif(go, body_block, &[], exit, &[]);
        self.b.switch_to_block(body_block);
        let iv = self.b.use_var(i);
        body(self, iv)?;
        let next = self.b.ins().iadd_imm_s(iv, step);
        self.b.def_var(i, next);
        let again = self.b.ins().icmp(IntCC::SignedLessThan, next, limit);
        self.b.ins().brif(again, body_block, &[], exit, &[]);
        self.b.switch_to_block(exit);
        Ok(())
    }
}
