//! `neg` and `sigmoid` on 1-D `f32` tensors through the public facade on the CPU device: the
//! workload `kiln_cli::workloads::unary`, the same three quantities `kiln bench unary` prints (see
//! `crates/cli/src/bench/unary.rs`):
//!
//! - `single`: one fresh op on a realized source, realized (`x.neg()` then `realize`): the time
//!   of one `realize` of a one-op program.
//! - `eager`: a chain of [`CHAIN`] ops realized after every op (each op reads the previous op's
//!   realized result), reported per op (chain time / [`CHAIN`]).
//! - `lazy`: the same chain recorded lazily and realized once (the compiler fuses it into one
//!   kernel), reported per op (chain time / [`CHAIN`]).
//!
//! Steady state: each program is compiled during warm-up, so the timed runs hit the program
//! cache. Criterion reports its own estimate (mean of the per-iteration slope) where the CLI
//! reports the median of its runs; the quantity measured is the same. `neg` chains of even
//! length fold away (`neg-neg`), so lazy `neg` measures the rewriter's saving, not a kernel.
//!
//! Measurement times are short (the whole bench runs in about a minute; `-- --quick` is
//! faster still).

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kiln::{Device, Tensor};
use kiln_cli::workloads::unary::{CHAIN, SIZES, UnaryOp, eager_chain, input, lazy_chain};

/// The workload's input of `n` elements, realized on the CPU device.
fn source(n: usize) -> Tensor {
    let x = input(n).to_device(Device::Cpu).expect("the cpu device");
    x.realize().expect("the source realizes");
    x
}

fn realize(t: &Tensor) {
    kiln::realize(&[t]).expect("realize");
}

/// Per-op time of `iters` chains (each chain's time divided by [`CHAIN`]).
fn per_op(iters: u64, mut chain: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        chain();
    }
    start.elapsed() / CHAIN as u32
}

fn unary(c: &mut Criterion) {
    // As the `kiln` command does, so that outputs freed between iterations are reused warm.
    kiln::tune_host_allocator();
    for op in UnaryOp::ALL {
        let mut group = c.benchmark_group(format!("unary_{}", op.name()));
        group.sample_size(10);
        group.warm_up_time(Duration::from_millis(200));
        group.measurement_time(Duration::from_millis(500));
        for n in SIZES {
            let x = source(n);
            group.bench_with_input(BenchmarkId::new("single", n), &x, |b, x| {
                b.iter(|| {
                    let y = op.apply(x);
                    realize(&y);
                    y
                })
            });
            group.bench_with_input(BenchmarkId::new("eager", n), &x, |b, x| {
                b.iter_custom(|iters| {
                    per_op(iters, || {
                        let y = eager_chain(op, x, |y| kiln::realize(&[&y]).map(|()| y));
                        let _ = std::hint::black_box(y.expect("realize"));
                    })
                })
            });
            group.bench_with_input(BenchmarkId::new("lazy", n), &x, |b, x| {
                b.iter_custom(|iters| {
                    per_op(iters, || {
                        let y = lazy_chain(op, x);
                        realize(&y);
                        let _ = std::hint::black_box(y);
                    })
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, unary);
criterion_main!(benches);
