//! Compile time and steady-state run time of equality saturation (`lower::OptLevel`) against the
//! greedy rewrites alone, measured in one process: each workload is compiled at `O1` and at a
//! saturating level on fresh CPU devices (compile times: median of 5), then timed runs
//! alternate between the two programs for several rounds, and each round prints its ratio.
//!
//! ```text
//! cargo run --release -p kiln-cli --example saturate_bench [rounds]
//! ```
//!
//! Last, the saturate pass alone on the 2- and 8-layer Transformer (after the greedy rewrites,
//! as `compile` runs it), warm: the median of 201 calls.
//!
//! Workloads: the matmul chain `(A @ B) @ v` (512x512 matrices, a 512x1 vector) at `O3`
//! (reassociation is fast-math for floats), three projections of one 512x64 input (attention's
//! Q, K and V) at `O2`, the 2- and 8-layer Transformer forward of `kiln profile` at `O2` and
//! `O3`, and the 2-layer forward on 32 sequences of 64 tokens at `O2` (where the QKV merge
//! pays: 2048 rows per projection).

use std::sync::Arc;
use std::time::Instant;

use kiln::Tensor;
use kiln_cli::model::{Gpt, GptConfig};
use kiln_cli::timing::median;
use kiln_cli::workloads::matmul::operand;
use lower::{CompileOptions, OptLevel};
use runtime::CpuDevice;
use runtime::vm::Executable;

struct Workload {
    name: String,
    level: OptLevel,
    program: kiln::Program,
}

fn compile(program: &kiln::Program, level: OptLevel) -> anyhow::Result<(Arc<Executable>, f64)> {
    let mut times = Vec::new();
    let mut exe = None;
    for _ in 0..5 {
        let device = CpuDevice::with_options(CompileOptions { level, ..CompileOptions::default() })?;
        let t0 = Instant::now();
        exe = Some(device.compile(&program.graph)?);
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok((exe.expect("compiled five times"), median(&times)))
}

fn run_ms(exe: &Executable, program: &kiln::Program, runs: usize) -> anyhow::Result<f64> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t0 = Instant::now();
        std::hint::black_box(exe.run(&program.inputs, &program.bindings)?);
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(&times))
}

fn transformer(layers: usize) -> anyhow::Result<kiln::Program> {
    transformer_with(GptConfig { layers, ..GptConfig::default() })
}

fn transformer_with(config: GptConfig) -> anyhow::Result<kiln::Program> {
    let model = Gpt::new(config, 0)?;
    let (outputs, _) = model.outputs(&model.tokens(1))?;
    Ok(kiln::trace(&outputs.iter().collect::<Vec<_>>())?)
}

fn main() -> anyhow::Result<()> {
    kiln::tune_host_allocator();
    let rounds: usize = std::env::args().nth(1).map_or(Ok(3), |a| a.parse())?;
    let chain = {
        let (a, b, v) = (operand(512, 512, 1), operand(512, 512, 2), operand(512, 1, 3));
        kiln::trace(&[&a.matmul(&b).matmul(&v)])?
    };
    let qkv = {
        let x = operand(512, 64, 1);
        let ws: Vec<Tensor> = (0..3).map(|i| operand(64, 64, 2 + i)).collect();
        let outs: Vec<Tensor> = ws.iter().map(|w| x.matmul(w)).collect();
        kiln::trace(&outs.iter().collect::<Vec<_>>())?
    };
    let workloads = vec![
        Workload { name: "matmul chain (A@B)@v 512".into(), level: OptLevel::O3, program: chain },
        Workload { name: "QKV projections 512x64".into(), level: OptLevel::O2, program: qkv },
        Workload { name: "transformer forward, 2 layers".into(), level: OptLevel::O2, program: transformer(2)? },
        Workload { name: "transformer forward, 2 layers".into(), level: OptLevel::O3, program: transformer(2)? },
        Workload { name: "transformer forward, 8 layers".into(), level: OptLevel::O2, program: transformer(8)? },
        // 32 sequences of 64 tokens: 2048 rows per projection, where one wider QKV GEMM reads
        // the normalised activations once instead of three times.
        Workload {
            name: "transformer forward, 2 layers, 32x64 tokens".into(),
            level: OptLevel::O2,
            program: transformer_with(GptConfig { layers: 2, batch: 32, seq: 64, ..GptConfig::default() })?,
        },
    ];
    println!("workload | level | compile O1 ms | compile ms | run O1 ms | run ms | run ratio per round (level / O1)");
    for w in &workloads {
        let (base, base_compile) = compile(&w.program, OptLevel::O1)?;
        let (sat, sat_compile) = compile(&w.program, w.level)?;
        let want = base.run(&w.program.inputs, &w.program.bindings)?;
        let got = sat.run(&w.program.inputs, &w.program.bindings)?;
        for (x, y) in want.iter().zip(&got) {
            let (x, y) = (x.data.to_f64_vec(), y.data.to_f64_vec());
            let worst = x.iter().zip(&y).map(|(a, b)| (a - b).abs() / (1.0 + a.abs())).fold(0.0, f64::max);
            anyhow::ensure!(worst < 1e-3, "{}: results differ by {worst}", w.name);
        }
        let (mut base_ms, mut sat_ms, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let b = run_ms(&base, &w.program, 21)?;
            let s = run_ms(&sat, &w.program, 21)?;
            base_ms.push(b);
            sat_ms.push(s);
            ratios.push(format!("{:.3}", s / b));
        }
        println!(
            "{} | {:?} | {base_compile:.2} | {sat_compile:.2} | {:.3} | {:.3} | {}",
            w.name,
            w.level,
            median(&base_ms),
            median(&sat_ms),
            ratios.join(" ")
        );
    }
    // The saturate pass alone, warm, on the greedy pipeline's output (as `compile` runs it).
    for layers in [2, 8] {
        let mut graph = transformer(layers)?.graph;
        lower::rewrite::optimize(&mut graph);
        let options = lower::saturate::SaturateOptions::default();
        let times: Vec<f64> = (0..201)
            .map(|_| {
                let mut g = graph.clone();
                let t0 = Instant::now();
                std::hint::black_box(lower::saturate::saturate(&mut g, &options));
                t0.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        println!("saturate pass alone, transformer {layers} layers, O2: median of 201 {:.3} ms", median(&times));
    }
    Ok(())
}
