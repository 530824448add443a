//! Element-wise nests run by native Rust instead of JIT-ed code, at the quick tier: a loop nest
//! whose innermost body computes `f32` values from loads with exact IEEE operations (`+ - * /`,
//! `max`, `min`, negation, reciprocal, square root, truncation, `where`) and stores them, any of
//! its loads masked, or its values picked by a mask, over ranges of the loop variables: a padded
//! bias and ReLU (`where(0 < i < 17 && 0 < j < 17, max(x[i - 1, j - 1] + b[c], 0), 0)`), the
//! input of a depthwise convolution; a dense layer's bias and ReLU; a state broadcast.
//!
//! Why: MobileNet's first call compiled three such kernels with Cranelift (175-225 us each, more
//! than its whole run), and the nest needs no code of its own: its extents, strides and mask
//! bounds are a few numbers per call ([`copy`](super::copy)'s, which this reuses), and its
//! arithmetic a handful of operations per element. [`MapPlan::of`] recognises the nest;
//! [`MapPlan::run`] walks it with the JIT's calling convention in blocks of up to [`CHUNK`]
//! elements (a long row in pieces, short rows several to a block), one statement at a time over
//! the block, its computing statements over whole vectors of lanes; a nest whose masks all hold
//! over one box ([`Boxed`]) has its border filled with the one value stored there and only the
//! box computed, no mask looked at. The tiered JIT swaps
//! optimised code in once the program runs again, as for a copy; both compute the same bits (the
//! operations are IEEE's, with Cranelift's `max` and `min`: NaN if either operand is, and
//! `-0 < +0`).

use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;

use air::{BinaryOp, DType, Scalar, UnaryOp};
use lower::kir::{IExpr, Inst, LoopKernel, Reg, Stmt, Var};

use super::copy::{MAX_DEPTH, Num, Range, Side, ZEROS, leaves_ok, ranges};
use super::tile::{TileLevel, fmax, fmin};

/// Elements of an innermost run computed together, one statement at a time: 256, so that the
/// per-block work of each statement (its rows' bounds and addresses) is spread over more
/// elements (MobileNet's padded 18 x 18 planes: 14 rows a block instead of 3).
const CHUNK: usize = 256;

/// Lanes the computing statements handle at once: a 512-bit vector (four SSE vectors on the
/// baseline target), so that [`MapPlan::run`]'s AVX-512 instantiation runs them full width.
const LANES: usize = 16;

/// The most registers a plan holds (a chunk of values each): an imported one-channel 3x3
/// convolution with its bias and ReLU holds forty (which the stencil routine does not take, its
/// weights loaded before the row loop); compiled, it was most of conv-1's first call (`kiln bench
/// onnx conv-1.onnx --dim batch=8`, warm process, 0.59-0.61 -> 0.45-0.47 ms).
const MAX_SLOTS: usize = 64;

/// An element-wise nest, recognised from a loop kernel (see the module docs).
#[derive(Debug)]
pub(crate) struct MapPlan {
    /// Loop extents, outermost first (the outermost is the kernel's parallel loop).
    extents: Vec<Num>,
    /// The statements, in the kernel's order, constants left out (`consts`).
    steps: Vec<Step>,
    /// The slots of the constants, and their values: filled once per call.
    consts: Vec<(usize, f32)>,
    /// Registers, one slot (a block of values) each.
    slots: usize,
    /// One past the largest loop variable number.
    n_vars: usize,
    n_syms: usize,
    /// Runs the AVX-512F instantiation ([`MapPlan::run_avx512`]): the compiler's tile level is
    /// [`TileLevel::Avx512`], which it picks only on a host that has it.
    wide: bool,
    /// Set when the nest has two levels or more, every load is masked and every mask holds over
    /// one box (see [`Boxed`]).
    boxed: Option<Boxed>,
}

/// A nest whose masked statements all hold over the same box of loop indices and whose loads are
/// all masked (a padded input's interior): outside the box every statement's value is known when
/// the plan is made, so the store writes one constant there, and inside it no mask is looked at.
/// [`MapPlan::run`] then fills the border (whole planes at once where the rows follow each other,
/// the interior stored again after) and computes only the interior, whose rows all have the same
/// columns, copied in and out as one run where they follow each other. MobileNet's padded inputs
/// in its first run, `k6`, `k9` and `k3` of `kiln profile onnx mobilenet.onnx --dim batch=4
/// --launches 14` (alternating binaries): 55 -> 20, 54 -> 21 and 32 -> 14 us, the run's launches
/// 0.22-0.24 -> 0.14 ms; 16 channels of 16 x 16 planes for 4 images alone, in a loop: 33 -> 12
/// us, what the quick tier's compiled code takes.
#[derive(Debug)]
struct Boxed {
    /// What the store writes outside the box.
    outside: f32,
}

impl Boxed {
    /// The box of `steps` (a plan's, `consts` its constants' slots and values, `slots` its slot
    /// count) when every load is masked and every load's and mask's ranges are the same list:
    /// the value stored outside it is then the steps' value with every load its `other` and
    /// every mask clear, computed here with the operations `Step::apply` runs lane by lane.
    fn of(steps: &[Step], consts: &[(usize, f32)], slots: usize) -> Option<Boxed> {
        let mut shared: Option<&[Range]> = None;
        let mut vals = vec![0f32; slots];
        for &(s, v) in consts {
            vals[s] = v;
        }
        for step in steps {
            match *step {
                Step::Load { ref ranges, .. } | Step::Inside { ref ranges, .. } => {
                    if ranges.is_empty() || !shared.is_none_or(|a| a == ranges.as_slice()) {
                        return None;
                    }
                    shared = Some(ranges);
                }
                _ => {}
            }
            match *step {
                Step::Load { to, other, .. } => vals[to] = other,
                Step::Inside { to, .. } => vals[to] = f32::from_bits(0),
                Step::Unary { to, op, a } => vals[to] = unary(op, vals[a]),
                Step::Binary { to, op, a, b } => vals[to] = binary(op, vals[a], vals[b]),
                Step::Select { to, c, a, b } => vals[to] = pick(vals[c], vals[a], vals[b]),
                Step::Store { value, .. } => return Some(Boxed { outside: vals[value] }),
            }
        }
        None
    }
}

/// A unary step's operation on one lane.
#[inline(always)]
fn unary(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Sqrt => x.sqrt(),
        _ => x.trunc(),
    }
}

/// A binary step's operation on one lane.
#[inline(always)]
fn binary(op: BinaryOp, x: f32, y: f32) -> f32 {
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Max => fmax(x, y),
        _ => fmin(x, y),
    }
}

/// `where`'s pick on one lane: `x` where `c`'s bits are set, `y` where they are clear.
#[inline(always)]
fn pick(c: f32, x: f32, y: f32) -> f32 {
    let c = c.to_bits();
    f32::from_bits((x.to_bits() & c) | (y.to_bits() & !c))
}

/// One statement of the nest; `to` and the operands are slots (one per register).
#[derive(Debug)]
enum Step {
    /// Element `side` of its parameter where every range holds, `other` elsewhere.
    Load {
        to: usize,
        side: Side,
        ranges: Vec<Range>,
        other: f32,
    },
    /// Every bit set where every range holds, none elsewhere (a mask's `index`).
    Inside {
        to: usize,
        ranges: Vec<Range>,
    },
    Unary {
        to: usize,
        op: UnaryOp,
        a: usize,
    },
    Binary {
        to: usize,
        op: BinaryOp,
        a: usize,
        b: usize,
    },
    /// `a` where `c`'s bits are set, `b` where they are clear (`where`).
    Select {
        to: usize,
        c: usize,
        a: usize,
        b: usize,
    },
    Store {
        side: Side,
        value: usize,
    },
}

impl MapPlan {
    /// The plan of `k` when its whole body is one element-wise nest: a parallel loop and any
    /// loops inside it (at most [`MAX_DEPTH`] levels, each extent free of loop variables), or no
    /// loop at all (one element: a reduction over an empty axis left a constant's store),
    /// `let`s before each level's nested loop, the innermost level `let`s and then one `store`;
    /// every value `f32` (a mask `bool`), every op one of the module docs', every access of an
    /// `f32` parameter at an index affine in the loop variables (as a copy's), no parameter both
    /// loaded and stored, every mask a conjunction of ranges of loop variables (as a copy's).
    /// Nests without a mask too: the quick tier's alternative is a Cranelift compile on the
    /// program's first call (a dense layer's bias and ReLU took 230 us of an imported MLP's first
    /// call, 0.42 -> 0.19 ms), and the vectorised loop comes with the tier-up.
    /// `tile`: the compiler's tile level, which picks the instantiation `run` calls.
    pub(crate) fn of(k: &LoopKernel, tile: TileLevel) -> Option<MapPlan> {
        // A parallel loop around the nest, or no loop at all (one element, a kernel called once).
        let looped = matches!(k.body.as_slice(), [Stmt::Loop { parallel: true, .. }]);
        if !looped && k.body.iter().any(|s| matches!(s, Stmt::Loop { .. })) {
            return None;
        }
        let mut extents = Vec::new();
        let mut vars: SmallVec<[Var; MAX_DEPTH]> = SmallVec::new();
        let mut lets = Vec::new();
        let mut stores = Vec::new();
        let mut level = k.body.as_slice();
        loop {
            let mut inner = None;
            for s in level {
                match s {
                    Stmt::Loop { var, extent, parallel, body } if inner.is_none() && stores.is_empty() => {
                        if (*parallel != extents.is_empty()) || extents.len() == MAX_DEPTH {
                            return None;
                        }
                        extents.push(extent);
                        vars.push(*var);
                        inner = Some(body.as_slice());
                    }
                    Stmt::Let { reg, dtype, inst } if inner.is_none() && stores.is_empty() => {
                        lets.push((*reg, *dtype, inst))
                    }
                    Stmt::Store { buf, index, value } if inner.is_none() => stores.push((*buf, index, *value)),
                    _ => return None,
                }
            }
            match inner {
                Some(body) => level = body,
                None => break,
            }
        }
        if stores.is_empty() || extents.iter().any(|e| e.reads_vars()) {
            return None;
        }
        let n_syms = k.n_syms as usize;
        let n_vars = vars.iter().map(|v| v.0 as usize + 1).max().unwrap_or(0);
        if n_vars > ZEROS.len() || !extents.iter().all(|e| leaves_ok(e, &vars, n_syms)) {
            return None;
        }
        let zeros = &ZEROS[..n_vars];
        let mask = |m: &IExpr| if leaves_ok(m, &vars, n_syms) { ranges(m, &vars, zeros) } else { None };
        let mut slot: HashMap<Reg, (usize, DType)> = HashMap::default();
        let mut steps = Vec::with_capacity(lets.len() + stores.len());
        let mut consts = Vec::new();
        let mut loaded = SmallVec::<[u32; 8]>::new();
        for (reg, dtype, inst) in lets {
            let to = slot.len();
            let operand = |r: &Reg, want: DType| slot.get(r).filter(|s| s.1 == want).map(|s| s.0);
            let step = match (dtype, inst) {
                (DType::F32, Inst::Const(Scalar::Float(v))) => {
                    consts.push((to, *v as f32));
                    None
                }
                (DType::F32, Inst::Load { buf, index, mask: m, other }) => {
                    let (ranges, other) = match (m, other) {
                        (Some(m), Scalar::Float(other)) => (mask(m)?, *other),
                        (None, _) => (Vec::new(), 0.0),
                        _ => return None,
                    };
                    loaded.push(*buf);
                    let side = Side::of(k, *buf, index, DType::F32, &vars, zeros)?;
                    Some(Step::Load { to, side, ranges, other: other as f32 })
                }
                (DType::Bool, Inst::Index(m)) => Some(Step::Inside { to, ranges: mask(m)? }),
                (DType::F32, Inst::Unary(op @ (UnaryOp::Neg | UnaryOp::Recip | UnaryOp::Sqrt | UnaryOp::Trunc), a)) => {
                    Some(Step::Unary { to, op: *op, a: operand(a, DType::F32)? })
                }
                (
                    DType::F32,
                    Inst::Binary(
                        op @ (BinaryOp::Add
                        | BinaryOp::Sub
                        | BinaryOp::Mul
                        | BinaryOp::Div
                        | BinaryOp::Max
                        | BinaryOp::Min),
                        a,
                        b,
                    ),
                ) => Some(Step::Binary { to, op: *op, a: operand(a, DType::F32)?, b: operand(b, DType::F32)? }),
                (DType::F32, Inst::Where(c, a, b)) => Some(Step::Select {
                    to,
                    c: operand(c, DType::Bool)?,
                    a: operand(a, DType::F32)?,
                    b: operand(b, DType::F32)?,
                }),
                _ => return None,
            };
            if slot.insert(reg, (to, dtype)).is_some() || slot.len() > MAX_SLOTS {
                return None;
            }
            steps.extend(step);
        }
        // One store: the nest then writes each element once, whatever order it runs in.
        let [(buf, index, value)] = stores[..] else { return None };
        if loaded.contains(&buf) {
            return None;
        }
        let value = slot.get(&value).filter(|s| s.1 == DType::F32)?.0;
        steps.push(Step::Store { side: Side::of(k, buf, index, DType::F32, &vars, zeros)?, value });
        let extents: Vec<Num> = extents.iter().map(|e| Num::of(e, zeros)).collect();
        let wide = cfg!(target_arch = "x86_64") && tile == TileLevel::Avx512;
        // A box needs a row level around the innermost (`run_boxed` packs rows of it).
        let boxed = if extents.len() >= 2 { Boxed::of(&steps, &consts, slot.len()) } else { None };
        Some(MapPlan { extents, steps, consts, slots: slot.len(), n_vars, n_syms, wide, boxed })
    }

    /// Runs the nest: the JIT's calling convention (`bufs`: one pointer per parameter; `syms`:
    /// the symbol values; `[start, end)`: the iterations of the parallel outer loop to run,
    /// clamped to its extent).
    ///
    /// # Safety
    /// As for a compiled kernel: every element the nest reads (where its masks hold) or writes
    /// for these symbols lies inside its parameter's buffer, and nothing else touches the
    /// destinations' elements meanwhile.
    pub(crate) unsafe fn run(&self, bufs: *const *mut u8, syms: *const i64, start: i64, end: i64) {
        #[cfg(target_arch = "x86_64")]
        if self.wide {
            // SAFETY: the caller's contract; `wide` only where the host has AVX-512F (`of`).
            return unsafe { self.run_avx512(bufs, syms, start, end) };
        }
        // SAFETY: the caller's contract.
        unsafe { self.run_here(bufs, syms, start, end) }
    }

    /// [`MapPlan::run`] compiled with AVX-512F: the computing statements' loops over
    /// [`LANES`] lanes become one 512-bit operation each (the same IEEE operations, so the same
    /// bits), the rows' loads, fills and stores wider vectors. MobileNet's three padded inputs
    /// of depthwise convolutions, before [`Boxed`]: 40-42, 35-37 and 20-21 us at 128 bits,
    /// 34-40, 31-35 and 17-20 us with it (`KILN_JIT=quick kiln profile onnx mobilenet.onnx
    /// --dim batch=4 --launches 30`, alternating binaries).
    ///
    /// # Safety
    /// As for [`MapPlan::run`], on a host with AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn run_avx512(&self, bufs: *const *mut u8, syms: *const i64, start: i64, end: i64) {
        // SAFETY: the caller's contract.
        unsafe { self.run_here(bufs, syms, start, end) }
    }

    /// [`MapPlan::run`]'s body, inlined into each instantiation.
    ///
    /// # Safety
    /// As for [`MapPlan::run`].
    #[inline(always)]
    unsafe fn run_here(&self, bufs: *const *mut u8, syms: *const i64, start: i64, end: i64) {
        // SAFETY: the caller passes `n_syms` symbols.
        let syms = unsafe { std::slice::from_raw_parts(syms, self.n_syms) };
        let vars = &ZEROS[..self.n_vars];
        let depth = self.extents.len();
        let mut extent = [0i64; MAX_DEPTH];
        for (d, e) in self.extents.iter().enumerate() {
            extent[d] = e.eval(vars, syms).max(0);
        }
        // No loop: one element, the kernel called once (`start = 0, end = 1`).
        let (first, last) = if depth == 0 { (start.max(0), end.min(1)) } else { (start.max(0), end.min(extent[0])) };
        if first >= last || extent[1..depth.max(1)].contains(&0) {
            return;
        }
        // SAFETY: the caller passes one pointer per parameter.
        let live: SmallVec<[Live; 16]> = self.steps.iter().map(|s| unsafe { Live::of(s, bufs, vars, syms) }).collect();
        let mut slots = vec![[0f32; CHUNK]; self.slots];
        for &(s, v) in &self.consts {
            slots[s] = [v; CHUNK];
        }
        if let Some(boxed) = &self.boxed {
            // SAFETY: the caller's contract.
            return unsafe { self.run_boxed(boxed, &live, &mut slots, &extent, (first, last)) };
        }
        let slots = slots.as_mut_ptr();
        // Every step over one block, in the kernel's order.
        let run_block = |block: &Block<'_>| {
            for (step, live) in self.steps.iter().zip(&live) {
                // SAFETY: the caller's contract for the accesses; every step writes a slot of
                // its own register, which no operand of it is (SSA).
                unsafe { step.apply(live, block, slots) };
            }
        };
        let mut at = [0i64; MAX_DEPTH];
        if depth <= 1 {
            // One row: the parallel level's `first..last` a chunk at a time (no loop: the one
            // element, `0..1`).
            let mut j0 = first;
            while j0 < last {
                let m = (last - j0).min(CHUNK as i64) as usize;
                run_block(&Block { at: &at, depth, rows: 1, j0, m });
                j0 += m as i64;
            }
            return;
        }
        // Two levels or more from here: rows of the innermost level in the one around it.
        let inner = depth - 1;
        let n = extent[inner];
        // Short rows go several to a block (one row of the level around the innermost after
        // the other), so that each statement runs over more elements per dispatch: the rows of
        // a padded 10 x 10 plane cost 40 ns each one at a time.
        let mid = inner - 1;
        let per_block = if n <= CHUNK as i64 / 2 { CHUNK as i64 / n } else { 1 };
        let (mid_first, mid_last) = if mid == 0 { (first, last) } else { (0, extent[mid]) };
        at[0] = first;
        loop {
            at[mid] = mid_first;
            while at[mid] < mid_last {
                let rows = per_block.min(mid_last - at[mid]) as usize;
                let mut j0 = 0;
                while j0 < n {
                    let m = (n - j0).min(CHUNK as i64) as usize;
                    run_block(&Block { at: &at, depth, rows, j0, m });
                    j0 += m as i64;
                }
                at[mid] += rows as i64;
            }
            // The next block of rows.
            if !next_outer(&mut at, mid, last, &extent) {
                return;
            }
        }
    }

    /// [`MapPlan::run_here`] for a [`Boxed`] nest: every row's elements outside the box set to
    /// `boxed.outside`, and the box's rows computed several to a block (as `run_here` does), each
    /// load a copy of the row's interior, each mask all set, the store a copy back.
    ///
    /// # Safety
    /// As for [`MapPlan::run`]; `live` is the steps' numbers for this call, `slots` one slot per
    /// register (the constants' filled), `extent` the levels' extents (none zero), and
    /// `first..last` a nonempty range of the parallel level.
    #[inline(always)]
    unsafe fn run_boxed(
        &self,
        boxed: &Boxed,
        live: &[Live],
        slots: &mut [[f32; CHUNK]],
        extent: &[i64; MAX_DEPTH],
        (first, last): (i64, i64),
    ) {
        let depth = self.extents.len();
        let (mid, inner) = (depth - 2, depth - 1);
        // The box per level, inside the nest.
        let mut bounds: [(i64, i64); MAX_DEPTH] = std::array::from_fn(|d| (0, extent[d]));
        for (step, live) in self.steps.iter().zip(live) {
            if matches!(step, Step::Load { .. } | Step::Inside { .. }) {
                for (b, &(lo, hi)) in bounds.iter_mut().zip(&live.bounds).take(depth) {
                    *b = (b.0.max(lo), b.1.min(hi));
                }
            }
        }
        // Inside the box every mask holds: its slots all set, once per call.
        for step in &self.steps {
            if let Step::Inside { to, .. } = *step {
                slots[to] = [f32::from_bits(u32::MAX); CHUNK];
            }
        }
        let slots = slots.as_mut_ptr();
        // `of` ends every plan with its store.
        let store = live.last().expect("a plan stores");
        let n = extent[inner];
        let (a, b) = (bounds[inner].0.clamp(0, n), bounds[inner].1.clamp(0, n));
        let width = (b - a).max(0);
        let outside = boxed.outside;
        let (mid_first, mid_last) = if mid == 0 { (first, last) } else { (0, extent[mid]) };
        let (box_lo, box_hi) = (bounds[mid].0.max(mid_first), bounds[mid].1.min(mid_last));
        // Rows of the box computed together: as many whole interiors as a chunk holds.
        let per_block = if width > 0 && width <= CHUNK as i64 / 2 { CHUNK as i64 / width } else { 1 };
        let mut at = [0i64; MAX_DEPTH];
        at[0] = first;
        // Per step, the index of element 0 of the row at `at` with the level around the
        // innermost at 0: a row's is that plus the level's value times its coefficient.
        let mut row0: SmallVec<[i64; 16]> = live.iter().map(|_| 0).collect();
        let (store_step, store_row_step) = (store.coefs[inner], store.coefs[mid]);
        loop {
            let outer_ok = (0..mid).all(|d| bounds[d].0 <= at[d] && at[d] < bounds[d].1);
            at[mid] = 0;
            for ((r, l), step) in row0.iter_mut().zip(live).zip(&self.steps) {
                if matches!(step, Step::Load { .. } | Step::Store { .. }) {
                    *r = l.row_base(&at, depth);
                }
            }
            let store_row0 = *row0.last().expect("a plan stores");
            // The border: whole rows outside the box, and each box row's ends; when the rows
            // follow each other in the buffer, all of them at once (the box's elements are
            // stored again below: a few vector stores more per plane, against two short fills
            // per row).
            let in_box = |v: i64| outer_ok && width > 0 && (box_lo..box_hi).contains(&v);
            let row = |v: i64| store_row0.wrapping_add(v.wrapping_mul(store_row_step));
            // SAFETY (every fill): the caller's contract: the nest writes every element of its
            // rows.
            if store_step == 1 && store_row_step == n {
                unsafe { fill(store.ptr, row(mid_first), 1, 0, (mid_last - mid_first) * n, outside) };
            } else {
                for v in mid_first..mid_last {
                    unsafe {
                        if in_box(v) {
                            fill(store.ptr, row(v), store_step, 0, a, outside);
                            fill(store.ptr, row(v), store_step, b, n, outside);
                        } else {
                            fill(store.ptr, row(v), store_step, 0, n, outside);
                        }
                    }
                }
            }
            // The box's rows.
            if outer_ok && width > 0 && box_lo < box_hi {
                let mut v = box_lo;
                while v < box_hi {
                    let rows = per_block.min(box_hi - v) as usize;
                    at[mid] = v;
                    let mut j0 = a;
                    while j0 < b {
                        let m = (b - j0).min(CHUNK as i64) as usize;
                        let block = Block { at: &at, depth, rows, j0, m };
                        for ((step, live), &r0) in self.steps.iter().zip(live).zip(&row0) {
                            let base = r0.wrapping_add(v.wrapping_mul(live.coefs[mid]));
                            // SAFETY: the caller's contract for the accesses (inside the box,
                            // where every load's mask holds); distinct slots (SSA).
                            unsafe { step.apply_boxed(live, &block, base, slots) };
                        }
                        j0 += m as i64;
                    }
                    v += rows as i64;
                }
            }
            // The next plane.
            if !next_outer(&mut at, mid, last, extent) {
                return;
            }
        }
    }
}

/// Steps `at`'s levels outside `mid` to their next values, an odometer (the parallel level's up
/// to `last`, the others' up to their extents); false when they are all done.
#[inline(always)]
fn next_outer(at: &mut [i64; MAX_DEPTH], mid: usize, last: i64, extent: &[i64; MAX_DEPTH]) -> bool {
    let mut d = mid;
    loop {
        if d == 0 {
            return false;
        }
        d -= 1;
        at[d] += 1;
        if at[d] < if d == 0 { last } else { extent[d] } {
            return true;
        }
        at[d] = 0;
    }
}

/// Elements `j0..j0 + m` of the innermost level in `rows` rows: those of the level around it
/// from `at[mid]` on (`at` holds the levels' values, the innermost's ignored). Row `r`'s
/// elements are lanes `r * m..(r + 1) * m` of a slot.
struct Block<'a> {
    at: &'a [i64; MAX_DEPTH],
    depth: usize,
    rows: usize,
    j0: i64,
    m: usize,
}

/// A step's numbers for one call: its parameter's pointer, the index's offset and coefficients,
/// and its ranges' bounds per level (`lo..hi`).
struct Live {
    ptr: *mut f32,
    offset: i64,
    coefs: [i64; MAX_DEPTH],
    bounds: [(i64, i64); MAX_DEPTH],
}

impl Live {
    /// # Safety
    /// `bufs` holds a pointer for every parameter.
    unsafe fn of(step: &Step, bufs: *const *mut u8, vars: &[i64], syms: &[i64]) -> Live {
        let mut live = Live {
            ptr: std::ptr::null_mut(),
            offset: 0,
            coefs: [0; MAX_DEPTH],
            bounds: [(i64::MIN, i64::MAX); MAX_DEPTH],
        };
        let (side, ranges) = match step {
            Step::Load { side, ranges, .. } => (Some(side), &ranges[..]),
            Step::Store { side, .. } => (Some(side), &[][..]),
            Step::Inside { ranges, .. } => (None, &ranges[..]),
            _ => (None, &[][..]),
        };
        if let Some(side) = side {
            // SAFETY: the caller's contract.
            live.ptr = unsafe { *bufs.add(side.param) } as *mut f32;
            live.offset = side.offset.eval(vars, syms);
            for (c, e) in live.coefs.iter_mut().zip(&side.coefs) {
                *c = e.eval(vars, syms);
            }
        }
        for r in ranges {
            let b = &mut live.bounds[r.level];
            *b = (b.0.max(r.lo.eval(vars, syms)), b.1.min(r.hi.eval(vars, syms)));
        }
        live
    }

    /// The index of element 0 of the innermost level in the row at `at` (its levels outside the
    /// innermost).
    #[inline(always)]
    fn row_base(&self, at: &[i64; MAX_DEPTH], depth: usize) -> i64 {
        let mut base = self.offset;
        for (&v, &c) in at[..depth - 1].iter().zip(&self.coefs) {
            base = base.wrapping_add(v.wrapping_mul(c));
        }
        base
    }

    /// Where the block's rows are: per row `r`, elements `a..b` of the chunk (where every range
    /// holds: all rows alike but those outside the ranges of the level around the innermost,
    /// which read none) from index `base + r * row_step` on, `step` apart.
    #[inline(always)]
    fn rows(&self, block: &Block<'_>) -> Rows {
        let (at, depth) = (block.at, block.depth);
        let Some(inner) = depth.checked_sub(1) else {
            // No loop: the one element, at the index's offset (no range: no loop variable).
            return Rows {
                span: (0, block.m),
                first: 0,
                end: block.rows,
                base: self.offset as isize,
                step: 0,
                row_step: 0,
            };
        };
        // The level around the innermost, if any: a nest of one level is one row.
        let mid = depth.checked_sub(2);
        let outer_ok = at[..mid.unwrap_or(0)].iter().zip(&self.bounds).all(|(&v, &(lo, hi))| lo <= v && v < hi);
        let (lo, hi) = self.bounds[inner];
        let m = block.m as i64;
        let a = lo.saturating_sub(block.j0).clamp(0, m) as usize;
        let b = hi.saturating_sub(block.j0).clamp(0, m) as usize;
        let span = if outer_ok && a < b { (a, b) } else { (0, 0) };
        let mut base = self.offset;
        for (&v, &c) in at[..inner].iter().zip(&self.coefs) {
            base = base.wrapping_add(v.wrapping_mul(c));
        }
        let step = self.coefs[inner];
        let (first, end, row_step) = match mid {
            Some(mid) => {
                let (mid_lo, mid_hi) = self.bounds[mid];
                // Rows `r` with `mid_lo <= at[mid] + r < mid_hi` (clamped to the block).
                let clamp = |v: i64| v.saturating_sub(at[mid]).clamp(0, block.rows as i64) as usize;
                (clamp(mid_lo), clamp(mid_hi), self.coefs[mid])
            }
            None => (0, block.rows, 0),
        };
        Rows {
            span,
            first,
            end,
            base: base.wrapping_add(block.j0.wrapping_mul(step)) as isize,
            step: step as isize,
            row_step: row_step as isize,
        }
    }
}

/// A step's rows in a block ([`Live::rows`]).
struct Rows {
    span: (usize, usize),
    first: usize,
    end: usize,
    base: isize,
    step: isize,
    row_step: isize,
}

impl Rows {
    /// Row `r`'s elements where every range holds.
    #[inline(always)]
    fn span(&self, r: usize) -> (usize, usize) {
        if (self.first..self.end).contains(&r) { self.span } else { (0, 0) }
    }

    /// The address of element `j` of row `r` of `ptr`'s buffer (not dereferenced).
    #[inline(always)]
    fn at(&self, ptr: *mut f32, r: usize, j: usize) -> *mut f32 {
        let i = self
            .base
            .wrapping_add(self.row_step.wrapping_mul(r as isize))
            .wrapping_add(self.step.wrapping_mul(j as isize));
        ptr.wrapping_offset(i)
    }
}

impl Step {
    /// Computes the block.
    ///
    /// # Safety
    /// `slots` holds the plan's slots; the step's accesses are inside their buffers (where its
    /// ranges hold, for a load), and its own slot is none of its operands'.
    #[inline(always)]
    unsafe fn apply(&self, live: &Live, block: &Block<'_>, slots: *mut [f32; CHUNK]) {
        let m = block.m;
        // Computing statements run over whole vectors of lanes: past the block (up to the
        // chunk's end) they compute on what the slots held, which nothing stores.
        let lanes = (block.rows * m).next_multiple_of(LANES).min(CHUNK);
        // SAFETY: the caller's contract (distinct slots; accesses inside their buffers).
        unsafe {
            let slot = |s: usize| &*slots.add(s);
            match *self {
                Step::Load { to, other, .. } => {
                    let slot = &mut *slots.add(to);
                    let rows = live.rows(block);
                    for (r, out) in slot.chunks_exact_mut(m).take(block.rows).enumerate() {
                        let (a, b) = rows.span(r);
                        out[..a].fill(other);
                        out[b..].fill(other);
                        let src = |j: usize| rows.at(live.ptr, r, j);
                        match rows.step {
                            _ if a == b => {}
                            0 => out[a..b].fill(*src(a)),
                            1 => copy(src(a), out[a..b].as_mut_ptr(), b - a),
                            _ => (a..b).zip(&mut out[a..b]).for_each(|(j, o)| *o = *src(j)),
                        }
                    }
                }
                Step::Inside { to, .. } => {
                    let slot = &mut *slots.add(to);
                    let rows = live.rows(block);
                    for (r, out) in slot.chunks_exact_mut(m).take(block.rows).enumerate() {
                        let (a, b) = rows.span(r);
                        // A compare per lane rather than two fills (short rows, no `memset`
                        // calls), without branches so that it vectorizes: `a <= j < b` as one
                        // unsigned compare (a branch per lane was a quarter of MobileNet's pads).
                        let (a, width) = (a as u32, (b - a) as u32);
                        for (j, o) in out.iter_mut().enumerate() {
                            *o = f32::from_bits(u32::from((j as u32).wrapping_sub(a) < width).wrapping_neg());
                        }
                    }
                }
                Step::Unary { to, op, a } => {
                    let (out, x) = (&mut (&mut *slots.add(to))[..lanes], slot(a));
                    // One arm per operation, so that each loop is one vector operation.
                    match op {
                        UnaryOp::Neg => map1(out, x, |x| unary(UnaryOp::Neg, x)),
                        UnaryOp::Recip => map1(out, x, |x| unary(UnaryOp::Recip, x)),
                        UnaryOp::Sqrt => map1(out, x, |x| unary(UnaryOp::Sqrt, x)),
                        _ => map1(out, x, |x| unary(UnaryOp::Trunc, x)),
                    }
                }
                Step::Binary { to, op, a, b } => {
                    let (out, x, y) = (&mut (&mut *slots.add(to))[..lanes], slot(a), slot(b));
                    match op {
                        BinaryOp::Add => map2(out, x, y, |x, y| binary(BinaryOp::Add, x, y)),
                        BinaryOp::Sub => map2(out, x, y, |x, y| binary(BinaryOp::Sub, x, y)),
                        BinaryOp::Mul => map2(out, x, y, |x, y| binary(BinaryOp::Mul, x, y)),
                        BinaryOp::Div => map2(out, x, y, |x, y| binary(BinaryOp::Div, x, y)),
                        BinaryOp::Max => map2(out, x, y, |x, y| binary(BinaryOp::Max, x, y)),
                        _ => map2(out, x, y, |x, y| binary(BinaryOp::Min, x, y)),
                    }
                }
                Step::Select { to, c, a, b } => {
                    let (out, c, x, y) = (&mut (&mut *slots.add(to))[..lanes], slot(c), slot(a), slot(b));
                    for (o, (c, (x, y))) in out
                        .chunks_exact_mut(LANES)
                        .zip(c.chunks_exact(LANES).zip(x.chunks_exact(LANES).zip(y.chunks_exact(LANES))))
                    {
                        for k in 0..LANES {
                            o[k] = pick(c[k], x[k], y[k]);
                        }
                    }
                }
                Step::Store { value, .. } => {
                    let rows = live.rows(block);
                    for (r, v) in slot(value).chunks_exact(m).take(block.rows).enumerate() {
                        if rows.step == 1 {
                            copy(v.as_ptr(), rows.at(live.ptr, r, 0), m);
                        } else {
                            v.iter().enumerate().for_each(|(j, &v)| *rows.at(live.ptr, r, j) = v);
                        }
                    }
                }
            }
        }
    }

    /// [`Step::apply`] for a block inside a [`Boxed`] nest's box (`base`: the index of element 0
    /// of its first row, by the step's access): a load copies its rows' elements (every mask
    /// holds), a mask is left as it is (its slot all set for the call), a store copies the rows
    /// back; the computing steps are `apply`'s.
    ///
    /// # Safety
    /// As for [`Step::apply`], the block inside the box.
    #[inline(always)]
    unsafe fn apply_boxed(&self, live: &Live, block: &Block<'_>, base: i64, slots: *mut [f32; CHUNK]) {
        let (m, mid, inner) = (block.m, block.depth - 2, block.depth - 1);
        let (step, row_step) = (live.coefs[inner], live.coefs[mid]);
        // Row `r`'s element `j` (from the block's first column).
        let at = |r: usize, j: usize| {
            let i = base
                .wrapping_add((r as i64).wrapping_mul(row_step))
                .wrapping_add((block.j0 + j as i64).wrapping_mul(step));
            live.ptr.wrapping_offset(i as isize)
        };
        // SAFETY: the caller's contract (distinct slots; accesses inside their buffers).
        unsafe {
            match *self {
                Step::Load { to, .. } => {
                    let slot = &mut *slots.add(to);
                    match (step, row_step) {
                        // One element for the whole block (a per-channel bias), or rows that
                        // follow each other in the buffer (an unpadded input's plane): one run.
                        (0, 0) => slot[..block.rows * m].fill(*at(0, 0)),
                        (1, _) if row_step == m as i64 => copy(at(0, 0), slot.as_mut_ptr(), block.rows * m),
                        _ => {
                            for (r, out) in slot.chunks_exact_mut(m).take(block.rows).enumerate() {
                                match step {
                                    0 => out.fill(*at(r, 0)),
                                    1 => copy(at(r, 0), out.as_mut_ptr(), m),
                                    _ => out.iter_mut().enumerate().for_each(|(j, o)| *o = *at(r, j)),
                                }
                            }
                        }
                    }
                }
                Step::Inside { .. } => {}
                Step::Store { value, .. } => {
                    let slot = &*slots.add(value);
                    if step == 1 && row_step == m as i64 {
                        copy(slot.as_ptr(), at(0, 0), block.rows * m);
                        return;
                    }
                    for (r, v) in slot.chunks_exact(m).take(block.rows).enumerate() {
                        if step == 1 {
                            copy(v.as_ptr(), at(r, 0), m);
                        } else {
                            v.iter().enumerate().for_each(|(j, &v)| *at(r, j) = v);
                        }
                    }
                }
                _ => self.apply(live, block, slots),
            }
        }
    }
}

/// Copies `n` floats from `src` to `dst` (not overlapping): inline, a row's 16 floats at a time
/// (one vector move each in the AVX-512F instantiation) and the rest one by one, where a call of
/// `memcpy` would cost more than the copy (a padded plane's rows are 16 floats).
///
/// # Safety
/// Both ranges lie inside their buffers.
#[inline(always)]
unsafe fn copy(src: *const f32, dst: *mut f32, n: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        if n > 256 {
            return std::ptr::copy_nonoverlapping(src, dst, n);
        }
        let mut j = 0;
        while j + 16 <= n {
            (dst.add(j) as *mut [f32; 16]).write_unaligned((src.add(j) as *const [f32; 16]).read_unaligned());
            j += 16;
        }
        if j + 8 <= n {
            (dst.add(j) as *mut [f32; 8]).write_unaligned((src.add(j) as *const [f32; 8]).read_unaligned());
            j += 8;
        }
        if j + 4 <= n {
            (dst.add(j) as *mut [f32; 4]).write_unaligned((src.add(j) as *const [f32; 4]).read_unaligned());
            j += 4;
        }
        while j < n {
            *dst.add(j) = *src.add(j);
            j += 1;
        }
    }
}

/// Sets elements `from..to` of a row (element `j` at `ptr + base + j * step`) to `value`.
///
/// # Safety
/// Those elements lie inside `ptr`'s buffer.
#[inline(always)]
unsafe fn fill(ptr: *mut f32, base: i64, step: i64, from: i64, to: i64, value: f32) {
    // SAFETY: the caller's contract.
    unsafe {
        let at = |j: i64| ptr.wrapping_offset(base.wrapping_add(j.wrapping_mul(step)) as isize);
        if step == 1 && to - from >= 4 {
            let (mut p, end) = (at(from), at(to));
            while p.wrapping_add(16) <= end {
                (p as *mut [f32; 16]).write_unaligned([value; 16]);
                p = p.add(16);
            }
            while p.wrapping_add(4) <= end {
                (p as *mut [f32; 4]).write_unaligned([value; 4]);
                p = p.add(4);
            }
            while p < end {
                *p = value;
                p = p.add(1);
            }
        } else {
            for j in from..to {
                *at(j) = value;
            }
        }
    }
}

/// `out[j] = f(x[j])`, [`LANES`] lanes at a time (`out`'s length is a multiple of it: the loop
/// vectorizes).
#[inline(always)]
fn map1(out: &mut [f32], x: &[f32], f: impl Fn(f32) -> f32) {
    for (o, x) in out.chunks_exact_mut(LANES).zip(x.chunks_exact(LANES)) {
        for k in 0..LANES {
            o[k] = f(x[k]);
        }
    }
}

/// `out[j] = f(x[j], y[j])`, [`LANES`] lanes at a time (as [`map1`]).
#[inline(always)]
fn map2(out: &mut [f32], x: &[f32], y: &[f32], f: impl Fn(f32, f32) -> f32) {
    for (o, (x, y)) in out.chunks_exact_mut(LANES).zip(x.chunks_exact(LANES).zip(y.chunks_exact(LANES))) {
        for k in 0..LANES {
            o[k] = f(x[k], y[k]);
        }
    }
}
