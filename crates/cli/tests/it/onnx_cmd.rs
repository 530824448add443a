//! `kiln onnx info`, `kiln onnx run`, `kiln profile onnx` and `kiln bench onnx` on a small model
//! written here: `y = softmax(x @ w + b)` with a symbolic batch and one op the importer lacks in
//! a second file, and a max pool whose profile must be the inference program.

use std::collections::HashMap;
use std::path::PathBuf;

use kiln_cli::onnx_cmd;
use kiln_cli::timing::Budget;
use kiln_onnx::proto::attribute_proto::AttributeType;
use kiln_onnx::proto::tensor_proto::DataType;
use kiln_onnx::proto::tensor_shape_proto::{Dimension, dimension};
use kiln_onnx::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto, type_proto,
};
use prost::Message;

fn value(name: &str, dims: Vec<dimension::Value>) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(DataType::Float as i32),
                shape: Some(TensorShapeProto {
                    dim: dims.into_iter().map(|v| Dimension { value: Some(v), ..Default::default() }).collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
    NodeProto {
        name: Some(format!("{op}_0")),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    }
}

/// Writes the model (with `extra` as the last op when given) and returns its path.
fn write_model(file: &str, extra: Option<&str>) -> PathBuf {
    let w: Vec<u8> = (0..12).flat_map(|i| (i as f32 * 0.1 - 0.5).to_le_bytes()).collect();
    let mut nodes =
        vec![node("MatMul", &["x", "w"], "xw"), node("Add", &["xw", "b"], "z"), node("Softmax", &["z"], "y")];
    if let Some(op) = extra {
        nodes.push(node(op, &["y"], "y2"));
    }
    let out = if extra.is_some() { "y2" } else { "y" };
    let batch = dimension::Value::DimParam("batch".into());
    let m = ModelProto {
        ir_version: Some(9),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(18) }],
        graph: Some(GraphProto {
            node: nodes,
            input: vec![value("x", vec![batch.clone(), dimension::Value::DimValue(4)])],
            output: vec![value(out, vec![batch, dimension::Value::DimValue(3)])],
            initializer: vec![
                TensorProto {
                    name: Some("w".into()),
                    dims: vec![4, 3],
                    data_type: Some(DataType::Float as i32),
                    raw_data: Some(w.into()),
                    ..Default::default()
                },
                TensorProto {
                    name: Some("b".into()),
                    dims: vec![3],
                    data_type: Some(DataType::Float as i32),
                    float_data: vec![0.1, 0.2, 0.3],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }),
        ..Default::default()
    };
    let path = std::env::temp_dir().join(format!("kiln-cli-{}-{file}", std::process::id()));
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    path
}

#[test]
fn profile_compiles_the_inference_program() {
    // A 2x2 max pool: traced with gradients on, it keeps each window's winner (an i32 buffer of
    // indices and two more reduces); the session, and so the profile, trace it under no_grad.
    let mut pool = node("MaxPool", &["x"], "y");
    for name in ["kernel_shape", "strides"] {
        pool.attribute.push(AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::Ints as i32),
            ints: vec![2, 2],
            ..Default::default()
        });
    }
    let dims = |d: [i64; 4]| d.into_iter().map(dimension::Value::DimValue).collect();
    let m = ModelProto {
        ir_version: Some(9),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(18) }],
        graph: Some(GraphProto {
            node: vec![pool],
            input: vec![value("x", dims([2, 3, 8, 8]))],
            output: vec![value("y", dims([2, 3, 4, 4]))],
            ..Default::default()
        }),
        ..Default::default()
    };
    let path = std::env::temp_dir().join(format!("kiln-cli-{}-pool.onnx", std::process::id()));
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let (_, p) = onnx_cmd::profile(&path, &HashMap::new(), &lower::CompileOptions::default(), false, true).unwrap();
    let program = p.compiled.exe.program();
    assert!(program.buffers.iter().all(|b| b.dtype != air::DType::I32), "{program}");
    assert_eq!(p.compiled.kernels, 1, "{program}");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn info_lists_io_ops_and_unsupported_ones() {
    let path = write_model("info.onnx", Some("Det"));
    let text = onnx_cmd::info(&path).unwrap();
    assert!(text.contains("x: FLOAT [batch, 4]"), "{text}");
    assert!(text.contains("weights: 2 tensors, 60 bytes"), "{text}");
    assert!(text.contains("MatMul") && text.contains("Softmax"), "{text}");
    assert!(text.contains("unsupported ops (1):") && text.contains("Det (node \"Det_0\", opset 18)"), "{text}");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn profile_and_bench_run_the_imported_model() {
    let path = write_model("run.onnx", None);
    let dims: HashMap<String, usize> = onnx_cmd::parse_dims(&["batch=5".to_string()]).unwrap();
    let (_, p) = onnx_cmd::profile(&path, &dims, &lower::CompileOptions::default(), false, true).unwrap();
    let text = onnx_cmd::render_profile(&path, &p);
    assert!(text.contains("kiln profile onnx") && text.contains("codegen"), "{text}");
    let r = onnx_cmd::bench(&path, &dims, kiln::Device::Cpu, Budget::SMOKE).unwrap();
    assert!(r.first_call_ms > 0.0 && r.steady_ms > 0.0);
    assert!(r.warm_first_call_ms.is_some_and(|(median, fastest)| fastest > 0.0 && fastest <= median));
    // A symbolic dim without --dim is an error that says what to pass.
    let err = onnx_cmd::bench(&path, &HashMap::new(), kiln::Device::Cpu, Budget::SMOKE).err().unwrap().to_string();
    assert!(err.contains("--dim batch=N"), "{err}");
    assert!(onnx_cmd::parse_dims(&["batch".to_string()]).is_err());
    std::fs::remove_file(path).unwrap();
}

/// `softmax(x @ w + b)` of the model `write_model` writes, by the definition.
fn reference(x: &[f32], batch: usize) -> Vec<f32> {
    let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.1 - 0.5).collect();
    let b = [0.1f32, 0.2, 0.3];
    let mut y = Vec::new();
    for r in 0..batch {
        let z: Vec<f32> = (0..3).map(|j| (0..4).map(|p| x[r * 4 + p] * w[p * 3 + j]).sum::<f32>() + b[j]).collect();
        let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = z.iter().map(|v| (v - m).exp()).collect();
        let s: f32 = e.iter().sum();
        y.extend(e.iter().map(|v| v / s));
    }
    y
}

#[test]
fn run_reads_inputs_from_files_and_writes_and_checks_outputs() {
    use kiln::{HostData, HostTensor};
    use kiln_cli::bench::check::Tolerance;
    use kiln_cli::tensor_file;

    let path = write_model("files.onnx", None);
    let dir = std::env::temp_dir().join(format!("kiln-cli-{}-run", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f32s = |v: Vec<f32>, shape: Vec<usize>| HostTensor::new(HostData::F32(v), shape).unwrap();
    // Batch 2 as a .npy file; batch 3 as a TensorProto (.pb): the batch is symbolic.
    let x2: Vec<f32> = (0..8).map(|i| (i as f32 * 0.37).sin()).collect();
    tensor_file::write_npy(&dir.join("x2.npy"), &f32s(x2.clone(), vec![2, 4])).unwrap();
    tensor_file::write_npy(&dir.join("y2.npy"), &f32s(reference(&x2, 2), vec![2, 3])).unwrap();
    let x3: Vec<f32> = (0..12).map(|i| (i as f32 * 0.61).cos()).collect();
    let proto = TensorProto {
        name: Some("x".into()),
        dims: vec![3, 4],
        data_type: Some(DataType::Float as i32),
        float_data: x3.clone(),
        ..Default::default()
    };
    std::fs::write(dir.join("x3.pb"), proto.encode_to_vec()).unwrap();
    let named = |pairs: &[(&str, &str)]| -> Vec<(String, PathBuf)> {
        pairs.iter().map(|(n, f)| (n.to_string(), dir.join(f))).collect()
    };
    let out = dir.join("out");
    let tol = Tolerance { rtol: 1e-5, atol: 1e-6 };
    let run = |inputs: &[(String, PathBuf)], expect: &[(String, PathBuf)], out: Option<&std::path::Path>| {
        onnx_cmd::run(&onnx_cmd::RunArgs { model: &path, inputs, expect, tol, out, device: kiln::Device::Cpu })
    };

    let r = run(&named(&[("x", "x2.npy")]), &named(&[("y", "y2.npy")]), Some(&out)).unwrap();
    assert!(r.mismatches.is_empty(), "{}", r.text);
    assert!(r.text.contains("y: f32 [2, 3]") && r.text.contains("matches"), "{}", r.text);
    // The written output reads back as what the model computed.
    let written = tensor_file::read(&out.join("y.npy")).unwrap();
    assert_eq!(written.shape, vec![2, 3]);
    let got = written.data.to_f64_vec();
    for (g, w) in got.iter().zip(reference(&x2, 2)) {
        assert!((g - w as f64).abs() < 1e-6, "{got:?}");
    }

    // Batch 3 from a TensorProto, checked against a reference of the wrong batch: a mismatch
    // that says why, not an error of the run itself.
    let r = run(&named(&[("x", "x3.pb")]), &named(&[("y", "y2.npy")]), None).unwrap();
    assert!(r.text.contains("y: f32 [3, 3]"), "{}", r.text);
    assert_eq!(r.mismatches.len(), 1, "{}", r.text);
    assert!(r.mismatches[0].contains("shape [3, 3] where the reference has [2, 3]"), "{:?}", r.mismatches);
    // A reference off in one element.
    let mut off = reference(&x3, 3);
    off[4] += 1e-3;
    tensor_file::write_npy(&dir.join("y3_off.npy"), &f32s(off, vec![3, 3])).unwrap();
    let r = run(&named(&[("x", "x3.pb")]), &named(&[("y", "y3_off.npy")]), None).unwrap();
    assert!(r.text.contains("DIFFERS") && r.mismatches[0].contains("1 of 9 elements"), "{}", r.text);

    // Missing and unknown inputs, unknown outputs and unreadable files are errors that say what
    // the model takes.
    let err = run(&[], &[], None).err().unwrap().to_string();
    assert!(err.contains("--input NAME=FILE") && err.contains("x: FLOAT [batch, 4]"), "{err}");
    let err = run(&named(&[("x", "x2.npy"), ("z", "x2.npy")]), &[], None).err().unwrap().to_string();
    assert!(err.contains("--input z: the model has no such input"), "{err}");
    let err = run(&named(&[("x", "x2.npy")]), &named(&[("q", "y2.npy")]), None).err().unwrap().to_string();
    assert!(err.contains("--expect q: the model has no such output"), "{err}");
    std::fs::write(dir.join("x.txt"), "1 2 3").unwrap();
    let err = format!("{:#}", run(&named(&[("x", "x.txt")]), &[], None).err().unwrap());
    assert!(err.contains("expected a .npy or a .pb"), "{err}");
    std::fs::write(dir.join("bad.npy"), "not numpy").unwrap();
    assert!(run(&named(&[("x", "bad.npy")]), &[], None).is_err());
    assert!(onnx_cmd::parse_named_files("--input", &["x".to_string()]).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_file(path).unwrap();
}
