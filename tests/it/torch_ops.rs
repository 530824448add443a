//! Compares every op of the `kiln` facade against PyTorch on the committed fixtures in
//! `tests/fixtures/ops.safetensors` (written by `tests/fixtures/gen.py`; no Python needed here).
//!
//! Each test covers one op family: it builds every fixture of its ops with the facade from the
//! fixture's inputs and arguments, realizes it, and compares with PyTorch's `out` (floats within
//! `1e-5 + 1e-5 * |torch|`, ints and bools exactly). A failure lists every disagreeing fixture
//! with its op, input shapes and the largest error. Every family runs once on the interpreter
//! on the CPU backend and on the wgpu backend, every fixture on each (i64 included: wgpu emulates
//! it with 32-bit word pairs), and fails when a device compares fewer fixtures than the family
//! has. Without a wgpu adapter the wgpu pass is skipped with a printed reason, unless `KILN_REQUIRE_VULKAN=1` makes that a failure.
//! `every_fixture_is_tested` makes sure no fixture in the file goes unused.

use crate::common;

use std::cell::Cell;

use common::{Array, Data, Fixture, fixtures};
use kiln::{DType, Device, Tensor};

// The op names (the `op` of each fixture's metadata) each family test covers.
const UNARY: &[&str] =
    &["neg", "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "abs"];
const ARITHMETIC: &[&str] = &["add", "sub", "mul", "div"];
const BINARY_OTHER: &[&str] = &["maximum", "minimum", "pow"];
const COMPARE: &[&str] = &["lt", "le", "gt", "ge", "eq"];
const WHERE: &[&str] = &["where"];
const REDUCE: &[&str] = &["sum", "max", "min", "mean"];
const SOFTMAX: &[&str] = &["softmax", "log_softmax"];
const ARGMAX: &[&str] = &["argmax"];
const MATMUL: &[&str] = &["matmul"];
const MOVEMENT: &[&str] = &["reshape", "permute", "transpose", "expand", "squeeze", "unsqueeze", "narrow", "flatten"];
const PAD: &[&str] = &["pad"];
const JOIN: &[&str] = &["cat", "stack"];
const GATHER: &[&str] = &["gather"];
const CAST: &[&str] = &["cast"];

const FAMILIES: &[&[&str]] = &[
    UNARY,
    ARITHMETIC,
    BINARY_OTHER,
    COMPARE,
    WHERE,
    REDUCE,
    SOFTMAX,
    ARGMAX,
    MATMUL,
    MOVEMENT,
    PAD,
    JOIN,
    GATHER,
    CAST,
];

thread_local! {
    /// The device the running family builds its tensors on.
    static DEVICE: Cell<Device> = Cell::new(Device::default());
}

/// Whether the wgpu device can run here: `false` (with the reason printed) when there is no
/// adapter, a failure instead when `KILN_REQUIRE_VULKAN=1`.
fn wgpu_available() -> bool {
    match kiln::Device::Wgpu.probe() {
        Ok(_) => true,
        Err(e) => {
            let required = std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v.trim() == "1");
            assert!(!required, "KILN_REQUIRE_VULKAN=1 but there is no wgpu device: {e}");
            eprintln!("skipping the wgpu pass: no wgpu device ({e}); KILN_REQUIRE_VULKAN=1 makes this a failure");
            false
        }
    }
}

/// Runs a family's fixtures (see [`common::run_family`]) on the interpreter, the CPU device and
/// (where there is an adapter) the wgpu device; each must compare all `expected` of them.
fn run_family(family: &str, ops: &[&str], expected: usize, eval: impl Fn(&Fixture) -> Result<Array, String>) {
    let mut devices = vec![Device::Interp, Device::Cpu];
    if wgpu_available() {
        devices.push(Device::Wgpu);
    }
    for device in devices {
        DEVICE.with(|d| d.set(device));
        let (compared, skipped) = common::run_family(&format!("{family} on {device}"), ops, &|_| false, &eval);
        assert!(
            compared == expected && skipped.is_empty(),
            "{family} on {device}: {compared} fixtures compared of {expected}, skipped {skipped:?}"
        );
    }
}

/// A facade tensor holding a copy of the fixture tensor, on the current device.
fn tensor(a: &Array) -> Result<Tensor, String> {
    let host = match &a.data {
        Data::F32(v) => Tensor::from_slice(v, &a.shape),
        Data::I64(v) => Tensor::from_slice(v, &a.shape),
        Data::I32(v) => Tensor::from_slice(v, &a.shape),
        Data::Bool(v) => Tensor::from_slice(v, &a.shape),
    };
    let device = DEVICE.with(Cell::get);
    host.to_device(device).map_err(|e| format!("moving an input to {device}: {e}"))
}

/// Realizes `t` and brings its value back as an [`Array`].
fn realize(t: &Tensor) -> Result<Array, String> {
    let kiln_err = |e: kiln::Error| format!("kiln error: {e}");
    let data = match t.dtype() {
        DType::F32 => Data::F32(t.to_vec().map_err(kiln_err)?),
        DType::I64 => Data::I64(t.to_vec().map_err(kiln_err)?),
        DType::I32 => Data::I32(t.to_vec().map_err(kiln_err)?),
        DType::Bool => Data::Bool(t.to_vec().map_err(kiln_err)?),
        other => return Err(format!("kiln gave dtype {other}, which no fixture holds")),
    };
    Ok(Array { shape: t.dims().map_err(kiln_err)?, data })
}

/// The fixture's single input as a facade tensor.
fn input(fx: &Fixture) -> Result<Tensor, String> {
    tensor(fx.input()?)
}

/// The fixture's inputs, in call order, as facade tensors.
fn inputs(fx: &Fixture) -> Result<Vec<Tensor>, String> {
    fx.inputs()?.into_iter().map(tensor).collect()
}

/// The right operand of a binary op: a tensor, or a scalar kept as an integer or a float as the
/// fixture wrote it (PyTorch types `x / 4` and `x / 4.0` differently for integer `x`).
enum Rhs {
    Tensor(Tensor),
    Int(i64),
    Float(f64),
}

/// The operands of a binary fixture: inputs `a` and `b`, or input `a` and the argument `scalar`.
fn binary_operands(fx: &Fixture) -> Result<(Tensor, Rhs), String> {
    let ins = inputs(fx)?;
    match (ins.as_slice(), fx.has_arg("scalar")) {
        ([a, b], false) => Ok((a.clone(), Rhs::Tensor(b.clone()))),
        ([a], true) => Ok((a.clone(), scalar(fx)?)),
        _ => Err(format!("binary fixture with inputs {:?} and args {:?}", fx.info.inputs, fx.info.args.keys())),
    }
}

/// The fixture's `scalar` argument.
fn scalar(fx: &Fixture) -> Result<Rhs, String> {
    let v = fx.arg("scalar")?;
    v.as_i64().map(Rhs::Int).or_else(|| v.as_f64().map(Rhs::Float)).ok_or_else(|| format!("scalar {v} is not a number"))
}

/// Applies `$method` to `$a` and the right operand `$rhs`, whichever kind it is.
macro_rules! apply {
    ($a:expr, $method:ident, $rhs:expr) => {
        match $rhs {
            Rhs::Tensor(b) => $a.$method(b),
            Rhs::Int(s) => $a.$method(*s),
            Rhs::Float(s) => $a.$method(*s),
        }
    };
}

fn unknown(fx: &Fixture) -> String {
    format!("no Kiln op for `{}` in this test", fx.info.op)
}

#[test]
fn unary() {
    run_family("unary", UNARY, 50, |fx| {
        let a = input(fx)?;
        let out = match fx.info.op.as_str() {
            "neg" => a.neg(),
            "exp" => a.exp(),
            "log" => a.log(),
            "sqrt" => a.sqrt(),
            "sin" => a.sin(),
            "cos" => a.cos(),
            "tanh" => a.tanh(),
            "sigmoid" => a.sigmoid(),
            "relu" => a.relu(),
            "gelu" => a.gelu(),
            "gelu_tanh" => a.gelu_tanh(),
            "silu" => a.silu(),
            "abs" => a.abs(),
            _ => return Err(unknown(fx)),
        };
        realize(&out)
    });
}

#[test]
fn arithmetic() {
    run_family("arithmetic", ARITHMETIC, 34, |fx| {
        let (a, b) = binary_operands(fx)?;
        let out = match fx.info.op.as_str() {
            "add" => apply!(a, add, &b),
            "sub" => apply!(a, sub, &b),
            "mul" => apply!(a, mul, &b),
            "div" => apply!(a, div, &b),
            _ => return Err(unknown(fx)),
        };
        realize(&out)
    });
}

#[test]
fn maximum_minimum_pow() {
    run_family("maximum/minimum/pow", BINARY_OTHER, 23, |fx| {
        let (a, b) = binary_operands(fx)?;
        let out = match fx.info.op.as_str() {
            "maximum" => apply!(a, maximum, &b),
            "minimum" => apply!(a, minimum, &b),
            "pow" => apply!(a, pow, &b),
            _ => return Err(unknown(fx)),
        };
        realize(&out)
    });
}

#[test]
fn comparisons() {
    run_family("comparisons", COMPARE, 22, |fx| {
        let (a, b) = binary_operands(fx)?;
        let out = match fx.info.op.as_str() {
            "lt" => apply!(a, lt, &b),
            "le" => apply!(a, le, &b),
            "gt" => apply!(a, gt, &b),
            "ge" => apply!(a, ge, &b),
            "eq" => apply!(a, eq, &b),
            _ => return Err(unknown(fx)),
        };
        realize(&out)
    });
}

#[test]
fn where_select() {
    run_family("where", WHERE, 4, |fx| {
        let (cond, a) = (tensor(fx.tensor("cond")?)?, tensor(fx.tensor("a")?)?);
        let b = if fx.has_arg("scalar") { scalar(fx)? } else { Rhs::Tensor(tensor(fx.tensor("b")?)?) };
        realize(&match &b {
            Rhs::Tensor(b) => cond.where_cond(&a, b),
            Rhs::Int(s) => cond.where_cond(&a, *s),
            Rhs::Float(s) => cond.where_cond(&a, *s),
        })
    });
}

#[test]
fn reductions() {
    run_family("reductions", REDUCE, 36, |fx| {
        let a = input(fx)?;
        let keepdim = fx.arg_bool("keepdim")?;
        let out = match (fx.info.op.as_str(), fx.arg_i64s("dims")?) {
            ("sum", Some(d)) if keepdim => a.sum_keepdim(d),
            ("sum", Some(d)) => a.sum(d),
            ("max", Some(d)) if keepdim => a.max_keepdim(d),
            ("max", Some(d)) => a.max(d),
            ("min", Some(d)) if keepdim => a.min_keepdim(d),
            ("min", Some(d)) => a.min(d),
            ("mean", Some(d)) if keepdim => a.mean_keepdim(d),
            ("mean", Some(d)) => a.mean(d),
            // PyTorch's reductions without `dim` give a rank-0 tensor.
            ("sum", None) => a.sum_all(),
            ("max", None) => a.max_all(),
            ("min", None) => a.min_all(),
            ("mean", None) => a.mean_all(),
            _ => return Err(unknown(fx)),
        };
        realize(&out)
    });
}

#[test]
fn softmax_log_softmax() {
    run_family("softmax", SOFTMAX, 11, |fx| {
        let a = input(fx)?;
        let dim = fx.arg_i64("dim")?;
        let out = match fx.info.op.as_str() {
            "softmax" => a.softmax(dim),
            "log_softmax" => a.log_softmax(dim),
            _ => return Err(unknown(fx)),
        };
        realize(&out)
    });
}

#[test]
fn argmax() {
    run_family("argmax", ARGMAX, 6, |fx| {
        let (a, dim) = (input(fx)?, fx.arg_i64("dim")?);
        realize(&if fx.arg_bool("keepdim")? { a.argmax_keepdim(dim) } else { a.argmax(dim) })
    });
}

#[test]
fn matmul() {
    run_family("matmul", MATMUL, 8, |fx| {
        let (a, b) = (tensor(fx.tensor("a")?)?, tensor(fx.tensor("b")?)?);
        realize(&a.matmul(&b))
    });
}

#[test]
fn movement() {
    run_family("movement", MOVEMENT, 26, |fx| {
        let a = input(fx)?;
        let list = |key: &str| fx.arg_i64s(key)?.ok_or_else(|| format!("argument `{key}` is null"));
        let out = match fx.info.op.as_str() {
            "reshape" => a.reshape(list("shape")?),
            "expand" => a.expand(list("shape")?),
            "permute" => a.permute(list("dims")?),
            "transpose" => a.transpose(fx.arg_i64("dim0")?, fx.arg_i64("dim1")?),
            "squeeze" => match fx.arg_opt_i64("dim")? {
                Some(d) => a.squeeze(d),
                None => a.squeeze_all(),
            },
            "unsqueeze" => a.unsqueeze(fx.arg_i64("dim")?),
            "narrow" => a.narrow(fx.arg_i64("dim")?, fx.arg_i64("start")?, fx.arg_i64("length")?),
            "flatten" => a.flatten(fx.arg_i64("start_dim")?, fx.arg_i64("end_dim")?),
            _ => return Err(unknown(fx)),
        };
        realize(&out)
    });
}

#[test]
fn pad() {
    run_family("pad", PAD, 3, |fx| {
        let a = input(fx)?;
        let pads = fx.arg_i64s("pads")?.ok_or("argument `pads` is null")?;
        // `F.pad` lists (before, after) pairs from the last axis backwards and may leave leading
        // axes out; Kiln's `pad` takes one pair per axis, first axis first.
        let rank = a.ndim();
        if pads.len() % 2 != 0 || pads.len() / 2 > rank || pads.iter().any(|&p| p < 0) {
            return Err(format!("pads {pads:?} do not fit rank {rank}"));
        }
        let mut pairs = vec![(0usize, 0usize); rank];
        for (k, pair) in pads.chunks(2).enumerate() {
            pairs[rank - 1 - k] = (pair[0] as usize, pair[1] as usize);
        }
        realize(&a.pad(&pairs, fx.arg_f64("value")?))
    });
}

#[test]
fn cat_stack() {
    run_family("cat/stack", JOIN, 7, |fx| {
        let xs = inputs(fx)?;
        let refs: Vec<&Tensor> = xs.iter().collect();
        let dim = fx.arg_i64("dim")?;
        let out = match fx.info.op.as_str() {
            "cat" => Tensor::cat(&refs, dim),
            "stack" => Tensor::stack(&refs, dim),
            _ => return Err(unknown(fx)),
        };
        realize(&out)
    });
}

#[test]
fn gather() {
    run_family("gather", GATHER, 3, |fx| {
        let (a, index) = (tensor(fx.tensor("a")?)?, tensor(fx.tensor("index")?)?);
        realize(&a.gather(fx.arg_i64("dim")?, &index))
    });
}

#[test]
fn cast() {
    run_family("cast", CAST, 7, |fx| {
        let to = fx.arg_str("to")?;
        let dtype = DType::from_name(to).ok_or_else(|| format!("unknown dtype `{to}`"))?;
        realize(&input(fx)?.cast(dtype))
    });
}

/// Every fixture in the file has an op some test above covers, and every tensor in the file
/// belongs to a fixture with metadata (the family tests check that they read every tensor and
/// argument of each fixture they run).
#[test]
fn every_fixture_is_tested() {
    let file = fixtures();
    let mut problems = Vec::new();
    for info in file.fixtures.values() {
        if !FAMILIES.iter().any(|ops| ops.contains(&info.op.as_str())) {
            problems.push(format!("fixture {} has op `{}`, which no test covers", info.name, info.op));
        }
        let mut expected: Vec<String> = info.inputs.clone();
        expected.push("out".to_string());
        expected.sort();
        let stored: Vec<String> = file.roles(&info.name).into_iter().collect();
        if stored != expected {
            problems.push(format!("fixture {} lists tensors {expected:?} but the file holds {stored:?}", info.name));
        }
    }
    for name in file.tensors.keys() {
        let fixture = name.split_once('.').map_or(name.as_str(), |(f, _)| f);
        if !file.fixtures.contains_key(fixture) {
            problems.push(format!("tensor {name} belongs to no fixture in the metadata"));
        }
    }
    let mut ops: Vec<&str> = FAMILIES.iter().flat_map(|f| f.iter().copied()).collect();
    ops.sort_unstable();
    if let Some(w) = ops.windows(2).find(|w| w[0] == w[1]) {
        problems.push(format!("op `{}` is in two families", w[0]));
    }
    assert!(file.fixtures.len() > 100, "only {} fixtures loaded", file.fixtures.len());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
