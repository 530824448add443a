//! Masked element-wise nests (a padded bias and ReLU, the input of a depthwise convolution) run
//! natively at the quick tier (`cpu/map.rs`): the same bits as the evaluator and as the compiled
//! code, at every pad, size and batch split, and only where the nest is one such.

use crate::common;

use air::{BinaryOp, DType, Scalar, UnaryOp};
use common::*;
use lower::kir::{Access, IExpr, Inst, LoopKernel};
use proptest::prelude::*;

use kiln_codegen::{CpuCompiler, JitMode};

/// The nest's shape: `channels` planes of `rows` x `cols` padded by `pad` on every side (the
/// output `rows + 2 pad` x `cols + 2 pad`), the input read with column stride `stride`, `op`
/// applied with the per-channel bias, then `max(_, 0)` (or `neg` and `sqrt` on the way when
/// `unary`), `fill` on the border.
#[derive(Clone, Debug)]
struct Spec {
    channels: i64,
    rows: i64,
    cols: i64,
    pad: i64,
    stride: i64,
    op: BinaryOp,
    unary: bool,
    fill: f64,
    /// How the bias is loaded: 0 under the nest's mask (every masked statement then holds over
    /// one box, which the native run computes apart from its border), 1 unmasked, 2 masked by
    /// the rows' range alone (both of which it runs row by row, every mask looked at).
    bias_mask: u8,
    /// Elements left between output rows (0: the rows follow each other).
    gap: i64,
}

impl Spec {
    fn out_rows(&self) -> i64 {
        self.rows + 2 * self.pad
    }
    fn out_cols(&self) -> i64 {
        self.cols + 2 * self.pad
    }
    fn out_row(&self) -> i64 {
        self.out_cols() + self.gap
    }
}

/// `out[n, c, y, x] = inside ? relu(op(in[n, c, y - pad, (x - pad) * stride], bias[c])) : fill`.
fn kernel(s: &Spec) -> LoopKernel {
    let (pad, rows, cols) = (s.pad, s.rows, s.cols);
    let inside = |v: u32, n: i64| IExpr::and(IExpr::lt(c(pad - 1), i(v)), IExpr::lt(i(v), c(n + pad)));
    let mask = IExpr::and(inside(2, rows), inside(3, cols));
    let masked =
        |buf: u32, index: IExpr, mask: Option<IExpr>| Inst::Load { buf, index, mask, other: Scalar::Float(0.0) };
    let plane = rows * cols * s.stride;
    let src = IExpr::add(
        IExpr::add(IExpr::mul(i(0), c(s.channels * plane)), IExpr::mul(i(1), c(plane))),
        IExpr::add(
            IExpr::mul(IExpr::add(i(2), c(-pad)), c(cols * s.stride)),
            IExpr::mul(IExpr::add(i(3), c(-pad)), c(s.stride)),
        ),
    );
    let out_plane = s.out_rows() * s.out_row();
    let dst = IExpr::add(
        IExpr::add(IExpr::mul(i(0), c(s.channels * out_plane)), IExpr::mul(i(1), c(out_plane))),
        IExpr::add(IExpr::mul(i(2), c(s.out_row())), i(3)),
    );
    let mut body = vec![
        let_(1, DType::F32, masked(1, src, Some(mask.clone()))),
        let_(
            2,
            DType::F32,
            masked(
                2,
                i(1),
                match s.bias_mask {
                    0 => Some(mask.clone()),
                    1 => None,
                    _ => Some(inside(2, rows)),
                },
            ),
        ),
        let_(3, DType::F32, Inst::Binary(s.op, r(1), r(2))),
    ];
    if s.unary {
        body.push(let_(4, DType::F32, Inst::Unary(UnaryOp::Neg, r(3))));
        body.push(let_(5, DType::F32, Inst::Unary(UnaryOp::Sqrt, r(4))));
    } else {
        body.push(let_(5, DType::F32, Inst::Binary(BinaryOp::Max, r(3), r(0))));
    }
    body.extend([
        let_(6, DType::Bool, Inst::Index(mask.clone())),
        let_(7, DType::F32, Inst::Const(Scalar::Float(s.fill))),
        let_(8, DType::F32, Inst::Where(r(6), r(5), r(7))),
        store(0, dst, 8),
    ]);
    let nest = for_(
        1,
        c(s.channels),
        false,
        vec![for_(2, c(s.out_rows()), false, vec![for_(3, c(s.out_cols()), false, body)])],
    );
    LoopKernel {
        params: vec![p(DType::F32, Access::Write), p(DType::F32, Access::Read), p(DType::F32, Access::Read)],
        n_syms: 1,
        body: vec![for_(0, IExpr::Sym(0), true, vec![let_(0, DType::F32, Inst::Const(Scalar::Float(0.0))), nest])],
    }
}

fn bufs(s: &Spec, batch: i64, seed: u64) -> Vec<Buf> {
    let n_in = (batch * s.channels * s.rows * s.cols * s.stride) as usize;
    vec![
        Buf::from_vals(
            DType::F32,
            &sample(DType::F32, (batch * s.channels * s.out_rows() * s.out_row()) as usize, seed),
        ),
        Buf::from_vals(DType::F32, &sample(DType::F32, n_in, seed + 1)),
        Buf::from_vals(DType::F32, &sample(DType::F32, s.channels as usize, seed + 2)),
    ]
}

fn compiler(native: bool) -> CpuCompiler {
    let c = CpuCompiler::with_mode(JitMode::Quick).expect("host ISA");
    c.set_native_maps(native);
    c
}

/// The native run and the compiled code each give the evaluator's bits, the batch split in two
/// calls; the nest runs natively exactly when asked to.
fn case(s: &Spec, batch: i64, split: i64, seed: u64) {
    let k = kernel(s);
    let mut want = bufs(s, batch, seed);
    eval(&k, &mut want, &[batch], 0, batch);
    for native in [true, false] {
        let c = compiler(native);
        assert_eq!(c.compile(&k).expect("compile").is_native(), native, "{s:?}");
        let mut got = bufs(s, batch, seed);
        let split = split.min(batch);
        jit_with(&c, &k, &mut got, &[batch], 0, split);
        jit_with(&c, &k, &mut got, &[batch], split, batch);
        assert_same(&got[0], &want[0], &format!("{s:?} batch {batch}, native {native}"));
    }
}

fn relu_pad() -> Spec {
    Spec {
        channels: 3,
        rows: 5,
        cols: 16,
        pad: 1,
        stride: 1,
        op: BinaryOp::Add,
        unary: false,
        fill: 0.0,
        bias_mask: 0,
        gap: 0,
    }
}

#[test]
fn a_padded_bias_and_relu_runs_natively_with_the_evaluators_bits() {
    case(&relu_pad(), 3, 1, 5);
    // Rows longer than a chunk, a strided read, a border of its own value, NaNs from `sqrt`.
    case(&Spec { cols: 150, pad: 2, ..relu_pad() }, 2, 1, 9);
    case(&Spec { stride: 3, fill: -1.5, op: BinaryOp::Mul, ..relu_pad() }, 2, 2, 13);
    case(&Spec { unary: true, op: BinaryOp::Sub, ..relu_pad() }, 1, 0, 17);
    // Masks that differ between statements: each row's masks looked at.
    case(&Spec { bias_mask: 1, ..relu_pad() }, 2, 1, 21);
    case(&Spec { bias_mask: 2, fill: 3.0, ..relu_pad() }, 2, 1, 23);
    // Output rows apart: the border filled row by row, the elements between rows untouched.
    case(&Spec { gap: 3, ..relu_pad() }, 2, 1, 25);
    case(&Spec { gap: 2, bias_mask: 1, ..relu_pad() }, 2, 1, 27);
}

#[test]
fn nests_without_a_mask_run_natively_and_other_work_is_compiled() {
    let native = compiler(true);
    // No mask, one level or two: the quick tier computes the element-wise nest itself (a
    // Cranelift compile on a model's first call took 100-450 us; the tiered JIT still swaps the
    // vectorised loop in later), with the evaluator's bits.
    let plain = elementwise(
        vec![p(DType::F32, Access::Read), p(DType::F32, Access::Write)],
        IExpr::Sym(0),
        vec![load(0, DType::F32, 0, i(0)), let_(1, DType::F32, Inst::Unary(UnaryOp::Neg, r(0))), store(1, i(0), 1)],
    );
    assert!(native.compile(&plain).expect("compile").is_native());
    for (n, start, end) in [(1000i64, 0i64, 1000i64), (1000, 300, 700), (5, 2, 5)] {
        let a: Vec<f32> = (0..n).map(|j| j as f32 * 0.25 - 3.0).collect();
        let mut got = vec![Buf::f32s(&a), Buf::zeros(DType::F32, n as usize)];
        let mut want = got.clone();
        eval(&plain, &mut want, &[n], start, end);
        jit_with(&native, &plain, &mut got, &[n], start, end);
        assert_same(&got[1], &want[1], &format!("neg over {start}..{end} of {n}"));
    }
    // A dense layer's bias and ReLU: two levels, nothing masked.
    let width = 70i64;
    let at = IExpr::add(IExpr::mul(i(0), c(width)), i(1));
    let dense = LoopKernel {
        params: vec![p(DType::F32, Access::Read), p(DType::F32, Access::Read), p(DType::F32, Access::Write)],
        n_syms: 1,
        body: vec![for_(
            0,
            IExpr::Sym(0),
            true,
            vec![
                let_(0, DType::F32, Inst::Const(Scalar::Float(0.0))),
                for_(
                    1,
                    c(width),
                    false,
                    vec![
                        load(1, DType::F32, 0, at.clone()),
                        load(2, DType::F32, 1, i(1)),
                        let_(3, DType::F32, Inst::Binary(BinaryOp::Add, r(1), r(2))),
                        let_(4, DType::F32, Inst::Binary(BinaryOp::Max, r(3), r(0))),
                        store(2, at, 4),
                    ],
                ),
            ],
        )],
    };
    assert!(native.compile(&dense).expect("compile").is_native());
    let rows = 5i64;
    let bufs = || {
        vec![
            Buf::from_vals(DType::F32, &sample(DType::F32, (rows * width) as usize, 3)),
            Buf::from_vals(DType::F32, &sample(DType::F32, width as usize, 4)),
            Buf::zeros(DType::F32, (rows * width) as usize),
        ]
    };
    let (mut got, mut want) = (bufs(), bufs());
    eval(&dense, &mut want, &[rows], 0, rows);
    jit_with(&native, &dense, &mut got, &[rows], 0, 2);
    jit_with(&native, &dense, &mut got, &[rows], 2, rows);
    assert_same(&got[2], &want[2], "a dense layer's bias and ReLU");
    // An approximated op (`exp2`) is the JIT's: the native run could not give its bits.
    let mut k = kernel(&relu_pad());
    fn retarget(stmts: &mut [lower::kir::Stmt]) {
        for s in stmts {
            match s {
                lower::kir::Stmt::Let { inst: Inst::Binary(BinaryOp::Max, a, _), .. } => {
                    *s = let_(5, DType::F32, Inst::Unary(UnaryOp::Exp2, *a))
                }
                lower::kir::Stmt::Loop { body, .. } => retarget(body),
                _ => {}
            }
        }
    }
    retarget(&mut k.body);
    assert!(!native.compile(&k).expect("compile").is_native());
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        1i64..4,
        1i64..6,
        1i64..70,
        0i64..3,
        1i64..3,
        proptest::sample::select(vec![BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Min]),
        any::<bool>(),
        proptest::sample::select(vec![0.0, -2.5]),
        (0u8..3, 0i64..3),
    )
        .prop_map(|(channels, rows, cols, pad, stride, op, unary, fill, (bias_mask, gap))| Spec {
            channels,
            rows,
            cols,
            pad,
            stride,
            op,
            unary,
            fill,
            bias_mask,
            gap,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn masked_nests_match_the_evaluator_bit_for_bit(s in spec(), batch in 1i64..4, split in 0i64..4, seed in 0u64..1000) {
        case(&s, batch, split, seed);
    }
}

/// A nest of two levels, the parallel one masked with a symbolic bound: rows go several to a
/// block along the parallel loop itself, within each call's `[start, end)`.
#[test]
fn a_two_level_nest_masked_along_its_parallel_loop() {
    let (rows, cols) = (7i64, 5i64);
    // out[y, x] = 0 < y < s0 - 1 && 0 < x < cols + 1 ? in[y - 1, x - 1] * 2 : 0, y < s0 = rows + 2.
    let mask = IExpr::and(
        IExpr::and(IExpr::lt(c(0), i(0)), IExpr::lt(i(0), IExpr::add(IExpr::Sym(0), c(-1)))),
        IExpr::and(IExpr::lt(c(0), i(1)), IExpr::lt(i(1), c(cols + 1))),
    );
    let src = IExpr::add(IExpr::mul(IExpr::add(i(0), c(-1)), c(cols)), IExpr::add(i(1), c(-1)));
    let k = LoopKernel {
        params: vec![p(DType::F32, Access::Write), p(DType::F32, Access::Read)],
        n_syms: 1,
        body: vec![for_(
            0,
            IExpr::Sym(0),
            true,
            vec![for_(
                1,
                c(cols + 2),
                false,
                vec![
                    let_(0, DType::F32, Inst::Load { buf: 1, index: src, mask: Some(mask), other: Scalar::Float(0.0) }),
                    let_(1, DType::F32, Inst::Const(Scalar::Float(2.0))),
                    let_(2, DType::F32, Inst::Binary(BinaryOp::Mul, r(0), r(1))),
                    store(0, IExpr::add(IExpr::mul(i(0), c(cols + 2)), i(1)), 2),
                ],
            )],
        )],
    };
    let syms = [rows + 2];
    let fresh = || {
        vec![
            Buf::from_vals(DType::F32, &sample(DType::F32, ((rows + 2) * (cols + 2)) as usize, 3)),
            Buf::from_vals(DType::F32, &sample(DType::F32, (rows * cols) as usize, 4)),
        ]
    };
    for native in [true, false] {
        let c = compiler(native);
        assert_eq!(c.compile(&k).expect("compile").is_native(), native);
        for split in [0, 1, 4, rows + 2] {
            // The first call alone writes its rows and no others; the second the rest.
            let (mut got, mut want) = (fresh(), fresh());
            jit_with(&c, &k, &mut got, &syms, 0, split);
            eval(&k, &mut want, &syms, 0, split);
            assert_same(&got[0], &want[0], &format!("native {native}, rows below {split}"));
            jit_with(&c, &k, &mut got, &syms, split, rows + 2);
            eval(&k, &mut want, &syms, split, rows + 2);
            assert_same(&got[0], &want[0], &format!("native {native}, split at {split}"));
        }
    }
}

/// A kernel with no loop (one element, called once): a scalar's bias, and the constant a sum
/// over an empty axis leaves (`kir::drop_empty_loops`), run natively with the evaluator's bits.
#[test]
fn a_kernel_without_a_loop_runs_natively() {
    let native = compiler(true);
    let biased = LoopKernel {
        params: vec![p(DType::F32, Access::Write), p(DType::F32, Access::Read)],
        n_syms: 0,
        body: vec![
            load(0, DType::F32, 1, c(2)),
            let_(1, DType::F32, Inst::Const(Scalar::Float(1.5))),
            let_(2, DType::F32, Inst::Binary(BinaryOp::Add, r(0), r(1))),
            store(0, c(1), 2),
        ],
    };
    let zero = LoopKernel {
        params: vec![p(DType::F32, Access::Write), p(DType::F32, Access::Read)],
        n_syms: 0,
        body: vec![let_(0, DType::F32, Inst::Const(Scalar::Float(0.0))), store(0, c(0), 0)],
    };
    for k in [&biased, &zero] {
        assert!(native.compile(k).expect("compile").is_native());
        let bufs = || vec![Buf::f32s(&[7.0, 7.0, 7.0]), Buf::f32s(&[0.25, -1.0, 2.75])];
        let (mut got, mut want) = (bufs(), bufs());
        eval(k, &mut want, &[], 0, 1);
        jit_with(&native, k, &mut got, &[], 0, 1);
        assert_same(&got[0], &want[0], &format!("{}", lower::kir::Kernel::Loops(k.clone())));
    }
}

/// A one-channel 3x3 convolution with its bias and ReLU, its weights loaded before the row loop
/// (an imported `Conv`, which the stencil routine does not take): forty registers, run natively
/// with the evaluator's bits.
#[test]
fn a_convolution_with_its_weights_loaded_runs_natively() {
    let (h, w) = (7i64, 9i64);
    let (ih, iw) = (h + 2, w + 2);
    let mut pre: Vec<lower::kir::Stmt> = (0..9).map(|t| load(t, DType::F32, 2, c(t as i64))).collect();
    pre.push(load(9, DType::F32, 3, c(0)));
    pre.push(let_(10, DType::F32, Inst::Const(Scalar::Float(0.0))));
    let base = IExpr::add(IExpr::add(IExpr::mul(i(0), c(ih * iw)), IExpr::mul(i(1), c(iw))), i(2));
    let mut body = Vec::new();
    let mut sum = None;
    for t in 0..9u32 {
        let (dy, dx) = ((t / 3) as i64, (t % 3) as i64);
        let (x, p) = (11 + 3 * t, 12 + 3 * t);
        body.push(load(x, DType::F32, 1, IExpr::add(base.clone(), c(dy * iw + dx))));
        body.push(let_(p, DType::F32, Inst::Binary(BinaryOp::Mul, r(x), r(t))));
        sum = Some(match sum {
            None => p,
            Some(s) => {
                body.push(let_(13 + 3 * t, DType::F32, Inst::Binary(BinaryOp::Add, r(s), r(p))));
                13 + 3 * t
            }
        });
    }
    body.push(let_(40, DType::F32, Inst::Binary(BinaryOp::Add, r(sum.unwrap()), r(9))));
    body.push(let_(41, DType::F32, Inst::Binary(BinaryOp::Max, r(40), r(10))));
    let dst = IExpr::add(IExpr::add(IExpr::mul(i(0), c(h * w)), IExpr::mul(i(1), c(w))), i(2));
    body.push(store(0, dst, 41));
    pre.push(for_(1, c(h), false, vec![for_(2, c(w), false, body)]));
    let k = LoopKernel {
        params: vec![
            p(DType::F32, Access::Write),
            p(DType::F32, Access::Read),
            p(DType::F32, Access::Read),
            p(DType::F32, Access::Read),
        ],
        n_syms: 1,
        body: vec![for_(0, IExpr::Sym(0), true, pre)],
    };
    let native = compiler(true);
    assert!(native.compile(&k).expect("compile").is_native());
    let batch = 3i64;
    let bufs = || {
        vec![
            Buf::zeros(DType::F32, (batch * h * w) as usize),
            Buf::from_vals(DType::F32, &sample(DType::F32, (batch * ih * iw) as usize, 41)),
            Buf::from_vals(DType::F32, &sample(DType::F32, 9, 42)),
            Buf::from_vals(DType::F32, &sample(DType::F32, 1, 43)),
        ]
    };
    let (mut got, mut want) = (bufs(), bufs());
    eval(&k, &mut want, &[batch], 0, batch);
    jit_with(&native, &k, &mut got, &[batch], 0, 1);
    jit_with(&native, &k, &mut got, &[batch], 1, batch);
    assert_same(&got[0], &want[0], "a 3x3 convolution");
}
