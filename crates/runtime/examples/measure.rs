//! Temporary measurement harness.
use std::sync::Arc;
use std::time::Instant;

use air::{Bindings, DType, Dim, HostTensor, Scalar, TensorType, UnaryOp};
use kiln_runtime as runtime;
use lower::kir::{Access, IExpr, Inst, Kernel, LoopKernel, Param, Reg, Stmt, Var};
use lower::{BufId, BufferInfo, BufferKind, Program, Step};
use runtime::Executable;
use runtime::vm::{KernelFn, MemoryStats, Placement};

fn planner(p: &Program, b: &Bindings) -> runtime::Result<Placement> {
    let mut offsets = Vec::new();
    let mut end = 0usize;
    for buf in &p.buffers {
        if buf.kind == BufferKind::Temp {
            let bytes = buf.numel.eval(b).unwrap() as usize * buf.dtype.size_bytes();
            offsets.push(Some(end));
            end += bytes.div_ceil(64) * 64;
        } else {
            offsets.push(None);
        }
    }
    Ok(Placement { offsets, stats: MemoryStats { arena_bytes: end, naive_bytes: end, peak_live_bytes: end } })
}

unsafe extern "C" fn neg_f32(bufs: *const *mut u8, _syms: *const i64, start: i64, end: i64) {
    unsafe {
        let (x, y) = (*bufs as *const f32, *bufs.add(1) as *mut f32);
        let x = std::slice::from_raw_parts(x.add(start as usize), (end - start) as usize);
        let y = std::slice::from_raw_parts_mut(y.add(start as usize), (end - start) as usize);
        for (a, b) in x.iter().zip(y) {
            *b = -*a;
        }
    }
}

fn chain(n: i64, len: usize) -> Executable {
    let i = Var(0);
    let k = Kernel::Loops(LoopKernel {
        params: vec![
            Param { dtype: DType::F32, access: Access::Read },
            Param { dtype: DType::F32, access: Access::Write },
        ],
        n_syms: 0,
        body: vec![Stmt::Loop {
            var: i,
            extent: IExpr::Const(n),
            parallel: true,
            body: vec![
                Stmt::Let {
                    reg: Reg(0),
                    dtype: DType::F32,
                    inst: Inst::Load { buf: 0, index: IExpr::Var(i), mask: None, other: Scalar::Float(0.0) },
                },
                Stmt::Let { reg: Reg(1), dtype: DType::F32, inst: Inst::Unary(UnaryOp::Neg, Reg(0)) },
                Stmt::Store { buf: 1, index: IExpr::Var(i), value: Reg(1) },
            ],
        }],
    });
    let mut buffers = vec![BufferInfo { dtype: DType::F32, numel: Dim::Const(n), kind: BufferKind::Input(0) }];
    let mut steps = vec![];
    for s in 0..len {
        let kind = if s + 1 == len { BufferKind::Output(0) } else { BufferKind::Temp };
        buffers.push(BufferInfo { dtype: DType::F32, numel: Dim::Const(n), kind });
        steps.push(Step { kernel: 0, args: vec![BufId(s as u32), BufId(s as u32 + 1)] });
    }
    let ty = TensorType::new(DType::F32, vec![Dim::Const(n)]);
    let p =
        Program { symbols: vec![], kernels: vec![k], steps, buffers, outputs: vec![(BufId(len as u32), ty.clone())] };
    Executable::new(p, vec![Some(ty)], vec![Some(neg_f32 as KernelFn)], Arc::new(()), planner).unwrap()
}

fn time(iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..iters / 10 + 1 {
        f();
    }
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / iters as f64);
    }
    best
}

fn main() {
    let b = Bindings::new();
    for len in [1usize, 100] {
        let e = chain(1, len);
        let x = vec![HostTensor::from_vec(vec![1f32], vec![1]).unwrap()];
        let t = time(20000, || {
            e.run(&x, &b).unwrap();
        });
        println!(
            "chain of {len} 1-element launches: {:.3} us per run, {:.1} ns per launch",
            t * 1e6,
            t * 1e9 / len as f64
        );
    }
    let t = time(20000, || runtime::parallel::for_chunks(2, 2, &|_, _| {}));
    println!("for_chunks(2 chunks, no work): {:.2} us", t * 1e6);
    for n in [4096i64, 8192, 16384, 32768, 65536, 131072, 262144] {
        let x = vec![HostTensor::from_vec(vec![1f32; n as usize], vec![n as usize]).unwrap()];
        let e = chain(n, 10);
        let par = time(200, || {
            e.run(&x, &b).unwrap();
        }) / 10.0;
        // Single-threaded: run the kernel directly over the whole range.
        let src = vec![1f32; n as usize];
        let mut dst = vec![0f32; n as usize];
        let ptrs = [src.as_ptr() as *mut u8, dst.as_mut_ptr() as *mut u8];
        let one = time(200, || unsafe { neg_f32(ptrs.as_ptr(), std::ptr::null(), 0, n) });
        println!(
            "neg n={n}: VM {} per launch {:.2} us, single-thread kernel {:.2} us",
            if n >= 32768 { "(split)" } else { "(inline)" },
            par * 1e6,
            one * 1e6
        );
    }
}
