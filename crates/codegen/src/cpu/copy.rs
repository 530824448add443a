//! Copy kernels run by a native routine instead of JIT-ed code: a loop nest whose only work is
//! loads stored unchanged (a transpose, a broadcast, a slice, a key/value cache write, a
//! concatenation's piece, an im2col's shifted windows, a zero-padded border), with every index
//! affine in the loop variables and every load's mask a range of loop variables.
//!
//! Why: a program is full of them (the cached GPT forward launches 16 of its 62 steps at depth
//! 2 as copies; an RNN imported from ONNX has 10-20 of its 24-33 kernels; a convolution's im2col
//! and padding are the largest kernels MobileNet compiles), each cost a Cranelift compile (the
//! quick tier's code then ran index-heavy nests at 5-10x the optimised tier's time: a cache write
//! of 1,920 floats took 5 us on a first run against 0.5), and the nest needs no code of its own:
//! its extents, strides, offsets and mask bounds are a few numbers per call, and the innermost
//! run of a single unmasked copy is a `memmove` where both sides are contiguous. [`CopyPlan::of`]
//! recognises the nest; [`CopyPlan::run`] evaluates it for the call's symbols and copies, with
//! the JIT's calling convention (the arguments' pointers, the symbols, and the `[start, end)`
//! range of a parallel outer loop). It is the copy's quick tier: the tiered JIT swaps optimised
//! code in once the program runs again, except for a nest whose every copy moves short runs in
//! AVX-512 vectors ([`CopyPlan::stays`]: an im2col's windows), which is faster than that code and
//! stays. A nest of one unmasked copy walks its two levels around the innermost in plain loops
//! with each run one move of a size fixed before them, so its short rows (a head split's eight
//! floats) cost what the optimised code's do.

use air::{DType, Scalar};
use lower::kir::{IExpr, Inst, LoopKernel, Reg, Stmt, Var};
use smallvec::SmallVec;

use super::tile::TileLevel;

/// The most loop levels a copy nest may have (a view of rank 8 or less is the norm).
pub(super) const MAX_DEPTH: usize = 8;

/// Loop variables at 0: a plan's variables are numbered below its length (kernels number theirs
/// from 0; a nest past it gets no plan).
pub(super) static ZEROS: [i64; 64] = [0; 64];

/// A number of the plan: known when the kernel is compiled, or an expression of the symbols (and
/// of loop variables at 0) evaluated per call. Most are constants: a call then evaluates little
/// (a decoding step's copies are a few hundred elements each).
#[derive(Debug, PartialEq)]
pub(super) enum Num {
    Known(i64),
    PerCall(IExpr),
}

impl Num {
    /// `e` with every loop variable at 0 (`vars` zeros), folded where it reads no symbol.
    pub(super) fn of(e: &IExpr, vars: &[i64]) -> Num {
        let mut syms = Vec::new();
        e.symbols(&mut syms);
        if syms.is_empty() { Num::Known(e.eval(vars, &[])) } else { Num::PerCall(e.clone()) }
    }

    #[inline]
    pub(super) fn eval(&self, vars: &[i64], syms: &[i64]) -> i64 {
        match self {
            Num::Known(v) => *v,
            Num::PerCall(e) => e.eval(vars, syms),
        }
    }
}

/// One side of a copy: element `(i0, i1, ...)` is at `offset + sum(coefs[d] * i_d)` of parameter
/// `param`.
#[derive(Debug)]
pub(super) struct Side {
    pub(super) param: usize,
    /// The index with every loop variable 0: the element of the first iteration.
    pub(super) offset: Num,
    /// Per loop level, outermost first: how far one step of its variable moves the index.
    pub(super) coefs: Vec<Num>,
}

impl Side {
    /// Element `index` of parameter `param` of `k`, which must be of `dtype`, in the nest of loop
    /// variables `vars` (`zeros`: as many zeros): `None` unless the index is affine in them with
    /// coefficients free of them, and reads only those variables and `k`'s symbols.
    pub(super) fn of(
        k: &LoopKernel,
        param: u32,
        index: &IExpr,
        dtype: DType,
        vars: &[Var],
        zeros: &[i64],
    ) -> Option<Side> {
        let p = k.params.get(param as usize)?;
        if p.dtype != dtype {
            return None;
        }
        if let Some((offset, coefs)) = affine_known(index, vars) {
            let coefs = coefs[..vars.len()].iter().map(|&c| Num::Known(c)).collect();
            return Some(Side { param: param as usize, offset: Num::Known(offset), coefs });
        }
        if !leaves_ok(index, vars, k.n_syms as usize) {
            return None;
        }
        let coefs: Vec<IExpr> = vars.iter().map(|&v| index.linear_coeff(v)).collect::<Option<_>>()?;
        if coefs.iter().any(IExpr::reads_vars) {
            return None;
        }
        let coefs = coefs.iter().map(|e| Num::of(e, zeros)).collect();
        Some(Side { param: param as usize, offset: Num::of(index, zeros), coefs })
    }
}

/// `e` as `offset + sum(coefs[d] * vars[d])` with known numbers, where it is one: built of
/// constants, the variables `vars`, sums, and products with a side free of them (wrapping, as
/// `IExpr::eval`). Nothing is allocated: the general path ([`Side::of`]'s, one `linear_coeff`
/// per variable, each building an expression) was most of a copy plan's time, about 5 us for an
/// im2col's nine copies. `None` for anything else (a symbol, a division), which that path takes.
fn affine_known(e: &IExpr, vars: &[Var]) -> Option<(i64, [i64; MAX_DEPTH])> {
    const NONE: [i64; MAX_DEPTH] = [0; MAX_DEPTH];
    if vars.len() > MAX_DEPTH {
        return None;
    }
    match e {
        IExpr::Const(c) => Some((*c, NONE)),
        IExpr::Var(v) => {
            let mut coefs = NONE;
            coefs[vars.iter().position(|x| x == v)?] = 1;
            Some((0, coefs))
        }
        IExpr::Add(a, b) => {
            let ((x, cx), (y, cy)) = (affine_known(a, vars)?, affine_known(b, vars)?);
            Some((x.wrapping_add(y), std::array::from_fn(|d| cx[d].wrapping_add(cy[d]))))
        }
        IExpr::Mul(a, b) => {
            let ((x, cx), (y, cy)) = (affine_known(a, vars)?, affine_known(b, vars)?);
            match (cx == NONE, cy == NONE) {
                (true, _) => Some((x.wrapping_mul(y), cy.map(|c| x.wrapping_mul(c)))),
                (_, true) => Some((x.wrapping_mul(y), cx.map(|c| c.wrapping_mul(y)))),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Where a masked load reads: the loop variable of level `level` in `lo..hi` (elsewhere the
/// copy stores zero, the load's `other`).
#[derive(Debug, PartialEq)]
pub(super) struct Range {
    pub(super) level: usize,
    pub(super) lo: Num,
    pub(super) hi: Num,
}

/// One load stored unchanged.
#[derive(Debug)]
struct Pair {
    src: Side,
    dst: Side,
    /// The load's mask as ranges of loop variables, all of which must hold (empty: unmasked).
    ranges: Vec<Range>,
}

/// The most copies one nest may hold (an im2col of a 3x3 window holds nine).
const MAX_PAIRS: usize = 16;

/// A copy nest, recognised from a loop kernel (see the module docs).
#[derive(Debug)]
pub(crate) struct CopyPlan {
    /// Loop extents, outermost first (symbols and constants only).
    extents: Vec<Num>,
    /// Whether the outermost loop is the kernel's parallel loop, which `[start, end)` ranges.
    parallel: bool,
    /// Bytes per element (every side's dtype is the same).
    size: usize,
    /// The copies, in the order the kernel stores them.
    pairs: Vec<Pair>,
    /// One past the largest loop variable number (the length of `eval`'s `vars`, at most
    /// `ZEROS.len()`).
    n_vars: usize,
    /// Symbols the expressions read (`LoopKernel::n_syms`).
    n_syms: usize,
    /// Moves runs of 4-byte elements with AVX-512F ([`move_words_avx512`]): the compiler's tile
    /// level is [`TileLevel::Avx512`], which it picks only on a host that has it.
    wide: bool,
}

/// One side of a [`CopyMove`]: element `(i_0, i_1, ..)` of the nest is at `offset + sum(i_d *
/// steps[d])` of parameter `param` (elements, not bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopySide {
    pub param: usize,
    pub offset: i64,
    pub steps: Vec<i64>,
}

/// One copy of a [`CopyNest`]: each element of the nest read at `src` and stored at `dst`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyMove {
    pub src: CopySide,
    pub dst: CopySide,
}

/// A copy kernel's nest for one call's symbols, none of its copies masked: the loop extents
/// (outermost first, the whole parallel loop) and its copies in the kernel's order. What a
/// runner needs to read the copy's source in place instead of running it (see
/// `KernelEntry::copy_nest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyNest {
    pub extents: Vec<i64>,
    pub moves: Vec<CopyMove>,
}

/// A load the nest holds: its register, dtype, parameter, index and mask.
type Load<'k> = (Reg, DType, u32, &'k IExpr, Option<&'k IExpr>);

impl CopyPlan {
    /// The plan of `k` when its whole body is one copy nest: nested loops (at most
    /// [`MAX_DEPTH`], the outermost possibly parallel, each extent free of loop variables),
    /// `load`s at any level and, in the innermost loop, at most [`MAX_PAIRS`] `store`s each of
    /// one loaded value, every side of one dtype, no parameter both loaded and stored, every
    /// index affine in the loop variables with coefficients free of them, and every mask a
    /// conjunction of `c < i` and `i < c` for a loop variable `i` and a `c` free of them, with a
    /// zero `other`.
    pub(crate) fn of(k: &LoopKernel, tile: TileLevel) -> Option<CopyPlan> {
        let mut extents = Vec::new();
        let mut vars = Vec::new();
        let mut loads: SmallVec<[Load<'_>; MAX_PAIRS]> = SmallVec::new();
        let mut stores: SmallVec<[(u32, &IExpr, Reg); MAX_PAIRS]> = SmallVec::new();
        let mut level = k.body.as_slice();
        loop {
            let mut inner = None;
            for s in level {
                match s {
                    Stmt::Loop { var, extent, parallel: p, body } if inner.is_none() && stores.is_empty() => {
                        // `parallel` marks top-level loops only.
                        if *p && !extents.is_empty() {
                            return None;
                        }
                        extents.push(extent.clone());
                        vars.push(*var);
                        if extents.len() > MAX_DEPTH {
                            return None;
                        }
                        inner = Some(body.as_slice());
                    }
                    Stmt::Let { reg, dtype, inst: Inst::Load { buf, index, mask, other } }
                        if loads.len() < MAX_PAIRS && is_zero(other) =>
                    {
                        loads.push((*reg, *dtype, *buf, index, mask.as_ref()));
                    }
                    Stmt::Store { buf, index, value } if stores.len() < MAX_PAIRS && inner.is_none() => {
                        stores.push((*buf, index, *value));
                    }
                    _ => return None,
                }
            }
            match inner {
                // Stores are the innermost level's; nothing may follow a nested loop.
                Some(body) if matches!(level.last(), Some(Stmt::Loop { .. })) => level = body,
                Some(_) => return None,
                None => break,
            }
        }
        // As the JIT reads a kernel: `[start, end)` ranges the outer loop only when the body is
        // that one parallel loop (a load hoisted above it makes the launch one call of it all).
        let parallel = matches!(k.body.as_slice(), [Stmt::Loop { parallel: true, .. }]);
        if extents.is_empty() || stores.is_empty() || extents.iter().any(IExpr::reads_vars) {
            return None;
        }
        let dtype = loads.first()?.1;
        // No load reads what a store writes, so the loads may run in any order.
        if loads.iter().any(|l| stores.iter().any(|s| s.0 == l.2)) {
            return None;
        }
        let n_syms = k.n_syms as usize;
        let n_vars = vars.iter().map(|v| v.0 as usize + 1).max().unwrap_or(0);
        if n_vars > ZEROS.len() {
            return None;
        }
        let zeros = &ZEROS[..n_vars];
        // As the emitter checks: every symbol is one the kernel declares, every variable a loop's.
        let ok = |e: &IExpr| leaves_ok(e, &vars, n_syms);
        let side = |param: u32, index: &IExpr| Side::of(k, param, index, dtype, &vars, zeros);
        let mut pairs = Vec::with_capacity(stores.len());
        for &(dst_buf, dst_index, value) in &stores {
            let &(_, load_dtype, src_buf, src_index, mask) = loads.iter().find(|l| l.0 == value)?;
            if load_dtype != dtype {
                return None;
            }
            let ranges = match mask {
                None => Vec::new(),
                Some(m) if ok(m) => ranges(m, &vars, zeros)?,
                Some(_) => return None,
            };
            pairs.push(Pair { src: side(src_buf, src_index)?, dst: side(dst_buf, dst_index)?, ranges });
        }
        if !extents.iter().all(ok) {
            return None;
        }
        let extents = extents.iter().map(|e| Num::of(e, zeros)).collect();
        let wide = tile == TileLevel::Avx512;
        Some(CopyPlan { extents, parallel, size: dtype.size_bytes(), pairs, n_vars, n_syms, wide })
    }

    /// Runs the copy: the JIT's calling convention (`bufs`: one pointer per parameter, already
    /// at the offsets the kernel was split from; `syms`: the symbol values; `[start, end)`: the
    /// iterations of a parallel outer loop to run, clamped to its extent; ignored otherwise).
    ///
    /// # Safety
    /// As for a compiled kernel: every element the nest touches for these symbols lies inside
    /// its parameter's buffer, and nothing else touches the destination's elements meanwhile.
    pub(crate) unsafe fn run(&self, bufs: *const *mut u8, syms: *const i64, start: i64, end: i64) {
        // SAFETY: the caller passes `n_syms` symbols.
        let syms = unsafe { std::slice::from_raw_parts(syms, self.n_syms) };
        // Loop variables at 0, for the offsets and any per-call number.
        let vars = &ZEROS[..self.n_vars];
        let depth = self.extents.len();
        let mut extent = [0i64; MAX_DEPTH];
        for (d, e) in self.extents.iter().enumerate() {
            extent[d] = e.eval(vars, syms).max(0);
        }
        let (mut first, mut last) = (0, extent[0]);
        if self.parallel {
            (first, last) = (start.max(0), end.min(extent[0]));
        }
        if first >= last || extent[1..depth].contains(&0) {
            return;
        }
        extent[0] = last - first;
        let inner = depth - 1;
        let n = extent[inner];
        let size = self.size as isize;
        let mut copies: SmallVec<[Cursor; 2]> = SmallVec::new();
        for pair in &self.pairs {
            let step = |side: &Side, d: usize| (side.coefs[d].eval(vars, syms) as isize).wrapping_mul(size);
            let at_first = |side: &Side| {
                let offset = (side.offset.eval(vars, syms) as isize).wrapping_mul(size);
                offset.wrapping_add((first as isize).wrapping_mul(step(side, 0)))
            };
            let mut c = Cursor {
                // SAFETY: the caller passes one pointer per parameter.
                src: unsafe { *bufs.add(pair.src.param) }.wrapping_offset(at_first(&pair.src)),
                dst: unsafe { *bufs.add(pair.dst.param) }.wrapping_offset(at_first(&pair.dst)),
                src_steps: [0; MAX_DEPTH],
                dst_steps: [0; MAX_DEPTH],
                bounds: [(i64::MIN, i64::MAX); MAX_DEPTH],
                masked: !pair.ranges.is_empty(),
            };
            for d in 0..depth {
                (c.src_steps[d], c.dst_steps[d]) = (step(&pair.src, d), step(&pair.dst, d));
            }
            for r in &pair.ranges {
                let b = &mut c.bounds[r.level];
                *b = (b.0.max(r.lo.eval(vars, syms)), b.1.min(r.hi.eval(vars, syms)));
            }
            // Level 0 counts from `first`: its bounds too.
            c.bounds[0] = (c.bounds[0].0.saturating_sub(first), c.bounds[0].1.saturating_sub(first));
            copies.push(c);
        }
        if let [c] = copies.as_slice()
            && !c.masked
        {
            // SAFETY: the caller's contract, as below.
            unsafe { self.run_one(c, &extent[..depth]) };
            return;
        }
        // Copy after copy (each run a `memmove` where contiguous) when no two copies' runs of one
        // iteration of the outer levels store into the same bytes, else element after element
        // with the copies interleaved as the kernel stores them (the loads may run in any order:
        // none reads a stored byte). Runs that move alike at every outer level keep their
        // distance, so the first iteration's runs tell.
        let in_turn = copies.len() == 1
            || (copies.iter().all(|c| c.dst_steps[..inner] == copies[0].dst_steps[..inner])
                && stores_apart(&copies, &extent[..depth], inner, self.size));
        if in_turn
            && copies.iter().all(|c| !c.masked && self.moves_words(c.src_steps[inner], c.dst_steps[inner], n))
            && stores_never_meet(&copies, &extent[..depth], self.size)
        {
            // Copy after copy, each walked on its own in vector moves (an im2col's windows):
            // no two copies store into the same bytes anywhere in the nest, so their order
            // across iterations does not matter.
            for c in &copies {
                // SAFETY: as below, a copy at a time; `moves_words` checked the host.
                unsafe { walk_words_avx512(c, &extent[..depth], n as usize) };
            }
            return;
        }
        // An odometer over every level but the innermost, which is one run per copy.
        let mut at = [0i64; MAX_DEPTH];
        loop {
            if in_turn {
                for c in &copies {
                    let (lo, hi) = c.reads(&at[..inner], inner, n);
                    let (ss, ds) = (c.src_steps[inner], c.dst_steps[inner]);
                    let t = |j: i64| c.dst.wrapping_offset((j as isize).wrapping_mul(ds));
                    // SAFETY: elements `j < n` of the run are this iteration's stores, inside the
                    // destination, and elements `lo..hi` its reads, inside the source (the
                    // caller's contract; an element outside the mask is not read).
                    unsafe {
                        if lo > 0 {
                            zeros(t(0), ds, lo as usize, self.size);
                        }
                        let from = c.src.wrapping_offset((lo as isize).wrapping_mul(ss));
                        self.copy_run(from, ss, t(lo), ds, (hi - lo) as usize);
                        if hi < n {
                            zeros(t(hi), ds, (n - hi) as usize, self.size);
                        }
                    }
                }
            } else {
                let mut reads = [(0i64, 0i64); MAX_PAIRS];
                for (c, r) in copies.iter().zip(&mut reads) {
                    *r = c.reads(&at[..inner], inner, n);
                }
                for j in 0..n {
                    for (c, &(lo, hi)) in copies.iter().zip(&reads) {
                        let t = c.dst.wrapping_offset((j as isize).wrapping_mul(c.dst_steps[inner]));
                        // SAFETY: as above, for one element.
                        unsafe {
                            if j >= lo && j < hi {
                                let s = c.src.wrapping_offset((j as isize).wrapping_mul(c.src_steps[inner]));
                                run(s, 0, t, 0, 1, self.size);
                            } else {
                                zeros(t, self.size as isize, 1, self.size);
                            }
                        }
                    }
                }
            }
            let moved = advance(&mut at, &extent, inner, |d, by| {
                for c in copies.iter_mut() {
                    c.src = c.src.wrapping_offset(c.src_steps[d].wrapping_mul(by));
                    c.dst = c.dst.wrapping_offset(c.dst_steps[d].wrapping_mul(by));
                }
            });
            if !moved {
                return;
            }
        }
    }

    /// The nest for the symbols `syms` (at least the kernel's), if no copy is masked.
    pub(crate) fn nest(&self, syms: &[i64]) -> Option<CopyNest> {
        if syms.len() < self.n_syms || self.pairs.iter().any(|p| !p.ranges.is_empty()) {
            return None;
        }
        let vars = &ZEROS[..self.n_vars];
        let eval = |n: &Num| n.eval(vars, syms);
        let side =
            |s: &Side| CopySide { param: s.param, offset: eval(&s.offset), steps: s.coefs.iter().map(eval).collect() };
        let moves = self.pairs.iter().map(|p| CopyMove { src: side(&p.src), dst: side(&p.dst) }).collect();
        Some(CopyNest { extents: self.extents.iter().map(|e| eval(e).max(0)).collect(), moves })
    }

    /// Whether the kernel stays on this plan rather than tiering up: every copy unmasked, its
    /// runs of at most [`WORD_RUN_MAX`] 4-byte elements (a length known when the kernel is
    /// compiled) moved by [`move_words_avx512`], the copies stepping alike at every level (the
    /// same numbers, or the same expressions of the symbols: so they take turns, `run`, and are
    /// walked copy after copy where they never meet, [`stores_never_meet`]). Such a nest moves its
    /// short rows in two or three vector moves each, where the optimised tier's 128-bit code takes
    /// one move per four elements (conv-32's im2col, 1,872 rows of 26 floats: 5.4-10 us natively
    /// against 11-15; MobileNet's stem, every other float: 7.1-7.6 against 10.8-13.5, its batch
    /// known or a symbol).
    pub(crate) fn stays(&self) -> bool {
        let inner = self.extents.len() - 1;
        let known = |n: &Num| match n {
            Num::Known(v) => Some(*v),
            Num::PerCall(_) => None,
        };
        let first = &self.pairs[0].dst.coefs;
        self.wide
            && self.size == 4
            && matches!(known(&self.extents[inner]), Some(1..=WORD_RUN_MAX))
            && self.pairs.iter().all(|p| {
                p.ranges.is_empty()
                    && known(&p.dst.coefs[inner]) == Some(1)
                    && matches!(known(&p.src.coefs[inner]), Some(1 | 2))
                    && p.dst.coefs == *first
            })
    }

    /// Whether runs of `n` elements `src_step` and `dst_step` bytes apart go through
    /// [`move_words_avx512`]: at most [`WORD_RUN_MAX`] 4-byte elements, stored contiguously, read
    /// contiguously or every other one (an im2col's windows, stride 1 or 2), on an AVX-512F host
    /// (a longer contiguous run is one `memmove`).
    #[inline]
    fn moves_words(&self, src_step: isize, dst_step: isize, n: i64) -> bool {
        self.wide && self.size == 4 && dst_step == 4 && matches!(src_step, 4 | 8) && n <= WORD_RUN_MAX
    }

    /// Copies one run of `n` elements ([`copy_run`], or [`move_words_avx512`] where it takes it).
    ///
    /// # Safety
    /// As for [`run`].
    #[inline]
    unsafe fn copy_run(&self, src: *const u8, src_step: isize, dst: *mut u8, dst_step: isize, n: usize) {
        // SAFETY: the caller's contract; `moves_words` checked the host and the steps.
        unsafe {
            if self.moves_words(src_step, dst_step, n as i64) {
                move_words_avx512(src, dst, &WordRun::of(n, src_step))
            } else {
                copy_run(src, src_step, dst, dst_step, n, self.size)
            }
        }
    }

    /// [`CopyPlan::run`] for a nest of one unmasked copy: the two levels around the innermost
    /// walked in plain loops, each innermost run one move of a size known before them (a head
    /// split's rows of eight floats are one 32-byte move each), the levels outside those by an
    /// odometer. The general walk spent about 15 ns per such row (a cache write of 240 rows,
    /// 3.6 us against 1 for the optimised tier's code).
    ///
    /// # Safety
    /// As for [`CopyPlan::run`]; `c` is the call's cursor, `extent` its extents (none zero).
    unsafe fn run_one(&self, c: &Cursor, extent: &[i64]) {
        let inner = extent.len() - 1;
        let (n, size) = (extent[inner] as usize, self.size);
        let (ss, ds) = (c.src_steps[inner], c.dst_steps[inner]);
        // SAFETY (every arm): each run's elements are the nest's, inside their buffers (the
        // caller's contract); no parameter is both read and written, so the runs do not overlap.
        unsafe {
            if self.moves_words(ss, ds, n as i64) {
                return walk_words_avx512(c, extent, n);
            }
            if ss != size as isize || ds != size as isize {
                return walk(c, extent, |s, d| run(s, ss, d, ds, n, size));
            }
            match n * size {
                4 => walk(c, extent, |s, d| std::ptr::copy_nonoverlapping(s as *const [u8; 4], d as *mut [u8; 4], 1)),
                8 => walk(c, extent, |s, d| std::ptr::copy_nonoverlapping(s as *const [u8; 8], d as *mut [u8; 8], 1)),
                16 => {
                    walk(c, extent, |s, d| std::ptr::copy_nonoverlapping(s as *const [u8; 16], d as *mut [u8; 16], 1))
                }
                32 => {
                    walk(c, extent, |s, d| std::ptr::copy_nonoverlapping(s as *const [u8; 32], d as *mut [u8; 32], 1))
                }
                64 => {
                    walk(c, extent, |s, d| std::ptr::copy_nonoverlapping(s as *const [u8; 64], d as *mut [u8; 64], 1))
                }
                bytes if bytes <= SHORT_RUN => walk(c, extent, |s, d| copy_short(s, d, bytes)),
                bytes => walk(c, extent, |s, d| std::ptr::copy_nonoverlapping(s, d, bytes)),
            }
        }
    }
}

/// Calls `each(src, dst)` at the start of every innermost run of `c`'s nest (`extent`, none
/// zero), in the nest's order: the two levels around the innermost in plain loops, those outside
/// by an odometer. Only `each` touches memory.
#[inline(always)]
fn walk(c: &Cursor, extent: &[i64], each: impl Fn(*const u8, *mut u8)) {
    let inner = extent.len() - 1;
    let outer = inner.saturating_sub(2);
    // The plain levels `outer..inner`, outermost first, padded with levels of one step.
    let mut plain = [(1i64, 0isize, 0isize); 2];
    for (i, d) in (outer..inner).enumerate() {
        plain[2 - (inner - outer) + i] = (extent[d], c.src_steps[d], c.dst_steps[d]);
    }
    let [(rows_a, sa, da), (rows_b, sb, db)] = plain;
    let (mut src, mut dst) = (c.src as *const u8, c.dst);
    let mut at = [0i64; MAX_DEPTH];
    loop {
        let (mut s1, mut d1) = (src, dst);
        for _ in 0..rows_a {
            let (mut s2, mut d2) = (s1, d1);
            for _ in 0..rows_b {
                each(s2, d2);
                (s2, d2) = (s2.wrapping_offset(sb), d2.wrapping_offset(db));
            }
            (s1, d1) = (s1.wrapping_offset(sa), d1.wrapping_offset(da));
        }
        let moved = advance(&mut at, extent, outer, |d, by| {
            src = src.wrapping_offset(c.src_steps[d].wrapping_mul(by));
            dst = dst.wrapping_offset(c.dst_steps[d].wrapping_mul(by));
        });
        if !moved {
            return;
        }
    }
}

/// One step of an odometer over levels `..levels` of `extent` (the last the fastest) at `at`:
/// `move_by(d, by)` moves the cursors `by` steps along level `d` (one on, or `1 - extent` back to
/// the level's start when it wraps). False once every level has wrapped: the nest is done.
#[inline(always)]
fn advance(at: &mut [i64; MAX_DEPTH], extent: &[i64], levels: usize, mut move_by: impl FnMut(usize, isize)) -> bool {
    for d in (0..levels).rev() {
        at[d] += 1;
        if at[d] < extent[d] {
            move_by(d, 1);
            return true;
        }
        move_by(d, 1 - extent[d] as isize);
        at[d] = 0;
    }
    false
}

/// One copy of a [`CopyPlan`] during a call: where its current run starts, its steps per level
/// (bytes) and its mask's bounds per level (`lo..hi`, level 0's counted from the call's first
/// iteration).
struct Cursor {
    src: *mut u8,
    dst: *mut u8,
    src_steps: [isize; MAX_DEPTH],
    dst_steps: [isize; MAX_DEPTH],
    bounds: [(i64, i64); MAX_DEPTH],
    masked: bool,
}

impl Cursor {
    /// The values of the inner variable (below `n`) whose elements this copy reads at the outer
    /// levels' values `outer`: all of them unmasked, none where an outer value is outside its
    /// bounds.
    #[inline]
    fn reads(&self, outer: &[i64], inner: usize, n: i64) -> (i64, i64) {
        if !self.masked {
            return (0, n);
        }
        if outer.iter().zip(&self.bounds).any(|(&v, &(lo, hi))| v < lo || v >= hi) {
            return (0, 0);
        }
        let (lo, hi) = self.bounds[inner];
        let (lo, hi) = (lo.clamp(0, n), hi.clamp(0, n));
        if lo < hi { (lo, hi) } else { (0, 0) }
    }
}

/// Whether a masked load's `other` is zero in every dtype's bits (what a padded border reads).
fn is_zero(other: &Scalar) -> bool {
    match *other {
        Scalar::Bool(b) => !b,
        Scalar::Int(i) => i == 0,
        Scalar::Float(f) => f.to_bits() == 0,
    }
}

/// `mask` as ranges of loop variables: a conjunction of `c < i` (`i` from `c + 1`) and `i < c`
/// (`i` below `c`), `i` one of `vars` and `c` free of them; `None` for any other mask.
pub(super) fn ranges(mask: &IExpr, vars: &[Var], zeros: &[i64]) -> Option<Vec<Range>> {
    let mut out = Vec::new();
    let mut todo = vec![mask];
    while let Some(e) = todo.pop() {
        match e {
            IExpr::And(a, b) => todo.extend([&**a, &**b]),
            IExpr::Lt(a, b) => {
                let level = |e: &IExpr| match e {
                    IExpr::Var(v) => vars.iter().position(|w| w == v),
                    _ => None,
                };
                let range = match (level(a), level(b)) {
                    (Some(level), None) if !b.reads_vars() => {
                        Range { level, lo: Num::Known(i64::MIN), hi: Num::of(b, zeros) }
                    }
                    (None, Some(level)) if !a.reads_vars() => Range {
                        level,
                        lo: Num::of(&IExpr::add((**a).clone(), IExpr::Const(1)), zeros),
                        hi: Num::Known(i64::MAX),
                    },
                    _ => return None,
                };
                out.push(range);
            }
            _ => return None,
        }
    }
    Some(out)
}

/// Whether every leaf of `e` is a constant, one of `vars` or a symbol below `n_syms`.
pub(super) fn leaves_ok(e: &IExpr, vars: &[Var], n_syms: usize) -> bool {
    e.all_leaves(&|l| match l {
        IExpr::Var(v) => vars.contains(v),
        IExpr::Sym(s) => (*s as usize) < n_syms,
        _ => true,
    })
}

/// Whether the bytes each copy of `copies` stores over levels `from..` of the nest (`extent`,
/// elements of `size` bytes; the levels before `from` at their current values) lie apart from
/// every other copy's: from its first store to its last, whatever the steps' signs. From the
/// innermost level: one iteration's runs; from level 0: the whole nest.
fn stores_apart(copies: &[Cursor], extent: &[i64], from: usize, size: usize) -> bool {
    let mut spans: SmallVec<[(usize, usize); MAX_PAIRS]> = copies
        .iter()
        .map(|c| {
            let (mut lo, mut hi) = (0isize, 0isize);
            for (d, &e) in extent.iter().enumerate().skip(from) {
                let reach = c.dst_steps[d].wrapping_mul((e - 1) as isize);
                (lo, hi) = (lo.wrapping_add(reach.min(0)), hi.wrapping_add(reach.max(0)));
            }
            let at = c.dst as usize;
            (at.wrapping_add_signed(lo), at.wrapping_add_signed(hi).wrapping_add(size))
        })
        .collect();
    spans.sort_unstable();
    spans.windows(2).all(|w| w[0].1 <= w[1].0)
}

/// Whether no two copies of `copies` store into the same bytes anywhere in the nest (`extent`,
/// elements of `size` bytes): [`stores_apart`] over the whole nest, or, for copies that step
/// alike at every level and differ only where they start, an exact answer. Such copies meet iff
/// the distance between their starts is a sum of steps `x_d * step_d` with `|x_d| < extent_d`
/// ([`reaches`]). An im2col that puts each input channel's taps side by side (`[c][tap][pixel]`)
/// interleaves its copies' spans, which the span test takes for a clash: MobileNet's stem then
/// moved its 1,728 rows one call at a time, 21-24 us against 5-10 walked copy after copy.
fn stores_never_meet(copies: &[Cursor], extent: &[i64], size: usize) -> bool {
    if stores_apart(copies, extent, 0, size) {
        return true;
    }
    let depth = extent.len();
    let steps = &copies[0].dst_steps[..depth];
    let unit = size as isize;
    if copies.iter().any(|c| c.dst_steps[..depth] != *steps) || steps.iter().any(|s| s % unit != 0) {
        return false;
    }
    // In elements, largest step first: the distances an element's store can move.
    let mut levels: SmallVec<[(i64, i64); MAX_DEPTH]> =
        steps.iter().zip(extent).map(|(&s, &e)| ((s / unit).unsigned_abs() as i64, e)).filter(|l| l.0 != 0).collect();
    levels.sort_unstable_by_key(|l| std::cmp::Reverse(l.0));
    for (i, a) in copies.iter().enumerate() {
        for b in &copies[i + 1..] {
            let apart = (b.dst as isize).wrapping_sub(a.dst as isize);
            if apart % unit != 0 || reaches((apart / unit) as i64, &levels, &mut 4096) != Some(false) {
                return false;
            }
        }
    }
    true
}

/// Whether some `x` with `|x_d| < extent_d` makes `sum x_d * step_d` equal `target`, over
/// `levels` of `(step, extent)` (steps positive, largest first), searching digit by digit with
/// what the inner levels can still reach as the bound; `None` once `budget` visits run out (steps
/// that share so much that the search branches widely).
fn reaches(target: i64, levels: &[(i64, i64)], budget: &mut u32) -> Option<bool> {
    let Some((&(step, extent), inner)) = levels.split_first() else { return Some(target == 0) };
    *budget = budget.checked_sub(1)?;
    let reach: i64 = inner.iter().map(|&(s, e)| s.saturating_mul(e - 1)).fold(0, i64::saturating_add);
    // `x` such that `|target - x * step| <= reach`, within the level's extent.
    let lo = (target.saturating_sub(reach)).div_euclid(step)
        + i64::from((target.saturating_sub(reach)).rem_euclid(step) != 0);
    let hi = (target.saturating_add(reach)).div_euclid(step);
    for x in lo.max(1 - extent)..=hi.min(extent - 1) {
        if reaches(target - x * step, inner, budget)? {
            return Some(true);
        }
    }
    Some(false)
}

/// The longest run [`move_words_avx512`] moves (see [`CopyPlan::moves_words`]).
const WORD_RUN_MAX: i64 = 256;

/// A run of `n` 4-byte elements as [`move_words_avx512`] moves it: whole vectors of 16, then a
/// tail under masks, read contiguously or (`pairs`) every other element. Made once per walk, not
/// per run: MobileNet's stem im2col (1,728 rows of 16 floats read every other one) took 6.3-10 us
/// with the masks worked out per run against 4.8-4.9 with them made once, in a standalone loop
/// over hot buffers; in the model, where the buffers come from L2, both take 8-9 us.
#[derive(Clone, Copy)]
struct WordRun {
    full: usize,
    pairs: bool,
    /// Lanes of the tail's store, and of its two loads (words `0..2 t - 1` from the tail's start
    /// every other element; its lanes where contiguous).
    store: u16,
    lo: u16,
    hi: u16,
}

impl WordRun {
    fn of(n: usize, src_step: isize) -> WordRun {
        let mask = |lanes: usize| ((1u32 << lanes.min(16)) - 1) as u16;
        let (pairs, tail) = (src_step == 8, n % 16);
        let words = if pairs { (2 * tail).saturating_sub(1) } else { tail };
        WordRun { full: n / 16, pairs, store: mask(tail), lo: mask(words), hi: mask(words.saturating_sub(16)) }
    }
}

/// Copies a [`WordRun`] from `src` to `dst` (contiguous) 16 elements at a time with AVX-512F:
/// whole vectors, then a tail under masks (no byte outside the run is touched, a masked-off lane
/// does not fault), every other element picked by one lane permutation where the run reads
/// pairs. The bits move unchanged. A native im2col row of 26 floats took 9 moves of 13 words
/// each; this is two.
///
/// # Safety
/// The run's elements lie inside their buffers and do not overlap; AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn move_words_avx512(src: *const u8, dst: *mut u8, run: &WordRun) {
    use std::arch::x86_64::*;
    let (mut src, mut dst) = (src as *const f32, dst as *mut f32);
    // SAFETY: a whole vector's lanes are run elements `16 v..16 v + 16` (source words `32 v..32
    // v + 31` reading pairs: the run goes on past them or ends at the last), the tail's the
    // masks' lanes.
    unsafe {
        if run.pairs {
            let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            for _ in 0..run.full {
                let (lo, hi) = (_mm512_loadu_ps(src), _mm512_maskz_loadu_ps(0x7fff, src.add(16)));
                _mm512_storeu_ps(dst, _mm512_permutex2var_ps(lo, evens, hi));
                (src, dst) = (src.add(32), dst.add(16));
            }
            if run.store != 0 {
                let lo = _mm512_maskz_loadu_ps(run.lo, src);
                let hi = _mm512_maskz_loadu_ps(run.hi, src.add(16));
                _mm512_mask_storeu_ps(dst, run.store, _mm512_permutex2var_ps(lo, evens, hi));
            }
        } else {
            for _ in 0..run.full {
                _mm512_storeu_ps(dst, _mm512_loadu_ps(src));
                (src, dst) = (src.add(16), dst.add(16));
            }
            if run.store != 0 {
                _mm512_mask_storeu_ps(dst, run.store, _mm512_maskz_loadu_ps(run.store, src));
            }
        }
    }
}

/// Every run of `c`'s nest ([`walk`]) moved by [`move_words_avx512`], inlined into one loop.
///
/// # Safety
/// As for [`CopyPlan::run`], `c` a cursor of the call whose innermost steps
/// [`CopyPlan::moves_words`] took; AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn walk_words_avx512(c: &Cursor, extent: &[i64], n: usize) {
    let run = WordRun::of(n, c.src_steps[extent.len() - 1]);
    // SAFETY: the caller's contract, run by run.
    walk(c, extent, |s, d| unsafe { move_words_avx512(s, d, &run) });
}

/// [`walk_words_avx512`] off x86-64: never called (no plan is `wide` there).
#[cfg(not(target_arch = "x86_64"))]
unsafe fn walk_words_avx512(_: &Cursor, _: &[i64], _: usize) {
    unreachable!("a wide copy plan on a host without AVX-512F")
}

/// Copies `n` elements of `size` bytes from `src` (`src_step` bytes apart) to `dst` (`dst_step`
/// apart): one `memmove` (or an inline copy of a short run) where both are contiguous.
///
/// # Safety
/// As for [`run`].
#[inline]
unsafe fn copy_run(src: *const u8, src_step: isize, dst: *mut u8, dst_step: isize, n: usize, size: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        if src_step == size as isize && dst_step == size as isize {
            let bytes = n * size;
            if bytes <= SHORT_RUN {
                copy_short(src, dst, bytes);
            } else {
                std::ptr::copy(src, dst, bytes);
            }
        } else {
            run(src, src_step, dst, dst_step, n, size);
        }
    }
}

/// Stores zero into `n` elements of `size` bytes at `dst`, `dst_step` bytes apart.
///
/// # Safety
/// Every element lies inside its buffer.
#[inline]
unsafe fn zeros(dst: *mut u8, dst_step: isize, n: usize, size: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        if dst_step == size as isize && n * size > SHORT_RUN {
            std::ptr::write_bytes(dst, 0, n * size);
        } else if dst_step == size as isize {
            // A padded row's border: a word or two, inline rather than a call.
            let bytes = n * size;
            let mut i = 0;
            while i + 4 <= bytes {
                (dst.add(i) as *mut u32).write_unaligned(0);
                i += 4;
            }
            while i < bytes {
                *dst.add(i) = 0;
                i += 1;
            }
        } else {
            for j in 0..n as isize {
                std::ptr::write_bytes(dst.offset(j * dst_step), 0, size);
            }
        }
    }
}

/// Contiguous runs up to this many bytes are copied inline: a head split's rows of 8 floats
/// through `memmove` cost a call each, and the facade forward of a 2-layer GPT (240 such runs per
/// transpose) ran 3% slower than the JIT's code.
const SHORT_RUN: usize = 128;

/// Copies `bytes` bytes from `src` to `dst` eight at a time (the source read before the
/// destination is written, word by word: the ranges do not overlap in a copy kernel).
///
/// # Safety
/// Both ranges lie inside their buffers.
#[inline]
unsafe fn copy_short(src: *const u8, dst: *mut u8, bytes: usize) {
    // SAFETY: the caller's contract, word by word and then byte by byte.
    unsafe {
        let mut i = 0;
        while i + 8 <= bytes {
            (dst.add(i) as *mut u64).write_unaligned((src.add(i) as *const u64).read_unaligned());
            i += 8;
        }
        while i < bytes {
            *dst.add(i) = *src.add(i);
            i += 1;
        }
    }
}

/// Copies `n` elements of `size` bytes from `src` (`src_step` bytes apart) to `dst` (`dst_step`
/// apart).
///
/// # Safety
/// Every element read and written lies inside its buffer; the destination elements do not
/// overlap the source elements read after them.
unsafe fn run(src: *const u8, src_step: isize, dst: *mut u8, dst_step: isize, n: usize, size: usize) {
    // SAFETY: forwarded to the caller, element by element.
    unsafe {
        match size {
            4 => {
                for j in 0..n as isize {
                    let v = (src.offset(j * src_step) as *const u32).read_unaligned();
                    (dst.offset(j * dst_step) as *mut u32).write_unaligned(v);
                }
            }
            8 => {
                for j in 0..n as isize {
                    let v = (src.offset(j * src_step) as *const u64).read_unaligned();
                    (dst.offset(j * dst_step) as *mut u64).write_unaligned(v);
                }
            }
            _ => {
                for j in 0..n as isize {
                    std::ptr::copy(src.offset(j * src_step), dst.offset(j * dst_step), size);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use air::{BinaryOp, DType};
    use lower::kir::{Access, Param, Reg};

    use super::*;
    use crate::cpu::CpuCompiler;

    fn c(v: i64) -> IExpr {
        IExpr::Const(v)
    }
    fn v(n: u32) -> IExpr {
        IExpr::Var(Var(n))
    }
    fn add(a: IExpr, b: IExpr) -> IExpr {
        IExpr::Add(Box::new(a), Box::new(b))
    }
    fn mul(a: IExpr, b: IExpr) -> IExpr {
        IExpr::Mul(Box::new(a), Box::new(b))
    }
    fn load(reg: u32, dtype: DType, index: IExpr) -> Stmt {
        Stmt::Let { reg: Reg(reg), dtype, inst: Inst::Load { buf: 1, index, mask: None, other: air::Scalar::Int(0) } }
    }
    fn store(index: IExpr, reg: u32) -> Stmt {
        Stmt::Store { buf: 0, index, value: Reg(reg) }
    }
    fn looped(var: u32, extent: IExpr, parallel: bool, body: Vec<Stmt>) -> Stmt {
        Stmt::Loop { var: Var(var), extent, parallel, body }
    }
    fn plan(k: &LoopKernel) -> Option<CopyPlan> {
        CopyPlan::of(k, TileLevel::Base)
    }
    fn kernel(dtype: DType, n_syms: u32, body: Vec<Stmt>) -> LoopKernel {
        let params = vec![Param { dtype, access: Access::Write }, Param { dtype, access: Access::Read }];
        LoopKernel { params, n_syms, body }
    }

    /// Runs `k` natively and as JIT-ed code on the same input (bytes `0, 1, 2, ...`; bools 0 or 1), each into
    /// an output of `out_bytes` bytes filled with 0xAA first, for each `(start, end)`, and
    /// checks the two outputs are the same bytes.
    fn same_as_jit(k: &LoopKernel, in_bytes: usize, out_bytes: usize, syms: &[i64], ranges: &[(i64, i64)]) {
        let native = CpuCompiler::new().unwrap();
        native.set_native_copies(true);
        let jit = CpuCompiler::new().unwrap();
        jit.set_native_copies(false);
        // A padded copy is a masked element-wise nest too (`map`).
        jit.set_native_maps(false);
        let (a, b) = (native.compile(k).unwrap(), jit.compile(k).unwrap());
        assert!(a.is_native() && !b.is_native(), "{k:?}");
        // Bools hold 0 or 1 (what kernels store), other dtypes any bytes.
        let bools = k.params[1].dtype == DType::Bool;
        let input: Vec<u8> = (0..in_bytes).map(|i| if bools { (i % 3 == 1) as u8 } else { i as u8 }).collect();
        for &(start, end) in ranges {
            let mut outs = [vec![0xAAu8; out_bytes], vec![0xAAu8; out_bytes]];
            for (code, out) in [&a, &b].into_iter().zip(&mut outs) {
                let bufs = [out.as_mut_ptr(), input.as_ptr() as *mut u8];
                // SAFETY: the kernels touch only the elements their loops name, all inside
                // these buffers for these symbols (each test sizes them so).
                unsafe { code.run(&bufs, syms, start, end).unwrap() };
            }
            assert_eq!(outs[0], outs[1], "{k:?} over [{start}, {end})");
            assert!(outs[0].iter().any(|&b| b != 0xAA), "{k:?} wrote nothing");
        }
    }

    #[test]
    fn a_transpose_matches_the_jit_over_any_range_of_its_parallel_loop() {
        // out[i0, i1] = in[i1, i0], in 7x5.
        let body = vec![looped(
            0,
            c(5),
            true,
            vec![looped(
                1,
                c(7),
                false,
                vec![load(0, DType::F32, add(mul(v(1), c(5)), v(0))), store(add(mul(v(0), c(7)), v(1)), 0)],
            )],
        )];
        let k = kernel(DType::F32, 0, body);
        same_as_jit(&k, 35 * 4, 35 * 4, &[], &[(0, 5), (1, 4), (3, 99), (-2, 2)]);
    }

    #[test]
    fn a_broadcast_with_its_load_hoisted_matches_the_jit() {
        // out[i0, i1] = in[i0]: the load sits above the inner loop; 8-byte elements.
        let body = vec![looped(
            0,
            c(6),
            true,
            vec![load(0, DType::I64, v(0)), looped(1, c(9), false, vec![store(add(mul(v(0), c(9)), v(1)), 0)])],
        )];
        same_as_jit(&kernel(DType::I64, 0, body), 6 * 8, 54 * 8, &[], &[(0, 6), (2, 5)]);
        // A load above the only loop makes the launch one call of it all (start/end ignored).
        let body = vec![load(0, DType::F32, c(2)), looped(0, c(5), true, vec![store(v(0), 0)])];
        same_as_jit(&kernel(DType::F32, 0, body), 3 * 4, 5 * 4, &[], &[(0, 1)]);
    }

    #[test]
    fn a_write_at_a_symbolic_position_matches_the_jit() {
        // out[(i0 + s1) * 4 + i1] = in[i0 * 4 + i1] for i0 < s0 (a key/value cache's new rows),
        // 2-byte and 1-byte elements through the strided path too.
        for dtype in [DType::F32, DType::F16, DType::Bool] {
            let body = vec![looped(
                0,
                IExpr::Sym(0),
                true,
                vec![looped(
                    1,
                    c(4),
                    false,
                    vec![
                        load(0, dtype, add(mul(v(0), c(4)), v(1))),
                        store(add(mul(add(v(0), IExpr::Sym(1)), c(4)), v(1)), 0),
                    ],
                )],
            )];
            let s = dtype.size_bytes();
            same_as_jit(&kernel(dtype, 2, body), 3 * 4 * s, 8 * 4 * s, &[3, 2], &[(0, 3), (1, 2)]);
        }
        // A column of a row-major matrix into a row (strided source, contiguous destination),
        // four levels deep.
        let idx = add(add(add(mul(v(0), c(60)), mul(v(1), c(20))), mul(v(2), c(5))), v(3));
        let out = add(add(add(mul(v(3), c(24)), mul(v(0), c(12))), mul(v(1), c(4))), v(2));
        let body = vec![looped(
            0,
            c(2),
            true,
            vec![looped(
                1,
                c(3),
                false,
                vec![looped(
                    2,
                    c(4),
                    false,
                    vec![looped(3, c(5), false, vec![load(0, DType::F32, idx), store(out, 0)])],
                )],
            )],
        )];
        same_as_jit(&kernel(DType::F32, 0, body), 120 * 4, 120 * 4, &[], &[(0, 2), (1, 2)]);
    }

    #[test]
    fn a_head_split_of_rows_of_every_length_matches_the_jit() {
        // out[i0][i1][i2][i3] = in[i0][i2][i1][i3] (tokens x heads -> heads x tokens) for rows
        // of 1 to 40 floats: each fixed-size move, an inline short run and a `memmove`, under
        // an outer level walked by the odometer.
        for row in [1, 2, 3, 4, 8, 16, 20, 40] {
            let (b, h, t) = (3, 2, 5);
            let idx = add(add(add(mul(v(0), c(t * h * row)), mul(v(2), c(h * row))), mul(v(1), c(row))), v(3));
            let out = add(add(add(mul(v(0), c(h * t * row)), mul(v(1), c(t * row))), mul(v(2), c(row))), v(3));
            let body = vec![looped(
                0,
                c(b),
                true,
                vec![looped(
                    1,
                    c(h),
                    false,
                    vec![looped(
                        2,
                        c(t),
                        false,
                        vec![looped(3, c(row), false, vec![load(0, DType::F32, idx), store(out, 0)])],
                    )],
                )],
            )];
            let bytes = (b * h * t * row) as usize * 4;
            same_as_jit(&kernel(DType::F32, 0, body), bytes, bytes, &[], &[(0, 3), (1, 2), (2, 9)]);
        }
    }

    #[test]
    fn an_im2col_of_strided_windows_matches_the_jit() {
        // out[w][i0][i1] = in[i0 * 12 + i1 * 2 + w] for the three taps w of a stride-2 window
        // over rows of 12 (a convolution's im2col: one store per tap, each strided).
        let at = |w: i64| add(add(mul(v(0), c(12)), mul(v(1), c(2))), c(w));
        let mut inner = Vec::new();
        for w in 0..3 {
            inner.push(load(w as u32, DType::F32, at(w)));
            inner.push(store(add(add(mul(c(w), c(20)), mul(v(0), c(5))), v(1)), w as u32));
        }
        let body = vec![looped(0, c(4), true, vec![looped(1, c(5), false, inner)])];
        let k = kernel(DType::F32, 0, body);
        assert_eq!(CopyPlan::of(&k, TileLevel::Base).map(|p| p.pairs.len()), Some(3));
        same_as_jit(&k, 48 * 4, 60 * 4, &[], &[(0, 4), (1, 3), (3, 9)]);
        // Two stores into overlapping elements (out[i] and out[i + 1]): the later iteration's
        // store stays, as in the JIT's order.
        let body = vec![looped(
            0,
            c(6),
            true,
            vec![
                load(0, DType::F32, v(0)),
                store(v(0), 0),
                load(1, DType::F32, add(v(0), c(7))),
                store(add(v(0), c(1)), 1),
            ],
        )];
        same_as_jit(&kernel(DType::F32, 0, body), 13 * 4, 7 * 4, &[], &[(0, 6), (2, 5)]);
    }

    #[test]
    fn an_im2col_of_short_rows_moved_in_vectors_matches_the_jit_and_stays_native() {
        // A 3x3 window's nine taps over batch 2, three output rows of `ow` (past one vector and
        // not a multiple of 16), stride 1 and 2: each tap's rows contiguous in the output, read
        // contiguously or every other element (`move_words_avx512`).
        for (stride, ow) in [(1i64, 26i64), (2, 16), (2, 13), (1, 33), (2, 33)] {
            let (oh, iw) = (3, stride * 33 + 2);
            let ih = stride * oh + 2;
            let mut inner = Vec::new();
            for t in 0..9 {
                let (dy, dx) = (t / 3, t % 3);
                let row = add(mul(v(1), c(stride)), c(dy));
                let at = add(add(mul(v(0), c(ih * iw)), mul(row, c(iw))), add(mul(v(2), c(stride)), c(dx)));
                inner.push(load(t as u32, DType::F32, at));
                let to = add(add(c(t * 2 * oh * ow), mul(v(0), c(oh * ow))), add(mul(v(1), c(ow)), v(2)));
                inner.push(store(to, t as u32));
            }
            let body = vec![looped(0, c(2), true, vec![looped(1, c(oh), false, vec![looped(2, c(ow), false, inner)])])];
            let k = kernel(DType::F32, 0, body);
            assert!(CopyPlan::of(&k, TileLevel::Avx512).is_some_and(|p| p.stays()), "stride {stride}, {ow}");
            assert!(!plan(&k).is_some_and(|p| p.stays()), "the baseline plan tiers up");
            let (in_bytes, out_bytes) = ((2 * ih * iw * 4) as usize, (9 * 2 * oh * ow * 4) as usize);
            same_as_jit(&k, in_bytes, out_bytes, &[], &[(0, 2), (1, 2)]);
        }
    }

    #[test]
    fn an_im2col_with_each_channels_taps_side_by_side_matches_the_jit_and_stays_native() {
        // MobileNet's stem: out[c][tap][b][y][x] = in[b][c][2 y + dy][2 x + dx] over a symbolic
        // batch `s0`, the copies' spans interleaved (tap inside channel) though they never meet.
        let (oh, ow, ih, iw) = (3i64, 16i64, 8i64, 34i64);
        let s0 = || IExpr::Sym(0);
        let mut inner = Vec::new();
        for t in 0..9 {
            let (dy, dx) = (t / 3, t % 3);
            let row = add(mul(v(2), c(2)), c(dy));
            let at = add(
                add(add(mul(v(1), c(2 * ih * iw)), mul(v(0), c(ih * iw))), mul(row, c(iw))),
                add(mul(v(3), c(2)), c(dx)),
            );
            inner.push(load(t as u32, DType::F32, at));
            let plane = mul(s0(), c(oh * ow));
            let to = add(
                add(mul(v(0), mul(s0(), c(9 * oh * ow))), mul(plane, c(t))),
                add(mul(v(1), c(oh * ow)), add(mul(v(2), c(ow)), v(3))),
            );
            inner.push(store(to, t as u32));
        }
        let nest = looped(1, s0(), false, vec![looped(2, c(oh), false, vec![looped(3, c(ow), false, inner)])]);
        let k = kernel(DType::F32, 1, vec![looped(0, c(2), true, vec![nest])]);
        assert!(CopyPlan::of(&k, TileLevel::Avx512).is_some_and(|p| p.stays()));
        for batch in [1i64, 3] {
            let (in_bytes, out_bytes) = ((batch * 2 * ih * iw * 4) as usize, (2 * 9 * batch * oh * ow * 4) as usize);
            same_as_jit(&k, in_bytes, out_bytes, &[batch], &[(0, 2), (1, 2)]);
        }
    }

    #[test]
    fn a_distance_is_reached_by_the_nests_steps_only_where_some_iterations_cover_it() {
        // The stem's store steps (elements): channel 9216, batch 256, row 16, column 1; taps
        // 1,024 apart never meet, one batch entry apart (256) or a row and a column do.
        let stem = [(9216, 3), (256, 4), (16, 16), (1, 16)];
        let reached = |d: i64| reaches(d, &stem, &mut 4096);
        for taps in 1..9 {
            assert_eq!(reached(1024 * taps), Some(false), "{taps} taps apart");
        }
        assert_eq!(reached(256), Some(true));
        assert_eq!(reached(17), Some(true));
        assert_eq!(reached(-9216 - 3), Some(true));
        assert_eq!(reached(3 * 9216), Some(false), "past the channels");
        // Steps that overlap: rows of 8 stepping 8 reach every distance below 32.
        assert_eq!(reaches(13, &[(8, 4), (1, 8)], &mut 4096), Some(true));
        assert_eq!(reaches(32, &[(8, 4), (1, 8)], &mut 4096), Some(false));
        // A search that branches past its budget says it cannot tell.
        assert_eq!(reaches(1001, &[(2, 1000), (2, 1000), (2, 1000)], &mut 16), None);
    }

    #[test]
    fn copies_that_overlap_across_iterations_store_in_the_kernels_order() {
        // out[8 i + j] = in[8 i + j] and out[8 i + 8 + j] = in[100 + 8 i + j]: apart within an
        // iteration, but the first copy at i + 1 stores where the second stored at i, so the
        // first's later store must win, as in the JIT's order (not copy after copy).
        let inner = vec![
            load(0, DType::F32, add(mul(v(0), c(8)), v(1))),
            store(add(mul(v(0), c(8)), v(1)), 0),
            load(1, DType::F32, add(add(mul(v(0), c(8)), v(1)), c(100))),
            store(add(add(mul(v(0), c(8)), v(1)), c(8)), 1),
        ];
        let body = vec![looped(0, c(4), true, vec![looped(1, c(8), false, inner)])];
        same_as_jit(&kernel(DType::F32, 0, body), 132 * 4, 40 * 4, &[], &[(0, 4), (1, 3)]);
    }

    #[test]
    fn a_zero_padded_border_matches_the_jit() {
        // out[i0][i1] = in[(i0 - 1) * s0 + i1 - 1] inside a border of one (`0 < i < n - 1`),
        // else 0.0: an image of s0 x s0 padded to (s0 + 2) x (s0 + 2), over any range of rows.
        let lt = |a: IExpr, b: IExpr| IExpr::Lt(Box::new(a), Box::new(b));
        let and = |a: IExpr, b: IExpr| IExpr::And(Box::new(a), Box::new(b));
        let s0 = IExpr::Sym(0);
        let side = add(s0.clone(), c(2));
        let inside = |i: u32| and(lt(c(0), v(i)), lt(v(i), add(s0.clone(), c(1))));
        let index = add(add(mul(v(0), s0.clone()), v(1)), mul(add(s0.clone(), c(1)), c(-1)));
        let padded = Stmt::Let {
            reg: Reg(0),
            dtype: DType::F32,
            inst: Inst::Load { buf: 1, index, mask: Some(and(inside(0), inside(1))), other: air::Scalar::Float(0.0) },
        };
        let body = vec![looped(
            0,
            side.clone(),
            true,
            vec![looped(1, side.clone(), false, vec![padded, store(add(mul(v(0), side), v(1)), 0)])],
        )];
        let k = kernel(DType::F32, 1, body);
        assert!(CopyPlan::of(&k, TileLevel::Base).is_some());
        same_as_jit(&k, 9 * 4, 25 * 4, &[3], &[(0, 5), (1, 4), (2, 3), (4, 7)]);
        // One level, the mask on the parallel loop's own variable: a range starting past 0.
        let row = Stmt::Let {
            reg: Reg(0),
            dtype: DType::F32,
            inst: Inst::Load {
                buf: 1,
                index: add(v(0), c(-2)),
                mask: Some(and(lt(c(1), v(0)), lt(v(0), c(6)))),
                other: air::Scalar::Float(0.0),
            },
        };
        let k = kernel(DType::F32, 0, vec![looped(0, c(9), true, vec![row, store(v(0), 0)])]);
        same_as_jit(&k, 4 * 4, 9 * 4, &[], &[(0, 9), (3, 9), (4, 5), (7, 9)]);
    }

    #[test]
    fn known_affine_indices_decompose_as_the_general_path_does() {
        let vars = [Var(0), Var(1), Var(2)];
        // (i0 * 5184 + i1 * 324 + i2 * 36 + 37), constants on either side of a product, a
        // product of products, a negative coefficient.
        let cases = [
            add(add(add(mul(v(0), c(5184)), mul(v(1), c(324))), mul(v(2), c(36))), c(37)),
            mul(c(3), add(mul(add(v(2), c(1)), c(4)), v(0))),
            add(mul(mul(c(2), v(1)), c(-7)), c(-1)),
            c(42),
        ];
        for e in &cases {
            let (offset, coefs) = affine_known(e, &vars).expect("affine with known numbers");
            assert_eq!(offset, e.eval(&[0, 0, 0], &[]), "{e:?}");
            for (d, &var) in vars.iter().enumerate() {
                assert_eq!(Some(coefs[d]), e.linear_coeff(var).and_then(|k| k.as_const()), "{e:?} in {var:?}");
            }
        }
        // Not affine, a symbol, a variable of no level, a division: the general path's.
        for e in [mul(v(0), v(1)), add(v(0), IExpr::Sym(0)), v(5), IExpr::Div(Box::new(v(0)), Box::new(c(2)))] {
            assert!(affine_known(&e, &vars).is_none(), "{e:?}");
        }
    }

    #[test]
    fn only_copy_nests_have_a_plan() {
        let copy = |inner: Vec<Stmt>| kernel(DType::F32, 0, vec![looped(0, c(4), true, inner)]);
        assert!(plan(&copy(vec![load(0, DType::F32, v(0)), store(v(0), 0)])).is_some());
        // A masked load (padding).
        let masked = Stmt::Let {
            reg: Reg(0),
            dtype: DType::F32,
            inst: Inst::Load { buf: 1, index: v(0), mask: Some(v(0)), other: air::Scalar::Float(0.0) },
        };
        assert!(plan(&copy(vec![masked, store(v(0), 0)])).is_none());
        // A mask that is not ranges of loop variables: a product of one, a comparison of two.
        let masked_by = |mask: IExpr| Stmt::Let {
            reg: Reg(0),
            dtype: DType::F32,
            inst: Inst::Load { buf: 1, index: v(0), mask: Some(mask), other: air::Scalar::Float(0.0) },
        };
        let lt = |a: IExpr, b: IExpr| IExpr::Lt(Box::new(a), Box::new(b));
        assert!(plan(&copy(vec![masked_by(lt(mul(v(0), c(2)), c(5))), store(v(0), 0)])).is_none());
        assert!(plan(&copy(vec![masked_by(lt(v(0), v(0))), store(v(0), 0)])).is_none());
        assert!(plan(&copy(vec![masked_by(lt(c(0), v(0))), store(v(0), 0)])).is_some());
        // A padded border's `other` that is not zero.
        let ones = Stmt::Let {
            reg: Reg(0),
            dtype: DType::F32,
            inst: Inst::Load { buf: 1, index: v(0), mask: Some(lt(c(0), v(0))), other: air::Scalar::Float(1.0) },
        };
        assert!(plan(&copy(vec![ones, store(v(0), 0)])).is_none());
        // A computed value, a division in an index, a product of variables; a load nothing
        // stores is left out.
        let twice = Stmt::Let { reg: Reg(1), dtype: DType::F32, inst: Inst::Binary(BinaryOp::Add, Reg(0), Reg(0)) };
        assert!(plan(&copy(vec![load(0, DType::F32, v(0)), twice, store(v(0), 1)])).is_none());
        assert!(plan(&copy(vec![load(0, DType::F32, v(0)), load(1, DType::F32, v(0)), store(v(0), 1)])).is_some());
        let div = IExpr::Div(Box::new(v(0)), Box::new(c(2)));
        assert!(plan(&copy(vec![load(0, DType::F32, div), store(v(0), 0)])).is_none());
        let square = mul(v(0), v(0));
        assert!(plan(&copy(vec![load(0, DType::F32, v(0)), store(square, 0)])).is_none());
        // Reading and writing one parameter; the store's value not the load's.
        let mut same = copy(vec![load(0, DType::F32, v(0)), store(v(0), 0)]);
        if let Stmt::Loop { body, .. } = &mut same.body[0]
            && let Stmt::Let { inst: Inst::Load { buf, .. }, .. } = &mut body[0]
        {
            *buf = 0;
        }
        assert!(plan(&same).is_none());
        assert!(plan(&copy(vec![load(0, DType::F32, v(0)), store(v(0), 3)])).is_none());
        // A symbol the kernel does not declare, a variable no loop defines (left to the
        // emitter, which reports them).
        assert!(plan(&copy(vec![load(0, DType::F32, IExpr::Sym(0)), store(v(0), 0)])).is_none());
        assert!(plan(&copy(vec![load(0, DType::F32, v(7)), store(v(0), 0)])).is_none());
    }
}
