//! `kiln bench memory`: what the memory planner saves. For each program, the bytes of the one
//! arena holding every temporary (planned: liveness + best-fit placement, `lower::memplan`), the
//! most temporary bytes live at one step (no placement can beat it), and the bytes one allocation
//! per temporary would take (naive). Inputs are read in place and outputs handed back, so neither
//! counts as a temporary.
//!
//! Programs:
//! - a chain of [`CHAIN`] unary primitives (`sin`, `neg` alternating, so no rewrite cancels any)
//!   on an `f32` vector, compiled without fusion: one kernel per op, as if realized one op at a
//!   time, and [`CHAIN`] - 1 temporaries of which only two are ever live;
//! - the same chain fused (kernels of up to `lower::schedule::MAX_DEPTH` ops, so 100 ops make
//!   two kernels and one temporary);
//! - the 2-layer `nn::Transformer` forward of the anchors (dim 64, 8 heads, vocab 64, tokens
//!   10x3).
//!
//! With `--device wgpu` the same programs compile for the wgpu device, and the suite also counts
//! the GPU buffers created by the first run (compile included) and by the second run of the
//! cached program (the target: zero).
//!
//! Then the bounded caches: a fresh device (caches at their default bounds) compiles and runs
//! `--compiles` (10,000) distinct shapes of a small graph, and the suite reports the process's
//! resident memory (`VmRSS` of `/proc/self/status`) before, at every tenth of the way and after,
//! with the cache sizes. Before the caches were bounded, RSS grew by ~13 KiB per program on the
//! CPU without end; with them it levels off once the caches are full.
//!
//! Each program's first-run outputs are checked against `air::interp::eval` of the same graph on
//! the same inputs before anything is reported ([`measure_cpu`], [`measure_wgpu`]).

use air::{DType, Graph, HostTensor, Op, UnaryOp};
use anyhow::bail;
use kiln::Tensor;
use lower::CompileOptions;
#[cfg(feature = "wgpu")]
use runtime::wgpu::WgpuDevice;
use runtime::{CpuDevice, MemoryStats};

use crate::bench::check::{self, Tolerance};
use crate::model::{Gpt, GptConfig};
use crate::output::{Cell, SuiteOutput, Table, progress};
use crate::pipeline::Traced;
use crate::svg::{Plot, Series};

/// Ops in the chain.
pub const CHAIN: usize = 100;

/// Elements of the chain's vector.
pub const ELEMENTS: usize = 65536;

/// Distinct programs the cache measurement compiles.
pub const COMPILES: usize = 10_000;

/// Where the programs compile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemDevice {
    Cpu,
    Wgpu,
}

impl MemDevice {
    /// Parses `--device` (`cpu` or `wgpu`).
    pub fn parse(name: &str) -> anyhow::Result<MemDevice> {
        match name.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(MemDevice::Cpu),
            #[cfg(feature = "wgpu")]
            "wgpu" => Ok(MemDevice::Wgpu),
            #[cfg(not(feature = "wgpu"))]
            "wgpu" => bail!("wgpu support not compiled in (enable the kiln-cli feature \"wgpu\")"),
            other => bail!("kiln bench memory runs on cpu or wgpu, not `{other}`"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Args {
    /// Ops in the chain.
    pub chain: usize,
    /// Elements of the chain's vector.
    pub elements: usize,
    /// The Transformer's sizes.
    pub model: GptConfig,
    pub device: MemDevice,
    /// Distinct programs compiled for the cache measurement.
    pub compiles: usize,
}

impl Default for Args {
    fn default() -> Args {
        Args {
            chain: CHAIN,
            elements: ELEMENTS,
            model: GptConfig::default(),
            device: MemDevice::Cpu,
            compiles: COMPILES,
        }
    }
}

/// What one program plans and, on wgpu, how many buffers its runs create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Measured {
    /// Unique kernels of the program.
    pub kernels: usize,
    /// Launches (dispatches) per run.
    pub launches: usize,
    /// The planned arena, the most temporary bytes live at one step, and one allocation per
    /// temporary.
    pub memory: MemoryStats,
    /// GPU buffers created by compile + first run, and by the second run (wgpu only).
    pub buffers_first_run: Option<u64>,
    pub buffers_second_run: Option<u64>,
}

impl Measured {
    /// naive / planned, `None` when nothing is planned (no temporaries).
    pub fn ratio(&self) -> Option<f64> {
        let m = &self.memory;
        (m.arena_bytes > 0).then(|| m.naive_bytes as f64 / m.arena_bytes as f64)
    }
}

/// `x` through `len` unary primitives, `sin` and `neg` alternating (nothing folds).
pub fn chain(x: &Tensor, len: usize) -> Tensor {
    let mut y = x.clone();
    for i in 0..len {
        y = if i % 2 == 0 { y.sin() } else { y.neg() };
    }
    y
}

/// The traced chain of `len` ops on a vector of `elements` `f32`s.
pub fn chain_program(elements: usize, len: usize) -> anyhow::Result<Traced> {
    let data: Vec<f32> = (0..elements).map(|i| ((i % 89) as f32 - 44.0) / 32.0).collect();
    let x = Tensor::from_vec(data, &[elements]);
    Traced::of(&[&chain(&x, len)])
}

/// The traced Transformer forward of `config` (weights from seed 0, tokens from seed 1) as it
/// runs on `device`: its weights and tokens are moved there first, so the program is the one
/// `realize` would hand that device (on wgpu, for one, the causal mask arrives as a realized
/// `bool` input instead of an `i64` iota comparison, which WGSL cannot compute).
pub fn transformer_program(config: GptConfig, device: kiln::Device) -> anyhow::Result<Traced> {
    config.validate().map_err(anyhow::Error::msg)?;
    let mut gpt = Gpt::new(config, 0)?;
    let mut failure = None;
    nn::ModuleParams::visit_mut(&mut gpt.model, &mut |_, t, _| match t.to_device(device) {
        Ok(moved) => *t = moved,
        Err(e) => failure = Some(e),
    });
    if let Some(e) = failure {
        return Err(e.into());
    }
    let tokens = gpt.tokens(1).to_device(device)?;
    Traced::of(&[&gpt.forward(&tokens)])
}

/// Lowering options with fusion on or off (everything else default).
pub fn options(fuse: bool) -> CompileOptions {
    CompileOptions { fuse, ..CompileOptions::default() }
}

/// Compiles `traced` on `device`, runs it twice (checking the first run's outputs against the
/// interpreter), and reads the plan for its bindings.
pub fn measure_cpu(device: &CpuDevice, traced: &Traced) -> anyhow::Result<Measured> {
    let exe = device.compile(&traced.graph)?;
    let outputs = exe.run(&traced.inputs, &traced.bindings)?;
    check::against_eval("memory program on cpu", traced, &outputs, Tolerance::MODEL)?;
    exe.run(&traced.inputs, &traced.bindings)?;
    let m = exe.memory(&traced.bindings)?;
    Ok(Measured {
        kernels: exe.program().kernels.len(),
        launches: exe.launches(),
        memory: m,
        buffers_first_run: None,
        buffers_second_run: None,
    })
}

/// Compiles `traced` on `device`, runs it twice counting the buffers each run creates (compile
/// counts with the first; the first run's outputs are checked against the interpreter), and reads
/// the plan for its bindings.
#[cfg(feature = "wgpu")]
pub fn measure_wgpu(device: &WgpuDevice, traced: &Traced) -> anyhow::Result<Measured> {
    let before = device.buffers_created();
    let exe = device.compile(&traced.graph)?;
    let outputs = exe.run(&traced.inputs, &traced.bindings)?;
    let after_first = device.buffers_created();
    check::against_eval("memory program on wgpu", traced, &outputs, Tolerance::MODEL)?;
    exe.run(&traced.inputs, &traced.bindings)?;
    let after_second = device.buffers_created();
    let m = exe.memory(&traced.bindings)?;
    Ok(Measured {
        kernels: exe.program().kernels.len(),
        launches: exe.launches(),
        memory: m,
        buffers_first_run: Some(after_first - before),
        buffers_second_run: Some(after_second - after_first),
    })
}

/// The resident set size of this process in bytes (`VmRSS` of `/proc/self/status`), or `None`
/// where there is no such file (not Linux).
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.trim_start_matches("VmRSS:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// `-x` over `f32[n]`: a distinct program (and loop kernel) for every `n`.
pub fn shape_graph(n: usize) -> anyhow::Result<Graph> {
    let mut g = Graph::new();
    let ty = air::TensorType::new(DType::F32, air::dim::shape_of(&[n]));
    let x = g.add_leaf(Op::Input(air::op::Input { slot: 0 }), ty)?;
    let y = g.add(Op::Unary(UnaryOp::Neg), &[x])?;
    g.add_output(y);
    Ok(g)
}

/// One sample of the cache measurement: after `compiles` distinct programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheSample {
    pub compiles: usize,
    /// Resident bytes of the process, when known.
    pub rss_bytes: Option<u64>,
    pub cached_programs: usize,
    /// Kernels in the code generator's cache (CPU only).
    pub cached_kernels: Option<usize>,
}

/// Compiles and runs `compiles` distinct shapes on a fresh device with default cache bounds,
/// sampling RSS and the cache sizes ten times along the way (and before the first).
pub fn measure_caches(device: MemDevice, compiles: usize) -> anyhow::Result<Vec<CacheSample>> {
    // Each device through its own type: the facade's `kiln::Device` is the one device enum, and
    // this measures a device's own caches, which it does not expose.
    match device {
        MemDevice::Cpu => {
            let d = CpuDevice::new()?;
            sample_caches(
                compiles,
                |g, x| d.run(g, x, &Default::default()).map(drop).map_err(Into::into),
                || (d.cached_programs(), Some(d.cached_kernels())),
            )
        }
        #[cfg(not(feature = "wgpu"))]
        MemDevice::Wgpu => bail!("wgpu support not compiled in (enable the kiln-cli feature \"wgpu\")"),
        #[cfg(feature = "wgpu")]
        MemDevice::Wgpu => {
            let d = WgpuDevice::new()?;
            let run = |g: &Graph, x: &[HostTensor]| d.run(g, x, &Default::default()).map(drop).map_err(Into::into);
            sample_caches(compiles, run, || (d.cached_programs(), None))
        }
    }
}

/// The samples of [`measure_caches`]: `run` runs a graph on the device, `cached` reads its
/// program and kernel caches.
fn sample_caches(
    compiles: usize,
    run: impl Fn(&Graph, &[HostTensor]) -> anyhow::Result<()>,
    cached: impl Fn() -> (usize, Option<usize>),
) -> anyhow::Result<Vec<CacheSample>> {
    let step = (compiles / 10).max(1);
    let mut samples = Vec::new();
    for n in 0..=compiles {
        if n > 0 {
            let x = HostTensor::from_vec(vec![1.0f32; n], vec![n]).map_err(anyhow::Error::msg)?;
            run(&shape_graph(n)?, &[x])?;
        }
        if n % step == 0 || n == compiles {
            let (cached_programs, cached_kernels) = cached();
            samples.push(CacheSample { compiles: n, rss_bytes: rss_bytes(), cached_programs, cached_kernels });
        }
    }
    Ok(samples)
}

/// Adds the cache measurement (RSS after `args.compiles` distinct programs) to `out`.
fn cache_table(out: &mut SuiteOutput, args: &Args) -> anyhow::Result<()> {
    let samples = measure_caches(args.device, args.compiles)?;
    let (device, bounds) = match args.device {
        MemDevice::Cpu => (
            "CpuDevice",
            format!(
                "{} programs ({}), {} kernels ({})",
                runtime::cpu::PROGRAM_CACHE_CAPACITY,
                runtime::cpu::PROGRAM_CACHE_ENV,
                codegen::cpu::KERNEL_CACHE_CAPACITY,
                codegen::cpu::KERNEL_CACHE_ENV
            ),
        ),
        #[cfg(not(feature = "wgpu"))]
        MemDevice::Wgpu => bail!("wgpu support not compiled in"),
        #[cfg(feature = "wgpu")]
        MemDevice::Wgpu => (
            "WgpuDevice",
            format!(
                "{} programs ({}), {} pipelines ({})",
                runtime::wgpu::WGPU_PROGRAM_CACHE_CAPACITY,
                runtime::wgpu::WGPU_PROGRAM_CACHE_ENV,
                runtime::wgpu::PIPELINE_CACHE_CAPACITY,
                runtime::wgpu::PIPELINE_CACHE_ENV
            ),
        ),
    };
    let what = format!("fresh {device}, default bounds: {bounds}; `-x` over f32[n], n = 1..={}", args.compiles);
    out.meta("caches", what);
    let mut table = Table::new(
        "caches",
        "Resident memory (VmRSS) while compiling distinct shapes, caches at their default bounds",
        &["programs compiled", "RSS bytes", "cached programs", "cached kernels"],
    );
    for sample in &samples {
        table.push(vec![
            sample.compiles.into(),
            sample.rss_bytes.map_or(Cell::Missing, Cell::Int),
            sample.cached_programs.into(),
            sample.cached_kernels.map_or(Cell::Missing, Cell::from),
        ]);
    }
    out.tables.push(table);
    if let (Some(first), Some(last)) = (samples.first(), samples.last())
        && let (Some(a), Some(b)) = (first.rss_bytes, last.rss_bytes)
    {
        out.notes.push(format!(
            "RSS after {} distinct programs: {:.1} MiB ({:+.1} MiB from a fresh device)",
            last.compiles,
            b as f64 / (1 << 20) as f64,
            (b as f64 - a as f64) / (1 << 20) as f64
        ));
    }
    Ok(())
}

/// Runs the suite.
pub fn run(args: &Args) -> anyhow::Result<SuiteOutput> {
    let cases: [(String, bool); 3] = [
        (format!("chain of {} unary ops, unfused", args.chain), false),
        (format!("chain of {} unary ops, fused", args.chain), true),
        (format!("transformer forward, {} layers", args.model.layers), true),
    ];
    let bar = progress(cases.len() as u64, "memory");
    let chain = chain_program(args.elements, args.chain)?;
    let facade_device = match args.device {
        MemDevice::Cpu => kiln::Device::Cpu,
        MemDevice::Wgpu => kiln::Device::Wgpu,
    };
    let transformer = transformer_program(args.model, facade_device)?;
    let programs = [&chain, &chain, &transformer];

    let mut out = SuiteOutput::new("memory");
    let mut results = Vec::new();
    match args.device {
        MemDevice::Cpu => {
            let unfused = CpuDevice::with_options(options(false))?;
            let fused = CpuDevice::with_options(options(true))?;
            out.meta("device", "cpu (runtime::CpuDevice, one device per fusion setting)");
            for ((name, fuse), traced) in cases.iter().zip(programs) {
                bar.set_message(name.clone());
                results.push(measure_cpu(if *fuse { &fused } else { &unfused }, traced)?);
                bar.inc(1);
            }
        }
        #[cfg(not(feature = "wgpu"))]
        MemDevice::Wgpu => bail!("wgpu support not compiled in"),
        #[cfg(feature = "wgpu")]
        MemDevice::Wgpu => {
            let unfused = WgpuDevice::with_options(options(false))?;
            let fused = WgpuDevice::with_options(options(true))?;
            out.meta("device", format!("wgpu: {}", fused.adapter()));
            for ((name, fuse), traced) in cases.iter().zip(programs) {
                bar.set_message(name.clone());
                results.push(measure_wgpu(if *fuse { &fused } else { &unfused }, traced)?);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();

    let c = &args.model;
    out.meta(
        "chain",
        format!(
            "{} ops (sin, neg alternating) on f32[{}]: {} bytes per buffer",
            args.chain,
            args.elements,
            4 * args.elements
        ),
    );
    out.meta(
        "transformer",
        format!(
            "{} layers, dim {}, {} heads, vocab {}, tokens ({}, {}), forward without gradients",
            c.layers, c.dim, c.heads, c.vocab, c.batch, c.seq
        ),
    );
    let wgpu = args.device == MemDevice::Wgpu;
    let mut columns = vec![
        "program",
        "unique kernels",
        "launches",
        "arena (planned) bytes",
        "peak live bytes",
        "naive bytes",
        "naive/planned",
    ];
    if wgpu {
        columns.extend(["buffers created (run 1)", "buffers created (run 2)"]);
    }
    let mut table = Table::new("plan", "Temporaries: planned arena vs one allocation each", &columns);
    for ((name, _), m) in cases.iter().zip(&results) {
        let mut row: Vec<Cell> = vec![
            name.clone().into(),
            m.kernels.into(),
            m.launches.into(),
            m.memory.arena_bytes.into(),
            m.memory.peak_live_bytes.into(),
            m.memory.naive_bytes.into(),
            m.ratio().into(),
        ];
        if wgpu {
            row.push(m.buffers_first_run.map_or(Cell::Missing, Cell::Int));
            row.push(m.buffers_second_run.map_or(Cell::Missing, Cell::Int));
        }
        table.push(row);
    }
    out.tables.push(table);

    let series = |name: &str, f: fn(&MemoryStats) -> usize| Series {
        name: name.into(),
        points: results.iter().enumerate().map(|(i, m)| ((i + 1) as f64, f(&m.memory) as f64)).collect(),
    };
    out.plots.push((
        "bytes".into(),
        Plot {
            title: "Temporary bytes per program".into(),
            x_label: "program: 1 chain unfused, 2 chain fused, 3 transformer".into(),
            y_label: "bytes".into(),
            log_x: false,
            log_y: true,
            series: vec![
                series("naive", |m| m.naive_bytes),
                series("arena (planned)", |m| m.arena_bytes),
                series("peak live", |m| m.peak_live_bytes),
            ],
        },
    ));
    if results.iter().any(|m| m.memory.arena_bytes == 0) {
        out.notes.push("zero bytes (a program without temporaries) are left off the log-scale plot".into());
    }
    cache_table(&mut out, args)?;
    if wgpu {
        let second: u64 = results.iter().filter_map(|m| m.buffers_second_run).sum();
        out.notes.push(if second == 0 {
            "target met: the second run of every cached program created no buffer".into()
        } else {
            format!("target missed: second runs created {second} buffers (target 0)")
        });
    }
    Ok(out)
}
