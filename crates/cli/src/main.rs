//! `kiln`: profile a compilation pass by pass, and run the benchmark suites.
//!
//! ```text
//! kiln profile transformer --layers 2 [--start-pos 2] [--launches 10] [--trace t.json] [--dump dir]
//! kiln generate --weights model.safetensors --prompt "..." [--max-new-tokens 32] [--temperature T --top-k K --top-p P --seed S]
//! kiln bench transformer-compile [--layers 1,2,4,8,16,32] [--fresh-process N] [--out dir] [--smoke]
//! kiln bench unary | models | tree-matmul | matmul [--device cpu] [--out dir] [--smoke]
//! kiln bench decode [--out dir] [--smoke]
//! kiln bench memory [--device cpu|wgpu] [--chain 100] [--elements 65536] [--compiles 10000] [--out dir] [--smoke]
//! kiln profile model conv-32 [--fit] [--launches 10] [--trace t.json] [--dump DIR]
//! kiln onnx info model.onnx
//! kiln onnx run model.onnx --input x=x.npy [--expect y=y.npy] [--out DIR] [--device cpu]
//! kiln profile onnx model.onnx [--dim batch=8] [--no-fuse] [--trace t.json] [--launches 10] [--dump DIR]
//! kiln bench onnx model.onnx [--dim batch=8] [--device cpu] [--smoke]
//! ```
//!
//! `-v` (repeatable) or `RUST_LOG=info|debug|trace` shows the libraries' `log` records on stderr
//! (the wgpu adapter, `KILN_DISASM` listings); Kiln's warnings and errors show by default. The command
//! allocates through mimalloc (see `ALLOC`), not glibc's `malloc`, so it has no use for the
//! library's glibc tuning (`kiln::tune_host_allocator`, which criterion's benches apply).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use kiln_cli::bench;
use kiln_cli::model::GptConfig;
use kiln_cli::output::SuiteOutput;
use kiln_cli::runner::Runner;
use kiln_cli::timing::Budget;
use kiln_cli::{dump, onnx_cmd, profile_cmd};

/// mimalloc under the profiler's counting ([`kiln_cli::Allocator`]).
#[global_allocator]
static ALLOC: kiln_cli::Allocator = kiln_cli::ALLOCATOR;

#[derive(Parser)]
#[command(name = "kiln", version, about = "Kiln: profile compilations and run the benchmark suites")]
struct Cli {
    /// Show log records: -v info, -vv debug, -vvv trace (default: Kiln's warnings; or
    /// `RUST_LOG=<level>`).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile a model once under the profiler and print the per-pass table.
    #[command(subcommand)]
    Profile(ProfileTarget),
    /// Run a benchmark suite.
    #[command(subcommand)]
    Bench(Suite),
    /// Generate text from a GPT-2 checkpoint (Hugging Face safetensors), streamed as it decodes.
    Generate(GenerateCli),
    /// Inspect or run an ONNX model.
    #[command(subcommand)]
    Onnx(OnnxCmd),
}

#[derive(Subcommand)]
enum OnnxCmd {
    /// Inputs, outputs, weights, the op histogram and the ops Kiln does not support.
    Info {
        /// The .onnx file.
        model: PathBuf,
    },
    /// Run the model once on inputs from files; describe, write and check its outputs.
    Run {
        /// The .onnx file.
        model: PathBuf,
        /// A graph input's tensor, a .npy or .pb (TensorProto) file: --input NAME=FILE, one per
        /// input; their shapes give the model's symbolic dims.
        #[arg(long = "input", value_name = "NAME=FILE")]
        inputs: Vec<String>,
        /// A reference for an output (.npy or .pb): --expect NAME=FILE; a difference beyond the
        /// tolerance is an error.
        #[arg(long = "expect", value_name = "NAME=FILE")]
        expect: Vec<String>,
        /// Relative tolerance of --expect: |got - want| <= atol + rtol * |want|.
        #[arg(long, default_value_t = 1e-4)]
        rtol: f64,
        /// Absolute tolerance of --expect.
        #[arg(long, default_value_t = 1e-5)]
        atol: f64,
        /// Write every output to DIR/NAME.npy.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        #[command(flatten)]
        device: DeviceArg,
    },
}

#[derive(Args)]
struct OnnxArgs {
    /// The .onnx file.
    model: PathBuf,
    /// The size of a symbolic input dim (the file's dim_param), e.g. --dim batch=8; repeatable.
    #[arg(long = "dim", value_name = "NAME=SIZE")]
    dims: Vec<String>,
}

#[derive(Args)]
struct GenerateCli {
    /// The model's safetensors file; a `config.json` beside it gives the number of heads.
    #[arg(long)]
    weights: PathBuf,
    /// The text to continue.
    #[arg(long)]
    prompt: String,
    /// The most tokens to generate (stops early at <|endoftext|>).
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// Sample with this temperature (default: greedy).
    #[arg(long)]
    temperature: Option<f32>,
    /// Sample among the K most likely tokens.
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample among the most likely tokens whose probabilities sum to P.
    #[arg(long)]
    top_p: Option<f32>,
    /// The sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Attention heads per block, when no config.json gives them.
    #[arg(long)]
    n_heads: Option<usize>,
}

#[derive(Subcommand)]
enum ProfileTarget {
    /// The GPT-style decoder of `nn` (the anchor benchmark's model).
    Transformer(ProfileArgs),
    /// A model of the suite of `kiln bench models` (`nn::zoo`): its predict program, or with
    /// --fit its loss and gradients.
    Model {
        /// The model: dense-tiny, dense-large, conv-1, conv-32, simple-rnn, gru, lstm, mobilenet
        /// or attention.
        name: String,
        /// Profile the training program (loss and every parameter's gradient) instead.
        #[arg(long)]
        fit: bool,
        #[command(flatten)]
        out: ProfileOut,
    },
    /// An imported ONNX model (inputs: a fixed pattern; symbolic dims from --dim).
    Onnx {
        #[command(flatten)]
        onnx: OnnxArgs,
        #[command(flatten)]
        out: ProfileOut,
    },
}

impl ProfileTarget {
    /// The launch table's kernel count, when asked for.
    fn launches(&self) -> Option<usize> {
        match self {
            ProfileTarget::Transformer(args) => args.launches,
            ProfileTarget::Model { out, .. } | ProfileTarget::Onnx { out, .. } => out.launches,
        }
    }
}

/// What `kiln profile model` and `kiln profile onnx` can add to the per-pass table.
#[derive(Args, Clone)]
struct ProfileOut {
    /// Compile without fusion (one kernel per element-wise or reduce op).
    #[arg(long)]
    no_fuse: bool,
    /// Write the spans as a Chrome trace-event file (opens in Perfetto).
    #[arg(long, value_name = "FILE.json")]
    trace: Option<PathBuf>,
    /// Also time every launch of the compiled program (median of 11 runs, and its time in the
    /// program's first run) and list the N kernels that take the most time.
    #[arg(long, value_name = "N")]
    launches: Option<usize>,
    /// Write the graph after each pass (air text, DOT), the kernel IR and the CLIF into DIR.
    #[arg(long, value_name = "DIR")]
    dump: Option<PathBuf>,
    /// Profile the first compilation of the process, with its one-time start-up costs (by
    /// default the same program is compiled and run once untimed first, on a device of its own;
    /// the profiled compilation is still uncached).
    #[arg(long)]
    cold: bool,
}

impl ProfileOut {
    /// The line under the table that says which compilation it shows.
    fn footnote(&self) -> String {
        footnote(self.cold, "compilation and run of the same program")
    }
}

/// The line under a profile's table: the process's first compilation (`cold`), or one after an
/// untimed `warm_up`.
fn footnote(cold: bool, warm_up: &str) -> String {
    if cold {
        "(cold: the first compilation of this process, start-up costs included)".into()
    } else {
        format!("(after one untimed {warm_up}, so process start-up costs are left out; --cold includes them)")
    }
}

#[derive(Args, Clone)]
struct ModelArgs {
    /// Model width.
    #[arg(long, default_value_t = 64)]
    dim: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 8)]
    heads: usize,
    /// Vocabulary size.
    #[arg(long, default_value_t = 64)]
    vocab: usize,
    /// Learned positions.
    #[arg(long, default_value_t = 64)]
    max_seq: usize,
    /// Sequences per batch.
    #[arg(long, default_value_t = 10)]
    batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 3)]
    seq: usize,
    /// Compile the forward with a key/value cache, its tokens at this start position (a symbol
    /// of the program, as are the tokens per sequence).
    #[arg(long)]
    start_pos: Option<usize>,
}

impl ModelArgs {
    fn config(&self, layers: usize) -> GptConfig {
        GptConfig {
            layers,
            dim: self.dim,
            heads: self.heads,
            vocab: self.vocab,
            max_seq: self.max_seq,
            batch: self.batch,
            seq: self.seq,
            start_pos: self.start_pos,
        }
    }
}

#[derive(Args)]
struct ProfileArgs {
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    #[command(flatten)]
    model: ModelArgs,
    /// Write the spans as a Chrome trace-event file (opens in Perfetto).
    #[arg(long, value_name = "FILE.json")]
    trace: Option<PathBuf>,
    /// Write the graph after each pass (air text, DOT), the kernel IR and the CLIF into DIR.
    #[arg(long, value_name = "DIR")]
    dump: Option<PathBuf>,
    /// Compile without fusion (one kernel per element-wise or reduce op).
    #[arg(long)]
    no_fuse: bool,
    /// Profile the first compilation of the process, with its one-time start-up costs (by
    /// default an untimed 1-layer compilation runs first; the profiled one is still uncached).
    #[arg(long)]
    cold: bool,
    /// Also time every launch of the compiled program (median of 11 runs, and its time in the
    /// program's first run) and list the N kernels that take the most time.
    #[arg(long, value_name = "N")]
    launches: Option<usize>,
    /// Optimization level: 1 greedy rewrites only, 2 also equality saturation (exact rules),
    /// 3 also fast-math saturation (float matmul reassociation). Default: `KILN_OPT`, else 1.
    #[arg(long, value_name = "LEVEL")]
    opt: Option<u8>,
}

fn opt_level(level: u8) -> anyhow::Result<lower::OptLevel> {
    Ok(match level {
        1 => lower::OptLevel::O1,
        2 => lower::OptLevel::O2,
        3 => lower::OptLevel::O3,
        other => anyhow::bail!("--opt {other}: the levels are 1, 2 and 3"),
    })
}

#[derive(Args, Clone)]
struct Common {
    /// Write CSV, JSON and SVG files into DIR.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Tiny sizes and few repeats: a CI check that the suite runs (seconds).
    #[arg(long)]
    smoke: bool,
}

#[derive(Args, Clone)]
struct DeviceArg {
    /// Device: cpu (default), interp, or wgpu where built.
    #[arg(long, default_value = "cpu")]
    device: String,
}

#[derive(Subcommand)]
enum Suite {
    /// Compile time of the decoder per depth in fresh caches, ratio to depth 1, steady forward.
    TransformerCompile {
        /// Depths to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
        layers: Vec<usize>,
        /// Compilations per depth (the median is reported).
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Also time the model's first call in N fresh `kiln` processes per depth, cold and
        /// pre-warmed (the median is reported), as the anchors time jax.jit and torch.compile.
        #[arg(long, value_name = "N")]
        fresh_process: Option<usize>,
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        common: Common,
    },
    /// One timed first call of the decoder in this process (what `transformer-compile
    /// --fresh-process` spawns); prints `first-call-ms <ms>`.
    #[command(hide = true)]
    TransformerFirstCall {
        /// Transformer blocks.
        #[arg(long, default_value_t = 2)]
        layers: usize,
        /// Realize one trivial program first, untimed (device start-up).
        #[arg(long)]
        prewarm: bool,
        #[command(flatten)]
        model: ModelArgs,
    },
    /// neg and sigmoid per size: one op, eager chain, lazy chain.
    Unary {
        /// Sizes (elements), comma-separated.
        #[arg(long, value_delimiter = ',')]
        sizes: Option<Vec<usize>>,
        #[command(flatten)]
        device: DeviceArg,
        #[command(flatten)]
        common: Common,
    },
    /// Decoding with a KV cache, batch 1: the dim-64 model and GPT-2 small's shapes.
    Decode {
        /// Only this model of the suite: `tiny` or `gpt2`
        #[arg(long, value_parser = ["tiny", "gpt2"])]
        model: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Data-parallel training steps at 1, 2 and 4 in-process ranks: step and all-reduce time.
    Dist {
        #[command(flatten)]
        common: Common,
    },
    /// Embedding lookup (gather) at vocab 64 and 50,257, beside the one-hot GEMM it replaced.
    Embedding {
        #[command(flatten)]
        device: DeviceArg,
        #[command(flatten)]
        common: Common,
    },
    /// Predict and fit for nn's model suite.
    Models {
        #[command(flatten)]
        device: DeviceArg,
        #[command(flatten)]
        common: Common,
    },
    /// 32 independent matmuls: a loop of realizes, one realize of all, one batched matmul.
    TreeMatmul {
        #[command(flatten)]
        device: DeviceArg,
        #[command(flatten)]
        common: Common,
    },
    /// An ONNX model: load (decode + validate), first call (import + compile + run), steady call.
    Onnx {
        #[command(flatten)]
        onnx: OnnxArgs,
        #[command(flatten)]
        device: DeviceArg,
        /// Few repeats: a CI check that the command runs.
        #[arg(long)]
        smoke: bool,
    },
    /// (512x1024)@(1024x2048) and 1024^3, GFLOP/s.
    Matmul {
        #[command(flatten)]
        device: DeviceArg,
        #[command(flatten)]
        common: Common,
    },
    /// Planned arena vs one allocation per temporary: a chain of unary ops (unfused, fused) and
    /// the 2-layer Transformer forward; on wgpu also buffers created per run.
    Memory {
        /// Unary ops in the chain.
        #[arg(long, default_value_t = bench::memory::CHAIN)]
        chain: usize,
        /// Elements of the chain's f32 vector.
        #[arg(long, default_value_t = bench::memory::ELEMENTS)]
        elements: usize,
        /// Device: cpu (default) or wgpu.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Distinct programs compiled to measure resident memory with bounded caches.
        #[arg(long, default_value_t = bench::memory::COMPILES)]
        compiles: usize,
        #[command(flatten)]
        common: Common,
    },
}

/// Writes log records to stderr as `kiln <level> <target>: <message>`: Kiln's own records (targets
/// starting with `kiln`) up to `kiln`, other crates' (wgpu's, ...) up to `others`.
struct StderrLogger {
    kiln: log::LevelFilter,
    others: log::LevelFilter,
}

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        let limit = if metadata.target().starts_with("kiln") { self.kiln } else { self.others };
        metadata.level() <= limit
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            eprintln!("kiln {} {}: {}", record.level(), record.target(), record.args());
        }
    }

    fn flush(&self) {}
}

/// The logger for `-v` repeated `verbose` times: Kiln's warnings by default, then info, debug and
/// trace, with other crates one step quieter; without `-v`, `RUST_LOG=<level>` (a plain level
/// such as `info`) sets both.
fn logger(verbose: u8) -> StderrLogger {
    use log::LevelFilter::{Debug, Info, Off, Trace, Warn};
    let (kiln, others) = match verbose {
        0 => match std::env::var("RUST_LOG").ok().and_then(|v| v.trim().parse().ok()) {
            Some(level) => (level, level),
            None => (Warn, Off),
        },
        1 => (Info, Warn),
        2 => (Debug, Info),
        _ => (Trace, Trace),
    };
    StderrLogger { kiln, others }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logger = logger(cli.verbose);
    let max = logger.kiln.max(logger.others);
    if log::set_logger(Box::leak(Box::new(logger))).is_ok() {
        log::set_max_level(max);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kiln: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Profile(target) = &cli.command {
        // The launch table shows each kernel's first run too: its launches are timed then.
        runtime::time_first_runs(target.launches().is_some());
    }
    match cli.command {
        Command::Profile(ProfileTarget::Transformer(args)) => profile_transformer(args),
        Command::Profile(ProfileTarget::Onnx { onnx, out }) => {
            let options = lower::CompileOptions { fuse: !out.no_fuse, ..lower::CompileOptions::default() };
            let dims = onnx_cmd::parse_dims(&onnx.dims)?;
            let (_, profiled) = onnx_cmd::profile(&onnx.model, &dims, &options, out.dump.is_some(), out.cold)?;
            print!("{}", onnx_cmd::render_profile(&onnx.model, &profiled));
            println!("{}", out.footnote());
            report_extras(&profiled, out.launches, out.trace.as_deref(), out.dump.as_deref())
        }
        Command::Profile(ProfileTarget::Model { name, fit, out }) => {
            let options = lower::CompileOptions { fuse: !out.no_fuse, ..lower::CompileOptions::default() };
            let profiled = profile_cmd::profile_model(&name, fit, &options, out.dump.is_some(), out.cold)?;
            let what = if fit { "loss and gradients" } else { "predict" };
            print!("{}", profile_cmd::render_titled(&format!("kiln profile model: {name} ({what}) on cpu"), &profiled));
            println!("{}", out.footnote());
            report_extras(&profiled, out.launches, out.trace.as_deref(), out.dump.as_deref())
        }
        Command::Onnx(OnnxCmd::Info { model }) => {
            print!("{}", onnx_cmd::info(&model)?);
            Ok(())
        }
        Command::Onnx(OnnxCmd::Run { model, inputs, expect, rtol, atol, out, device }) => {
            let report = onnx_cmd::run(&onnx_cmd::RunArgs {
                model: &model,
                inputs: &onnx_cmd::parse_named_files("--input", &inputs)?,
                expect: &onnx_cmd::parse_named_files("--expect", &expect)?,
                tol: kiln_cli::bench::check::Tolerance { rtol, atol },
                out: out.as_deref(),
                device: kiln::Device::parse(&device.device)?,
            })?;
            print!("{}", report.text);
            match report.mismatches.as_slice() {
                [] => Ok(()),
                m => anyhow::bail!("{} of the outputs differ from their reference:\n{}", m.len(), m.join("\n")),
            }
        }
        Command::Bench(suite) => run_suite(suite),
        Command::Generate(g) => kiln_cli::generate_cmd::run(&kiln_cli::generate_cmd::GenerateArgs {
            weights: g.weights,
            n_heads: g.n_heads,
            prompt: g.prompt,
            max_new_tokens: g.max_new_tokens,
            temperature: g.temperature,
            top_k: g.top_k,
            top_p: g.top_p,
            seed: g.seed,
        }),
    }
}

fn profile_transformer(args: ProfileArgs) -> anyhow::Result<()> {
    let config = args.model.config(args.layers);
    let mut options = lower::CompileOptions { fuse: !args.no_fuse, ..lower::CompileOptions::default() };
    if let Some(level) = args.opt {
        options.level = opt_level(level)?;
    }
    if !args.cold {
        profile_cmd::profile_transformer(GptConfig { layers: 1, ..config }, &options)?;
    }
    let profiled = profile_cmd::profile_transformer_with(config, &options, args.dump.is_some())?;
    print!("{}", profile_cmd::render(&config, &profiled));
    if let Some(s) = &profiled.compiled.saturate {
        println!("saturate: {s}");
    }
    println!("{}", footnote(args.cold, "1-layer compilation"));
    report_extras(&profiled, args.launches, args.trace.as_deref(), args.dump.as_deref())
}

/// What both profile commands print or write on request: the launch table, the Chrome trace
/// and the dump of graphs, kernel IR and CLIF.
fn report_extras(
    profiled: &profile_cmd::Profiled,
    launches: Option<usize>,
    trace: Option<&std::path::Path>,
    dump: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    if let Some(top) = launches {
        print!("{}", profile_cmd::launch_table(profiled, top)?);
    }
    if let Some(path) = trace {
        std::fs::write(path, profiled.report.chrome_trace())?;
        println!("trace: {} (open in https://ui.perfetto.dev)", path.display());
    }
    if let Some(dir) = dump {
        let files = dump::write(dir, &profiled.traced.graph, &profiled.compiled)?;
        println!("dump: {} files in {}", files.len(), dir.display());
    }
    Ok(())
}

fn finish(output: SuiteOutput, common: &Common) -> anyhow::Result<()> {
    print!("{output}");
    if let Some(dir) = &common.out {
        let files = output.write(dir)?;
        println!("\nwrote {} files to {}", files.len(), dir.display());
    }
    Ok(())
}

fn budget(smoke: bool) -> Budget {
    if smoke { Budget::SMOKE } else { Budget::STEADY }
}

fn run_suite(suite: Suite) -> anyhow::Result<()> {
    match suite {
        Suite::TransformerCompile { layers, repeats, fresh_process, model, common } => {
            let fresh_process = match fresh_process {
                Some(n) => {
                    Some(bench::transformer::FreshProcess { exe: std::env::current_exe()?, processes: n.max(1) })
                }
                None => None,
            };
            let args = bench::transformer::Args {
                layers: if common.smoke { vec![1, 2] } else { layers },
                repeats: if common.smoke { 2 } else { repeats.max(1) },
                base: model.config(1),
                steady: budget(common.smoke),
                fresh_process,
            };
            args.base.validate().map_err(anyhow::Error::msg)?;
            finish(bench::transformer::run(&args)?, &common)
        }
        Suite::TransformerFirstCall { layers, prewarm, model } => {
            let ms = bench::transformer::first_call(model.config(layers), prewarm)?;
            println!("{}{ms}", bench::transformer::FIRST_CALL_PREFIX);
            Ok(())
        }
        Suite::Unary { sizes, device, common } => {
            let sizes = match (sizes, common.smoke) {
                (Some(s), _) => s,
                (None, true) => vec![1, 729],
                (None, false) => bench::unary::SIZES.to_vec(),
            };
            let runner = Runner::for_device(&device.device)?;
            finish(bench::unary::run(&bench::unary::Args { sizes, budget: budget(common.smoke) }, &runner)?, &common)
        }
        Suite::Decode { model, common } => {
            let mut args = if common.smoke { bench::decode::Args::smoke() } else { bench::decode::Args::full() };
            if let Some(model) = model {
                args.models.retain(|m| m.key == model);
                if args.models.is_empty() {
                    anyhow::bail!("the {} suite has no model {model}", if common.smoke { "smoke" } else { "full" });
                }
            }
            finish(bench::decode::run(&args)?, &common)
        }
        Suite::Dist { common } => {
            let args = if common.smoke { bench::dist::Args::smoke() } else { bench::dist::Args::full() };
            finish(bench::dist::run(&args)?, &common)
        }
        Suite::Embedding { device, common } => {
            let runner = Runner::for_device(&device.device)?;
            let args = if common.smoke {
                bench::embedding::Args { vocabs: vec![64, 1000], tokens: 16, dim: 8, budget: Budget::SMOKE }
            } else {
                bench::embedding::Args::default()
            };
            finish(bench::embedding::run(&args, &runner)?, &common)
        }
        Suite::Models { device, common } => {
            let runner = Runner::for_device(&device.device)?;
            finish(bench::models::run(common.smoke, &runner)?, &common)
        }
        Suite::TreeMatmul { device, common } => {
            let runner = Runner::for_device(&device.device)?;
            let args = if common.smoke {
                bench::tree::Args { pairs: 4, m: 16, k: 32, n: 64, budget: Budget::SMOKE }
            } else {
                bench::tree::Args::default()
            };
            finish(bench::tree::run(&args, &runner)?, &common)
        }
        Suite::Onnx { onnx, device, smoke } => {
            let device = kiln::Device::parse(&device.device)?;
            let r = onnx_cmd::bench(&onnx.model, &onnx_cmd::parse_dims(&onnx.dims)?, device, budget(smoke))?;
            println!("kiln bench onnx: {} on {}", onnx.model.display(), device.name());
            println!("  load (decode + validate)          {:>10.3} ms", r.load_ms);
            println!("  first call (import+compile+run)   {:>10.3} ms", r.first_call_ms);
            if let Some((median, fastest)) = r.warm_first_call_ms {
                println!(
                    "  first call, warm process          {:>10.3} ms (median of {}, fastest {:.3}; caches emptied before each)",
                    median,
                    onnx_cmd::WARM_FIRST_CALLS,
                    fastest
                );
            }
            println!("  steady call (median)              {:>10.3} ms", r.steady_ms);
            Ok(())
        }
        Suite::Matmul { device, common } => {
            let runner = Runner::for_device(&device.device)?;
            let shapes = if common.smoke { vec![(64, 128, 256)] } else { bench::matmul::SHAPES.to_vec() };
            finish(bench::matmul::run(&bench::matmul::Args { shapes, budget: budget(common.smoke) }, &runner)?, &common)
        }
        Suite::Memory { chain, elements, device, compiles, common } => {
            let args = bench::memory::Args {
                chain: chain.max(1),
                elements: if common.smoke { 729 } else { elements.max(1) },
                model: GptConfig::default(),
                device: bench::memory::MemDevice::parse(&device)?,
                compiles: if common.smoke { 50 } else { compiles },
            };
            finish(bench::memory::run(&args)?, &common)
        }
    }
}
