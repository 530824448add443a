//! Tree of matmuls, the workload `kiln_cli::workloads::tree` (also `kiln bench tree-matmul`):
//! N = 32 independent `(128x256)@(256x512)` f32 products (1.07 GFLOP per call),
//! the anchor `bench_tree_matmul.py` measures in PyTorch (6.4 ms dict loop, 5.6 ms pre-stacked
//! `bmm`, 2 threads). Three ways through the public API (`kiln::realize` on `Device::Cpu`):
//!
//! - `loop`: one realize per product (32 program runs);
//! - `tree`: `Tree::matmul` and one realize of the whole tree (one program; the 32 matmul steps
//!   form one grouped GEMM launch, its problems split over the cores);
//! - `bmm`: one batched matmul of pre-stacked `[32, 128, 256]` and `[32, 256, 512]` operands;
//! - `tree_run`: the tree's compiled executable run directly (no tracing), the VM's share.
//!
//! Criterion's throughput is in FLOP, so "elem/s" reads as FLOP/s.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use kiln::{Device, HostTensor, Tensor};
use kiln_cli::workloads::tree::{self, Shape, stacked, tree_of};
use runtime::CpuDevice;

/// The workload's operand of `rows x cols`, on the CPU device.
fn filled(rows: usize, cols: usize, seed: usize) -> Tensor {
    tree::operand(rows, cols, seed).to_device(Device::Cpu).unwrap()
}

/// User + system CPU seconds of this process so far (all threads), from `/proc/self/stat`; 0 where
/// that file does not exist.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses): utime and stime are 14 and 15.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Realizes `outputs` (one program on the facade's CPU device) and returns their data.
fn run(outputs: &[&Tensor]) -> Vec<HostTensor> {
    kiln::realize(outputs).unwrap();
    outputs.iter().map(|t| t.to_host().unwrap()).collect()
}

fn tree_matmul(c: &mut Criterion) {
    // As the `kiln` command does, so that outputs freed between iterations are reused warm.
    kiln::tune_host_allocator();
    let dev = CpuDevice::new().unwrap();
    let shape = Shape::default();
    let out_size = shape.m * shape.n;
    let on_cpu =
        |ts: Vec<Tensor>| -> Vec<Tensor> { ts.into_iter().map(|t| t.to_device(Device::Cpu).unwrap()).collect() };
    let (a, b) = tree::operands(shape);
    let (a, b) = (on_cpu(a), on_cpu(b));
    let (sa, sb) = (stacked(&a), stacked(&b));
    let (a, b) = (tree_of(&a).unwrap(), tree_of(&b).unwrap());
    sa.realize().unwrap();
    sb.realize().unwrap();

    // The three agree.
    let tree_out = run(&a.matmul(&b).leaves());
    let bmm_out = run(&[&sa.matmul(&sb)]);
    let bmm = bmm_out[0].as_slice::<f32>().unwrap();
    for (i, t) in tree_out.iter().enumerate() {
        assert_eq!(t.as_slice::<f32>().unwrap(), &bmm[i * out_size..(i + 1) * out_size]);
    }
    let program = kiln::trace(&a.matmul(&b).leaves()).unwrap();
    let exe = dev.compile(&program.graph).unwrap();
    eprintln!(
        "tree_matmul: the tree is one program of {} launches over {} kernels; levels:\n{}",
        exe.launches(),
        exe.program().kernels.len(),
        lower::batch::describe(exe.program()).unwrap()
    );

    // CPU time per call (user + system, all threads, idle pool threads spinning included) and
    // the fastest wall time of 60 calls: on a shared machine both are steadier than the mean.
    let inputs = &program.inputs;
    let in_order = CpuDevice::with_level_threshold(lower::CompileOptions::default(), None).unwrap();
    let exe_in_order = in_order.compile(&program.graph).unwrap();
    let bindings = kiln::Bindings::new();
    let cpu = |name: &str, f: &mut dyn FnMut()| {
        f();
        let reps = 60;
        let (mut fastest, c0) = (f64::INFINITY, cpu_seconds());
        let t0 = std::time::Instant::now();
        for _ in 0..reps {
            let t = std::time::Instant::now();
            f();
            fastest = fastest.min(t.elapsed().as_secs_f64());
        }
        let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
        eprintln!(
            "tree_matmul {name:>18}: {:6.2} ms CPU per call, {:6.2} ms wall (mean), {:6.2} ms wall (fastest)",
            cpu * 1e3 / reps as f64,
            wall * 1e3 / reps as f64,
            fastest * 1e3
        );
    };
    cpu("loop", &mut || {
        for (x, y) in a.leaves().into_iter().zip(b.leaves()) {
            run(&[&x.matmul(y)]);
        }
    });
    cpu("tree", &mut || drop(run(&a.matmul(&b).leaves())));
    cpu("tree_trace_only", &mut || drop(kiln::trace(&a.matmul(&b).leaves()).unwrap()));
    cpu("tree_trace_compile", &mut || drop(dev.compile(&kiln::trace(&a.matmul(&b).leaves()).unwrap().graph).unwrap()));
    cpu("bmm", &mut || drop(run(&[&sa.matmul(&sb)])));
    cpu("tree_run", &mut || drop(exe.run(inputs, &bindings).unwrap()));
    cpu("tree_run_in_order", &mut || drop(exe_in_order.run(inputs, &bindings).unwrap()));

    let mut group = c.benchmark_group("tree_matmul");
    group.sample_size(30);
    group.throughput(Throughput::Elements(shape.flops()));
    group.bench_function("loop", |bench| {
        bench.iter(|| {
            for (x, y) in a.leaves().into_iter().zip(b.leaves()) {
                run(&[&x.matmul(y)]);
            }
        })
    });
    group.bench_function("tree", |bench| bench.iter(|| run(&a.matmul(&b).leaves())));
    group.bench_function("bmm", |bench| bench.iter(|| run(&[&sa.matmul(&sb)])));
    group.bench_function("tree_run", |bench| bench.iter(|| exe.run(&program.inputs, &bindings).unwrap()));
    // The same program with the steps in order, each GEMM threaded over the cores.
    group.bench_function("tree_run_in_order", |bench| {
        bench.iter(|| exe_in_order.run(&program.inputs, &bindings).unwrap())
    });
    group.finish();
}

/// Where running a level's steps at the same time starts to pay: 32 products of `s x s`
/// matrices, run by levels (the threshold decides) and in order. The first line of each size says
/// what the threshold chose.
fn threshold(c: &mut Criterion) {
    // As the `kiln` command does, so that outputs freed between iterations are reused warm.
    kiln::tune_host_allocator();
    let by_levels = CpuDevice::new().unwrap();
    let in_order = CpuDevice::with_level_threshold(lower::CompileOptions::default(), None).unwrap();
    let forced = CpuDevice::with_level_threshold(lower::CompileOptions::default(), Some(0)).unwrap();
    let mut group = c.benchmark_group("tree_threshold");
    group.sample_size(20);
    let pairs = Shape::default().pairs;
    for s in [4usize, 8, 16, 24, 32, 64] {
        let a: Vec<Tensor> = (0..pairs).map(|i| filled(s, s, 2 * i)).collect();
        let b: Vec<Tensor> = (0..pairs).map(|i| filled(s, s, 2 * i + 1)).collect();
        let products: Vec<Tensor> = a.iter().zip(&b).map(|(x, y)| x.matmul(y)).collect();
        let program = kiln::trace(&products.iter().collect::<Vec<_>>()).unwrap();
        let bindings = kiln::Bindings::new();
        let chosen = by_levels.compile(&program.graph).unwrap();
        let schedule = chosen.level_schedule(&bindings).unwrap();
        eprintln!("tree_threshold: 32 x ({s}x{s})@({s}x{s}): concurrent = {}", schedule.is_some());
        group.throughput(Throughput::Elements(Shape { pairs, m: s, k: s, n: s }.flops()));
        for (name, dev) in [("threshold", &by_levels), ("in_order", &in_order), ("concurrent", &forced)] {
            let exe = dev.compile(&program.graph).unwrap();
            group.bench_function(format!("{s}/{name}"), |bench| {
                bench.iter(|| exe.run(&program.inputs, &bindings).unwrap())
            });
        }
    }
    group.finish();
}

criterion_group!(benches, tree_matmul, threshold);
criterion_main!(benches);
