//! Masked element-wise nests run by native Rust instead of JIT-ed code, at the quick tier: a loop
//! nest whose innermost body computes `f32` values from loads with exact IEEE operations (`+ - *
//! /`, `max`, `min`, negation, reciprocal, square root, truncation, `where`) and stores them, some
//! of its loads masked, or its values picked by a mask, over ranges of the loop variables: a
//! padded bias and ReLU (`where(0 < i < 17 && 0 < j < 17, max(x[i - 1, j - 1] + b[c], 0), 0)`),
//! the input of a depthwise convolution.
//!
//! Why: MobileNet's first call compiled three such kernels with Cranelift (175-225 us each, more
//! than its whole run), and the nest needs no code of its own: its extents, strides and mask
//! bounds are a few numbers per call ([`copy`](super::copy)'s, which this reuses), and its
//! arithmetic a handful of operations per element. [`MapPlan::of`] recognises the nest;
//! [`MapPlan::run`] walks it with the JIT's calling convention in blocks of up to [`CHUNK`]
//! elements (a long row in pieces, short rows several to a block), one statement at a time over
//! the block, its computing statements over whole vectors of lanes. The tiered JIT swaps
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

/// The most registers a plan holds (a chunk of values each).
const MAX_SLOTS: usize = 32;

/// A masked element-wise nest, recognised from a loop kernel (see the module docs).
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
    /// The plan of `k` when its whole body is one masked element-wise nest: a parallel loop and
    /// at least one loop inside it (at most [`MAX_DEPTH`] levels, each extent free of loop
    /// variables), `let`s before each level's nested loop, the innermost level `let`s and then
    /// one `store`; every value `f32` (a mask `bool`), every op one of the module docs', every
    /// access of an `f32` parameter at an index affine in the loop variables (as a copy's), no
    /// parameter both loaded and stored, every mask a conjunction of ranges of loop variables
    /// (as a copy's), and at least one mask (a nest without one is the vectorised loop's).
    /// `tile`: the compiler's tile level, which picks the instantiation `run` calls.
    pub(crate) fn of(k: &LoopKernel, tile: TileLevel) -> Option<MapPlan> {
        let [Stmt::Loop { parallel: true, .. }] = k.body.as_slice() else { return None };
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
        if extents.len() < 2 || stores.is_empty() || extents.iter().any(|e| e.reads_vars()) {
            return None;
        }
        let n_syms = k.n_syms as usize;
        let n_vars = vars.iter().map(|v| v.0 as usize + 1).max()?;
        if n_vars > ZEROS.len() || !extents.iter().all(|e| leaves_ok(e, &vars, n_syms)) {
            return None;
        }
        let zeros = &ZEROS[..n_vars];
        let mask = |m: &IExpr| if leaves_ok(m, &vars, n_syms) { ranges(m, &vars, zeros) } else { None };
        let mut slot: HashMap<Reg, (usize, DType)> = HashMap::default();
        let mut steps = Vec::with_capacity(lets.len() + stores.len());
        let mut consts = Vec::new();
        let mut loaded = SmallVec::<[u32; 8]>::new();
        let mut masked = false;
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
                    masked |= !ranges.is_empty();
                    loaded.push(*buf);
                    let side = Side::of(k, *buf, index, DType::F32, &vars, zeros)?;
                    Some(Step::Load { to, side, ranges, other: other as f32 })
                }
                (DType::Bool, Inst::Index(m)) => {
                    masked = true;
                    Some(Step::Inside { to, ranges: mask(m)? })
                }
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
        if loaded.contains(&buf) || !masked {
            return None;
        }
        let value = slot.get(&value).filter(|s| s.1 == DType::F32)?.0;
        steps.push(Step::Store { side: Side::of(k, buf, index, DType::F32, &vars, zeros)?, value });
        let extents = extents.iter().map(|e| Num::of(e, zeros)).collect();
        let wide = cfg!(target_arch = "x86_64") && tile == TileLevel::Avx512;
        Some(MapPlan { extents, steps, consts, slots: slot.len(), n_vars, n_syms, wide })
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
    /// of depthwise convolutions: 40-42, 35-37 and 20-21 us at 128 bits, 34-40, 31-35 and
    /// 17-20 us with it (`KILN_JIT=quick kiln profile onnx mobilenet.onnx --dim batch=4
    /// --launches 30`, alternating binaries).
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
        let inner = depth - 1;
        let mut extent = [0i64; MAX_DEPTH];
        for (d, e) in self.extents.iter().enumerate() {
            extent[d] = e.eval(vars, syms).max(0);
        }
        let (first, last) = (start.max(0), end.min(extent[0]));
        if first >= last || extent[1..depth].contains(&0) {
            return;
        }
        // SAFETY: the caller passes one pointer per parameter.
        let live: SmallVec<[Live; 16]> = self.steps.iter().map(|s| unsafe { Live::of(s, bufs, vars, syms) }).collect();
        let mut slots = vec![[0f32; CHUNK]; self.slots];
        for &(s, v) in &self.consts {
            slots[s] = [v; CHUNK];
        }
        let slots = slots.as_mut_ptr();
        let n = extent[inner];
        // Short rows go several to a block (one row of the level around the innermost after
        // the other), so that each statement runs over more elements per dispatch: the rows of
        // a padded 10 x 10 plane cost 40 ns each one at a time.
        let mid = inner - 1;
        let per_block = if n <= CHUNK as i64 / 2 { CHUNK as i64 / n } else { 1 };
        let (mid_first, mid_last) = if mid == 0 { (first, last) } else { (0, extent[mid]) };
        let mut at = [0i64; MAX_DEPTH];
        at[0] = first;
        loop {
            at[mid] = mid_first;
            while at[mid] < mid_last {
                let rows = per_block.min(mid_last - at[mid]) as usize;
                let mut j0 = 0;
                while j0 < n {
                    let m = (n - j0).min(CHUNK as i64) as usize;
                    let block = Block { at: &at, depth, rows, j0, m };
                    for (step, live) in self.steps.iter().zip(&live) {
                        // SAFETY: the caller's contract for the accesses; every step writes
                        // a slot of its own register, which no operand of it is (SSA).
                        unsafe { step.apply(live, &block, slots) };
                    }
                    j0 += m as i64;
                }
                at[mid] += rows as i64;
            }
            // The next block of rows: an odometer over the levels outside `mid`.
            let mut d = mid;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                at[d] += 1;
                if at[d] < if d == 0 { last } else { extent[d] } {
                    break;
                }
                at[d] = 0;
            }
        }
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

    /// Where the block's rows are: per row `r`, elements `a..b` of the chunk (where every range
    /// holds: all rows alike but those outside the ranges of the level around the innermost,
    /// which read none) from index `base + r * row_step` on, `step` apart.
    #[inline(always)]
    fn rows(&self, block: &Block<'_>) -> Rows {
        let (at, depth) = (block.at, block.depth);
        let (mid, inner) = (depth - 2, depth - 1);
        let outer_ok = at[..mid].iter().zip(&self.bounds).all(|(&v, &(lo, hi))| lo <= v && v < hi);
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
        let (mid_lo, mid_hi) = self.bounds[mid];
        Rows {
            span,
            // Rows `r` with `mid_lo <= at[mid] + r < mid_hi` (clamped to the block).
            first: mid_lo.saturating_sub(at[mid]).clamp(0, block.rows as i64) as usize,
            end: mid_hi.saturating_sub(at[mid]).clamp(0, block.rows as i64) as usize,
            base: base.wrapping_add(block.j0.wrapping_mul(step)) as isize,
            step: step as isize,
            row_step: self.coefs[mid] as isize,
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
                    match op {
                        UnaryOp::Neg => map1(out, x, |x| -x),
                        UnaryOp::Recip => map1(out, x, |x| 1.0 / x),
                        UnaryOp::Sqrt => map1(out, x, f32::sqrt),
                        _ => map1(out, x, f32::trunc),
                    }
                }
                Step::Binary { to, op, a, b } => {
                    let (out, x, y) = (&mut (&mut *slots.add(to))[..lanes], slot(a), slot(b));
                    match op {
                        BinaryOp::Add => map2(out, x, y, |x, y| x + y),
                        BinaryOp::Sub => map2(out, x, y, |x, y| x - y),
                        BinaryOp::Mul => map2(out, x, y, |x, y| x * y),
                        BinaryOp::Div => map2(out, x, y, |x, y| x / y),
                        BinaryOp::Max => map2(out, x, y, fmax),
                        _ => map2(out, x, y, fmin),
                    }
                }
                Step::Select { to, c, a, b } => {
                    let (out, c, x, y) = (&mut (&mut *slots.add(to))[..lanes], slot(c), slot(a), slot(b));
                    let pick = |c: f32, x: f32, y: f32| {
                        let c = c.to_bits();
                        f32::from_bits((x.to_bits() & c) | (y.to_bits() & !c))
                    };
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
}

/// Copies `n` floats from `src` to `dst` (not overlapping): inline for a short row, where a call
/// of `memcpy` would cost more than the copy.
///
/// # Safety
/// Both ranges lie inside their buffers.
#[inline(always)]
unsafe fn copy(src: *const f32, dst: *mut f32, n: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        if n <= 16 {
            for j in 0..n {
                *dst.add(j) = *src.add(j);
            }
        } else {
            std::ptr::copy_nonoverlapping(src, dst, n);
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
