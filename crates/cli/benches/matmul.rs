//! f32 matmul through the CPU device (lowered to `Kernel::Matmul`, run with the `gemm` crate on
//! rayon's pool): the workload `kiln_cli::workloads::matmul` (the shapes and operands
//! `kiln bench matmul` times through the facade), traced once and its compiled executable run
//! directly, so only the launch and the GEMM are timed. Criterion's throughput is in FLOP, so
//! "elem/s" reads as FLOP/s.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use air::Bindings;
use kiln_cli::workloads::matmul::{SHAPES, flops, operands};
use runtime::CpuDevice;

fn matmul(c: &mut Criterion) {
    // As the `kiln` command does, so that outputs freed between iterations are reused warm.
    kiln::tune_host_allocator();
    let dev = CpuDevice::new().unwrap();
    let mut group = c.benchmark_group("matmul_f32");
    group.sample_size(20);
    for (m, k, n) in SHAPES {
        let (a, b) = operands(m, k, n);
        let program = kiln::trace(&[&a.matmul(&b)]).unwrap();
        let exe = dev.compile(&program.graph).unwrap();
        let is_gemm = exe.program().kernels.iter().any(|k| matches!(k, lower::kir::Kernel::Matmul(_)));
        eprintln!("matmul ({m}x{k})@({k}x{n}): lowered to {} launches, GEMM: {is_gemm}", exe.launches());
        let bindings = Bindings::new();
        group.throughput(Throughput::Elements(flops(m, k, n)));
        group.bench_function(format!("({m}x{k})@({k}x{n})"), |bench| {
            bench.iter(|| exe.run(&program.inputs, &bindings).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, matmul);
criterion_main!(benches);
