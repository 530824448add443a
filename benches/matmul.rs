//! f32 matmul through the CPU device (lowered to `Kernel::Matmul`, run with the `gemm` crate on
//! rayon's pool). Criterion's throughput is in FLOP, so "elem/s" reads as FLOP/s.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use air::dim::shape_of;
use air::op::{Expand, Input, Permute, Reduce, Reshape};
use air::{BinaryOp, Bindings, DType, Graph, HostTensor, Op, ReduceOp, TensorType};
use runtime::CpuDevice;

/// `a[m, k] @ b[k, n]` as expand-mul-sum over a last axis `k` (`b` seen transposed), the pattern
/// the lowering recognises.
fn matmul_graph(m: usize, k: usize, n: usize) -> Graph {
    let mut g = Graph::new();
    let a = g.add_leaf(Op::Input(Input { slot: 0 }), TensorType::new(DType::F32, shape_of(&[m, k]))).unwrap();
    let b = g.add_leaf(Op::Input(Input { slot: 1 }), TensorType::new(DType::F32, shape_of(&[k, n]))).unwrap();
    let a = g.add(Op::Reshape(Reshape { shape: shape_of(&[m, 1, k]) }), &[a]).unwrap();
    let a = g.add(Op::Expand(Expand { shape: shape_of(&[m, n, k]) }), &[a]).unwrap();
    let b = g.add(Op::Permute(Permute { perm: [1usize, 0].into_iter().collect() }), &[b]).unwrap();
    let b = g.add(Op::Reshape(Reshape { shape: shape_of(&[1, n, k]) }), &[b]).unwrap();
    let b = g.add(Op::Expand(Expand { shape: shape_of(&[m, n, k]) }), &[b]).unwrap();
    let p = g.add(Op::Binary(BinaryOp::Mul), &[a, b]).unwrap();
    let s = g.add(Op::Reduce(Reduce { op: ReduceOp::Sum, axes: [2usize].into_iter().collect() }), &[p]).unwrap();
    let c = g.add(Op::Reshape(Reshape { shape: shape_of(&[m, n]) }), &[s]).unwrap();
    g.add_output(c);
    g
}

fn filled(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn matmul(c: &mut Criterion) {
    // As the `kiln` command does, so that outputs freed between iterations are reused warm.
    kiln::tune_host_allocator();
    let dev = CpuDevice::new().unwrap();
    let mut group = c.benchmark_group("matmul_f32");
    group.sample_size(20);
    for (m, k, n) in [(512usize, 1024usize, 2048usize), (1024, 1024, 1024)] {
        let exe = dev.compile(&matmul_graph(m, k, n)).unwrap();
        let is_gemm = exe.program().kernels.iter().any(|k| matches!(k, lower::kir::Kernel::Matmul(_)));
        eprintln!("matmul ({m}x{k})@({k}x{n}): lowered to {} launches, GEMM: {is_gemm}", exe.launches());
        let inputs = [
            HostTensor::from_vec(filled(m * k, 1), vec![m, k]).unwrap(),
            HostTensor::from_vec(filled(k * n, 2), vec![k, n]).unwrap(),
        ];
        let b = Bindings::new();
        group.throughput(Throughput::Elements((2 * m * k * n) as u64));
        group.bench_function(format!("({m}x{k})@({k}x{n})"), |bench| bench.iter(|| exe.run(&inputs, &b).unwrap()));
    }
    group.finish();
}

criterion_group!(benches, matmul);
criterion_main!(benches);
