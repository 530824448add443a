//! Benchmarks the wgpu device: unary neg/sigmoid eager vs lazy over a range of sizes, f32 matmul
//! GFLOP/s, planned vs naive GPU memory, and buffers created by a repeat run.
//!
//! `cargo run --release -p kiln-runtime --example wgpu_bench -- [--max-n N] [--matmul N] [--reps R]`
//!
//! Eager runs every primitive op as its own program (a host round trip per op, as a device without
//! laziness would); lazy builds the whole expression as one graph (one fused kernel). Times are
//! medians of `--reps` runs after a warm-up, host tensors in and out (uploads and downloads
//! included). Sigmoid is `recip(1 + exp2(x * -log2(e)))`: four primitive ops.

use std::time::Instant;

use air::{Bindings, Graph, HostTensor};
use kiln_runtime::wgpu::WgpuDevice;

const SIZES: [usize; 7] = [1, 729, 2187, 59049, 177147, 531441, 1594323];

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn parse(text: &str) -> Graph {
    air::text::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn tensor(shape: &[usize], scale: f32) -> HostTensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (((i * 7919) % 2003) as f32 / 1001.5 - 1.0) * scale).collect();
    HostTensor::from_vec(v, shape.to_vec()).expect("shape")
}

/// Median seconds of `reps` calls of `f` after one warm-up call.
fn median(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn unary_graph(op: &str, n: usize) -> Graph {
    parse(&format!("graph {{\n n0 = input 0 : f32[{n}]\n n1 = {op} n0 : f32[{n}]\n return n1\n}}"))
}

fn const_graph(op: &str, value: &str, n: usize) -> Graph {
    parse(&format!(
        "graph {{\n n0 = input 0 : f32[{n}]\n n1 = const {value} : f32[{n}]\n n2 = {op} n0, n1 : f32[{n}]\n return n2\n}}"
    ))
}

fn sigmoid_graph(n: usize) -> Graph {
    parse(&format!(
        "graph {{\n n0 = input 0 : f32[{n}]\n n1 = const -1.4426950408889634 : f32[{n}]\n n2 = mul n0, n1 : f32[{n}]\n n3 = exp2 n2 : f32[{n}]\n n4 = const 1.0 : f32[{n}]\n n5 = add n3, n4 : f32[{n}]\n n6 = recip n5 : f32[{n}]\n return n6\n}}"
    ))
}

/// `x @ w` applied `chain` times in one graph (`[n, n]` each).
fn matmul_chain(n: usize, chain: usize) -> Graph {
    let mut text = format!("graph {{\n x0 = input 0 : f32[1, {n}, {n}]\n w = input 1 : f32[1, {n}, {n}]\n");
    text += &format!(
        " wt = permute [0, 2, 1] w : f32[1, {n}, {n}]\n wr = reshape [1, 1, {n}, {n}] wt : f32[1, 1, {n}, {n}]\n"
    );
    text += &format!(" we = expand [1, {n}, {n}, {n}] wr : f32[1, {n}, {n}, {n}]\n");
    for i in 0..chain {
        text += &format!(
            " a{i} = reshape [1, {n}, 1, {n}] x{i} : f32[1, {n}, 1, {n}]\n e{i} = expand [1, {n}, {n}, {n}] a{i} : f32[1, {n}, {n}, {n}]\n p{i} = mul e{i}, we : f32[1, {n}, {n}, {n}]\n s{i} = reduce sum axes=[3] p{i} : f32[1, {n}, {n}, 1]\n x{} = reshape [1, {n}, {n}] s{i} : f32[1, {n}, {n}]\n",
            i + 1
        );
    }
    text += &format!(" return x{chain}\n}}");
    parse(&text)
}

fn main() {
    let max_n = arg("--max-n", usize::MAX);
    let mm = arg("--matmul", 4096);
    let reps = arg("--reps", 9);
    let dev = match WgpuDevice::new() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("no wgpu device: {e}");
            std::process::exit(2);
        }
    };
    let fused = dev.clone();
    let unfused =
        WgpuDevice::with_options(lower::CompileOptions { fuse: false, ..Default::default() }).expect("device");
    let b = Bindings::new();
    println!("adapter: {}", dev.adapter());
    println!("{:>9} | {:>11} {:>11} | {:>13} {:>13}", "n", "neg eager", "neg lazy", "sigmoid eager", "sigmoid lazy");
    println!("{:->9}-+-{:->11}-{:->11}-+-{:->13}-{:->13}", "", "", "", "", "");
    for n in SIZES.into_iter().filter(|&n| n <= max_n) {
        let x = tensor(&[n], 4.0);
        let neg = fused.compile(&unary_graph("neg", n)).expect("compile");
        let neg_lazy = median(reps, || drop(neg.run(std::slice::from_ref(&x), &b).expect("run")));
        // Eager neg is the same single op; it still goes through the program cache per call.
        let neg_eager =
            median(reps, || drop(fused.run(&unary_graph("neg", n), std::slice::from_ref(&x), &b).expect("run")));
        let sig = fused.compile(&sigmoid_graph(n)).expect("compile");
        let sig_lazy = median(reps, || drop(sig.run(std::slice::from_ref(&x), &b).expect("run")));
        let ops = [
            const_graph("mul", "-1.4426950408889634", n),
            unary_graph("exp2", n),
            const_graph("add", "1.0", n),
            unary_graph("recip", n),
        ];
        let sig_eager = median(reps, || {
            let mut v = x.clone();
            for g in &ops {
                v = fused.run(g, &[v], &b).expect("run").remove(0);
            }
        });
        let us = |s: f64| format!("{:.1} us", s * 1e6);
        println!("{n:>9} | {:>11} {:>11} | {:>13} {:>13}", us(neg_eager), us(neg_lazy), us(sig_eager), us(sig_lazy));
    }

    let (a, w) = (tensor(&[1, mm, mm], 1.0), tensor(&[1, mm, mm], 1.0 / (mm as f32).sqrt()));
    let single = dev.compile(&matmul_chain(mm, 1)).expect("compile");
    let t1 = median(reps.min(5), || drop(single.run(&[a.clone(), w.clone()], &b).expect("run")));
    let chain = 8;
    let many = dev.compile(&matmul_chain(mm, chain)).expect("compile");
    let t8 = median(reps.min(5), || drop(many.run(&[a.clone(), w.clone()], &b).expect("run")));
    let flop = 2.0 * (mm as f64).powi(3);
    println!(
        "matmul {mm}^3 f32: {:.1} GFLOP/s end to end ({:.2} ms incl. upload/download); {:.1} GFLOP/s over {chain} chained in one program (strategies {:?})",
        flop / t1 / 1e9,
        t1 * 1e3,
        flop * chain as f64 / t8 / 1e9,
        many.strategies().first().copied().unwrap_or("-"),
    );

    let n = SIZES.into_iter().filter(|&n| n <= max_n).max().unwrap_or(1);
    for (what, d, g) in [
        ("unfused sigmoid", &unfused, sigmoid_graph(n)),
        ("unfused softmax", &unfused, softmax(64, n.div_ceil(64))),
        ("matmul chain", &dev, matmul_chain(mm, chain)),
    ] {
        let exe = d.compile(&g).expect("compile");
        let m = exe.memory(&b).expect("memory");
        let io = exe.io_bytes(&b).expect("io bytes");
        println!(
            "peak GPU temp memory, {what}: planned arena {} bytes vs naive {} bytes (peak live {}), io {io} bytes",
            m.arena_bytes, m.naive_bytes, m.peak_live_bytes
        );
    }
    let exe = unfused.compile(&sigmoid_graph(n)).expect("compile");
    let x = tensor(&[n], 4.0);
    exe.run(std::slice::from_ref(&x), &b).expect("run");
    let before = unfused.buffers_created();
    exe.run(std::slice::from_ref(&x), &b).expect("run");
    println!("buffers created on the second run: {}", unfused.buffers_created() - before);
}

fn softmax(rows: usize, cols: usize) -> Graph {
    parse(&format!(
        "graph {{\n n0 = input 0 : f32[{rows}, {cols}]\n n1 = reduce max axes=[1] n0 : f32[{rows}, 1]\n n2 = expand [{rows}, {cols}] n1 : f32[{rows}, {cols}]\n n3 = sub n0, n2 : f32[{rows}, {cols}]\n n4 = exp2 n3 : f32[{rows}, {cols}]\n n5 = reduce sum axes=[1] n4 : f32[{rows}, 1]\n n6 = expand [{rows}, {cols}] n5 : f32[{rows}, {cols}]\n n7 = recip n6 : f32[{rows}, {cols}]\n n8 = mul n4, n7 : f32[{rows}, {cols}]\n return n8\n}}"
    ))
}
