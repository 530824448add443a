//! ONNX's backend node tests (from the onnx 1.22.0 wheel) as the reference: every folder named
//! in `node-allowlist.txt` must import, run and match its recorded outputs on `cpu` and `interp`,
//! and on `wgpu` where its dtypes are ones wgpu has (not f16/bf16; a missing adapter skips
//! wgpu unless `CI` or `KILN_REQUIRE_VULKAN=1` is set).
//!
//! The data: `bash scripts/onnx-node-data.sh` installs the wheel into a throwaway venv and prints
//! the folder; set `KILN_ONNX_NODE_DIR` to it (`scripts/test.sh` does). Without it the tests fail
//! under CI (`CI` set) and print a notice elsewhere. `KILN_ONNX_NODE_ALL=1` runs every folder on
//! `cpu` instead and prints the ones that pass (to grow the allowlist); `KILN_ONNX_NODE_ALL=text`
//! runs the folders whose names contain `text`.
//!
//! Tolerances are ONNX's backend runner's: `rtol = 1e-3`, `atol = 1e-7` for floats, exact for
//! integers and booleans; NaN matches only NaN.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use air::testing::{Tol, check_host};
use kiln::{DType, Device, HostTensor, Tensor};
use kiln_onnx::Model;
use kiln_onnx::proto::TensorProto;
use prost::Message;

const TOL: Tol = Tol { atol: 1e-7, rtol: 1e-3 };

fn node_dir() -> Option<PathBuf> {
    match std::env::var_os("KILN_ONNX_NODE_DIR") {
        Some(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ => {
            let how = "KILN_ONNX_NODE_DIR is not set: run `export KILN_ONNX_NODE_DIR=$(bash scripts/onnx-node-data.sh)` \
                       (installs the onnx 1.22.0 wheel into target/onnx-venv and prints its node-test folder)";
            assert!(std::env::var_os("CI").is_none(), "{how}");
            eprintln!("skipping the ONNX node tests: {how}");
            None
        }
    }
}

fn allowlist() -> Vec<&'static str> {
    include_str!("../node-allowlist.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

fn read_tensor(path: &Path) -> Result<HostTensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let proto = TensorProto::decode(bytes.as_slice()).map_err(|e| format!("{}: {e}", path.display()))?;
    kiln_onnx::from_tensor_proto(&proto, path.parent()).map_err(|e| e.to_string())
}

/// `prefix_0.pb, prefix_1.pb, ...` of a test data set, in index order.
fn numbered(set: &Path, prefix: &str) -> Result<Vec<HostTensor>, String> {
    let mut out = Vec::new();
    while set.join(format!("{prefix}_{}.pb", out.len())).exists() {
        out.push(read_tensor(&set.join(format!("{prefix}_{}.pb", out.len())))?);
    }
    Ok(out)
}

/// What a test is filed under in the per-op counts: its op when the model has one node type.
fn label(model: &Model) -> String {
    let mut ops: Vec<&str> = model.nodes().filter_map(|n| n.op_type.as_deref()).collect();
    ops.sort_unstable();
    ops.dedup();
    match ops.as_slice() {
        [one] => one.to_string(),
        _ => "(function expansions)".into(),
    }
}

fn is_wgpu_dtype(d: DType) -> bool {
    !matches!(d, DType::F16 | DType::BF16)
}

/// Runs test folder `name` on `device`: `Ok(false)` when the device cannot take its dtypes.
fn run_case(root: &Path, name: &str, device: Device) -> Result<bool, String> {
    let dir = root.join(name);
    let model = Model::load(dir.join("model.onnx")).map_err(|e| e.to_string())?;
    let set = dir.join("test_data_set_0");
    let (inputs, want) = (numbered(&set, "input")?, numbered(&set, "output")?);
    if device == Device::Wgpu && !inputs.iter().chain(&want).all(|t| is_wgpu_dtype(t.dtype())) {
        return Ok(false);
    }
    let inputs: Vec<Tensor> = inputs.into_iter().map(|h| Tensor::from_host_on(h, device)).collect();
    // A model whose inner values have a dtype wgpu lacks (f16 through a Cast) is skipped there too.
    let skip_dtype =
        |e: String| if device == Device::Wgpu && e.contains("unsupported kernel: dtype") { Ok(false) } else { Err(e) };
    let got = match model.run(&inputs) {
        Ok(got) => got,
        Err(e) => return skip_dtype(e.to_string()),
    };
    if got.len() != want.len() {
        return Err(format!("{} outputs where the test records {}", got.len(), want.len()));
    }
    let refs: Vec<&Tensor> = got.iter().collect();
    if let Err(e) = kiln::realize(&refs) {
        return skip_dtype(e.to_string());
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let g = g.to_host().map_err(|e| e.to_string())?;
        if g.numel() == 0 && w.numel() == 0 && g.shape == w.shape && g.dtype() == w.dtype() {
            continue;
        }
        check_host(&g, w, TOL).map_err(|e| format!("output {i}: {e}"))?;
    }
    Ok(true)
}

/// Runs `names` on `device`, prints per-op pass counts, and returns the failures.
fn run_all(root: &Path, names: &[String], device: Device) -> (Vec<String>, Vec<(String, String)>) {
    let mut per_op: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let (mut passed, mut failed, mut skipped) = (Vec::new(), Vec::new(), 0);
    let start = std::time::Instant::now();
    for name in names {
        let op = Model::load(root.join(name).join("model.onnx"))
            .map(|m| label(&m))
            .unwrap_or_else(|_| "(unreadable)".into());
        let result = std::panic::catch_unwind(|| run_case(root, name, device))
            .unwrap_or_else(|p| Err(format!("panicked: {}", p.downcast_ref::<String>().cloned().unwrap_or_default())));
        let entry = per_op.entry(op).or_default();
        match result {
            Ok(true) => {
                entry.0 += 1;
                entry.1 += 1;
                passed.push(name.clone());
            }
            Ok(false) => skipped += 1,
            Err(e) => {
                entry.1 += 1;
                failed.push((name.clone(), e));
            }
        }
    }
    println!("ONNX node tests on {}: per op (passed/run)", device.name());
    for (op, (p, t)) in &per_op {
        println!("  {op:<28} {p}/{t}");
    }
    println!(
        "total on {}: {} passed, {} failed, {skipped} skipped (dtypes), {:.1} s",
        device.name(),
        passed.len(),
        failed.len(),
        start.elapsed().as_secs_f64()
    );
    (passed, failed)
}

fn check_allowlist(device: Device) {
    let Some(root) = node_dir() else { return };
    let names: Vec<String> = allowlist().iter().map(|s| s.to_string()).collect();
    let (_, failed) = run_all(&root, &names, device);
    for (name, e) in &failed {
        println!("FAIL {name}: {e}");
    }
    assert!(failed.is_empty(), "{} allowlisted node tests failed on {} (listed above)", failed.len(), device.name());
}

#[test]
fn node_tests_cpu() {
    if let Some(which) = std::env::var("KILN_ONNX_NODE_ALL").ok().filter(|v| !v.is_empty()) {
        let Some(root) = node_dir() else { return };
        let part = if which == "1" { "" } else { which.as_str() };
        let mut names: Vec<String> = std::fs::read_dir(&root)
            .expect("the node-test folder is readable")
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|name| name.contains(part))
            .collect();
        names.sort();
        let (passed, failed) = run_all(&root, &names, Device::Cpu);
        for (name, e) in &failed {
            println!("FAIL {name}: {}", e.lines().next().unwrap_or(""));
        }
        for name in &passed {
            println!("PASS {name}");
        }
        return;
    }
    check_allowlist(Device::Cpu);
}

#[test]
fn node_tests_interp() {
    check_allowlist(Device::Interp);
}

#[test]
fn node_tests_wgpu() {
    if let Err(e) = Device::Wgpu.probe() {
        let required =
            std::env::var_os("CI").is_some() || std::env::var_os("KILN_REQUIRE_VULKAN").is_some_and(|v| v == "1");
        assert!(!required, "wgpu is unavailable where it is required (CI or KILN_REQUIRE_VULKAN=1): {e}");
        eprintln!("skipping the wgpu node tests: {e}");
        return;
    }
    check_allowlist(Device::Wgpu);
}
