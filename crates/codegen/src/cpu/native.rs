//! Kernels run by native Rust instead of JIT-ed code, as the quick tier of the tiered JIT: copy
//! nests (`copy`; those that move short rows in vectors for good, [`Native::stays`]), tiled
//! kernels ([`TileRun`]) and stencils ([`StencilRun`]), whose JIT-ed code would only call
//! routines, and masked element-wise nests (`map`).
//!
//! A tiled kernel (`analysis::tile_plan`, `analysis::tile_rows_plan`) is a parallel loop whose
//! JIT-ed code walks the loop in tiles of `tile::TILE` elements (or of whole short rows) and,
//! per tile, calls one full-width routine per computed statement (`emit/tile.rs`): the code of
//! its own is index arithmetic, a few scalar statements and the calls. [`TileRun`] walks the same
//! plan in Rust and calls the same routines with the same arguments, so it computes what the
//! JIT-ed code computes, bit for bit, with no Cranelift compile: an imported LSTM's gate kernels
//! (five exponentials per element, rows of 32 tiled whole) were most of the code generator's work
//! in its first call. The tiered JIT swaps the optimised code in once the program runs again, as
//! for a copy.
//!
//! A kernel runs natively only where the plan is exactly the one the emitter takes for its loop
//! (the same decisions, made by the same functions), its routines have FMA (the routines then
//! give the JIT's results for its scalar statements too, `tile`'s docs), and every index is
//! affine (no division or remainder).

use smallvec::SmallVec;

use air::DType;
use lower::kir::{IExpr, Inst, LoopKernel, Reg, Stmt, Var};

use super::Tiling;
use super::analysis::{
    AroundParam, KernelInfo, TilePlan, TileStep, tile_binary_op, tile_plan, tile_rows_plan, tile_unary_op, vector_plan,
};
use super::copy::CopyPlan;
use super::emit::f32_const;
use super::helpers::copy_rows;
use super::map::MapPlan;
use super::stencil::{Operand, StencilArgs, StencilPlan, plane_plan, stencil_avx512, stencil_base, stencil_plan};
use super::tile::{
    A_SCALAR, B_SCALAR, MAX_SLOTS, NEUTRAL, PARAMS, SELECT_BOUND, SELECT_FIRST, SELECT_OTHER, TILE, TILE_MIN_TRIPS,
    TileLevel, TileMode, TileUnary, binary_avx2, binary_avx512, unary_avx2, unary_avx512,
};

/// A kernel's native quick tier.
#[derive(Debug)]
pub(crate) enum Native {
    Copy(CopyPlan),
    Tiles(TileRun),
    Stencil(Box<StencilRun>),
    Map(MapPlan),
}

/// Which kernels run natively (each kind on unless its environment variable is `0`; none under
/// `JitMode::Optimized`, whose first code is the optimised one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NativeKinds {
    pub(crate) copies: bool,
    pub(crate) tiles: bool,
    pub(crate) stencils: bool,
    pub(crate) maps: bool,
}

impl NativeKinds {
    pub(crate) const NONE: NativeKinds = NativeKinds { copies: false, tiles: false, stencils: false, maps: false };
}

impl Native {
    /// How `k` runs natively (of the `kinds` allowed, its tiles as `tiling` says), if it can.
    pub(crate) fn of(k: &LoopKernel, kinds: NativeKinds, tiling: Tiling) -> Option<Native> {
        let copy = kinds.copies.then(|| CopyPlan::of(k, tiling.level)).flatten().map(Native::Copy);
        copy.or_else(|| kinds.tiles.then(|| TileRun::of(k, tiling)).flatten().map(Native::Tiles))
            .or_else(|| {
                kinds.stencils.then(|| StencilRun::of(k, tiling)).flatten().map(|s| Native::Stencil(Box::new(s)))
            })
            .or_else(|| kinds.maps.then(|| MapPlan::of(k, tiling.level)).flatten().map(Native::Map))
    }

    /// Whether the kernel keeps this native run rather than tiering up (see `CopyPlan::stays`).
    pub(crate) fn stays(&self) -> bool {
        matches!(self, Native::Copy(p) if p.stays())
    }

    /// Runs the kernel with the JIT's calling convention.
    ///
    /// # Safety
    /// As for calling the kernel's code (see `KernelEntry::invoke`).
    #[inline]
    pub(crate) unsafe fn run(&self, bufs: *const *mut u8, syms: *const i64, start: i64, end: i64) {
        // SAFETY: forwarded to the caller.
        unsafe {
            match self {
                Native::Copy(p) => p.run(bufs, syms, start, end),
                Native::Tiles(t) => t.run(bufs, syms, start, end),
                Native::Stencil(t) => t.run(bufs, syms, start, end),
                Native::Map(m) => m.run(bufs, syms, start, end),
            }
        }
    }
}

/// A stencil kernel run natively: a parallel loop whose body is constants and then a loop that
/// `Emitter::stencil_loop` emits as one routine call (`stencil::plane_plan`,
/// `stencil::stencil_plan`), so its JIT-ed code only fills the routine's arguments per iteration
/// of the parallel loop and calls it. [`StencilRun::run`] fills the same arguments
/// ([`StencilPlan::args`]) and calls the same routine: a depthwise convolution's kernel
/// (MobileNet has three) needs no Cranelift compile at the quick tier.
pub(crate) struct StencilRun {
    var: Var,
    extent: IExpr,
    plan: StencilPlan,
    /// The values of the constants the plan's uniform operands name.
    consts: Vec<(Reg, f32)>,
    routine: unsafe extern "C" fn(*const StencilArgs),
    n_syms: usize,
}

impl std::fmt::Debug for StencilRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StencilRun").field("var", &self.var).field("plan", &self.plan).finish_non_exhaustive()
    }
}

impl StencilRun {
    /// The native run of `k` where its JIT-ed code would be one stencil routine call per
    /// iteration of its parallel loop (the decisions `Emitter::emit_loop` takes, in its order).
    pub(crate) fn of(k: &LoopKernel, tiling: Tiling) -> Option<StencilRun> {
        let routine: unsafe extern "C" fn(*const StencilArgs) = match (tiling.mode, tiling.level) {
            (TileMode::Always, TileLevel::Avx512) | (TileMode::Auto, TileLevel::Avx512) => stencil_avx512,
            (TileMode::Always, _) => stencil_base,
            _ => return None,
        };
        let [Stmt::Loop { var, extent, parallel: true, body }] = k.body.as_slice() else { return None };
        // Its body: constants, then the stencil's loop (checked first: the parallel loop's
        // analyses below cost more, and most kernels are no stencil).
        let (last, prefix) = body.split_last()?;
        let Stmt::Loop { var: inner, extent: inner_extent, parallel: false, body: inner_body } = last else {
            return None;
        };
        let mut consts = Vec::with_capacity(prefix.len());
        for s in prefix {
            match s {
                Stmt::Let { reg, dtype: DType::F32, inst: Inst::Const(c) } => consts.push((*reg, f32_const(*c))),
                _ => return None,
            }
        }
        let plan =
            plane_plan(*inner, inner_extent, inner_body).or_else(|| stencil_plan(*inner, inner_extent, inner_body))?;
        let known = |o: &Operand| match o {
            Operand::Const(_) => true,
            Operand::Reg(r) => consts.iter().any(|(c, _)| c == r),
        };
        // Every uniform a constant above; every index reads the parallel loop's variable alone.
        let reads_var_alone = |e: &IExpr| e.all_leaves(&|l| !matches!(l, IExpr::Var(v) if v != var));
        if !plan.operands().iter().all(known) || !plan.exprs().into_iter().chain([extent]).all(reads_var_alone) {
            return None;
        }
        // The parallel loop: no rows plan and no vector plan, so a plain loop over its body.
        let info = KernelInfo::new(k).ok()?;
        let rows = extent.as_const().is_none_or(|n| n * 8 >= TILE_MIN_TRIPS)
            && tile_rows_plan(k, &info, *var, body, tiling.mode, TILE_MIN_TRIPS).is_some();
        if rows || vector_plan(k, &info, *var, body).is_some() {
            return None;
        }
        Some(StencilRun { var: *var, extent: extent.clone(), plan, consts, routine, n_syms: k.n_syms as usize })
    }

    /// Runs iterations `[start, end)` of the parallel loop, one routine call each, as the JIT-ed
    /// code does.
    ///
    /// # Safety
    /// As for calling the kernel's code (see `KernelEntry::invoke`).
    pub(crate) unsafe fn run(&self, bufs: *const *mut u8, syms: *const i64, start: i64, end: i64) {
        // SAFETY: the caller passes `n_syms` symbols.
        let syms = unsafe { std::slice::from_raw_parts(syms, self.n_syms) };
        let mut vars: SmallVec<[i64; 8]> = SmallVec::from_elem(0, self.var.0 as usize + 1);
        let (lo, hi) = (start.max(0), end.min(self.extent.eval(&vars, syms)));
        let operand = |o: Operand| match o {
            Operand::Const(x) => x,
            Operand::Reg(r) => self.consts.iter().find(|(c, _)| *c == r).map_or(0.0, |&(_, x)| x),
        };
        for i in lo..hi {
            vars[self.var.0 as usize] = i;
            let value = |e: &IExpr| e.eval(&vars, syms);
            // SAFETY: the caller passes one pointer per parameter; the offset is the kernel's.
            let addr =
                |buf: u32, e: &IExpr| unsafe { *bufs.add(buf as usize) as *mut f32 }.wrapping_offset(value(e) as isize);
            let args = self.plan.args(&value, &addr, &operand);
            // SAFETY: the arguments are those the JIT-ed code passes (the caller's contract
            // covers every element they reach).
            unsafe { (self.routine)(&args) };
        }
    }
}

/// The routines of one [`TileLevel`] with FMA.
type UnaryFn = extern "C" fn(i32, *mut f32, *const f32, i64, *const f32);
type BinaryFn = extern "C" fn(i32, *mut f32, *const f32, *const f32, i64);

/// Rows tiled whole (`analysis::RowsPlan`): the inner loop's variable and width, and per step
/// of the flattened body, whether its access is copied row by row (strided) or filled with one
/// value per row, with the row stride and the scratch tile.
#[derive(Debug)]
struct Rows {
    inner: Var,
    width: i64,
    by_step: Vec<RowAccess>,
}

#[derive(Debug)]
enum RowAccess {
    InPlace,
    Strided(IExpr, usize),
    PerRow(IExpr, usize),
}

/// A tiled kernel run natively (see the module docs): its parallel loop, the statements the
/// plan covers (the rows plan's prefix and inner body, flattened) and the plan.
pub(crate) struct TileRun {
    var: Var,
    extent: IExpr,
    rows: Option<Rows>,
    body: Vec<Stmt>,
    plan: TilePlan,
    unary: UnaryFn,
    binary: BinaryFn,
    /// One past the largest loop variable and register numbers.
    n_vars: usize,
    n_regs: usize,
    n_syms: usize,
}

impl std::fmt::Debug for TileRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TileRun").field("var", &self.var).field("rows", &self.rows).finish_non_exhaustive()
    }
}

impl TileRun {
    /// The native run of `k` where its JIT-ed code would be a tiled loop (see the module docs).
    pub(crate) fn of(k: &LoopKernel, tiling: Tiling) -> Option<TileRun> {
        let (unary, binary): (UnaryFn, BinaryFn) = match tiling.level {
            TileLevel::Avx512 => (unary_avx512, binary_avx512),
            TileLevel::Avx2Fma => (unary_avx2, binary_avx2),
            TileLevel::Base => return None,
        };
        let [Stmt::Loop { var, extent, parallel: true, body }] = k.body.as_slice() else { return None };
        let info = KernelInfo::new(k).ok()?;
        // The decisions `Emitter::emit_loop` takes for the kernel's parallel loop (a range, no
        // vector body around it): a rows plan first, then a tile plan where the loop vectorizes.
        let rows = extent
            .as_const()
            .is_none_or(|n| n * 8 >= TILE_MIN_TRIPS)
            .then(|| tile_rows_plan(k, &info, *var, body, tiling.mode, TILE_MIN_TRIPS))
            .flatten();
        let (rows, flat, plan) = match rows {
            Some(r) => {
                let Some(Stmt::Loop { body: inner, .. }) = body.get(r.prefix) else { return None };
                let mut flat = body[..r.prefix].to_vec();
                flat.extend(inner.iter().cloned());
                let (mut strided, mut per_row) = (r.strided, r.per_row);
                let by_step = (0..flat.len())
                    .map(|i| match (strided.remove(&i), per_row.remove(&i)) {
                        (Some((e, slot)), _) => RowAccess::Strided(e, slot),
                        (None, Some((e, slot))) => RowAccess::PerRow(e, slot),
                        (None, None) => RowAccess::InPlace,
                    })
                    .collect();
                (Some(Rows { inner: r.inner, width: r.width, by_step }), flat, r.tiles)
            }
            None => {
                vector_plan(k, &info, *var, body)?;
                (None, body.clone(), tile_plan(k, &info, *var, body, tiling.mode)?)
            }
        };
        if plan.slots > MAX_SLOTS || flat.len() != plan.steps.len() {
            return None;
        }
        // Every index affine; every statement one the walk below runs.
        let mut exprs: Vec<&IExpr> = vec![extent];
        for (s, step) in flat.iter().zip(&plan.steps) {
            match (s, step) {
                (Stmt::Let { dtype: DType::F32, inst: Inst::Load { index, mask: None, .. }, .. }, _) => {
                    exprs.push(index)
                }
                (Stmt::Let { dtype: DType::F32, inst: Inst::Index(e), .. }, TileStep::Uniform) => exprs.push(e),
                (Stmt::Let { dtype: DType::F32, inst: Inst::Const(_), .. }, TileStep::Uniform) => {}
                (Stmt::Let { dtype: DType::F32, inst: Inst::Unary(op, _), .. }, _) if tile_unary_op(*op).is_some() => {}
                (Stmt::Let { dtype: DType::F32, inst: Inst::Binary(op, ..), .. }, _)
                    if tile_binary_op(*op).is_some() => {}
                (Stmt::Let { inst: Inst::Where(..), .. }, TileStep::Slot(_) | TileStep::Direct(_)) => {}
                (Stmt::Store { index, .. }, _) => exprs.push(index),
                (_, TileStep::Absorbed) => {}
                _ => return None,
            }
        }
        if let Some(r) = &rows {
            exprs.extend(r.by_step.iter().filter_map(|a| match a {
                RowAccess::Strided(e, _) | RowAccess::PerRow(e, _) => Some(e),
                RowAccess::InPlace => None,
            }));
        }
        exprs.extend(plan.selects.values().map(|s| &s.index));
        if !exprs.iter().all(|e| affine(e)) {
            return None;
        }
        // The loop variables in scope: the parallel loop's and, for rows, the inner loop's (a
        // kernel that reads another is left to the JIT, which reports it).
        let in_scope = |v: &Var| *v == *var || rows.as_ref().is_some_and(|r| r.inner == *v);
        if !exprs.iter().all(|e| e.all_leaves(&|l| !matches!(l, IExpr::Var(v) if !in_scope(v)))) {
            return None;
        }
        let n_vars = 1 + rows.as_ref().map_or(var.0, |r| r.inner.0.max(var.0)) as usize;
        let mut n_regs = 0;
        for s in &flat {
            match s {
                Stmt::Let { reg, inst, .. } => {
                    n_regs = n_regs.max(reg.0 as usize + 1);
                    for r in inst.operands() {
                        n_regs = n_regs.max(r.0 as usize + 1);
                    }
                }
                Stmt::Store { value, .. } => n_regs = n_regs.max(value.0 as usize + 1),
                _ => {}
            }
        }
        for a in plan.around.values() {
            n_regs = n_regs.max(a.out.0 as usize + 1).max(a.src.0 as usize + 1);
        }
        Some(TileRun {
            var: *var,
            extent: extent.clone(),
            rows,
            body: flat,
            plan,
            unary,
            binary,
            n_vars,
            n_regs,
            n_syms: k.n_syms as usize,
        })
    }

    /// Runs rows (or elements) `[start, end)` of the parallel loop, tile by tile, as the JIT-ed
    /// code does (`Emitter::tile_loop`, `Emitter::tile_rows_loop`).
    ///
    /// # Safety
    /// As for calling the kernel's code (see `KernelEntry::invoke`).
    pub(crate) unsafe fn run(&self, bufs: *const *mut u8, syms: *const i64, start: i64, end: i64) {
        // SAFETY: the caller passes `n_syms` symbols.
        let syms = unsafe { std::slice::from_raw_parts(syms, self.n_syms) };
        let mut vars: SmallVec<[i64; 8]> = SmallVec::from_elem(0, self.n_vars);
        let (lo, hi) = (start.max(0), end.min(self.extent.eval(&vars, syms)));
        if lo >= hi {
            return;
        }
        let (per_tile, width) = match &self.rows {
            Some(r) => (TILE / r.width, r.width),
            None => (TILE, 1),
        };
        Scratch::with(self.n_regs, |scratch| {
            let mut t = lo;
            while t < hi {
                vars[self.var.0 as usize] = t;
                if let Some(r) = &self.rows {
                    vars[r.inner.0 as usize] = 0;
                }
                let count = (hi - t).min(per_tile);
                // SAFETY: the caller's contract; the plan is the JIT's for this kernel.
                unsafe { self.tile(bufs, syms, &vars, scratch, count, count * width) };
                t += per_tile;
            }
        });
    }

    /// One tile of `count` rows (`n` elements) at the loop variables `vars`.
    ///
    /// # Safety
    /// As for [`TileRun::run`].
    unsafe fn tile(&self, bufs: *const *mut u8, syms: &[i64], vars: &[i64], s: &mut Scratch, count: i64, n: i64) {
        let addr = |buf: u32, index: &IExpr| -> *mut f32 {
            // SAFETY: one pointer per parameter (the caller's contract); the kernel's indices for
            // this tile lie inside the buffer.
            unsafe { (*bufs.add(buf as usize) as *mut f32).wrapping_offset(index.eval(vars, syms) as isize) }
        };
        let rows = self.rows.as_ref();
        let width = rows.map_or(1, |r| r.width);
        for (i, (stmt, &step)) in self.body.iter().zip(&self.plan.steps).enumerate() {
            match (stmt, step) {
                (Stmt::Let { reg, inst: Inst::Load { buf, index, .. }, .. }, TileStep::Load) => {
                    let mut a = addr(*buf, index);
                    match rows.map(|r| &r.by_step[i]) {
                        Some(RowAccess::Strided(stride, slot)) => {
                            let tile = s.tile(*slot);
                            let step = 4 * stride.eval(vars, syms);
                            // SAFETY: `count` rows of the source, `stride` apart, lie in the buffer;
                            // the tile holds `TILE >= count * width` floats.
                            unsafe { copy_rows(tile as *mut u8, 4 * width, a as *const u8, step, count, 4 * width) };
                            a = tile;
                        }
                        Some(RowAccess::PerRow(stride, slot)) => {
                            let tile = s.tile(*slot);
                            let step = stride.eval(vars, syms) as isize;
                            for row in 0..count as isize {
                                // SAFETY: as above, one value per row.
                                let v = unsafe { *a.wrapping_offset(row * step) };
                                // SAFETY: the tile holds `count * width` floats.
                                unsafe {
                                    std::slice::from_raw_parts_mut(
                                        tile.add(row as usize * width as usize),
                                        width as usize,
                                    )
                                }
                                .fill(v);
                            }
                            a = tile;
                        }
                        Some(RowAccess::InPlace) | None => {}
                    }
                    s.at[reg.0 as usize] = a;
                }
                (Stmt::Store { buf, index, value }, TileStep::Copy) => {
                    let src = s.at[value.0 as usize];
                    let dst = addr(*buf, index);
                    match rows.map(|r| &r.by_step[i]) {
                        // SAFETY: as for the loads, the store's rows lie in the buffer.
                        Some(RowAccess::Strided(stride, _)) => unsafe {
                            copy_rows(
                                dst as *mut u8,
                                4 * stride.eval(vars, syms),
                                src as *const u8,
                                4 * width,
                                count,
                                4 * width,
                            )
                        },
                        _ => (self.unary)(TileUnary::Copy as i32, dst, src, n, NEUTRAL.as_ptr()),
                    }
                }
                (Stmt::Let { reg, inst, .. }, TileStep::Uniform) => {
                    let v = match inst {
                        Inst::Const(c) => f32_const(*c),
                        // The JIT's conversion of an index to f32 rounds to nearest, as `as` does.
                        Inst::Index(e) => e.eval(vars, syms) as f32,
                        // SAFETY: a uniform load's element lies in its buffer.
                        Inst::Load { buf, index, .. } => unsafe { *addr(*buf, index) },
                        Inst::Unary(op, r) => {
                            let op = tile_unary_op(*op).expect("checked in `of`");
                            let mut out = 0f32;
                            (self.unary)(op as i32, &mut out, &s.scalar[r.0 as usize], 1, NEUTRAL.as_ptr());
                            out
                        }
                        Inst::Binary(op, a, b) => {
                            let op = tile_binary_op(*op).expect("checked in `of`");
                            let mut out = 0f32;
                            (self.binary)(op as i32, &mut out, &s.scalar[a.0 as usize], &s.scalar[b.0 as usize], 1);
                            out
                        }
                        _ => unreachable!("`of` admits no other uniform statement"),
                    };
                    s.scalar[reg.0 as usize] = v;
                }
                (Stmt::Let { reg, inst, .. }, TileStep::Slot(_) | TileStep::Direct(_)) => {
                    let dst = match step {
                        TileStep::Slot(slot) => s.tile(slot),
                        TileStep::Direct(j) => match &self.body[j] {
                            Stmt::Store { buf, index, .. } => addr(*buf, index),
                            _ => unreachable!("a direct step writes a store's tile (`tile_plan`)"),
                        },
                        _ => unreachable!(),
                    };
                    let mut out = *reg;
                    match inst {
                        Inst::Unary(op, r) => {
                            let op = tile_unary_op(*op).expect("checked in `of`");
                            let mut params = NEUTRAL;
                            let (code, src) = match self.plan.around.get(&i) {
                                Some(around) => {
                                    for (p, param) in params.iter_mut().zip(&around.params) {
                                        match *param {
                                            AroundParam::Neutral => {}
                                            AroundParam::Const(c) => *p = c,
                                            AroundParam::Reg { reg, negate } => {
                                                let v = s.scalar[reg.0 as usize];
                                                *p = if negate { -v } else { v };
                                            }
                                        }
                                    }
                                    out = around.out;
                                    (around.code(op), s.at[around.src.0 as usize])
                                }
                                None => (op as i32, s.at[r.0 as usize]),
                            };
                            (self.unary)(code, dst, src, n, params.as_ptr());
                        }
                        Inst::Binary(op, a, b) => {
                            let mut mode = tile_binary_op(*op).expect("checked in `of`") as i32;
                            let operand = |r: &Reg, bit: i32, mode: &mut i32| -> *const f32 {
                                let p = s.at[r.0 as usize];
                                if p.is_null() {
                                    *mode |= bit;
                                    &s.scalar[r.0 as usize]
                                } else {
                                    p
                                }
                            };
                            let pa = operand(a, A_SCALAR, &mut mode);
                            let pb = operand(b, B_SCALAR, &mut mode);
                            (self.binary)(mode, dst, pa, pb, n);
                        }
                        Inst::Where(_, x, _) => {
                            let sel = self.plan.selects.get(&i).expect("a select step has its select (`tile_plan`)");
                            let mut params = [0f32; PARAMS];
                            params[SELECT_BOUND] = s.scalar[sel.bound.0 as usize];
                            params[SELECT_OTHER] = s.scalar[sel.other.0 as usize];
                            let first = sel.index.eval(vars, syms);
                            // SAFETY: slots `SELECT_FIRST` and the next hold the i64, as the routine
                            // reads it (unaligned).
                            unsafe {
                                std::ptr::write_unaligned(params.as_mut_ptr().add(SELECT_FIRST) as *mut i64, first)
                            };
                            (self.unary)(TileUnary::SelectBelow as i32, dst, s.at[x.0 as usize], n, params.as_ptr());
                        }
                        _ => unreachable!("`of` admits no other computed statement"),
                    }
                    s.at[out.0 as usize] = dst;
                }
                (Stmt::Store { .. }, TileStep::Stored) | (_, TileStep::Absorbed) => {}
                _ => unreachable!("`of` admits no other statement"),
            }
        }
    }
}

/// A run's scratch: the tiles, and per register its tile (null for a scalar) and its scalar value.
/// One per thread, kept between runs (its tiles stay in cache, and a run allocates nothing).
struct Scratch {
    tiles: Box<[std::mem::MaybeUninit<Line>]>,
    at: Vec<*mut f32>,
    scalar: Vec<f32>,
}

/// 64 bytes, aligned as the JIT's scratch slot is (to 32 at least).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

thread_local! {
    static SCRATCH: std::cell::RefCell<Option<Scratch>> = const { std::cell::RefCell::new(None) };
}

impl Scratch {
    /// Runs `f` on this thread's scratch with room for `n_regs` registers (every pointer null:
    /// a register gets a tile only where its step runs).
    fn with<R>(n_regs: usize, f: impl FnOnce(&mut Scratch) -> R) -> R {
        SCRATCH.with(|cell| {
            // Taken out for the run (a routine calls nothing back, so no run nests in another;
            // should one, it would find the cell empty and make its own).
            let mut s = cell.borrow_mut().take().unwrap_or_else(|| Scratch {
                tiles: Box::new_uninit_slice(MAX_SLOTS * TILE as usize / 16),
                at: Vec::new(),
                scalar: Vec::new(),
            });
            s.at.clear();
            s.at.resize(n_regs, std::ptr::null_mut());
            s.scalar.clear();
            s.scalar.resize(n_regs, 0.0);
            let r = f(&mut s);
            *cell.borrow_mut() = Some(s);
            r
        })
    }

    /// Scratch tile `slot` (`TILE` floats; the routines write before they read).
    fn tile(&mut self, slot: usize) -> *mut f32 {
        (self.tiles.as_mut_ptr() as *mut f32).wrapping_add(slot * TILE as usize)
    }
}

/// Whether `e` is built of constants, variables, symbols, sums and products only.
fn affine(e: &IExpr) -> bool {
    match e {
        IExpr::Const(_) | IExpr::Var(_) | IExpr::Sym(_) => true,
        IExpr::Add(a, b) | IExpr::Mul(a, b) => affine(a) && affine(b),
        IExpr::Div(..) | IExpr::Mod(..) | IExpr::Lt(..) | IExpr::And(..) => false,
    }
}
