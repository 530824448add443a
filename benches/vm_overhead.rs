//! Per-launch overhead of the runtime's VM: a program of many tiny kernels (1-element buffers, so
//! the kernels themselves cost next to nothing), and a cached tiny graph run end to end through the
//! device (structural key, cache lookup, validation, output allocation, one launch).

use criterion::{Criterion, criterion_group, criterion_main};

use air::dim::shape_of;
use air::op::{Const, Input};
use air::{BinaryOp, Bindings, DType, Graph, HostTensor, Op, Scalar, TensorType, UnaryOp};
use runtime::CpuDevice;

/// `x` through `n` alternating `neg` / `add 0.5` nodes on a 1-element tensor.
fn tiny_chain(n: usize) -> Graph {
    let mut g = Graph::new();
    let ty = TensorType::new(DType::F32, shape_of(&[1]));
    let mut v = g.add_leaf(Op::Input(Input { slot: 0 }), ty.clone()).unwrap();
    for i in 0..n {
        v = if i % 2 == 0 {
            g.add(Op::Unary(UnaryOp::Neg), &[v]).unwrap()
        } else {
            let c = g.add_leaf(Op::Const(Const { value: Scalar::Float(0.5) }), ty.clone()).unwrap();
            g.add(Op::Binary(BinaryOp::Add), &[v, c]).unwrap()
        };
    }
    g.add_output(v);
    g
}

fn launches(c: &mut Criterion) {
    // As the `kiln` command does, so that outputs freed between iterations are reused warm.
    kiln::tune_host_allocator();
    // One kernel per op: no fusion, no rewrites (which would cancel or fold the chain).
    let options = lower::CompileOptions { fuse: false, optimize: false, ..lower::CompileOptions::default() };
    let dev = CpuDevice::with_options(options).unwrap();
    let g = tiny_chain(100);
    let exe = dev.compile(&g).unwrap();
    let x = [HostTensor::from_vec(vec![1f32], vec![1]).unwrap()];
    let b = Bindings::new();
    eprintln!("vm_overhead: the chain runs {} launches per call", exe.launches());
    c.bench_function(&format!("vm/{}_tiny_launches", exe.launches()), |bench| bench.iter(|| exe.run(&x, &b).unwrap()));

    let dev = CpuDevice::new().unwrap();
    let g = tiny_chain(1);
    let exe = dev.compile(&g).unwrap();
    c.bench_function("vm/neg_n1_executable_run", |bench| bench.iter(|| exe.run(&x, &b).unwrap()));
    c.bench_function("vm/neg_n1_device_run_cached", |bench| bench.iter(|| dev.run(&g, &x, &b).unwrap()));
}

criterion_group!(benches, launches);
criterion_main!(benches);
