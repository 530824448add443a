//! Microbenchmarks of JIT-compiled element-wise kernels (single thread) and of compilation.
//!
//! `cargo bench -p kiln-codegen --bench codegen_unary -- --quick` (all), `... -- --quick compile`
//! (compile times of neg, sigmoid, softmax rows and layer norm, each a fresh compile, and of 30
//! distinct such kernels one `compile` at a time vs one `compile_many` batch). `sigmoid_chain8`
//! is 8 sigmoids fused into one kernel (divide its time by 8 to compare with `sigmoid`).

use std::hint::black_box;

use air::ReduceOp;
use air::{BinaryOp, DType, Scalar, UnaryOp};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kiln_codegen::{CpuCompiler, TileLevel, TileMode, Tiling};
use lower::kir::{Acc, Access, IExpr, Inst, LoopKernel, Param, Reg, Stmt, Var};

const SIZES: [usize; 7] = [1, 729, 2187, 59049, 177147, 531441, 1594323];

fn let_(n: u32, inst: Inst) -> Stmt {
    Stmt::Let { reg: Reg(n), dtype: DType::F32, inst }
}

fn kernel(body: Vec<Stmt>, out: u32) -> LoopKernel {
    let i = IExpr::Var(Var(0));
    let mut body = body;
    body.insert(0, let_(0, Inst::Load { buf: 0, index: i.clone(), mask: None, other: Scalar::Float(0.0) }));
    body.push(Stmt::Store { buf: 1, index: i, value: Reg(out) });
    LoopKernel {
        params: vec![
            Param { dtype: DType::F32, access: Access::Read },
            Param { dtype: DType::F32, access: Access::Write },
        ],
        n_syms: 1,
        body: vec![Stmt::Loop { var: Var(0), extent: IExpr::Sym(0), parallel: true, body }],
    }
}

fn neg() -> LoopKernel {
    kernel(vec![let_(1, Inst::Unary(UnaryOp::Neg, Reg(0)))], 1)
}

/// `1 / (1 + exp2(-x * log2(e)))`, as the front end lowers sigmoid.
fn sigmoid() -> LoopKernel {
    sigmoid_with(std::f64::consts::LOG2_E)
}

/// Sigmoid with another scale, for distinct kernels.
fn sigmoid_with(scale: f64) -> LoopKernel {
    kernel(
        vec![
            let_(1, Inst::Unary(UnaryOp::Neg, Reg(0))),
            let_(2, Inst::Const(Scalar::Float(scale))),
            let_(3, Inst::Binary(BinaryOp::Mul, Reg(1), Reg(2))),
            let_(4, Inst::Unary(UnaryOp::Exp2, Reg(3))),
            let_(5, Inst::Const(Scalar::Float(1.0))),
            let_(6, Inst::Binary(BinaryOp::Add, Reg(5), Reg(4))),
            let_(7, Inst::Unary(UnaryOp::Recip, Reg(6))),
        ],
        7,
    )
}

/// `chain` sigmoids applied one after another in one kernel, as the fuser emits a chain of
/// element-wise ops (no memory traffic between them).
fn sigmoid_chain(chain: u32) -> LoopKernel {
    let mut body = Vec::new();
    let mut x = 0;
    for _ in 0..chain {
        body.extend([
            un(x + 1, UnaryOp::Neg, x),
            cst(x + 2, std::f64::consts::LOG2_E),
            bin(x + 3, BinaryOp::Mul, x + 1, x + 2),
            un(x + 4, UnaryOp::Exp2, x + 3),
            cst(x + 5, 1.0),
            bin(x + 6, BinaryOp::Add, x + 5, x + 4),
            un(x + 7, UnaryOp::Recip, x + 6),
        ]);
        x += 7;
    }
    kernel(body, x)
}

fn l(n: u32, inst: Inst) -> Stmt {
    Stmt::Let { reg: Reg(n), dtype: DType::F32, inst }
}
fn ld(n: u32, buf: u32, index: IExpr) -> Stmt {
    l(n, Inst::Load { buf, index, mask: None, other: Scalar::Float(0.0) })
}
fn cst(n: u32, x: f64) -> Stmt {
    l(n, Inst::Const(Scalar::Float(x)))
}
fn bin(n: u32, op: BinaryOp, a: u32, b: u32) -> Stmt {
    l(n, Inst::Binary(op, Reg(a), Reg(b)))
}
fn un(n: u32, op: UnaryOp, a: u32) -> Stmt {
    l(n, Inst::Unary(op, Reg(a)))
}
fn lp(v: u32, ext: IExpr, parallel: bool, body: Vec<Stmt>) -> Stmt {
    Stmt::Loop { var: Var(v), extent: ext, parallel, body }
}
fn pf(n: usize) -> Vec<Param> {
    let mut v = vec![Param { dtype: DType::F32, access: Access::Read }; n - 1];
    v.push(Param { dtype: DType::F32, access: Access::Write });
    v
}
fn row() -> IExpr {
    IExpr::add(IExpr::mul(IExpr::Var(Var(0)), IExpr::Sym(0)), IExpr::Var(Var(1)))
}
/// Softmax of rows of `s0` (max, sum of exp2, normalise), as the front end lowers it.
fn softmax() -> LoopKernel {
    softmax_with(std::f64::consts::LOG2_E)
}

/// Softmax with another scale of its exponent, for distinct kernels.
fn softmax_with(scale: f64) -> LoopKernel {
    let acc = |a: u32, op| Stmt::AccInit { acc: Acc(a), dtype: DType::F32, op };
    let upd = |a: u32, r: u32| Stmt::AccUpdate { acc: Acc(a), value: Reg(r) };
    LoopKernel {
        params: pf(2),
        n_syms: 2,
        body: vec![lp(
            0,
            IExpr::Sym(1),
            true,
            vec![
                acc(0, ReduceOp::Max),
                lp(1, IExpr::Sym(0), false, vec![ld(0, 0, row()), upd(0, 0)]),
                l(1, Inst::ReadAcc(Acc(0))),
                acc(1, ReduceOp::Sum),
                lp(
                    2,
                    IExpr::Sym(0),
                    false,
                    vec![
                        ld(2, 0, IExpr::add(IExpr::mul(IExpr::Var(Var(0)), IExpr::Sym(0)), IExpr::Var(Var(2)))),
                        bin(3, BinaryOp::Sub, 2, 1),
                        cst(4, scale),
                        bin(5, BinaryOp::Mul, 3, 4),
                        un(6, UnaryOp::Exp2, 5),
                        upd(1, 6),
                    ],
                ),
                l(7, Inst::ReadAcc(Acc(1))),
                un(8, UnaryOp::Recip, 7),
                lp(
                    3,
                    IExpr::Sym(0),
                    false,
                    vec![
                        ld(9, 0, IExpr::add(IExpr::mul(IExpr::Var(Var(0)), IExpr::Sym(0)), IExpr::Var(Var(3)))),
                        bin(10, BinaryOp::Sub, 9, 1),
                        cst(11, scale),
                        bin(12, BinaryOp::Mul, 10, 11),
                        un(13, UnaryOp::Exp2, 12),
                        bin(14, BinaryOp::Mul, 13, 8),
                        Stmt::Store {
                            buf: 1,
                            index: IExpr::add(IExpr::mul(IExpr::Var(Var(0)), IExpr::Sym(0)), IExpr::Var(Var(3))),
                            value: Reg(14),
                        },
                    ],
                ),
            ],
        )],
    }
}
/// Layer norm over rows of 64 (mean, variance, scale and shift).
fn layernorm() -> LoopKernel {
    layernorm_with(1e-5)
}

/// Layer norm with another epsilon, for distinct kernels.
fn layernorm_with(eps: f64) -> LoopKernel {
    let acc = |a: u32| Stmt::AccInit { acc: Acc(a), dtype: DType::F32, op: ReduceOp::Sum };
    let upd = |a: u32, r: u32| Stmt::AccUpdate { acc: Acc(a), value: Reg(r) };
    let ix = |v: u32| IExpr::add(IExpr::mul(IExpr::Var(Var(0)), IExpr::Sym(0)), IExpr::Var(Var(v)));
    LoopKernel {
        params: pf(4),
        n_syms: 2,
        body: vec![lp(
            0,
            IExpr::Sym(1),
            true,
            vec![
                acc(0),
                lp(1, IExpr::Sym(0), false, vec![ld(0, 0, ix(1)), upd(0, 0)]),
                l(1, Inst::ReadAcc(Acc(0))),
                cst(2, 1.0 / 64.0),
                bin(3, BinaryOp::Mul, 1, 2),
                acc(1),
                lp(
                    2,
                    IExpr::Sym(0),
                    false,
                    vec![ld(4, 0, ix(2)), bin(5, BinaryOp::Sub, 4, 3), bin(6, BinaryOp::Mul, 5, 5), upd(1, 6)],
                ),
                l(7, Inst::ReadAcc(Acc(1))),
                bin(8, BinaryOp::Mul, 7, 2),
                cst(9, eps),
                bin(10, BinaryOp::Add, 8, 9),
                un(11, UnaryOp::Sqrt, 10),
                un(12, UnaryOp::Recip, 11),
                lp(
                    3,
                    IExpr::Sym(0),
                    false,
                    vec![
                        ld(13, 0, ix(3)),
                        bin(14, BinaryOp::Sub, 13, 3),
                        bin(15, BinaryOp::Mul, 14, 12),
                        ld(16, 1, IExpr::Var(Var(3))),
                        bin(17, BinaryOp::Mul, 15, 16),
                        ld(18, 2, IExpr::Var(Var(3))),
                        bin(19, BinaryOp::Add, 17, 18),
                        Stmt::Store { buf: 3, index: ix(3), value: Reg(19) },
                    ],
                ),
            ],
        )],
    }
}

fn bench_kernels(c: &mut Criterion) {
    // `jit`: the JIT's own 128-bit loop; `tiled`: the loop over tiles that calls the full-width
    // routines (where the kernel is eligible; neg is not, in `Auto` mode).
    let jit = CpuCompiler::new().expect("host ISA");
    jit.set_tiling(Tiling { mode: TileMode::Off, level: TileLevel::detect() });
    let tiled = CpuCompiler::new().expect("host ISA");
    tiled.set_tiling(Tiling { mode: TileMode::Auto, level: TileLevel::detect() });
    // `sigmoid_chain8` runs 8 sigmoids per element: its time over 8 is the time per op, to
    // compare with `sigmoid` (fusion must not be slower per op than one sigmoid kernel).
    for (name, k) in [("neg", neg()), ("sigmoid", sigmoid()), ("sigmoid_chain8", sigmoid_chain(8))] {
        let mut group = c.benchmark_group(name);
        for n in SIZES {
            for (path, compiler) in [("jit", &jit), ("tiled", &tiled)] {
                let compiled = compiler.compile(&k).expect("compile");
                let input: Vec<f32> = (0..n).map(|j| (j % 1000) as f32 * 0.01 - 5.0).collect();
                let mut out = vec![0f32; n];
                let ptrs = [input.as_ptr() as *mut u8, out.as_mut_ptr() as *mut u8];
                let syms = [n as i64];
                group.bench_with_input(BenchmarkId::new(path, n), &n, |b, &n| {
                    // SAFETY: both buffers hold n f32.
                    b.iter(|| unsafe { compiled.call(black_box(ptrs.as_ptr()), syms.as_ptr(), 0, n as i64) })
                });
                black_box(&out);
            }
        }
        group.finish();
    }
}

fn bench_compile(c: &mut Criterion) {
    let compiler = CpuCompiler::new().expect("host ISA");
    let mut group = c.benchmark_group("compile");
    for (name, k) in [("neg", neg()), ("sigmoid", sigmoid()), ("softmax", softmax()), ("layernorm", layernorm())] {
        group.bench_function(name, |b| {
            b.iter(|| {
                compiler.clear_cache();
                compiler.compile(black_box(&k)).unwrap()
            })
        });
    }
    let k = neg();
    group.bench_function("cache_hit", |b| b.iter(|| compiler.compile(black_box(&k)).unwrap()));
    group.finish();
}

/// 30 distinct kernels, a mix like a small transformer's: element-wise, softmax, layer norm.
fn thirty_kernels() -> Vec<LoopKernel> {
    (0..30)
        .map(|j| {
            let x = 1.0 + j as f64 * 1e-3;
            match j % 4 {
                0 => kernel(vec![un(1, UnaryOp::Neg, 0), cst(2, x), bin(3, BinaryOp::Mul, 1, 2)], 3),
                1 => sigmoid_with(x),
                2 => softmax_with(x),
                _ => layernorm_with(x * 1e-5),
            }
        })
        .collect()
}

fn bench_compile_many(c: &mut Criterion) {
    let kernels = thirty_kernels();
    let refs: Vec<&LoopKernel> = kernels.iter().collect();
    let mut group = c.benchmark_group("compile_many");
    let compiler = CpuCompiler::new().expect("host ISA");
    group.bench_function("sequential_30", |b| {
        b.iter(|| {
            compiler.clear_cache();
            for k in &refs {
                black_box(compiler.compile(k).unwrap());
            }
        })
    });
    group.bench_function("batch_30", |b| {
        b.iter(|| {
            compiler.clear_cache();
            black_box(compiler.compile_many(black_box(&refs)))
        })
    });
    let one_thread = CpuCompiler::new().expect("host ISA");
    one_thread.set_compile_threads(1);
    group.bench_function("batch_30_one_thread", |b| {
        b.iter(|| {
            one_thread.clear_cache();
            black_box(one_thread.compile_many(black_box(&refs)))
        })
    });
    group.finish();
}

criterion_group!(benches, bench_kernels, bench_compile, bench_compile_many);
criterion_main!(benches);
