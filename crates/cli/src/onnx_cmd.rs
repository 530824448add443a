//! `kiln onnx info`, `kiln profile onnx` and `kiln bench onnx`: an imported ONNX model's
//! summary, its per-pass compile table, and its import + compile time and steady inference.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use kiln::{DType, Device, HostData, HostTensor, Tensor};
use kiln_onnx::Model;
use lower::CompileOptions;

use crate::profile_cmd::{self, Profiled};
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
/// onnx` runs (a max pool is one reduce, with no winner kept for a backward pass).
pub fn profile(
    path: &Path,
    dims: &HashMap<String, usize>,
    options: &CompileOptions,
    keep_graphs: bool,
) -> anyhow::Result<(Model, Profiled)> {
    let model = Model::load(path)?;
    let profiled = profile_cmd::profile_tensors(
        || {
            let x = inputs(&model, dims, Device::Cpu)?;
            Ok(kiln::profile::span(kiln::profile::Step::Forward, || kiln::no_grad(|| model.run(&x)))?)
        },
        options,
        keep_graphs,
    )?;
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
    /// The same on the CPU in the warm process, every compile cache emptied before each
    /// (median of [`WARM_FIRST_CALLS`]), like onnxruntime's session creation measured as the
    /// median of several in one process. `None` on other devices.
    pub warm_first_call_ms: Option<f64>,
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
        Device::Cpu => Some(crate::timing::median(&warm_first_calls(&model, &args, WARM_FIRST_CALLS)?)),
        _ => None,
    };
    Ok(BenchResult { load_ms, first_call_ms, warm_first_call_ms, steady_ms })
}

/// Milliseconds of `n` first calls of `model` on the CPU (import, trace, compile, run) in this
/// warm process, every compile cache of the CPU device emptied before each.
pub fn warm_first_calls(model: &Model, args: &[&Tensor], n: usize) -> anyhow::Result<Vec<f64>> {
    let cpu = kiln::backend::cpu_device()?;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        cpu.clear_caches();
        let mut session = model.session();
        let t0 = Instant::now();
        session.run(args)?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(times)
}

/// First calls timed in the warm process by `kiln bench onnx` (onnxruntime's anchor creates its
/// session five times too).
pub const WARM_FIRST_CALLS: usize = 5;
