//! `kiln onnx info`, `kiln onnx run`, `kiln profile onnx` and `kiln bench onnx`: an imported ONNX
//! model's summary, one run on inputs from files (outputs described, written and checked against
//! reference files), its per-pass compile table, and its import + compile time and steady
//! inference.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kiln::{DType, Device, HostData, HostTensor, Tensor};
use kiln_onnx::Model;
use lower::CompileOptions;

use crate::bench::check::{self, Tolerance};
use crate::profile_cmd::{self, Profiled};
use crate::tensor_file;
use crate::timing::{Budget, measure_ms};

/// Parses `--dim name=value` arguments.
pub fn parse_dims(args: &[String]) -> anyhow::Result<HashMap<String, usize>> {
    args.iter()
        .map(|a| {
            let (name, value) = a.split_once('=').ok_or_else(|| anyhow::anyhow!("--dim {a:?}: expected name=value"))?;
            let value = value.trim().parse().map_err(|_| anyhow::anyhow!("--dim {a:?}: {value:?} is not a size"))?;
            Ok((name.trim().to_string(), value))
        })
        .collect()
}

/// The text of `kiln onnx info`: opsets, inputs, outputs, weights, the op histogram and the ops
/// the importer does not support.
pub fn info(path: &Path) -> anyhow::Result<String> {
    let model = Model::load(path)?;
    let mut s = String::new();
    writeln!(
        s,
        "{}: {} nodes, opset {}",
        path.display(),
        model.nodes().count(),
        model.opset("").map_or("?".into(), |v| v.to_string())
    )?;
    writeln!(s, "inputs:")?;
    for i in model.inputs() {
        writeln!(s, "  {}", i.describe())?;
    }
    writeln!(s, "outputs:")?;
    for o in model.outputs() {
        writeln!(s, "  {}", o.describe())?;
    }
    let weights = model.initializers();
    let bytes: usize = weights.iter().map(|(_, h)| h.numel() * h.dtype().size_bytes()).sum();
    writeln!(s, "weights: {} tensors, {} bytes", weights.len(), bytes)?;
    let mut ops: BTreeMap<String, usize> = BTreeMap::new();
    for n in model.nodes() {
        let op = match n.domain.as_deref() {
            None | Some("") | Some("ai.onnx") => n.op_type.clone().unwrap_or_default(),
            Some(d) => format!("{d}.{}", n.op_type.as_deref().unwrap_or("")),
        };
        *ops.entry(op).or_default() += 1;
    }
    let mut ops: Vec<(String, usize)> = ops.into_iter().collect();
    ops.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    writeln!(s, "ops:")?;
    for (op, n) in &ops {
        writeln!(s, "  {op:<28} {n}")?;
    }
    let unsupported = model.unsupported();
    if unsupported.is_empty() {
        writeln!(s, "unsupported ops: none")?;
    } else {
        writeln!(s, "unsupported ops ({}):", unsupported.len())?;
        for u in &unsupported {
            writeln!(s, "  {u}")?;
        }
    }
    Ok(s)
}

/// Deterministic inputs for every graph input: symbolic dims take their `--dim` value, floats
/// a smooth pattern in `[-1, 1]`, integers and booleans zeros (valid indices). Symbolic dims stay
/// symbolic in the tensors' types, so one program serves every value.
pub fn inputs(model: &Model, dims: &HashMap<String, usize>, device: Device) -> anyhow::Result<Vec<Tensor>> {
    model
        .inputs()
        .iter()
        .enumerate()
        .map(|(index, info)| {
            let declared =
                info.dims.as_ref().ok_or_else(|| anyhow::anyhow!("input {:?} has no shape in the file", info.name))?;
            let shape = declared
                .iter()
                .map(|d| match d.as_const() {
                    Some(v) => Ok(v as usize),
                    None => dims.get(&d.to_string()).copied().ok_or_else(|| {
                        anyhow::anyhow!(
                            "input {:?} has the symbolic dim {d}: give its size with --dim {d}=N",
                            info.name
                        )
                    }),
                })
                .collect::<anyhow::Result<Vec<usize>>>()?;
            let n: usize = shape.iter().product();
            let dtype =
                info.dtype.ok_or_else(|| anyhow::anyhow!("input {:?} has an element type Kiln lacks", info.name))?;
            let data = match dtype {
                DType::F32 => HostData::F32((0..n).map(|i| (i as f32 * 0.731).sin()).collect()),
                DType::F64 => HostData::F64((0..n).map(|i| (i as f64 * 0.731).sin()).collect()),
                other => HostData::filled(other, n, kiln::Scalar::Int(0)),
            };
            let host = HostTensor::new(data, shape).map_err(anyhow::Error::msg)?;
            Ok(model.input_tensor(index, host, device)?)
        })
        .collect()
}

/// Imports the model at `path` and compiles and runs it once under the profiler (the import's
/// graph building is the `forward` span). The model is built under `kiln::no_grad`, as a
/// [`kiln_onnx::Session`] builds it, so the profile shows the inference program that `kiln bench
/// onnx` runs (a max pool is one reduce, with no winner kept for a backward pass). Unless
/// `cold`, the same import is compiled and run once first ([`profile_cmd::warm_up`]).
pub fn profile(
    path: &Path,
    dims: &HashMap<String, usize>,
    options: &CompileOptions,
    keep_graphs: bool,
    cold: bool,
) -> anyhow::Result<(Model, Profiled)> {
    let model = Model::load(path)?;
    let build = || -> anyhow::Result<Vec<Tensor>> {
        let x = inputs(&model, dims, Device::Cpu)?;
        Ok(kiln::profile::span(kiln::profile::Step::Forward, || kiln::no_grad(|| model.run(&x)))?)
    };
    if !cold {
        profile_cmd::warm_up(build, options)?;
    }
    let profiled = profile_cmd::profile_tensors(build, options, keep_graphs)?;
    Ok((model, profiled))
}

/// The text `kiln profile onnx` prints.
pub fn render_profile(path: &Path, p: &Profiled) -> String {
    profile_cmd::render_titled(&format!("kiln profile onnx: {} on cpu", path.display()), p)
}

/// What `kiln bench onnx` measures.
pub struct BenchResult {
    /// Reading and validating the file (decoding weights included), ms.
    pub load_ms: f64,
    /// Building the graph, compiling it and the first run, ms: the process's first (cold
    /// caches, Cranelift's own code not yet in memory).
    pub first_call_ms: f64,
    /// The same on the CPU in the warm process, every compile cache emptied before each: the
    /// median and the fastest of [`WARM_FIRST_CALLS`], as onnxruntime's anchor reports its
    /// session creations in one process. `None` on other devices.
    pub warm_first_call_ms: Option<(f64, f64)>,
    /// Median of steady calls of the compiled session (inputs bound, program run), ms.
    pub steady_ms: f64,
}

/// Loads the model, times its first call (import + compile + run) and its steady calls.
pub fn bench(
    path: &Path,
    dims: &HashMap<String, usize>,
    device: Device,
    budget: Budget,
) -> anyhow::Result<BenchResult> {
    let t0 = Instant::now();
    let model = Model::load(path)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let x = inputs(&model, dims, device)?;
    let args: Vec<&Tensor> = x.iter().collect();
    // A compiled session: the first call imports, traces and compiles; later ones bind and run.
    let mut session = model.session();
    let mut call = || -> anyhow::Result<()> {
        session.run(&args)?;
        Ok(())
    };
    let t0 = Instant::now();
    call()?;
    let first_call_ms = t0.elapsed().as_secs_f64() * 1e3;
    let steady_ms = measure_ms(budget, call)?;
    let warm_first_call_ms = match device {
        Device::Cpu => {
            let times = warm_first_calls(&model, &args, WARM_FIRST_CALLS)?;
            Some((crate::timing::median(&times), crate::timing::fastest(&times)))
        }
        _ => None,
    };
    Ok(BenchResult { load_ms, first_call_ms, warm_first_call_ms, steady_ms })
}

/// Milliseconds of `n` first calls of `model` on the CPU (import, trace, compile, run) in this
/// warm process, every compile cache of the CPU device emptied before each.
pub fn warm_first_calls(model: &Model, args: &[&Tensor], n: usize) -> anyhow::Result<Vec<f64>> {
    warm_first_calls_after(model, args, n, Duration::ZERO)
}

/// [`warm_first_calls`], the process idle for `idle` before each (its pool threads asleep, as
/// before an import in a process that was doing something else).
pub fn warm_first_calls_after(model: &Model, args: &[&Tensor], n: usize, idle: Duration) -> anyhow::Result<Vec<f64>> {
    let cpu = kiln::backend::cpu_device()?;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        cpu.clear_caches();
        if !idle.is_zero() {
            std::thread::sleep(idle);
        }
        let mut session = model.session();
        let t0 = Instant::now();
        session.run(args)?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(times)
}

/// First calls timed in the warm process by `kiln bench onnx` (onnxruntime's anchor,
/// `scripts/anchor_onnx_onnxruntime.py`, creates its session as many times). Fifteen, not five:
/// GRU's median of five read 1.46 ms in one run where a median of sixty read 0.98.
pub const WARM_FIRST_CALLS: usize = 15;

/// What `kiln onnx run` is asked to do.
pub struct RunArgs<'a> {
    /// The .onnx file.
    pub model: &'a Path,
    /// `(input name, file)`: every graph input's tensor (`.npy` or `.pb`).
    pub inputs: &'a [(String, PathBuf)],
    /// `(output name, file)`: outputs to compare with a reference.
    pub expect: &'a [(String, PathBuf)],
    /// The comparison's tolerance.
    pub tol: Tolerance,
    /// Where to write every output as `NAME.npy`.
    pub out: Option<&'a Path>,
    pub device: Device,
}

/// What `kiln onnx run` found.
pub struct RunReport {
    /// One block per output: dtype, shape, range, first values; and each comparison's verdict.
    pub text: String,
    /// The outputs that differ from their reference (each with why).
    pub mismatches: Vec<String>,
}

/// Parses `NAME=PATH` arguments (`--input`, `--expect`).
pub fn parse_named_files(flag: &str, args: &[String]) -> anyhow::Result<Vec<(String, PathBuf)>> {
    args.iter()
        .map(|a| match a.split_once('=') {
            Some((name, path)) if !name.is_empty() && !path.is_empty() => Ok((name.to_string(), PathBuf::from(path))),
            _ => anyhow::bail!("{flag} {a:?}: expected NAME=FILE"),
        })
        .collect()
}

/// Imports the model, runs it once on the inputs read from files (their shapes bind the
/// model's symbolic dims), and describes, writes and checks its outputs.
pub fn run(args: &RunArgs) -> anyhow::Result<RunReport> {
    let model = Model::load(args.model)?;
    let declared = |names: &mut dyn Iterator<Item = &kiln_onnx::ValueInfo>| {
        names.map(|i| format!("  {}", i.describe())).collect::<Vec<_>>().join("\n")
    };
    for (name, _) in args.inputs {
        if !model.inputs().iter().any(|i| &i.name == name) {
            anyhow::bail!(
                "--input {name}: the model has no such input; its inputs:\n{}",
                declared(&mut model.inputs().iter())
            );
        }
    }
    for (name, _) in args.expect {
        if !model.outputs().iter().any(|o| &o.name == name) {
            anyhow::bail!(
                "--expect {name}: the model has no such output; its outputs:\n{}",
                declared(&mut model.outputs().iter())
            );
        }
    }
    let missing: Vec<&kiln_onnx::ValueInfo> =
        model.inputs().iter().filter(|i| !args.inputs.iter().any(|(n, _)| n == &i.name)).collect();
    if !missing.is_empty() {
        anyhow::bail!(
            "no tensor for {} of the model's inputs (give each with --input NAME=FILE):\n{}",
            missing.len(),
            declared(&mut missing.into_iter())
        );
    }
    let x = model
        .inputs()
        .iter()
        .enumerate()
        .map(|(index, info)| {
            let (_, path) = args.inputs.iter().find(|(n, _)| n == &info.name).expect("checked above");
            Ok(model.input_tensor(index, tensor_file::read(path)?, args.device)?)
        })
        .collect::<anyhow::Result<Vec<Tensor>>>()?;
    let t0 = Instant::now();
    let y = kiln::no_grad(|| model.run(&x))?;
    kiln::realize(&y.iter().collect::<Vec<_>>())?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut text =
        format!("{}: import + compile + run on {} in {ms:.2} ms\n", args.model.display(), args.device.name());
    let mut mismatches = Vec::new();
    for (info, y) in model.outputs().iter().zip(&y) {
        let got = y.to_host()?;
        writeln!(text, "{}", describe_output(&info.name, &got))?;
        if let Some(dir) = args.out {
            std::fs::create_dir_all(dir)?;
            let path = dir.join(format!("{}.npy", file_stem(&info.name)));
            tensor_file::write_npy(&path, &got)?;
            writeln!(text, "  written to {}", path.display())?;
        }
        for (_, path) in args.expect.iter().filter(|(n, _)| n == &info.name) {
            let want = tensor_file::read(path)?;
            match check::compare(&info.name, &got, &want, args.tol) {
                Ok(()) => {
                    writeln!(text, "  matches {} (rtol {:e}, atol {:e})", path.display(), args.tol.rtol, args.tol.atol)?
                }
                Err(m) => {
                    writeln!(text, "  DIFFERS from {}: {}", path.display(), m.detail)?;
                    mismatches.push(format!("output {:?} differs from {}: {}", info.name, path.display(), m.detail));
                }
            }
        }
    }
    Ok(RunReport { text, mismatches })
}

/// `name: dtype [shape]`, the range and mean of its values, and its first values.
fn describe_output(name: &str, t: &HostTensor) -> String {
    let v = t.data.to_f64_vec();
    let finite: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    let mut s = format!("{name}: {} {:?}", t.dtype(), t.shape);
    if !finite.is_empty() {
        let (lo, hi) = finite.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
        let mean = finite.iter().sum::<f64>() / finite.len() as f64;
        let _ = write!(s, "  min {lo:.6} max {hi:.6} mean {mean:.6}");
    }
    if finite.len() < v.len() {
        let _ = write!(s, "  ({} not finite)", v.len() - finite.len());
    }
    let first: Vec<String> = v.iter().take(6).map(|x| format!("{x:.6}")).collect();
    let _ = write!(s, "\n  first values: [{}{}]", first.join(", "), if v.len() > 6 { ", ..." } else { "" });
    s
}

/// A file name for an output's name (ONNX names may hold `/` or `:`).
fn file_stem(name: &str) -> String {
    let s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with('.') { format!("output_{s}") } else { s }
}
