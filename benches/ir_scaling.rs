//! Benchmark: air graph operations (build, users, replace, topo sort, dead-code removal) at 1k..1M
//! nodes, reported per node (`Throughput::Elements`) so that linear scaling shows as a flat cost.
//!
//! The graph is a long chain of unary ops with a fan-out/fan-in diamond every few nodes and an
//! unused side node now and then (for `remove_dead` to find). Run with
//! `cargo bench --bench ir_scaling` (about a minute) or add `-- --quick` for a rougher pass.

use std::hint::black_box;
use std::time::Duration;

use air::op::{Input, TensorType};
use air::{BinaryOp, DType, Dim, Graph, NodeId, Op, UnaryOp};
use criterion::{BatchSize, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};

const SIZES: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];

/// About `n` nodes: `x -> neg -> exp2 -> (log2, sqrt) -> add -> ...`, plus a dead `sin` every 16.
fn build_graph(n: usize) -> Graph {
    let mut g = Graph::with_capacity(n);
    let ty = TensorType::new(DType::F32, [Dim::from(16), Dim::sym("seq")].into_iter().collect::<air::Shape>());
    let mut cur = g.add_leaf(Op::Input(Input { slot: 0 }), ty).expect("input");
    let mut step = 0usize;
    while g.len() < n {
        step += 1;
        cur = match step % 4 {
            0 => {
                // Fan out to two readers, fan back in.
                let a = unary(&mut g, UnaryOp::Log2, cur);
                let b = unary(&mut g, UnaryOp::Sqrt, cur);
                g.add(Op::Binary(BinaryOp::Add), &[a, b]).expect("add")
            }
            1 => unary(&mut g, UnaryOp::Neg, cur),
            _ => unary(&mut g, UnaryOp::Exp2, cur),
        };
        if step.is_multiple_of(16) {
            unary(&mut g, UnaryOp::Sin, cur);
        }
    }
    g.add_output(cur);
    g
}

fn unary(g: &mut Graph, op: UnaryOp, input: NodeId) -> NodeId {
    g.add(Op::Unary(op), &[input]).expect("unary")
}

/// A copy of `g` whose cached topological order is dropped (an edit that changes nothing).
fn fresh_copy(g: &Graph) -> Graph {
    let mut copy = g.clone();
    let last = *copy.outputs().last().expect("an output");
    let node = copy.node(last).clone();
    copy.set_op(last, node.op, node.ty);
    copy
}

fn ir_scaling(c: &mut Criterion) {
    for n in SIZES {
        let mut group = c.benchmark_group("ir");
        group.throughput(Throughput::Elements(n as u64));
        if n >= 100_000 {
            group.sampling_mode(SamplingMode::Flat);
            group.sample_size(10);
            group.warm_up_time(Duration::from_millis(300));
            group.measurement_time(Duration::from_secs(if n >= 1_000_000 { 3 } else { 2 }));
        } else {
            group.sample_size(30);
            group.warm_up_time(Duration::from_millis(300));
            group.measurement_time(Duration::from_secs(1));
        }
        let base = build_graph(n);
        let ids: Vec<NodeId> = base.ids().collect();

        group.bench_function(BenchmarkId::new("build", n), |b| b.iter(|| build_graph(black_box(n))));

        group.bench_function(BenchmarkId::new("users", n), |b| {
            b.iter(|| ids.iter().map(|&id| base.users(id).len()).sum::<usize>())
        });

        // Bypass every `neg` (each has one input): what a `neg-neg` style rewrite does.
        let negs: Vec<(NodeId, NodeId)> = ids
            .iter()
            .filter(|&&id| base.op(id) == &Op::Unary(UnaryOp::Neg))
            .map(|&id| (id, base.inputs(id)[0]))
            .collect();
        group.bench_function(BenchmarkId::new("replace_all_uses", n), |b| {
            b.iter_batched(
                || base.clone(),
                |mut g| {
                    for &(old, new) in &negs {
                        g.replace_all_uses_unchecked(old, new);
                    }
                    g
                },
                BatchSize::LargeInput,
            )
        });

        group.bench_function(BenchmarkId::new("topo_order", n), |b| {
            b.iter_batched(
                || fresh_copy(&base),
                |g| {
                    black_box(g.topo_order().len());
                    g
                },
                BatchSize::LargeInput,
            )
        });

        group.bench_function(BenchmarkId::new("remove_dead", n), |b| {
            b.iter_batched(
                || fresh_copy(&base),
                |mut g| {
                    black_box(g.remove_dead());
                    g
                },
                BatchSize::LargeInput,
            )
        });
        group.finish();
    }
}

criterion_group!(benches, ir_scaling);
criterion_main!(benches);
