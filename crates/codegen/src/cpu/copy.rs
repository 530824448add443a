//! Copy kernels run by a native routine instead of JIT-ed code: a loop nest whose only work is
//! one unmasked load stored unchanged (a transpose, a broadcast, a slice, a key/value cache
//! write, a concatenation's piece), with every index affine in the loop variables.
//!
//! Why: a program is full of them (the cached GPT forward launches 16 of its 62 steps at depth
//! 2 as copies; an RNN imported from ONNX has 10-20 of its 24-33 kernels), each cost a Cranelift
//! compile (the quick
//! tier's code then ran index-heavy nests at 5-10x the optimised tier's time: a cache write of
//! 1,920 floats took 5 us on a first run against 0.5), and the nest needs no code of its own: its
//! extents, strides and offsets are a few numbers per call, and its innermost run is a `memmove`
//! where both sides are contiguous. [`CopyPlan::of`] recognises the nest; [`CopyPlan::run`]
//! evaluates it for the call's symbols and copies, with the JIT's calling convention (the
//! arguments' pointers, the symbols, and the `[start, end)` range of a parallel outer loop).
//! It is the copy's quick tier: the tiered JIT swaps optimised code in once the program runs
//! again, which runs short rows (a head split's eight floats) without a call per row.

use lower::kir::{IExpr, Inst, LoopKernel, Stmt, Var};

/// The most loop levels a copy nest may have (a view of rank 8 or less is the norm).
const MAX_DEPTH: usize = 8;

/// Loop variables at 0: a plan's variables are numbered below its length (kernels number theirs
/// from 0; a nest past it gets no plan).
static ZEROS: [i64; 64] = [0; 64];

/// A number of the plan: known when the kernel is compiled, or an expression of the symbols (and
/// of loop variables at 0) evaluated per call. Most are constants: a call then evaluates little
/// (a decoding step's copies are a few hundred elements each).
#[derive(Debug)]
enum Num {
    Known(i64),
    PerCall(IExpr),
}

impl Num {
    /// `e` with every loop variable at 0 (`vars` zeros), folded where it reads no symbol.
    fn of(e: &IExpr, vars: &[i64]) -> Num {
        let mut syms = Vec::new();
        e.symbols(&mut syms);
        if syms.is_empty() { Num::Known(e.eval(vars, &[])) } else { Num::PerCall(e.clone()) }
    }

    #[inline]
    fn eval(&self, vars: &[i64], syms: &[i64]) -> i64 {
        match self {
            Num::Known(v) => *v,
            Num::PerCall(e) => e.eval(vars, syms),
        }
    }
}

/// One side of a copy: element `(i0, i1, ...)` is at `offset + sum(coefs[d] * i_d)` of parameter
/// `param`.
#[derive(Debug)]
struct Side {
    param: usize,
    /// The index with every loop variable 0: the element of the first iteration.
    offset: Num,
    /// Per loop level, outermost first: how far one step of its variable moves the index.
    coefs: Vec<Num>,
}

/// A copy nest, recognised from a loop kernel (see the module docs).
#[derive(Debug)]
pub(crate) struct CopyPlan {
    /// Loop extents, outermost first (symbols and constants only).
    extents: Vec<Num>,
    /// Whether the outermost loop is the kernel's parallel loop, which `[start, end)` ranges.
    parallel: bool,
    /// Bytes per element (the two sides' dtype is the same).
    size: usize,
    src: Side,
    dst: Side,
    /// One past the largest loop variable number (the length of `eval`'s `vars`, at most
    /// `ZEROS.len()`).
    n_vars: usize,
    /// Symbols the expressions read (`LoopKernel::n_syms`).
    n_syms: usize,
}

impl CopyPlan {
    /// The plan of `k` when its whole body is one copy nest: nested loops (at most
    /// [`MAX_DEPTH`], the outermost possibly parallel, each extent free of loop variables), one
    /// unmasked `load` of one parameter at any level and one `store` of that value into another
    /// parameter of the same dtype in the innermost loop, both indices affine in the loop
    /// variables with coefficients free of them.
    pub(crate) fn of(k: &LoopKernel) -> Option<CopyPlan> {
        let mut extents = Vec::new();
        let mut vars = Vec::new();
        let mut load = None;
        let mut store = None;
        let mut level = k.body.as_slice();
        loop {
            let mut inner = None;
            for s in level {
                match s {
                    Stmt::Loop { var, extent, parallel: p, body } if inner.is_none() => {
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
                    Stmt::Let { reg, dtype, inst: Inst::Load { buf, index, mask: None, .. } } if load.is_none() => {
                        load = Some((*reg, *dtype, *buf, index));
                    }
                    Stmt::Store { buf, index, value } if store.is_none() && inner.is_none() => {
                        store = Some((*buf, index, *value));
                    }
                    _ => return None,
                }
            }
            match inner {
                // A store must be the innermost level's; nothing may follow a nested loop.
                Some(body) if store.is_none() && matches!(level.last(), Some(Stmt::Loop { .. })) => level = body,
                Some(_) => return None,
                None => break,
            }
        }
        // As the JIT reads a kernel: `[start, end)` ranges the outer loop only when the body is
        // that one parallel loop (a load hoisted above it makes the launch one call of it all).
        let parallel = matches!(k.body.as_slice(), [Stmt::Loop { parallel: true, .. }]);
        let ((reg, dtype, src_buf, src_index), (dst_buf, dst_index, value)) = (load?, store?);
        let (src_param, dst_param) = (k.params.get(src_buf as usize)?, k.params.get(dst_buf as usize)?);
        if value != reg || src_buf == dst_buf || src_param.dtype != dtype || dst_param.dtype != dtype {
            return None;
        }
        if extents.is_empty() || extents.iter().any(IExpr::reads_vars) {
            return None;
        }
        // As the emitter checks: every symbol is one the kernel declares, every variable a loop's.
        let n_syms = k.n_syms as usize;
        if !extents.iter().chain([src_index, dst_index]).all(|e| leaves_ok(e, &vars, n_syms)) {
            return None;
        }
        let n_vars = vars.iter().map(|v| v.0 as usize + 1).max().unwrap_or(0);
        if n_vars > ZEROS.len() {
            return None;
        }
        let zeros = &ZEROS[..n_vars];
        let side = |param: u32, index: &IExpr| -> Option<Side> {
            let coefs: Vec<IExpr> = vars.iter().map(|&v| index.linear_coeff(v)).collect::<Option<_>>()?;
            if coefs.iter().any(IExpr::reads_vars) {
                return None;
            }
            let coefs = coefs.iter().map(|e| Num::of(e, zeros)).collect();
            Some(Side { param: param as usize, offset: Num::of(index, zeros), coefs })
        };
        let (src, dst) = (side(src_buf, src_index)?, side(dst_buf, dst_index)?);
        let extents = extents.iter().map(|e| Num::of(e, zeros)).collect();
        Some(CopyPlan { extents, parallel, size: dtype.size_bytes(), src, dst, n_vars, n_syms })
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
        let mut src_step = [0isize; MAX_DEPTH];
        let mut dst_step = [0isize; MAX_DEPTH];
        let size = self.size as isize;
        for d in 0..depth {
            extent[d] = self.extents[d].eval(vars, syms).max(0);
            src_step[d] = (self.src.coefs[d].eval(vars, syms) as isize).wrapping_mul(size);
            dst_step[d] = (self.dst.coefs[d].eval(vars, syms) as isize).wrapping_mul(size);
        }
        let (mut first, mut last) = (0, extent[0]);
        if self.parallel {
            (first, last) = (start.max(0), end.min(extent[0]));
        }
        if first >= last || extent[1..depth].contains(&0) {
            return;
        }
        // SAFETY: the caller passes one pointer per parameter.
        let (src_base, dst_base) = unsafe { (*bufs.add(self.src.param), *bufs.add(self.dst.param)) };
        let at_first = |side: &Side, step: isize| {
            (side.offset.eval(vars, syms) as isize).wrapping_mul(size).wrapping_add((first as isize).wrapping_mul(step))
        };
        let (src0, dst0) = (at_first(&self.src, src_step[0]), at_first(&self.dst, dst_step[0]));
        extent[0] = last - first;
        let inner = depth - 1;
        let n = extent[inner] as usize;
        let contiguous = src_step[inner] == size && dst_step[inner] == size;
        // An odometer over every level but the innermost, which is one run.
        let mut at = [0i64; MAX_DEPTH];
        let (mut src, mut dst) = (src0, dst0);
        loop {
            // SAFETY: `src + j * src_step[inner]` and `dst + j * dst_step[inner]` for `j < n` are
            // elements of this iteration, inside their buffers (the caller's contract).
            unsafe {
                let (s, t) = (src_base.wrapping_offset(src), dst_base.wrapping_offset(dst));
                if contiguous {
                    let bytes = n * self.size;
                    if bytes <= SHORT_RUN {
                        copy_short(s, t, bytes);
                    } else {
                        std::ptr::copy(s, t, bytes);
                    }
                } else {
                    run(s, src_step[inner], t, dst_step[inner], n, self.size);
                }
            }
            let mut d = inner;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                at[d] += 1;
                src = src.wrapping_add(src_step[d]);
                dst = dst.wrapping_add(dst_step[d]);
                if at[d] < extent[d] {
                    break;
                }
                src = src.wrapping_sub(src_step[d].wrapping_mul(extent[d] as isize));
                dst = dst.wrapping_sub(dst_step[d].wrapping_mul(extent[d] as isize));
                at[d] = 0;
            }
        }
    }
}

/// Whether every leaf of `e` is a constant, one of `vars` or a symbol below `n_syms`.
fn leaves_ok(e: &IExpr, vars: &[Var], n_syms: usize) -> bool {
    e.all_leaves(&|l| match l {
        IExpr::Var(v) => vars.contains(v),
        IExpr::Sym(s) => (*s as usize) < n_syms,
        _ => true,
    })
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
    fn only_copy_nests_have_a_plan() {
        let copy = |inner: Vec<Stmt>| kernel(DType::F32, 0, vec![looped(0, c(4), true, inner)]);
        assert!(CopyPlan::of(&copy(vec![load(0, DType::F32, v(0)), store(v(0), 0)])).is_some());
        // A masked load (padding).
        let masked = Stmt::Let {
            reg: Reg(0),
            dtype: DType::F32,
            inst: Inst::Load { buf: 1, index: v(0), mask: Some(v(0)), other: air::Scalar::Float(0.0) },
        };
        assert!(CopyPlan::of(&copy(vec![masked, store(v(0), 0)])).is_none());
        // A computed value, two loads, a division in an index, a product of variables.
        let twice = Stmt::Let { reg: Reg(1), dtype: DType::F32, inst: Inst::Binary(BinaryOp::Add, Reg(0), Reg(0)) };
        assert!(CopyPlan::of(&copy(vec![load(0, DType::F32, v(0)), twice, store(v(0), 1)])).is_none());
        assert!(
            CopyPlan::of(&copy(vec![load(0, DType::F32, v(0)), load(1, DType::F32, v(0)), store(v(0), 1)])).is_none()
        );
        let div = IExpr::Div(Box::new(v(0)), Box::new(c(2)));
        assert!(CopyPlan::of(&copy(vec![load(0, DType::F32, div), store(v(0), 0)])).is_none());
        let square = mul(v(0), v(0));
        assert!(CopyPlan::of(&copy(vec![load(0, DType::F32, v(0)), store(square, 0)])).is_none());
        // Reading and writing one parameter; the store's value not the load's.
        let mut same = copy(vec![load(0, DType::F32, v(0)), store(v(0), 0)]);
        if let Stmt::Loop { body, .. } = &mut same.body[0]
            && let Stmt::Let { inst: Inst::Load { buf, .. }, .. } = &mut body[0]
        {
            *buf = 0;
        }
        assert!(CopyPlan::of(&same).is_none());
        assert!(CopyPlan::of(&copy(vec![load(0, DType::F32, v(0)), store(v(0), 3)])).is_none());
        // A symbol the kernel does not declare, a variable no loop defines (left to the
        // emitter, which reports them).
        assert!(CopyPlan::of(&copy(vec![load(0, DType::F32, IExpr::Sym(0)), store(v(0), 0)])).is_none());
        assert!(CopyPlan::of(&copy(vec![load(0, DType::F32, v(7)), store(v(0), 0)])).is_none());
    }
}
