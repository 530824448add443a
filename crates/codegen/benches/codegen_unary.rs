//! Microbenchmarks of JIT-compiled element-wise kernels (single thread) and of compilation.
//!
//! `cargo bench -p kiln-codegen --bench codegen_unary -- --quick`

use std::hint::black_box;

use air::{BinaryOp, DType, Scalar, UnaryOp};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kiln_codegen::CpuCompiler;
use lower::kir::{Access, IExpr, Inst, LoopKernel, Param, Reg, Stmt, Var};

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
    kernel(
        vec![
            let_(1, Inst::Unary(UnaryOp::Neg, Reg(0))),
            let_(2, Inst::Const(Scalar::Float(std::f64::consts::LOG2_E))),
            let_(3, Inst::Binary(BinaryOp::Mul, Reg(1), Reg(2))),
            let_(4, Inst::Unary(UnaryOp::Exp2, Reg(3))),
            let_(5, Inst::Const(Scalar::Float(1.0))),
            let_(6, Inst::Binary(BinaryOp::Add, Reg(5), Reg(4))),
            let_(7, Inst::Unary(UnaryOp::Recip, Reg(6))),
        ],
        7,
    )
}

fn bench_kernels(c: &mut Criterion) {
    let compiler = CpuCompiler::new().expect("host ISA");
    for (name, k) in [("neg", neg()), ("sigmoid", sigmoid())] {
        let compiled = compiler.compile(&k).expect("compile");
        let mut group = c.benchmark_group(name);
        for n in SIZES {
            let input: Vec<f32> = (0..n).map(|j| (j % 1000) as f32 * 0.01 - 5.0).collect();
            let mut out = vec![0f32; n];
            let ptrs = [input.as_ptr() as *mut u8, out.as_mut_ptr() as *mut u8];
            let syms = [n as i64];
            group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
                // SAFETY: both buffers hold n f32.
                b.iter(|| unsafe { compiled.call(black_box(ptrs.as_ptr()), syms.as_ptr(), 0, n as i64) })
            });
            black_box(&out);
        }
        group.finish();
    }
}

fn bench_compile(c: &mut Criterion) {
    let compiler = CpuCompiler::new().expect("host ISA");
    let (neg, sigmoid) = (neg(), sigmoid());
    c.bench_function("compile/neg", |b| {
        b.iter(|| {
            compiler.clear_cache();
            compiler.compile(black_box(&neg)).unwrap()
        })
    });
    c.bench_function("compile/sigmoid", |b| {
        b.iter(|| {
            compiler.clear_cache();
            compiler.compile(black_box(&sigmoid)).unwrap()
        })
    });
    c.bench_function("compile/cache_hit", |b| b.iter(|| compiler.compile(black_box(&neg)).unwrap()));
}

criterion_group!(benches, bench_kernels, bench_compile);
criterion_main!(benches);
