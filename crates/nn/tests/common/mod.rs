//! Shared helpers of the `kiln-nn` tests: the PyTorch fixtures of `tests/fixtures/gen_nn.py` and
//! comparisons.

#![allow(dead_code)]

use std::collections::HashMap;

use kiln::Tensor;
use kiln_nn::{Module, Transformer, load_state_dict, read_safetensors};

/// The tensors of a fixture file under the repository's `tests/fixtures`.
pub fn fixture_file(file: &str) -> HashMap<String, Tensor> {
    let path = format!("{}/../../tests/fixtures/{file}", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    read_safetensors(&bytes).expect("fixture parses")
}

/// One fixture: the tensors named `<name>.*`, with the prefix removed.
pub struct Fixture {
    pub name: String,
    pub tensors: HashMap<String, Tensor>,
}

impl Fixture {
    pub fn new(all: &HashMap<String, Tensor>, name: &str) -> Fixture {
        let prefix = format!("{name}.");
        let tensors: HashMap<String, Tensor> =
            all.iter().filter_map(|(k, v)| k.strip_prefix(&prefix).map(|k| (k.to_string(), v.clone()))).collect();
        assert!(!tensors.is_empty(), "no fixture `{name}`");
        Fixture { name: name.to_string(), tensors }
    }

    pub fn get(&self, role: &str) -> Tensor {
        self.tensors.get(role).unwrap_or_else(|| panic!("{}: no `{role}`", self.name)).clone()
    }

    /// The tensors under `<group>.`, prefix removed (`param`, `grad`, `step3`).
    pub fn group(&self, group: &str) -> HashMap<String, Tensor> {
        let prefix = format!("{group}.");
        self.tensors.iter().filter_map(|(k, v)| k.strip_prefix(&prefix).map(|k| (k.to_string(), v.clone()))).collect()
    }

    /// Loads `param.*` into `module` (strictly: every name must match).
    pub fn load(&self, module: &mut dyn Module) {
        load_state_dict(module, &self.group("param"), true).unwrap_or_else(|e| panic!("{}: {e}", self.name));
    }
}

/// The elements of `t` as f64 (panics naming `what` if it cannot be realized); cast on the CPU,
/// so that tensors of devices without 64-bit floats compare too.
pub fn values(what: &str, t: &Tensor) -> Vec<f64> {
    t.to_device(kiln::Device::Cpu)
        .and_then(|t| t.cast(kiln::DType::F64).to_vec::<f64>())
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Asserts `got` matches `want` within `|got - want| <= tol * (1 + |want|)` (absolute near 0,
/// relative for large values) through `air::testing`: same shape, at least one element, NaN only
/// where the reference is NaN, infinities equal. Returns the largest such error.
#[track_caller]
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) -> f64 {
    let (g, w) = (values(what, got), values(what, want));
    assert_eq!(got.dims().unwrap(), want.dims().unwrap(), "{what}: shapes differ");
    air::testing::assert_close(what, &g, &w, air::testing::Tol::both(tol)).max_err
}

/// The anchor Transformer (dim 64, 8 heads, 2 layers, vocab 64) with the fixture's weights.
#[allow(dead_code)] // Used by some of the test binaries that include this module.
pub fn transformer_and_fixture() -> (Transformer, Fixture) {
    let f = Fixture::new(&fixture_file("nn_transformer.safetensors"), "transformer");
    let mut model = Transformer::new(64, 8, 2, 1e-5, 64).unwrap();
    f.load(&mut model);
    (model, f)
}

/// The devices to run on: the interpreter, the CPU device, and wgpu when this machine has an
/// adapter (skipped with a printed reason otherwise, unless `KILN_REQUIRE_GPU=1`).
pub fn devices() -> Vec<kiln::Device> {
    let mut out = vec![kiln::Device::Interp, kiln::Device::Cpu];
    let probe = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).to_device(kiln::Device::Wgpu).and_then(|t| {
        t.neg().realize()?;
        Ok(())
    });
    match probe {
        Ok(()) => out.push(kiln::Device::Wgpu),
        Err(e) => {
            let required = std::env::var("KILN_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!required, "KILN_REQUIRE_GPU=1 but the wgpu device failed: {e}");
            eprintln!("skipping wgpu: no usable GPU adapter ({e})");
        }
    }
    out
}
