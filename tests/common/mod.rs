//! Shared helpers for the PyTorch comparison tests: loading `tests/fixtures/ops.safetensors`,
//! tracking which tensors and arguments each fixture's test reads, and comparing results.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::OnceLock;

use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

/// The elements of a fixture tensor (or of a Kiln result brought back to the host).
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
}

impl Data {
    pub fn kind(&self) -> &'static str {
        match self {
            Data::F32(_) => "f32",
            Data::I64(_) => "i64",
            Data::I32(_) => "i32",
            Data::Bool(_) => "bool",
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }
}

/// A tensor: shape plus row-major elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub shape: Vec<usize>,
    pub data: Data,
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}", self.data.kind(), self.shape)
    }
}

/// One fixture's description from the file's `__metadata__`.
pub struct FixtureInfo {
    pub name: String,
    pub op: String,
    /// Input roles in call order.
    pub inputs: Vec<String>,
    /// The op's arguments (every metadata key but `op` and `inputs`).
    pub args: BTreeMap<String, Value>,
}

/// The whole fixture file, parsed once per test binary.
pub struct Fixtures {
    pub torch_version: String,
    pub fixtures: BTreeMap<String, FixtureInfo>,
    pub tensors: BTreeMap<String, Array>,
}

pub const FIXTURE_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ops.safetensors");

fn convert(name: &str, dtype: Dtype, shape: &[usize], bytes: &[u8]) -> Result<Array, String> {
    fn chunks<const N: usize, T>(bytes: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
        bytes.chunks_exact(N).map(|c| f(c.try_into().expect("chunks_exact yields N bytes"))).collect()
    }
    let data = match dtype {
        Dtype::F32 => Data::F32(chunks(bytes, f32::from_le_bytes)),
        Dtype::I64 => Data::I64(chunks(bytes, i64::from_le_bytes)),
        Dtype::I32 => Data::I32(chunks(bytes, i32::from_le_bytes)),
        Dtype::BOOL => Data::Bool(bytes.iter().map(|&b| b != 0).collect()),
        other => return Err(format!("{name}: unsupported fixture dtype {other:?}")),
    };
    let numel: usize = shape.iter().product();
    if data.len() != numel {
        return Err(format!("{name}: {} elements for shape {shape:?}", data.len()));
    }
    Ok(Array { shape: shape.to_vec(), data })
}

fn load() -> Result<Fixtures, String> {
    let bytes = std::fs::read(FIXTURE_FILE).map_err(|e| format!("reading {FIXTURE_FILE}: {e}"))?;
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| format!("{FIXTURE_FILE}: {e:?}"))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| format!("{FIXTURE_FILE}: {e:?}"))?;
    let mut tensors = BTreeMap::new();
    for (name, view) in st.iter() {
        tensors.insert(name.to_string(), convert(name, view.dtype(), view.shape(), view.data())?);
    }
    let raw = meta.metadata().as_ref().ok_or("fixture file has no __metadata__")?;
    let mut fixtures = BTreeMap::new();
    let mut torch_version = String::new();
    for (key, text) in raw {
        if key == "__torch_version__" {
            torch_version = text.clone();
            continue;
        }
        let json: Value = serde_json::from_str(text).map_err(|e| format!("metadata of {key}: {e}"))?;
        let Value::Object(mut obj) = json else {
            return Err(format!("metadata of {key} is not a JSON object"));
        };
        let op = obj.remove("op").and_then(|v| v.as_str().map(String::from));
        let op = op.ok_or_else(|| format!("metadata of {key} has no string `op`"))?;
        let inputs = obj.remove("inputs").and_then(|v| {
            v.as_array().map(|a| a.iter().filter_map(|r| r.as_str().map(String::from)).collect::<Vec<_>>())
        });
        let inputs = inputs.ok_or_else(|| format!("metadata of {key} has no `inputs` list"))?;
        let args = obj.into_iter().collect();
        fixtures.insert(key.clone(), FixtureInfo { name: key.clone(), op, inputs, args });
    }
    Ok(Fixtures { torch_version, fixtures, tensors })
}

/// The parsed fixture file (panics with the reason if it cannot be read).
pub fn fixtures() -> &'static Fixtures {
    static CELL: OnceLock<Fixtures> = OnceLock::new();
    CELL.get_or_init(|| load().unwrap_or_else(|e| panic!("loading PyTorch fixtures: {e}")))
}

impl Fixtures {
    /// The tensor roles stored for `fixture` (input roles and `out`).
    pub fn roles(&self, fixture: &str) -> BTreeSet<String> {
        let prefix = format!("{fixture}.");
        self.tensors.keys().filter_map(|k| k.strip_prefix(&prefix).map(String::from)).collect()
    }
}

/// One fixture while its test runs: hands out inputs and arguments and remembers which were read,
/// so that the harness can fail a test that ignored part of its fixture.
pub struct Fixture<'a> {
    pub info: &'a FixtureInfo,
    file: &'a Fixtures,
    read_roles: RefCell<BTreeSet<String>>,
    read_args: RefCell<BTreeSet<String>>,
}

impl<'a> Fixture<'a> {
    pub fn new(file: &'a Fixtures, info: &'a FixtureInfo) -> Fixture<'a> {
        Fixture { info, file, read_roles: RefCell::default(), read_args: RefCell::default() }
    }

    /// The tensor `role` of this fixture (`a`, `b`, `index`, `out`, ...).
    pub fn tensor(&self, role: &str) -> Result<&'a Array, String> {
        self.read_roles.borrow_mut().insert(role.to_string());
        let key = format!("{}.{role}", self.info.name);
        self.file.tensors.get(&key).ok_or_else(|| format!("fixture file has no tensor {key}"))
    }

    /// The input tensors in call order.
    pub fn inputs(&self) -> Result<Vec<&'a Array>, String> {
        self.info.inputs.iter().map(|r| self.tensor(r)).collect()
    }

    /// The single input of a one-input op.
    pub fn input(&self) -> Result<&'a Array, String> {
        match self.info.inputs.as_slice() {
            [only] => self.tensor(only),
            other => Err(format!("expected one input, the fixture lists {other:?}")),
        }
    }

    pub fn arg(&self, key: &str) -> Result<&'a Value, String> {
        self.read_args.borrow_mut().insert(key.to_string());
        self.info.args.get(key).ok_or_else(|| format!("metadata has no argument `{key}`"))
    }

    pub fn has_arg(&self, key: &str) -> bool {
        self.info.args.contains_key(key)
    }

    pub fn arg_i64(&self, key: &str) -> Result<i64, String> {
        self.arg(key)?.as_i64().ok_or_else(|| format!("argument `{key}` is not an integer"))
    }

    pub fn arg_f64(&self, key: &str) -> Result<f64, String> {
        self.arg(key)?.as_f64().ok_or_else(|| format!("argument `{key}` is not a number"))
    }

    pub fn arg_bool(&self, key: &str) -> Result<bool, String> {
        self.arg(key)?.as_bool().ok_or_else(|| format!("argument `{key}` is not a bool"))
    }

    pub fn arg_str(&self, key: &str) -> Result<&'a str, String> {
        self.arg(key)?.as_str().ok_or_else(|| format!("argument `{key}` is not a string"))
    }

    /// An integer list argument, or `None` where the metadata holds `null`.
    pub fn arg_i64s(&self, key: &str) -> Result<Option<Vec<i64>>, String> {
        let v = self.arg(key)?;
        if v.is_null() {
            return Ok(None);
        }
        let list = v.as_array().ok_or_else(|| format!("argument `{key}` is not a list"))?;
        list.iter()
            .map(|x| x.as_i64().ok_or_else(|| format!("argument `{key}` holds a non-integer")))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// An integer argument that may be `null`.
    pub fn arg_opt_i64(&self, key: &str) -> Result<Option<i64>, String> {
        let v = self.arg(key)?;
        if v.is_null() { Ok(None) } else { v.as_i64().map(Some).ok_or_else(|| format!("`{key}` is not an integer")) }
    }

    /// Errors naming whatever the test left unread.
    pub fn check_all_read(&self) -> Result<(), String> {
        let roles = self.file.roles(&self.info.name);
        let read = self.read_roles.borrow();
        let unread: Vec<_> = roles.iter().filter(|r| !read.contains(*r)).collect();
        let read_args = self.read_args.borrow();
        let unread_args: Vec<_> = self.info.args.keys().filter(|k| !read_args.contains(*k)).collect();
        if unread.is_empty() && unread_args.is_empty() {
            Ok(())
        } else {
            Err(format!("test left tensors {unread:?} and arguments {unread_args:?} unread"))
        }
    }
}

/// Absolute and relative tolerance for f32 results: `|got - want| <= ATOL + RTOL * |want|`.
pub const ATOL: f32 = 1e-5;
pub const RTOL: f32 = 1e-5;

/// Compares a Kiln result with PyTorch's through `air::testing`: same dtype, same shape, floats
/// within tolerance (NaN matches only NaN, infinities must match exactly), integers and bools
/// exactly, at least one element. Returns how much of the tolerance the worst element used
/// (`|got - want| / (ATOL + RTOL * |want|)`, 0 for ints).
pub fn compare(got: &Array, want: &Array) -> Result<f32, String> {
    use air::testing::{Mismatch, Tol, check_close, check_equal};
    if got.shape != want.shape || got.data.kind() != want.data.kind() {
        return Err(format!("kiln gave {got}, torch gave {want}"));
    }
    if want.data.len() == 0 {
        // An empty result: dtype and shape, checked above, are all there is to compare.
        return Ok(0.0);
    }
    let tol = Tol { atol: ATOL.into(), rtol: RTOL.into() };
    let result = match (&got.data, &want.data) {
        (Data::F32(g), Data::F32(w)) => check_close(g, w, tol).map(|c| c.used as f32),
        (Data::I64(g), Data::I64(w)) => check_equal(g, w).map(|_| 0.0),
        (Data::I32(g), Data::I32(w)) => check_equal(g, w).map(|_| 0.0),
        (Data::Bool(g), Data::Bool(w)) => check_equal(g, w).map(|_| 0.0),
        _ => unreachable!("kinds were checked equal"),
    };
    result.map_err(|e| match e {
        Mismatch::Values { bad, compared, index, got, want: w } => {
            let mut idx = vec![0; want.shape.len()];
            let mut rest = index;
            for (i, &d) in want.shape.iter().enumerate().rev() {
                idx[i] = rest % d.max(1);
                rest /= d.max(1);
            }
            format!(
                "{bad} of {compared} elements differ; worst at {idx:?}: kiln {got} torch {w} (shape {:?})",
                want.shape
            )
        }
        other => format!("{other} (shape {:?})", want.shape),
    })
}

/// Runs `eval` on every fixture whose op is in `ops` and that `skip` does not name, compares each
/// result with the fixture's `out`, and panics with one line per failing fixture (name, op, what
/// differed). Prints how many fixtures agreed and the largest float error among them (see it with
/// `--nocapture`). Returns the fixtures compared and the names of those skipped.
pub fn run_family(
    family: &str,
    ops: &[&str],
    skip: &dyn Fn(&FixtureInfo) -> bool,
    eval: &dyn Fn(&Fixture) -> Result<Array, String>,
) -> (usize, Vec<String>) {
    let file = fixtures();
    let mut failures = Vec::new();
    let mut ran = 0;
    let mut skipped = Vec::new();
    let mut worst_ok: (f32, &str) = (0.0, "-");
    for info in file.fixtures.values().filter(|f| ops.contains(&f.op.as_str())) {
        if skip(info) {
            skipped.push(info.name.clone());
            continue;
        }
        ran += 1;
        let fx = Fixture::new(file, info);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<f32, String> {
            let got = eval(&fx)?;
            let want = fx.tensor("out")?;
            let err = compare(&got, want)?;
            fx.check_all_read()?;
            Ok(err)
        }));
        let outcome = match result {
            Ok(r) => r,
            Err(p) => Err(format!(
                "panicked: {}",
                p.downcast_ref::<String>().map(String::as_str).or(p.downcast_ref::<&str>().copied()).unwrap_or("?")
            )),
        };
        match outcome {
            Ok(err) => {
                if err > worst_ok.0 {
                    worst_ok = (err, &info.name);
                }
            }
            Err(e) => {
                let shapes: Vec<String> =
                    info.inputs.iter().filter_map(|r| fx.tensor(r).ok().map(|t| format!("{r}={t}"))).collect();
                failures.push(format!("  {} (op {}, inputs {}): {e}", info.name, info.op, shapes.join(" ")));
            }
        }
    }
    for op in ops {
        if !file.fixtures.values().any(|f| f.op == *op) {
            failures.push(format!("  op {op}: no fixture in {FIXTURE_FILE}"));
        }
    }
    println!(
        "{family}: {} of {ran} fixtures agree with PyTorch {}; worst error {:.3} of the tolerance ({})",
        ran - failures.len(),
        file.torch_version,
        worst_ok.0,
        worst_ok.1
    );
    assert!(
        failures.is_empty(),
        "{family}: {} of {ran} fixtures disagree with PyTorch {}:\n{}",
        failures.len(),
        file.torch_version,
        failures.join("\n")
    );
    (ran, skipped)
}
