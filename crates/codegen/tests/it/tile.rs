//! The tiled path (inner loops run as calls to full-width AOT routines over tiles): random
//! element-wise trees, tiled at each routine level (AVX2 + FMA where the host has it, and the
//! forced baseline fallback) and at lengths that cross tile boundaries, against the evaluator
//! bit for bit for correctly rounded ops, and against the JIT-only path bit for bit for
//! `exp2`/`log2` (same operations, both with FMA).

use crate::common;

use air::{BinaryOp, DType, Scalar, UnaryOp};
use common::*;
use kiln_codegen::{CpuCompiler, TileLevel, TileMode, Tiling};
use lower::kir::{Access, IExpr, Inst, LoopKernel, Stmt};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Expr {
    /// `in_b[i]`: a contiguous load.
    Input(u32),
    /// `in_b[0]`: a broadcast load (uniform).
    Broadcast(u32),
    /// In a rows kernel, `in_b[r * row_stride_b]`: one value per row, loaded before the row's
    /// inner loop (a softmax's row maximum).
    Row(u32),
    Const(f32),
    Unary(UnaryOp, Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
}

fn tree(unary: Vec<UnaryOp>) -> impl Strategy<Value = Expr> {
    tree_with(unary, 0)
}

/// [`tree`], with per-row leaves ([`Expr::Row`]) weighted `row` (0: none).
fn tree_with(unary: Vec<UnaryOp>, row: u32) -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        4 => (0u32..3).prop_map(Expr::Input),
        1 => (0u32..3).prop_map(Expr::Broadcast),
        row => (0u32..3).prop_map(Expr::Row),
        1 => prop_oneof![Just(0.0f32), Just(1.0), Just(-2.5), Just(0.1), Just(f32::INFINITY)].prop_map(Expr::Const),
    ];
    leaf.prop_recursive(5, 32, 2, move |inner| {
        let un = proptest::sample::select(unary.clone());
        let bin = prop_oneof![
            Just(BinaryOp::Add),
            Just(BinaryOp::Sub),
            Just(BinaryOp::Mul),
            Just(BinaryOp::Div),
            Just(BinaryOp::Max),
            Just(BinaryOp::Min),
        ];
        prop_oneof![
            (un, inner.clone()).prop_map(|(op, a)| Expr::Unary(op, Box::new(a))),
            (bin, inner.clone(), inner).prop_map(|(op, a, b)| Expr::Binary(op, Box::new(a), Box::new(b))),
        ]
    })
}

/// `e` as statements, its inputs `in_b[index(b)]`.
fn lower_expr(e: &Expr, out: &mut Vec<Stmt>, next: &mut u32, index: &dyn Fn(u32) -> IExpr) -> u32 {
    let mut fresh = |out: &mut Vec<Stmt>, inst: Inst| {
        let r = *next;
        *next += 1;
        out.push(let_(r, DType::F32, inst));
        r
    };
    match e {
        Expr::Input(b) => fresh(out, Inst::Load { buf: *b, index: index(*b), mask: None, other: Scalar::Int(0) }),
        Expr::Broadcast(b) => fresh(out, Inst::Load { buf: *b, index: c(0), mask: None, other: Scalar::Int(0) }),
        // Defined before the loop by `rows_kernel`.
        Expr::Row(b) => ROW_REG + b,
        Expr::Const(x) => fresh(out, Inst::Const(Scalar::Float(*x as f64))),
        Expr::Unary(op, a) => {
            let a = lower_expr(a, out, next, index);
            let r = *next;
            *next += 1;
            out.push(let_(r, DType::F32, Inst::Unary(*op, common::r(a))));
            r
        }
        Expr::Binary(op, a, b) => {
            let a = lower_expr(a, out, next, index);
            let b = lower_expr(b, out, next, index);
            let r = *next;
            *next += 1;
            out.push(let_(r, DType::F32, Inst::Binary(*op, common::r(a), common::r(b))));
            r
        }
    }
}

/// `out[i] = e` and, when `twice`, `out2[i] = e` as well (a second store of one register).
fn kernel(e: &Expr, twice: bool) -> LoopKernel {
    let mut body = Vec::new();
    let mut next = 0;
    let out = lower_expr(e, &mut body, &mut next, &|_| i(0));
    body.push(store(3, i(0), out));
    if twice {
        body.push(store(4, i(0), out));
    }
    LoopKernel { params: three_in_two_out(), n_syms: 1, body: vec![for_(0, lower::kir::IExpr::Sym(0), true, body)] }
}

/// Three f32 inputs, then two f32 outputs: the parameters of the test kernels.
fn three_in_two_out() -> Vec<lower::kir::Param> {
    let d = DType::F32;
    vec![p(d, Access::Read), p(d, Access::Read), p(d, Access::Read), p(d, Access::Write), p(d, Access::Write)]
}

fn compiler(mode: TileMode, level: TileLevel) -> CpuCompiler {
    let c = CpuCompiler::new().expect("host ISA");
    c.set_tiling(Tiling { mode, level });
    c
}

/// The two ways a tiled kernel runs at `level`: natively (its quick tier, `native.rs`), then as
/// JIT-ed code that calls the routines (native tiles off).
fn both_ways(mode: TileMode, level: TileLevel) -> [CpuCompiler; 2] {
    let jit = compiler(mode, level);
    jit.set_native_tiles(false);
    [compiler(mode, level), jit]
}

fn inputs(n: usize, seed: u64) -> Vec<Buf> {
    (0..3)
        .map(|j| Buf::from_vals(DType::F32, &sample(DType::F32, n, seed + j)))
        .chain([Buf::zeros(DType::F32, n), Buf::zeros(DType::F32, n)])
        .collect()
}

/// Runs `k` with `c` in two calls split at `split` (the runtime's thread split).
fn run_split(c: &CpuCompiler, k: &LoopKernel, bufs: &mut [Buf], n: usize, split: usize) {
    let split = split.min(n) as i64;
    jit_with(c, k, bufs, &[n as i64], 0, split);
    jit_with(c, k, bufs, &[n as i64], split, n as i64);
}

fn exact_case(e: &Expr, n: usize, seed: u64, split: usize, twice: bool) {
    let k = kernel(e, twice);
    let mut want = inputs(n, seed);
    eval(&k, &mut want, &[n as i64], 0, n as i64);
    for level in [TileLevel::Avx512, TileLevel::Avx2Fma, TileLevel::Base] {
        for c in both_ways(TileMode::Always, level) {
            let mut got = inputs(n, seed);
            run_split(&c, &k, &mut got, n, split);
            let what = format!("{e:?} at {:?}", c.tiling().level);
            assert_bufs_close(&got[3], &want[3], 0.0, &what);
            assert_bufs_close(&got[4], &want[4], 0.0, &what);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn tiled_exact_trees_match_the_evaluator(
        e in tree(vec![UnaryOp::Neg, UnaryOp::Sqrt, UnaryOp::Recip]),
        n in 0usize..1300,
        seed in 0u64..1000,
        split in 0usize..1300,
        twice in any::<bool>(),
    ) {
        exact_case(&e, n, seed, split, twice);
    }

    #[test]
    fn tiled_exp2_log2_trees_match_the_jit_bit_for_bit(
        e in tree(vec![UnaryOp::Neg, UnaryOp::Recip, UnaryOp::Exp2, UnaryOp::Log2]),
        n in 0usize..1300,
        seed in 0u64..1000,
        split in 0usize..1300,
    ) {
        // Bit-for-bit needs both sides to fuse the same multiply-adds: the JIT uses FMA where
        // the host has it, and so does the AVX2 level; the baseline level does not (its accuracy
        // is checked by the sweeps in approx.rs).
        let k = kernel(&e, false);
        let mut want = inputs(n, seed);
        run_split(&compiler(TileMode::Off, TileLevel::Base), &k, &mut want, n, split);
        for level in [TileLevel::Avx512, TileLevel::Avx2Fma].into_iter().filter(|l| l.runs_here()) {
            for c in both_ways(TileMode::Always, level) {
                let mut got = inputs(n, seed);
                run_split(&c, &k, &mut got, n, split);
                assert_bufs_close(&got[3], &want[3], 0.0, &format!("{e:?} at {level:?}"));
            }
        }
    }
}

impl Expr {
    /// Whether the expression reads `Expr::Row(b)`.
    fn reads_row(&self, b: u32) -> bool {
        match self {
            Expr::Row(x) => *x == b,
            Expr::Input(_) | Expr::Broadcast(_) | Expr::Const(_) => false,
            Expr::Unary(_, a) => a.reads_row(b),
            Expr::Binary(_, x, y) => x.reads_row(b) || y.reads_row(b),
        }
    }
}

/// The register of `Expr::Row(b)`: `ROW_REG + b`.
const ROW_REG: u32 = 1000;

/// `out3[r*o0 + j] = e` (and `out4[r*o1 + j] = e` when `twice`) for rows `r < s0` of `width`
/// elements `j`, input `b` read at `in_b[r*strides[b] + j]`, a constant and the per-row values
/// `in_b[r * (strides[b] - 1)]` (`Expr::Row(b)`) before the row loop: the shape
/// `analysis::tile_rows_plan` tiles as whole rows.
fn rows_kernel(e: &Expr, width: i64, strides: [i64; 3], outs: [i64; 2], twice: bool) -> LoopKernel {
    let at = |stride: i64| IExpr::add(IExpr::mul(i(0), c(stride)), i(1));
    let mut inner = Vec::new();
    let mut next = 1;
    let out = lower_expr(e, &mut inner, &mut next, &|b| at(strides[b as usize]));
    inner.push(store(3, at(outs[0]), out));
    if twice {
        inner.push(store(4, at(outs[1]), out));
    }
    let d = DType::F32;
    let mut row = vec![let_(0, d, Inst::Const(Scalar::Float(0.5)))];
    for b in (0..3).filter(|&b| e.reads_row(b)) {
        let index = IExpr::mul(i(0), c(strides[b as usize] - 1));
        row.push(let_(ROW_REG + b, d, Inst::Load { buf: b, index, mask: None, other: Scalar::Int(0) }));
    }
    row.push(for_(1, c(width), false, inner));
    LoopKernel { params: three_in_two_out(), n_syms: 1, body: vec![for_(0, IExpr::Sym(0), true, row)] }
}

/// Buffers for `rows` rows of `rows_kernel` with the widest stride `span`.
fn rows_inputs(rows: usize, span: usize, seed: u64) -> Vec<Buf> {
    let n = rows * span;
    (0..3)
        .map(|j| Buf::from_vals(DType::F32, &sample(DType::F32, n, seed + j)))
        .chain([Buf::zeros(DType::F32, n), Buf::zeros(DType::F32, n)])
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Rows tiled whole (adjacent rows read and written in place, others gathered and
    /// scattered through scratch tiles, the last tile partial, the rows split between two
    /// calls) against the evaluator bit for bit (exact ops) and the JIT (exp2, log2); widths
    /// that do not divide a tile keep the JIT's loops and must agree too.
    #[test]
    fn rows_tiled_whole_match_the_evaluator_and_the_jit(
        exact in tree_with(vec![UnaryOp::Neg, UnaryOp::Sqrt, UnaryOp::Recip], 1),
        heavy in tree_with(vec![UnaryOp::Neg, UnaryOp::Recip, UnaryOp::Exp2, UnaryOp::Log2], 1),
        width in proptest::sample::select(vec![8i64, 16, 32, 48, 60]),
        pads in proptest::array::uniform3(0i64..3),
        outs in proptest::array::uniform2(0i64..2),
        rows in 0usize..70,
        split in 0usize..70,
        seed in 0u64..1000,
    ) {
        let strides = pads.map(|p| width + 5 * p);
        let outs = outs.map(|p| width + 3 * p);
        let span = (width + 10) as usize;
        let run = |c: &CpuCompiler, k: &LoopKernel| {
            let mut bufs = rows_inputs(rows, span, seed);
            let split = split.min(rows) as i64;
            jit_with(c, k, &mut bufs, &[rows as i64], 0, split);
            jit_with(c, k, &mut bufs, &[rows as i64], split, rows as i64);
            bufs
        };
        let k = rows_kernel(&exact, width, strides, outs, true);
        let mut want = rows_inputs(rows, span, seed);
        eval(&k, &mut want, &[rows as i64], 0, rows as i64);
        let k_heavy = rows_kernel(&heavy, width, strides, outs, false);
        let jit = run(&compiler(TileMode::Off, TileLevel::Base), &k_heavy);
        for level in [TileLevel::Avx512, TileLevel::Avx2Fma, TileLevel::Base] {
            for c in both_ways(TileMode::Always, level) {
                let got = run(&c, &k);
                let what =
                    format!("{exact:?} width {width} strides {strides:?} outs {outs:?} at {:?}", c.tiling().level);
                assert_bufs_close(&got[3], &want[3], 0.0, &what);
                assert_bufs_close(&got[4], &want[4], 0.0, &what);
                if level.runs_here() && level != TileLevel::Base {
                    let got = run(&c, &k_heavy);
                    assert_bufs_close(&got[3], &jit[3], 0.0, &format!("{heavy:?} width {width} at {level:?}"));
                }
            }
        }
    }
}

/// An LSTM-like gate (rows of 32, the input's rows 128 apart) runs as routine calls over whole
/// rows in `Auto` mode; rows of 60 (not dividing a tile) stay in the JIT's loops.
#[test]
fn short_rows_of_heavy_work_run_as_routine_calls() {
    let heavy = Expr::Unary(
        UnaryOp::Recip,
        Box::new(Expr::Binary(
            BinaryOp::Add,
            Box::new(Expr::Unary(UnaryOp::Exp2, Box::new(Expr::Input(0)))),
            Box::new(Expr::Const(1.0)),
        )),
    );
    let auto = Tiling { mode: TileMode::Auto, level: TileLevel::Avx512 };
    let calls = |width: i64| {
        let text =
            kiln_codegen::clif_text_with(&rows_kernel(&heavy, width, [128, 128, 128], [width, width], false), auto)
                .unwrap();
        routine_calls(&text)
    };
    // exp2, the addition and recip are one exp2-recip call, writing the output rows in place.
    assert_eq!(calls(32), 1, "rows of 32 call the routine");
    // The input's rows (128 apart) are gathered into the scratch tile by one call, not by
    // loads and stores unrolled in the kernel.
    let text = kiln_codegen::clif_text_with(&rows_kernel(&heavy, 32, [128, 128, 128], [32, 32], false), auto).unwrap();
    assert_eq!(text.matches(" call ").count(), 2, "a row copy and the routine:\n{text}");
    assert!(!text.contains("load.f32x4"), "no unrolled row copy:\n{text}");
    assert_eq!(calls(60), 0, "rows of 60 stay in the JIT");
    // Rows of cheap work (no exp2 or log2) stay in the JIT in `Auto` mode, and run as routine
    // calls where every eligible loop does.
    let cheap = Expr::Binary(BinaryOp::Add, Box::new(Expr::Input(0)), Box::new(Expr::Const(1.0)));
    let cheap_calls = |mode: TileMode| {
        let tiling = Tiling { mode, level: TileLevel::Avx512 };
        let text =
            kiln_codegen::clif_text_with(&rows_kernel(&cheap, 32, [128, 128, 128], [32, 32], false), tiling).unwrap();
        routine_calls(&text)
    };
    assert_eq!(cheap_calls(TileMode::Auto), 0, "cheap rows stay in the JIT");
    assert!(cheap_calls(TileMode::Always) > 0, "cheap rows are tiled when every loop may be");
}

/// A softmax's exponentials over rows of 16, `exp2((x - max_row) * log2 e)` with the row's
/// maximum loaded before the row loop, run as routine calls over whole rows in `Auto` mode (a
/// scratch tile filled with each row's maximum), where they were 128-bit JIT loops.
#[test]
fn rows_with_a_value_per_row_run_as_routine_calls() {
    let e = Expr::Unary(
        UnaryOp::Exp2,
        Box::new(Expr::Binary(
            BinaryOp::Mul,
            Box::new(Expr::Binary(BinaryOp::Sub, Box::new(Expr::Input(0)), Box::new(Expr::Row(1)))),
            Box::new(Expr::Const(std::f32::consts::LOG2_E)),
        )),
    );
    let k = rows_kernel(&e, 16, [16, 16, 16], [16, 16], false);
    let auto = Tiling { mode: TileMode::Auto, level: TileLevel::Avx512 };
    let text = kiln_codegen::clif_text_with(&k, auto).unwrap();
    assert!(routine_calls(&text) > 0, "rows of 16 with a per-row value call the routines");
    // And the values: the evaluator's, within the approximation (exp2 is not correctly rounded).
    let rows = 37;
    let mut want = rows_inputs(rows, 26, 7);
    eval(&k, &mut want, &[rows as i64], 0, rows as i64);
    let c = compiler(TileMode::Auto, TileLevel::Avx512);
    let mut got = rows_inputs(rows, 26, 7);
    jit_with(&c, &k, &mut got, &[rows as i64], 0, rows as i64);
    assert_bufs_close(&got[3], &want[3], 1e-6, "softmax rows");
}

/// A sigmoid, `1 / (1 + exp2(-x * log2 e))`, as the facade records it, 8 times over.
fn sigmoid_chain(links: usize) -> LoopKernel {
    let d = DType::F32;
    let mut body = vec![load(0, d, 0, i(0))];
    let mut x = 0;
    let mut next = 1;
    let mut push = |body: &mut Vec<Stmt>, inst: Inst| {
        body.push(let_(next, d, inst));
        next += 1;
        next - 1
    };
    for _ in 0..links {
        let neg = push(&mut body, Inst::Unary(UnaryOp::Neg, r(x)));
        let k = push(&mut body, Inst::Const(Scalar::Float(std::f64::consts::LOG2_E)));
        let m = push(&mut body, Inst::Binary(BinaryOp::Mul, r(neg), r(k)));
        let e = push(&mut body, Inst::Unary(UnaryOp::Exp2, r(m)));
        let one = push(&mut body, Inst::Const(Scalar::Float(1.0)));
        let s = push(&mut body, Inst::Binary(BinaryOp::Add, r(e), r(one)));
        x = push(&mut body, Inst::Unary(UnaryOp::Recip, r(s)));
    }
    body.push(store(1, i(0), x));
    LoopKernel {
        params: vec![p(d, Access::Read), p(d, Access::Write)],
        n_syms: 1,
        body: vec![for_(0, lower::kir::IExpr::Sym(0), true, body)],
    }
}

#[test]
fn sigmoid_chains_agree_at_every_level_and_length() {
    for links in [1, 8] {
        let k = sigmoid_chain(links);
        for n in [0usize, 1, 7, 8, 511, 512, 513, 2047, 5000] {
            let x: Vec<f32> = (0..n).map(|j| ((j % 97) as f32 - 48.0) / 16.0).collect();
            let run = |mode, level| {
                let mut bufs = vec![Buf::f32s(&x), Buf::zeros(DType::F32, n)];
                run_split(&compiler(mode, level), &k, &mut bufs, n, n / 3);
                bufs.swap_remove(1)
            };
            let jit = run(TileMode::Off, TileLevel::Base);
            let mut want = vec![Buf::f32s(&x), Buf::zeros(DType::F32, n)];
            eval(&k, &mut want, &[n as i64], 0, n as i64);
            // The approximations are within 1 ulp per step; a chain of 8 stays within 1e-5.
            assert_bufs_close(&jit, &want[1], 1e-5, "jit vs evaluator");
            let base = run(TileMode::Auto, TileLevel::Base);
            assert_bufs_close(&base, &want[1], 1e-5, "baseline tiles vs evaluator");
            for level in [TileLevel::Avx512, TileLevel::Avx2Fma].into_iter().filter(|l| l.runs_here()) {
                let tiled = run(TileMode::Auto, level);
                assert_bufs_close(&tiled, &jit, 0.0, &format!("{level:?} tiles vs jit"));
            }
        }
    }
}

#[test]
fn a_level_the_host_lacks_falls_back_to_the_best_it_has() {
    for level in [TileLevel::Avx512, TileLevel::Avx2Fma, TileLevel::Base] {
        let c = compiler(TileMode::Always, level);
        let want = if level.runs_here() { level } else { TileLevel::detect() };
        assert_eq!(c.tiling().level, want);
        assert_eq!(c.tiling().mode, TileMode::Always);
    }
}

#[test]
fn auto_tiles_loops_with_exp2_and_leaves_cheap_loops_to_the_jit() {
    let auto = Tiling { mode: TileMode::Auto, level: TileLevel::detect() };
    let calls = |k: &LoopKernel, t: Tiling| routine_calls(&kiln_codegen::clif_text_with(k, t).unwrap());
    // One sigmoid: neg, mul, exp2, add and recip are two routine calls per tile (the
    // multiplication, the exp2 and the addition are folded into one exp2-recip routine); the
    // load is read in place and the routine writes the output directly.
    assert_eq!(calls(&sigmoid_chain(1), auto), 2);
    // As the facade records it (a multiplication by `-log2 e` and a cap instead of the
    // negation), one; a tanh too (its trailing `* 2 - 1` folded after the recip).
    assert_eq!(calls(&facade_sigmoid(), auto), 1);
    assert_eq!(calls(&facade_tanh(), auto), 1);
    // The op code says which steps around the exp2-recip (6) run: with bit 8, the multiplication
    // and the cap; bit 9 the steps between (tanh's second multiplication); bit 10 those after.
    let code = |k: &LoopKernel| kiln_codegen::clif_text_with(k, auto).unwrap();
    assert!(code(&facade_sigmoid()).contains("iconst.i32 262"), "{}", code(&facade_sigmoid()));
    assert!(code(&facade_tanh()).contains("iconst.i32 1798"), "{}", code(&facade_tanh()));
    let neg = unary_kernel(UnaryOp::Neg, DType::F32, DType::F32, lower::kir::IExpr::Sym(0));
    assert_eq!(calls(&neg, auto), 0);
    assert_eq!(calls(&neg, Tiling { mode: TileMode::Always, level: TileLevel::Base }), 1);
    assert_eq!(calls(&sigmoid_chain(1), Tiling { mode: TileMode::Off, level: TileLevel::Base }), 0);
    // A loop known to run 12 times inside an outer loop stays in registers: two calls per 12
    // elements would cost more than the loop. Rows of 16 (dividing a tile) are tiled as whole
    // rows, two calls per 32 rows (`short_rows_of_heavy_work_run_as_routine_calls`).
    let short = |trips: i64| {
        let mut k = sigmoid_chain(1);
        let Stmt::Loop { body, .. } = k.body.remove(0) else { unreachable!() };
        k.body = vec![for_(1, lower::kir::IExpr::Sym(0), true, vec![for_(0, c(trips), false, body)])];
        k
    };
    assert_eq!(calls(&short(12), auto), 0);
    assert_eq!(calls(&short(12), Tiling { mode: TileMode::Always, level: TileLevel::Base }), 2);
    assert_eq!(calls(&short(16), auto), 2);
    assert_eq!(calls(&short(64), auto), 2);
}

/// A kernel over `x` whose body `build` writes, from the loaded register 0; stores its result.
fn kernel_of(build: impl FnOnce(&mut dyn FnMut(Inst) -> u32) -> u32) -> LoopKernel {
    let d = DType::F32;
    let mut body = vec![load(0, d, 0, i(0))];
    let mut next = 1;
    let out = build(&mut |inst| {
        body.push(let_(next, d, inst));
        next += 1;
        next - 1
    });
    body.push(store(1, i(0), out));
    LoopKernel {
        params: vec![p(d, Access::Read), p(d, Access::Write)],
        n_syms: 1,
        body: vec![for_(0, lower::kir::IExpr::Sym(0), true, body)],
    }
}

fn float(x: f64) -> Inst {
    Inst::Const(Scalar::Float(x))
}

/// The facade's sigmoid: `1 / (1 + exp2(min(x * -log2 e, 127)))`.
fn facade_sigmoid() -> LoopKernel {
    kernel_of(|push| {
        let k = push(float(-std::f64::consts::LOG2_E));
        let m = push(Inst::Binary(BinaryOp::Mul, r(0), r(k)));
        let cap = push(float(127.0));
        let t = push(Inst::Binary(BinaryOp::Min, r(m), r(cap)));
        let e = push(Inst::Unary(UnaryOp::Exp2, r(t)));
        let one = push(float(1.0));
        let s = push(Inst::Binary(BinaryOp::Add, r(e), r(one)));
        push(Inst::Unary(UnaryOp::Recip, r(s)))
    })
}

/// The facade's tanh: `2 / (1 + exp2(min(x * -2, 80) * log2 e)) - 1`.
fn facade_tanh() -> LoopKernel {
    kernel_of(|push| {
        let m2 = push(float(-2.0));
        let t = push(Inst::Binary(BinaryOp::Mul, r(0), r(m2)));
        let cap = push(float(80.0));
        let t = push(Inst::Binary(BinaryOp::Min, r(t), r(cap)));
        let l2e = push(float(std::f64::consts::LOG2_E));
        let t = push(Inst::Binary(BinaryOp::Mul, r(t), r(l2e)));
        let e = push(Inst::Unary(UnaryOp::Exp2, r(t)));
        let one = push(float(1.0));
        let s = push(Inst::Binary(BinaryOp::Add, r(e), r(one)));
        let q = push(Inst::Unary(UnaryOp::Recip, r(s)));
        let two = push(float(2.0));
        let q = push(Inst::Binary(BinaryOp::Mul, r(q), r(two)));
        push(Inst::Binary(BinaryOp::Sub, r(q), r(one)))
    })
}

#[test]
fn folded_sigmoid_and_tanh_match_the_jit_bit_for_bit() {
    for k in [facade_sigmoid(), facade_tanh()] {
        for n in [0usize, 1, 9, 513, 5000] {
            let x: Vec<f32> = (0..n).map(|j| ((j % 97) as f32 - 48.0) / 4.0).collect();
            let mut x = x;
            if n > 3 {
                x[1] = f32::NAN;
                x[2] = f32::INFINITY;
                x[3] = -200.0;
            }
            let run = |mode, level| {
                let mut bufs = vec![Buf::f32s(&x), Buf::zeros(DType::F32, n)];
                run_split(&compiler(mode, level), &k, &mut bufs, n, n / 3);
                bufs.swap_remove(1)
            };
            let jit = run(TileMode::Off, TileLevel::Base);
            for level in [TileLevel::Avx512, TileLevel::Avx2Fma].into_iter().filter(|l| l.runs_here()) {
                assert_bufs_close(&run(TileMode::Auto, level), &jit, 0.0, &format!("{level:?} tiles vs jit"));
            }
        }
    }
}

/// A causal mask as the cached attention computes it: per row `r` (outer, parallel), over
/// `j < n` (inner), `out[r*n + j] = exp2(where(f32(j + s2) < bound, x[r*n + j] * 0.5, other))`
/// with `bound = f32(r + s3) + 1` (uniform per row) and `other` a constant.
fn masked_exp2(other: f32) -> LoopKernel {
    let d = DType::F32;
    let row = i(1);
    let at = IExpr::add(IExpr::mul(row.clone(), IExpr::Sym(0)), i(0));
    let inner = vec![
        let_(3, d, Inst::Index(IExpr::add(i(0), IExpr::Sym(2)))),
        let_(4, DType::Bool, Inst::Binary(BinaryOp::CmpLt, r(3), r(2))),
        load(5, d, 0, at.clone()),
        let_(6, d, Inst::Binary(BinaryOp::Mul, r(5), r(0))),
        let_(7, d, Inst::Where(r(4), r(6), r(9))),
        let_(8, d, Inst::Unary(UnaryOp::Exp2, r(7))),
        store(3, at, 8),
    ];
    let outer = vec![
        let_(0, d, Inst::Const(Scalar::Float(0.5))),
        let_(9, d, Inst::Const(Scalar::Float(other as f64))),
        let_(1, d, Inst::Index(IExpr::add(row, IExpr::Sym(3)))),
        let_(10, d, Inst::Const(Scalar::Float(1.0))),
        let_(2, d, Inst::Binary(BinaryOp::Add, r(1), r(10))),
        for_(0, IExpr::Sym(0), false, inner),
    ];
    LoopKernel { params: three_in_two_out(), n_syms: 4, body: vec![for_(1, IExpr::Sym(1), true, outer)] }
}

#[test]
fn a_masked_where_of_the_loop_index_runs_as_one_routine_call_and_matches_the_jit() {
    let auto = Tiling { mode: TileMode::Auto, level: TileLevel::detect() };
    let clif = kiln_codegen::clif_text_with(&masked_exp2(f32::NEG_INFINITY), auto).unwrap();
    // The multiplication, the select and the exp2: three calls per tile, no index conversion
    // left in the loop.
    assert_eq!(routine_calls(&clif), 3, "{clif}");
    assert!(clif.contains(&format!("iconst.i32 {}", kiln_codegen_select_code())), "{clif}");
    // Row lengths across a tile (512), index offsets that cross 2^24 (where f32 stops being
    // exact and the routine converts from i64), bounds before, inside and past each row.
    for other in [f32::NEG_INFINITY, -3.0] {
        let k = masked_exp2(other);
        for (n, rows, s2, s3) in [
            (8usize, 3usize, 0i64, 2i64),
            (5, 4, 2, 0),
            (600, 2, 0, 300),
            (1030, 2, -40, 7),
            (64, 3, (1 << 24) - 40, (1 << 24) - 50),
            (40, 2, -(1 << 24) - 7, -(1 << 24) - 20),
        ] {
            let total = n * rows;
            let syms = [n as i64, rows as i64, s2, s3];
            let mut want = inputs(total, 5);
            jit_with(&compiler(TileMode::Off, TileLevel::Base), &k, &mut want, &syms, 0, rows as i64);
            let mut reference = inputs(total, 5);
            eval(&k, &mut reference, &syms, 0, rows as i64);
            for level in [TileLevel::Avx512, TileLevel::Avx2Fma, TileLevel::Base] {
                for mode in [TileMode::Auto, TileMode::Always] {
                    let c = compiler(mode, level);
                    let mut got = inputs(total, 5);
                    jit_with(&c, &k, &mut got, &syms, 0, rows as i64);
                    let what = format!("n {n} rows {rows} s2 {s2} s3 {s3} other {other} at {:?}", c.tiling());
                    // With FMA the routines compute the JIT's operations; the baseline
                    // evaluates exp2's polynomial in f64 (within its 1 ulp of the evaluator).
                    if c.tiling().level != TileLevel::Base {
                        assert_bufs_close(&got[3], &want[3], 0.0, &what);
                    }
                    assert_bufs_close(&got[3], &reference[3], 2.5e-7, &what);
                }
            }
        }
    }
}

/// `TileUnary::SelectBelow`'s op code, as the kernels pass it.
fn kiln_codegen_select_code() -> i32 {
    7
}

/// A loop of symbolic trip count inside an outer loop (an attention row over the positions a
/// cache holds so far): the tiles when it runs at least `TILE_MIN_TRIPS` (64) times, the vector
/// loop below that (a routine's call per op per row of 8 cost ~10x the loop). Both paths, at
/// widths on each side of the switch and with scalar remainders, agree with the JIT-only code
/// bit for bit and with the evaluator.
#[test]
fn symbolic_rows_pick_tiles_or_vectors_by_their_length() {
    // out[r * w + j] = sigmoid(x[r * w + j]) for r < s0, j < s1.
    let mut k = sigmoid_chain(1);
    let Stmt::Loop { body, .. } = k.body.remove(0) else { unreachable!() };
    let at = IExpr::add(IExpr::mul(i(1), IExpr::Sym(1)), i(0));
    let body: Vec<Stmt> = body
        .into_iter()
        .map(|s| match s {
            Stmt::Let { reg, dtype, inst: Inst::Load { buf, mask, other, .. } } => {
                Stmt::Let { reg, dtype, inst: Inst::Load { buf, index: at.clone(), mask, other } }
            }
            Stmt::Store { buf, value, .. } => Stmt::Store { buf, index: at.clone(), value },
            s => s,
        })
        .collect();
    k.n_syms = 2;
    k.body = vec![for_(1, IExpr::Sym(0), true, vec![for_(0, IExpr::Sym(1), false, body)])];
    let auto = compiler(TileMode::Auto, TileLevel::detect());
    let text = kiln_codegen::clif_text_with(&k, auto.tiling()).unwrap();
    if auto.tiling().level == TileLevel::Avx512 {
        assert!(text.contains(" call ") && text.contains("f32x4"), "both paths:\n{text}");
    }
    let off = compiler(TileMode::Off, TileLevel::Base);
    for width in [3usize, 8, 13, 63, 64, 100] {
        let rows = 5;
        let n = rows * width;
        let bufs = || vec![Buf::from_vals(DType::F32, &sample(DType::F32, n, width as u64)), Buf::zeros(DType::F32, n)];
        let syms = [rows as i64, width as i64];
        let (mut got, mut jit, mut want) = (bufs(), bufs(), bufs());
        jit_with(&auto, &k, &mut got, &syms, 0, rows as i64);
        jit_with(&off, &k, &mut jit, &syms, 0, rows as i64);
        eval(&k, &mut want, &syms, 0, rows as i64);
        assert_bufs_close(&got[1], &jit[1], 0.0, &format!("width {width} against the JIT-only code"));
        assert_bufs_close(&got[1], &want[1], 1e-6, &format!("width {width} against the evaluator"));
    }
}

/// Calls of the tile routines in a kernel's CLIF text (`(i32, i64, i64, i64, i64)`: an op code,
/// then pointers and a count), not of the row copies that gather and scatter strided rows
/// (six `i64`s).
fn routine_calls(clif: &str) -> usize {
    let sigs: Vec<&str> =
        clif.lines().filter_map(|l| l.trim().split_once(" = (i32, i64, i64, i64, i64)").map(|(sig, _)| sig)).collect();
    let routines: Vec<String> = clif
        .lines()
        .filter_map(|l| {
            let (name, def) = l.trim().split_once(" = ")?;
            (name.starts_with("fn") && sigs.iter().any(|s| def.ends_with(&format!(" {s}"))))
                .then(|| format!("call {name}("))
        })
        .collect();
    clif.lines().filter(|l| routines.iter().any(|r| l.contains(r.as_str()))).count()
}

/// The constant parameters of a tiled loop's routine calls are written once, before the loop,
/// one block per distinct set: a chain of sigmoids has two sets (its first link reads the
/// loaded value, the others a routine's result), not a block written before every call of
/// every tile.
#[test]
fn constant_routine_parameters_are_written_once_before_the_loop() {
    let t = Tiling { mode: TileMode::Auto, level: TileLevel::Avx512 };
    let clif = kiln_codegen::clif_text_with(&sigmoid_chain(8), t).unwrap();
    let lines: Vec<&str> = clif.lines().collect();
    let first_call = lines.iter().position(|l| l.contains(" call ")).expect("routine calls");
    let stores = |ls: &[&str]| ls.iter().filter(|l| l.trim_start().starts_with("store")).count();
    assert_eq!(routine_calls(&clif), 16, "{clif}");
    assert_eq!(stores(&lines[first_call..]), 0, "no store inside the loop:\n{clif}");
    assert_eq!(stores(&lines[..first_call]), 2 * 7, "two blocks of seven parameters:\n{clif}");
}

/// Tiled kernels run natively at the quick tier (routine calls with no code of their own until
/// the tier-up, `native.rs`) and compute what the JIT-ed tiles compute, bit for bit: flat tiles
/// of a folded sigmoid chain, flat tiles with uniform loads, constants and a uniform `exp2`
/// (computed once per tile by the routine), and rows tiled whole with strided inputs and
/// outputs and a value per row; every kernel over lengths that cross tiles, split between two
/// calls as the runtime's threads split it.
#[test]
fn tiled_kernels_run_natively_and_match_the_jit_ed_tiles() {
    let level = TileLevel::detect();
    if level == TileLevel::Base {
        // Only routines with FMA run natively (the JIT-ed scalar statements use FMA too).
        return;
    }
    let input = |b| Box::new(Expr::Input(b));
    let uniform_exp2 = Expr::Binary(
        BinaryOp::Mul,
        input(0),
        Box::new(Expr::Unary(
            UnaryOp::Exp2,
            Box::new(Expr::Binary(BinaryOp::Add, Box::new(Expr::Broadcast(1)), Box::new(Expr::Const(0.1)))),
        )),
    );
    let broadcasts =
        Expr::Unary(UnaryOp::Log2, Box::new(Expr::Binary(BinaryOp::Max, input(2), Box::new(Expr::Broadcast(0)))));
    // Steps folded around the exp2 with uniform registers for parameters, one negated (a
    // subtraction of a broadcast value).
    let around = Expr::Unary(
        UnaryOp::Exp2,
        Box::new(Expr::Binary(
            BinaryOp::Mul,
            Box::new(Expr::Binary(BinaryOp::Sub, input(0), Box::new(Expr::Broadcast(1)))),
            Box::new(Expr::Broadcast(2)),
        )),
    );
    let per_row = Expr::Unary(UnaryOp::Exp2, Box::new(Expr::Binary(BinaryOp::Sub, input(0), Box::new(Expr::Row(1)))));
    let check = |k: &LoopKernel, mode: TileMode, bufs: &dyn Fn() -> Vec<Buf>, syms: i64, split: i64| {
        let [native, jit] = both_ways(mode, level);
        assert!(native.compile(k).unwrap().is_native(), "{}", lower::kir::Kernel::Loops(k.clone()));
        assert!(!jit.compile(k).unwrap().is_native());
        let run = |c: &CpuCompiler| {
            let mut b = bufs();
            jit_with(c, k, &mut b, &[syms], 0, split);
            jit_with(c, k, &mut b, &[syms], split, syms);
            b
        };
        let (got, want) = (run(&native), run(&jit));
        for o in [3, 4] {
            assert_bufs_close(&got[o], &want[o], 0.0, &format!("output {o} of {syms} at {split}"));
        }
    };
    for n in [1i64, 511, 513, 1300] {
        let split = n / 3;
        let chain = sigmoid_chain(8);
        let [native, jit] = both_ways(TileMode::Auto, level);
        assert!(native.compile(&chain).unwrap().is_native() && !jit.compile(&chain).unwrap().is_native());
        let x: Vec<f32> = (0..n).map(|j| ((j % 97) as f32 - 48.0) / 16.0).collect();
        let run = |c: &CpuCompiler| {
            let mut bufs = vec![Buf::f32s(&x), Buf::zeros(DType::F32, n as usize)];
            run_split(c, &chain, &mut bufs, n as usize, split as usize);
            bufs.swap_remove(1)
        };
        assert_bufs_close(&run(&native), &run(&jit), 0.0, &format!("sigmoid chain of {n}"));
        for e in [&uniform_exp2, &broadcasts, &around] {
            check(&kernel(e, true), TileMode::Always, &|| inputs(n as usize, 3), n, split);
        }
    }
    // A causal mask over the parallel loop itself: `where(f32(i + s1) < f32(s2) + 1, x * 0.5,
    // -3)` then exp2, its bound a uniform index plus a constant (a uniform addition).
    let d = DType::F32;
    let masked = LoopKernel {
        params: three_in_two_out(),
        n_syms: 3,
        body: vec![for_(
            0,
            IExpr::Sym(0),
            true,
            vec![
                let_(0, d, Inst::Const(Scalar::Float(0.5))),
                let_(1, d, Inst::Index(IExpr::Sym(2))),
                let_(2, d, Inst::Const(Scalar::Float(1.0))),
                let_(3, d, Inst::Binary(BinaryOp::Add, r(1), r(2))),
                let_(4, d, Inst::Const(Scalar::Float(-3.0))),
                let_(5, d, Inst::Index(IExpr::add(i(0), IExpr::Sym(1)))),
                let_(6, DType::Bool, Inst::Binary(BinaryOp::CmpLt, r(5), r(3))),
                load(7, d, 0, i(0)),
                let_(8, d, Inst::Binary(BinaryOp::Mul, r(7), r(0))),
                let_(9, d, Inst::Where(r(6), r(8), r(4))),
                let_(10, d, Inst::Unary(UnaryOp::Exp2, r(9))),
                store(3, i(0), 10),
            ],
        )],
    };
    for (n, s1, s2) in [(700i64, 3i64, 400i64), (1300, -20, 5), (90, 0, 1000)] {
        let [native, jit] = both_ways(TileMode::Auto, level);
        assert!(native.compile(&masked).unwrap().is_native() && !jit.compile(&masked).unwrap().is_native());
        let run = |c: &CpuCompiler| {
            let mut b = inputs(n as usize, 4);
            jit_with(c, &masked, &mut b, &[n, s1, s2], 0, n / 2);
            jit_with(c, &masked, &mut b, &[n, s1, s2], n / 2, n);
            b
        };
        assert_bufs_close(&run(&native)[3], &run(&jit)[3], 0.0, &format!("masked {n} {s1} {s2}"));
    }
    for (width, rows) in [(16i64, 1usize), (16, 45), (32, 33), (8, 130)] {
        let k = rows_kernel(&per_row, width, [width + 5, width, width], [width + 3, width], true);
        let span = (width + 10) as usize;
        check(&k, TileMode::Auto, &|| rows_inputs(rows, span, 9), rows as i64, rows as i64 / 2);
    }
    // Optimised code only: nothing runs natively.
    let optimized = kiln_codegen::CpuCompiler::with_mode(kiln_codegen::JitMode::Optimized).unwrap();
    optimized.set_tiling(Tiling { mode: TileMode::Auto, level });
    assert!(!optimized.compile(&sigmoid_chain(1)).unwrap().is_native());
}
