//! Stencils run by the full-width routine (`cpu/stencil.rs`): random depthwise convolutions
//! (taps times per-channel or uniform weights, plus a bias, then a ReLU) and pooling windows
//! (the maximum of biased taps), at strides 1 and 2, of widths with and without a 16-lane tail,
//! against the reference evaluator bit for bit (NaN for NaN), through the JIT alone, the
//! portable routine and the host's best; and the shapes that must stay in the JIT's loops.

use crate::common;

use air::{BinaryOp, DType, ReduceOp, Scalar};
use common::*;
use kiln_codegen::{CpuCompiler, TileLevel, TileMode, Tiling, clif_text_with};
use lower::kir::{Acc, Access, IExpr, Inst, LoopKernel, Stmt};
use proptest::prelude::*;

#[derive(Clone, Copy, Debug)]
struct Spec {
    /// A pooling window's maximum, or a weighted sum.
    max: bool,
    planes: i64,
    rows: i64,
    width: i64,
    stride: i64,
    kh: i64,
    kw: i64,
    /// A bias per plane (loaded before the row loop).
    bias: bool,
    /// A sum times a scale per plane before the bias (an eval-mode BatchNorm).
    scale: bool,
    /// `max(value, 0)` at the end.
    relu: bool,
    /// Weights loaded per plane (else constants).
    loaded_weights: bool,
    /// Extra elements at the end of each output row.
    out_pad: i64,
}

impl Spec {
    fn in_row(&self) -> i64 {
        self.stride * (self.width - 1) + self.kw + 1
    }
    fn in_plane(&self) -> i64 {
        self.in_row() * (self.stride * (self.rows - 1) + self.kh)
    }
    fn out_row(&self) -> i64 {
        self.width + self.out_pad
    }
    fn out_plane(&self) -> i64 {
        self.out_row() * self.rows
    }
    fn taps(&self) -> i64 {
        self.kh * self.kw
    }
}

fn add(a: IExpr, b: IExpr) -> IExpr {
    IExpr::add(a, b)
}
fn mul(a: IExpr, b: IExpr) -> IExpr {
    IExpr::mul(a, b)
}
fn bin(n: u32, op: BinaryOp, a: u32, b: u32) -> Stmt {
    let_(n, DType::F32, Inst::Binary(op, r(a), r(b)))
}

/// The loop nest `lower` emits for a depthwise convolution or a pooling window over `s0`
/// batches (b0: output, b1: input, b2: weights, b3: biases, b4: scales): batch (parallel), plane, row,
/// column; the taps written out for a sum, an accumulator over two window loops for a maximum.
fn kernel(s: &Spec) -> LoopKernel {
    let f = DType::F32;
    // i0 batch, i1 plane, i2 row, i3 column, i4/i5 window.
    let base = add(
        add(mul(i(0), c(s.planes * s.in_plane())), mul(i(1), c(s.in_plane()))),
        add(mul(i(2), c(s.stride * s.in_row())), mul(i(3), c(s.stride))),
    );
    let mut plane = Vec::new();
    const W: u32 = 100; // weight registers W + t
    const BIAS: u32 = 90;
    if !s.max {
        for t in 0..s.taps() {
            let inst = if s.loaded_weights {
                Inst::Load { buf: 2, index: add(mul(i(1), c(s.taps())), c(t)), mask: None, other: Scalar::Int(0) }
            } else {
                Inst::Const(Scalar::Float(0.25 * (t as f64) - 0.75))
            };
            plane.push(let_(W + t as u32, f, inst));
        }
    }
    const SCALE: u32 = 91;
    if s.bias {
        plane.push(load(BIAS, f, 3, i(1)));
    }
    if s.scale && !s.max {
        plane.push(load(SCALE, f, 4, i(1)));
    }
    let mut body = Vec::new();
    let mut next = 200;
    let value = if s.max {
        let acc = Acc(0);
        let (x, y) = (next, next + 1);
        next += 2;
        let mut window = vec![load(x, f, 1, add(base.clone(), add(mul(i(4), c(s.in_row())), i(5))))];
        let biased = if s.bias {
            window.push(bin(y, BinaryOp::Add, x, BIAS));
            y
        } else {
            x
        };
        window.push(Stmt::AccUpdate { acc, value: r(biased) });
        body.push(Stmt::AccInit { acc, dtype: f, op: ReduceOp::Max });
        body.push(for_(4, c(s.kh), false, vec![for_(5, c(s.kw), false, window)]));
        body.push(let_(next, f, Inst::ReadAcc(acc)));
        next += 1;
        next - 1
    } else {
        let mut sum = None;
        for dy in 0..s.kh {
            for dx in 0..s.kw {
                let t = (dy * s.kw + dx) as u32;
                body.push(load(next, f, 1, add(base.clone(), c(dy * s.in_row() + dx))));
                body.push(bin(next + 1, BinaryOp::Mul, next, W + t));
                sum = Some(match sum {
                    None => next + 1,
                    Some(acc) => {
                        body.push(bin(next + 2, BinaryOp::Add, acc, next + 1));
                        next + 2
                    }
                });
                next += 3;
            }
        }
        let mut sum = sum.expect("taps");
        if s.scale {
            body.push(bin(next, BinaryOp::Mul, SCALE, sum));
            sum = next;
            next += 1;
        }
        if s.bias {
            body.push(bin(next, BinaryOp::Add, sum, BIAS));
            next += 1;
            next - 1
        } else {
            sum
        }
    };
    let value = if s.relu {
        body.push(bin(next, BinaryOp::Max, value, 0));
        next
    } else {
        value
    };
    let out = add(
        add(mul(i(0), c(s.planes * s.out_plane())), mul(i(1), c(s.out_plane()))),
        add(mul(i(2), c(s.out_row())), i(3)),
    );
    body.push(store(0, out, value));
    plane.push(for_(2, c(s.rows), false, vec![for_(3, c(s.width), false, body)]));
    let top = vec![let_(0, f, Inst::Const(Scalar::Float(0.0))), for_(1, c(s.planes), false, plane)];
    let d = DType::F32;
    LoopKernel {
        params: vec![
            p(d, Access::Write),
            p(d, Access::Read),
            p(d, Access::Read),
            p(d, Access::Read),
            p(d, Access::Read),
        ],
        n_syms: 1,
        body: vec![for_(0, IExpr::Sym(0), true, top)],
    }
}

fn bufs(s: &Spec, batch: i64, seed: u64) -> Vec<Buf> {
    let n_in = (batch * s.planes * s.in_plane()) as usize;
    let n_w = (s.planes * s.taps()) as usize;
    vec![
        Buf::zeros(DType::F32, (batch * s.planes * s.out_plane()) as usize),
        Buf::from_vals(DType::F32, &sample(DType::F32, n_in, seed)),
        Buf::from_vals(DType::F32, &sample(DType::F32, n_w, seed + 1)),
        Buf::from_vals(DType::F32, &sample(DType::F32, s.planes as usize, seed + 2)),
        Buf::from_vals(DType::F32, &sample(DType::F32, s.planes as usize, seed + 3)),
    ]
}

fn compiler(mode: TileMode, level: TileLevel, native: bool) -> CpuCompiler {
    let c = CpuCompiler::new().expect("host ISA");
    c.set_tiling(Tiling { mode, level });
    c.set_native_stencils(native);
    // The stencil's own run or its compiled code: not the element-wise map, which takes the
    // nests the routine does not (`cpu/map.rs`).
    c.set_native_maps(false);
    c
}

/// Whether the kernel compiles to a call of a stencil routine: helpers 16 (AVX-512) and 17
/// (portable) of `cpu/helpers.rs`, declared as `u0:16` / `u0:17` in the CLIF.
fn calls_routine(k: &LoopKernel, tiling: Tiling) -> bool {
    let text = clif_text_with(k, tiling).expect("clif");
    text.contains("= u0:16 ") || text.contains("= u0:17 ")
}

fn case(s: &Spec, batch: i64, split: i64, seed: u64) {
    let k = kernel(s);
    let mut want = bufs(s, batch, seed);
    eval(&k, &mut want, &[batch], 0, batch);
    let modes = [
        (TileMode::Off, TileLevel::Base),
        (TileMode::Always, TileLevel::Base),
        (TileMode::Auto, TileLevel::detect()),
        (TileMode::Always, TileLevel::detect()),
    ];
    for ((mode, level), native) in modes.into_iter().flat_map(|m| [(m, false), (m, true)]) {
        let c = compiler(mode, level, native);
        let mut got = bufs(s, batch, seed);
        let split = split.min(batch);
        jit_with(&c, &k, &mut got, &[batch], 0, split);
        jit_with(&c, &k, &mut got, &[batch], split, batch);
        assert_same(&got[0], &want[0], &format!("{s:?} at {mode:?} {level:?}, native stencils {native}"));
    }
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        any::<bool>(),
        1i64..4,
        1i64..7,
        proptest::sample::select(vec![4i64, 5, 8, 13, 16, 17, 33]),
        1i64..3,
        (1i64..4, 1i64..4),
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        0i64..3,
    )
        .prop_map(|(max, planes, rows, width, stride, (kh, kw), (bias, scale, relu, loaded_weights), out_pad)| {
            Spec { max, planes, rows, width, stride, kh, kw, bias, scale, relu, loaded_weights, out_pad }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Stencils of every shape the routine takes (and smaller windows it leaves to the JIT)
    /// agree with the evaluator bit for bit on every path, the batch split between two calls.
    #[test]
    fn stencils_match_the_evaluator_bit_for_bit(s in spec(), batch in 1i64..4, split in 0i64..4, seed in 0u64..1000) {
        case(&s, batch, split, seed);
    }
}

fn depthwise() -> Spec {
    Spec {
        max: false,
        planes: 3,
        rows: 5,
        width: 16,
        stride: 1,
        kh: 3,
        kw: 3,
        bias: true,
        scale: true,
        relu: true,
        loaded_weights: true,
        out_pad: 0,
    }
}

fn pool() -> Spec {
    Spec { max: true, kh: 2, kw: 2, stride: 2, width: 13, loaded_weights: false, ..depthwise() }
}

/// A depthwise convolution and a pooling window take the routine (the portable one when
/// forced, the host's best by default where it has AVX-512); the JIT alone never calls it.
#[test]
fn depthwise_and_pooling_run_as_routine_calls() {
    for s in [depthwise(), pool(), Spec { stride: 2, loaded_weights: false, ..depthwise() }] {
        let k = kernel(&s);
        assert!(calls_routine(&k, Tiling { mode: TileMode::Always, level: TileLevel::Base }), "{s:?}");
        assert!(!calls_routine(&k, Tiling { mode: TileMode::Off, level: TileLevel::Base }), "{s:?}");
        let auto = Tiling { mode: TileMode::Auto, level: TileLevel::detect() };
        assert_eq!(calls_routine(&k, auto), TileLevel::detect() == TileLevel::Avx512, "{s:?}");
        case(&s, 2, 1, 7);
    }
}

/// Where the code would be one routine call per batch entry, the kernel runs natively at the
/// quick tier (the same routine, its arguments filled in Rust: no compile) unless told not to,
/// and gives the same bits as the compiled call.
#[test]
fn a_routine_call_per_entry_runs_natively() {
    for s in [depthwise(), pool()] {
        let k = kernel(&s);
        for (mode, level) in [(TileMode::Always, TileLevel::Base), (TileMode::Auto, TileLevel::detect())] {
            let routine = calls_routine(&k, Tiling { mode, level });
            let (native, compiled) = (compiler(mode, level, true), compiler(mode, level, false));
            assert_eq!(native.compile(&k).expect("compile").is_native(), routine, "{s:?} {mode:?} {level:?}");
            assert!(!compiled.compile(&k).expect("compile").is_native(), "{s:?} {mode:?} {level:?}");
            let (mut a, mut b) = (bufs(&s, 3, 11), bufs(&s, 3, 11));
            jit_with(&native, &k, &mut a, &[3], 0, 3);
            jit_with(&compiled, &k, &mut b, &[3], 0, 3);
            assert_same(&a[0], &b[0], &format!("{s:?} {mode:?} {level:?}"));
        }
        let off = compiler(TileMode::Off, TileLevel::Base, true);
        assert!(!off.compile(&k).expect("compile").is_native(), "{s:?}");
    }
}

/// Shapes outside the pattern stay in the JIT's loops: too few taps, and a window whose taps
/// read the buffer the kernel writes.
#[test]
fn other_shapes_stay_in_the_jit() {
    let forced = Tiling { mode: TileMode::Always, level: TileLevel::Base };
    let small = Spec { kh: 1, kw: 3, ..depthwise() };
    assert!(!calls_routine(&kernel(&small), forced));
    let mut k = kernel(&depthwise());
    fn retarget(stmts: &mut [Stmt]) {
        for s in stmts {
            match s {
                Stmt::Let { inst: Inst::Load { buf: b @ 1, .. }, .. } => *b = 0,
                Stmt::Loop { body, .. } => retarget(body),
                _ => {}
            }
        }
    }
    retarget(&mut k.body);
    assert!(!calls_routine(&k, forced));
}
