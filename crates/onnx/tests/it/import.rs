//! Import behaviour beyond op numerics: unsupported ops reported all at once, malformed models
//! (dangling names, cycles, wrong attribute types, truncated or mutated bytes) as errors and never
//! panics, external data, symbolic `dim_param` inputs, and node errors naming the node.

use kiln::{Device, HostData, HostTensor, Tensor};
use kiln_onnx::proto::tensor_proto::{DataLocation, DataType};
use kiln_onnx::proto::tensor_shape_proto::{Dimension, dimension};
use kiln_onnx::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto, attribute_proto::AttributeType, type_proto,
};
use kiln_onnx::{Error, Model};
use proptest::prelude::*;
use prost::Message;

fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// A float tensor value `name` of `dims` (`Err(param)` dims are symbolic).
fn value(name: &str, dims: &[Result<i64, &str>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Ok(v) => dimension::Value::DimValue(*v),
                Err(p) => dimension::Value::DimParam(p.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(DataType::Float as i32),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A tensor value `name` of `dims` with element type `elem`.
fn typed_value(name: &str, dims: &[Result<i64, &str>], elem: DataType) -> ValueInfoProto {
    let mut v = value(name, dims);
    if let Some(type_proto::Value::TensorType(t)) = v.r#type.as_mut().and_then(|t| t.value.as_mut()) {
        t.elem_type = Some(elem as i32);
    }
    v
}

fn model(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    inits: Vec<TensorProto>,
) -> ModelProto {
    ModelProto {
        ir_version: Some(9),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(GraphProto {
            node: nodes,
            name: Some("g".into()),
            input: inputs,
            output: outputs,
            initializer: inits,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn floats(name: &str, dims: &[i64], data: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Float as i32),
        raw_data: Some(data.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>().into()),
        ..Default::default()
    }
}

/// `y = relu(x @ w + b)`, x `[batch, 3]`.
fn mlp() -> ModelProto {
    model(
        vec![
            node("mm", "MatMul", &["x", "w"], &["xw"]),
            node("add", "Add", &["xw", "b"], &["h"]),
            node("act", "Relu", &["h"], &["y"]),
        ],
        vec![value("x", &[Err("batch"), Ok(3)])],
        vec![value("y", &[Err("batch"), Ok(2)])],
        vec![floats("w", &[3, 2], &[1.0, -1.0, 2.0, 0.5, -3.0, 1.0]), floats("b", &[2], &[0.5, -0.25])],
    )
}

fn mlp_reference(x: &[f32]) -> Vec<f32> {
    let w = [[1.0, -1.0], [2.0, 0.5], [-3.0, 1.0]];
    let b = [0.5, -0.25];
    x.chunks(3)
        .flat_map(|r| (0..2).map(move |j| (r[0] * w[0][j] + r[1] * w[1][j] + r[2] * w[2][j] + b[j]).max(0.0)))
        .collect()
}

#[test]
fn mlp_runs_at_two_batch_sizes_with_a_symbolic_batch() {
    let m = Model::from_bytes(&mlp().encode_to_vec()).unwrap();
    assert_eq!(m.inputs()[0].dims.as_ref().unwrap()[0].to_string(), "batch");
    for batch in [2usize, 5] {
        let data: Vec<f32> = (0..batch * 3).map(|i| (i as f32 * 0.37).sin()).collect();
        let host = HostTensor::new(HostData::F32(data.clone()), vec![batch, 3]).unwrap();
        let x = m.input_tensor(0, host, Device::Cpu).unwrap();
        assert_eq!(x.shape()[0].to_string(), "batch");
        let y = m.run(&[x]).unwrap().remove(0);
        air::testing::assert_close(
            "mlp",
            &y.to_vec::<f32>().unwrap(),
            &mlp_reference(&data),
            air::testing::Tol::both(1e-6),
        );
    }
}

fn ints(name: &str, dims: &[i64], data: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Int64 as i32),
        raw_data: Some(data.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>().into()),
        ..Default::default()
    }
}

/// An exporter's shape arithmetic on a `[batch, seq, 4]` input, as torch.onnx writes it: the
/// shape `[batch * seq, 4]` built from `Shape`, `Gather`, `Mul`, `Unsqueeze` and `Concat` feeds a
/// `Reshape`; `Range(0, seq, 1)` gives the positions, added to a `Slice` up to `seq` of a longer
/// table.
fn shape_arithmetic() -> ModelProto {
    let int_attr = |mut n: NodeProto, name: &str, v: i64| {
        n.attribute.push(AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::Int as i32),
            i: Some(v),
            ..Default::default()
        });
        n
    };
    let u_rows = node("u_rows", "Unsqueeze", &["rows", "zero_axis"], &["rows1"]);
    let u_seq = node("u_seq", "Unsqueeze", &["seq", "zero_axis"], &["seq1"]);
    model(
        vec![
            node("shape", "Shape", &["x"], &["s"]),
            node("g0", "Gather", &["s", "i0"], &["batch"]),
            node("g1", "Gather", &["s", "i1"], &["seq"]),
            node("mul", "Mul", &["batch", "seq"], &["rows"]),
            u_rows,
            int_attr(node("cat", "Concat", &["rows1", "four"], &["target"]), "axis", 0),
            node("reshape", "Reshape", &["x", "target"], &["flat"]),
            node("range", "Range", &["i0", "seq", "one"], &["pos"]),
            int_attr(node("cast", "Cast", &["pos"], &["posf"]), "to", DataType::Float as i64),
            u_seq,
            node("slice", "Slice", &["table", "zero1", "seq1"], &["picked"]),
            node("add2", "Add", &["picked", "posf"], &["z"]),
            node("id", "Identity", &["flat"], &["y"]),
        ],
        vec![value("x", &[Err("batch"), Err("seq"), Ok(4)])],
        vec![value("y", &[Err("rows"), Ok(4)]), value("z", &[Err("seq")])],
        vec![
            ints("i0", &[], &[0]),
            ints("i1", &[], &[1]),
            ints("one", &[], &[1]),
            ints("four", &[1], &[4]),
            ints("zero_axis", &[1], &[0]),
            ints("zero1", &[1], &[0]),
            floats("table", &[16], &(0..16).map(|i| 100.0 + i as f32).collect::<Vec<_>>()),
        ],
    )
}

#[test]
fn shape_values_computed_from_symbolic_dims_drive_reshape_range_and_slice() {
    let m = Model::from_bytes(&shape_arithmetic().encode_to_vec()).unwrap();
    let mut session = m.session();
    for (batch, seq) in [(2usize, 3usize), (1, 5), (3, 2)] {
        let data: Vec<f32> = (0..batch * seq * 4).map(|i| i as f32).collect();
        let host = HostTensor::new(HostData::F32(data.clone()), vec![batch, seq, 4]).unwrap();
        let x = m.input_tensor(0, host, Device::Cpu).unwrap();
        for outs in [m.run(std::slice::from_ref(&x)).unwrap(), session.run(&[&x]).unwrap()] {
            assert_eq!(outs[0].to_vec::<f32>().unwrap(), data, "batch {batch} seq {seq}");
            assert_eq!(outs[0].dims().unwrap(), [batch * seq, 4]);
            let want: Vec<f32> = (0..seq).map(|p| 100.0 + 2.0 * p as f32).collect();
            assert_eq!(outs[1].to_vec::<f32>().unwrap(), want, "batch {batch} seq {seq}");
        }
    }
    assert_eq!(session.traces(), 1, "one trace serves every batch and sequence length");
}

/// `Gather(x, indices, axis=1)` on `x: [2, 4, 3]` with `indices` an initializer.
fn gather_known(dims: &[i64], indices: &[i64]) -> ModelProto {
    let mut g = node("g", "Gather", &["x", "i"], &["y"]);
    g.attribute.push(AttributeProto {
        name: Some("axis".into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(1),
        ..Default::default()
    });
    model(vec![g], vec![value("x", &[Ok(2), Ok(4), Ok(3)])], vec![value("y", &[])], vec![ints("i", dims, indices)])
}

/// Indices known at import become a slice when they are an ascending run (a model's `x[:, -1]`)
/// and stay a gather otherwise; either way the values are numpy's `take`, and an index outside
/// the axis is an error at import.
#[test]
fn gather_with_initializer_indices_matches_take() {
    let data: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let take = |picked: &[usize]| -> Vec<f32> {
        (0..2)
            .flat_map(|b| picked.iter().flat_map(move |&p| (0..3).map(move |c| (b * 12 + p * 3 + c) as f32)))
            .collect()
    };
    // (indices' dims, indices, the positions picked, the output's shape)
    type Case = (&'static [i64], &'static [i64], &'static [usize], &'static [usize]);
    let cases: [Case; 4] = [
        (&[], &[-1], &[3], &[2, 3]),
        (&[2], &[1, 2], &[1, 2], &[2, 2, 3]),
        (&[2], &[-3, -2], &[1, 2], &[2, 2, 3]),
        (&[3], &[2, 0, 3], &[2, 0, 3], &[2, 3, 3]),
    ];
    for (dims, indices, picked, shape) in cases {
        let m = Model::from_bytes(&gather_known(dims, indices).encode_to_vec()).unwrap();
        let host = HostTensor::new(HostData::F32(data.clone()), vec![2, 4, 3]).unwrap();
        let x = m.input_tensor(0, host, Device::Cpu).unwrap();
        let mut session = m.session();
        for y in [m.run(std::slice::from_ref(&x)).unwrap().remove(0), session.run(&[&x]).unwrap().remove(0)] {
            assert_eq!(y.dims().unwrap(), shape, "indices {indices:?}");
            assert_eq!(y.to_vec::<f32>().unwrap(), take(picked), "indices {indices:?}");
        }
    }
    for bad in [4, -5] {
        let m = Model::from_bytes(&gather_known(&[], &[bad]).encode_to_vec()).unwrap();
        let host = HostTensor::new(HostData::F32(data.clone()), vec![2, 4, 3]).unwrap();
        let x = m.input_tensor(0, host, Device::Cpu).unwrap();
        let e = m.run(&[x]).unwrap_err().to_string();
        assert!(e.contains("Gather") && e.contains("out of range"), "{e}");
    }
}

#[test]
fn every_unsupported_op_is_reported_at_once() {
    let g = model(
        vec![
            node("first", "FancyOp", &["x"], &["a"]),
            node("ok", "Relu", &["a"], &["b"]),
            node("second", "OtherOp", &["b"], &["y"]),
        ],
        vec![value("x", &[Ok(2)])],
        vec![value("y", &[Ok(2)])],
        vec![],
    );
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let names: Vec<String> = m.unsupported().iter().map(|u| format!("{}:{}:{}", u.node, u.op_type, u.opset)).collect();
    assert_eq!(names, ["first:FancyOp:17", "second:OtherOp:17"]);
    let err = m.run(&[Tensor::from_vec(vec![1.0f32, 2.0], &[2])]).unwrap_err();
    assert!(matches!(&err, Error::Unsupported(ops) if ops.len() == 2), "{err}");
    let text = err.to_string();
    assert!(text.contains("FancyOp") && text.contains("OtherOp") && text.contains("\"second\""), "{text}");
}

#[test]
fn dangling_names_and_cycles_are_errors() {
    let dangling = model(
        vec![node("n", "Relu", &["nowhere"], &["y"])],
        vec![value("x", &[Ok(1)])],
        vec![value("y", &[Ok(1)])],
        vec![],
    );
    let err = Model::from_bytes(&dangling.encode_to_vec()).unwrap_err().to_string();
    assert!(err.contains("\"nowhere\"") && err.contains("no input, initializer or node"), "{err}");

    let cycle = model(
        vec![node("p", "Add", &["x", "q_out"], &["p_out"]), node("q", "Relu", &["p_out"], &["q_out"])],
        vec![value("x", &[Ok(1)])],
        vec![value("q_out", &[Ok(1)])],
        vec![],
    );
    let err = Model::from_bytes(&cycle.encode_to_vec()).unwrap_err().to_string();
    assert!(err.contains("cycle") && err.contains("\"p\""), "{err}");

    let twice = model(
        vec![node("a", "Relu", &["x"], &["y"]), node("b", "Relu", &["x"], &["y"])],
        vec![value("x", &[Ok(1)])],
        vec![value("y", &[Ok(1)])],
        vec![],
    );
    let err = Model::from_bytes(&twice.encode_to_vec()).unwrap_err().to_string();
    assert!(err.contains("produced more than once"), "{err}");
}

#[test]
fn bad_attributes_and_shapes_name_the_node() {
    let mut t = node("flip", "Transpose", &["x"], &["y"]);
    t.attribute.push(AttributeProto {
        name: Some("perm".into()),
        r#type: Some(AttributeType::Floats as i32),
        floats: vec![1.0, 0.0],
        ..Default::default()
    });
    let g = model(vec![t], vec![value("x", &[Ok(2), Ok(3)])], vec![value("y", &[Ok(3), Ok(2)])], vec![]);
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let err = m.run(&[Tensor::zeros(&[2, 3], kiln::DType::F32)]).unwrap_err().to_string();
    assert!(err.contains("\"flip\"") && err.contains("Transpose") && err.contains("FLOATS"), "{err}");

    // A reshape to a size that does not fit: the facade's error, under the node's name.
    let g = model(
        vec![node("rs", "Reshape", &["x", "shape"], &["y"])],
        vec![value("x", &[Ok(2), Ok(3)])],
        vec![value("y", &[Ok(4)])],
        vec![TensorProto {
            name: Some("shape".into()),
            dims: vec![1],
            data_type: Some(DataType::Int64 as i32),
            int64_data: vec![4],
            ..Default::default()
        }],
    );
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let err = m.run(&[Tensor::zeros(&[2, 3], kiln::DType::F32)]).unwrap_err().to_string();
    assert!(err.contains("\"rs\"") && err.contains("Reshape") && err.contains("reshape"), "{err}");

    // Inputs that do not match the declared ones.
    let m = Model::from_bytes(&mlp().encode_to_vec()).unwrap();
    let err = m.run(&[Tensor::zeros(&[2, 4], kiln::DType::F32)]).unwrap_err().to_string();
    assert!(err.contains("input \"x\"") && err.contains("[2, 4]"), "{err}");
    assert!(m.run(&[]).is_err());
}

#[test]
fn initializers_read_external_data() {
    let dir = std::env::temp_dir().join(format!("kiln-onnx-external-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bias: Vec<u8> = [10.0f32, 20.0, 30.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut blob = vec![0u8; 8];
    blob.extend(&bias);
    std::fs::write(dir.join("weights.bin"), &blob).unwrap();
    let entry = |k: &str, v: &str| StringStringEntryProto { key: Some(k.into()), value: Some(v.into()) };
    let external = TensorProto {
        name: Some("b".into()),
        dims: vec![3],
        data_type: Some(DataType::Float as i32),
        data_location: Some(DataLocation::External as i32),
        external_data: vec![entry("location", "weights.bin"), entry("offset", "8"), entry("length", "12")],
        ..Default::default()
    };
    let g = model(
        vec![node("add", "Add", &["x", "b"], &["y"])],
        vec![value("x", &[Ok(3)])],
        vec![value("y", &[Ok(3)])],
        vec![external.clone()],
    );
    std::fs::write(dir.join("model.onnx"), g.encode_to_vec()).unwrap();
    let m = Model::load(dir.join("model.onnx")).unwrap();
    let y = m.run(&[Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])]).unwrap().remove(0);
    assert_eq!(y.to_vec::<f32>().unwrap(), [11.0, 22.0, 33.0]);
    // Without a folder, or reaching outside it, or past the file's end: errors.
    assert!(Model::from_bytes(&g.encode_to_vec()).unwrap_err().to_string().contains("folder"));
    for (key, v) in [("location", "../weights.bin"), ("length", "400")] {
        let mut bad = external.clone();
        bad.external_data.retain(|e| e.key.as_deref() != Some(key));
        bad.external_data.push(entry(key, v));
        let g = model(
            vec![node("add", "Add", &["x", "b"], &["y"])],
            vec![value("x", &[Ok(3)])],
            vec![value("y", &[Ok(3)])],
            vec![bad],
        );
        std::fs::write(dir.join("bad.onnx"), g.encode_to_vec()).unwrap();
        assert!(Model::load(dir.join("bad.onnx")).is_err(), "{key} = {v} loaded");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn wrong_sized_tensor_data_is_an_error() {
    let g = model(
        vec![node("add", "Add", &["x", "b"], &["y"])],
        vec![value("x", &[Ok(3)])],
        vec![value("y", &[Ok(3)])],
        vec![floats("b", &[4], &[1.0, 2.0, 3.0])],
    );
    let err = Model::from_bytes(&g.encode_to_vec()).unwrap_err().to_string();
    assert!(err.contains("tensor \"b\"") && err.contains("12 bytes"), "{err}");
}

/// Decodes and, when that succeeds, runs a model on zero inputs of its declared shapes: any
/// outcome but a panic is fine.
fn decode_and_run(bytes: &[u8]) {
    let Ok(m) = Model::from_bytes(bytes) else { return };
    let _ = m.unsupported();
    let inputs: Option<Vec<Tensor>> = m
        .inputs()
        .iter()
        .map(|i| {
            let dims: Option<Vec<usize>> = i
                .dims
                .as_ref()?
                .iter()
                .map(|d| d.as_const().filter(|&v| (0..=64).contains(&v)).map(|v| v as usize))
                .collect();
            Some(Tensor::zeros(dims?, i.dtype?))
        })
        .collect();
    if let Some(inputs) = inputs
        && let Ok(outs) = m.run(&inputs)
    {
        let refs: Vec<&Tensor> = outs.iter().collect();
        let _ = kiln::realize(&refs);
    }
}

proptest! {
    // 256 cases, or `PROPTEST_CASES` (scripts/fuzz.sh runs many more).
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        decode_and_run(&bytes);
    }

    #[test]
    fn mutated_models_never_panic(
        cut in 0usize..400,
        flips in proptest::collection::vec((0usize..400, any::<u8>()), 0..6),
    ) {
        let mut bytes = mlp().encode_to_vec();
        for (at, v) in flips {
            let n = bytes.len();
            bytes[at % n] = v;
        }
        bytes.truncate(bytes.len().saturating_sub(cut % 64));
        decode_and_run(&bytes);
    }
}

fn int_attr(name: &str, value: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(value),
        ..Default::default()
    }
}

/// One Attention node of opset 23 over `q`, `k`, `v` of `dims`.
fn attention_model(attrs: Vec<AttributeProto>, dims: &[Result<i64, &str>]) -> ModelProto {
    let mut n = node("att", "Attention", &["q", "k", "v"], &["y"]);
    n.attribute = attrs;
    let inputs = vec![value("q", dims), value("k", dims), value("v", dims)];
    let mut g = model(vec![n], inputs, vec![value("y", dims)], vec![]);
    g.opset_import[0].version = Some(23);
    g
}

#[test]
fn causal_attention_at_a_symbolic_sequence_length_matches_a_direct_computation() {
    let (heads, size) = (2usize, 4usize);
    let g = attention_model(vec![int_attr("is_causal", 1)], &[Ok(1), Ok(heads as i64), Err("seq"), Ok(size as i64)]);
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    for seq in [3usize, 5] {
        let data =
            |salt: f32| -> Vec<f32> { (0..heads * seq * size).map(|i| ((i as f32 + salt) * 0.61).sin()).collect() };
        let (q, k, v) = (data(0.0), data(1.0), data(2.0));
        let input = |i: usize, d: &[f32]| {
            let host = HostTensor::new(HostData::F32(d.to_vec()), vec![1, heads, seq, size]).unwrap();
            m.input_tensor(i, host, Device::Cpu).unwrap()
        };
        let y = m.run(&[input(0, &q), input(1, &k), input(2, &v)]).unwrap().remove(0);
        assert_eq!(y.shape()[2].to_string(), "seq");
        // Query `i` of each head attends to keys `0..=i`, scores scaled by 1/sqrt(size).
        let mut want = vec![0.0f32; heads * seq * size];
        for h in 0..heads {
            let at = |x: &[f32], row: usize, c: usize| x[(h * seq + row) * size + c];
            for i in 0..seq {
                let scores: Vec<f32> =
                    (0..=i).map(|j| (0..size).map(|c| at(&q, i, c) * at(&k, j, c)).sum::<f32>() / 2.0).collect();
                let top = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f32> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f32 = weights.iter().sum();
                for c in 0..size {
                    let sum: f32 = (0..=i).map(|j| weights[j] * at(&v, j, c)).sum();
                    want[(h * seq + i) * size + c] = sum / total;
                }
            }
        }
        air::testing::assert_close("attention", &y.to_vec::<f32>().unwrap(), &want, air::testing::Tol::both(1e-5));
    }
}

#[test]
fn attention_heads_that_do_not_fit_are_errors_naming_the_node() {
    // 3-D inputs without the head counts.
    let g = attention_model(vec![], &[Ok(1), Ok(2), Ok(8)]);
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let x = || Tensor::zeros(&[1, 2, 8], kiln::DType::F32);
    let err = m.run(&[x(), x(), x()]).unwrap_err().to_string();
    assert!(err.contains("\"att\"") && err.contains("Attention") && err.contains("q_num_heads"), "{err}");
    // 3 query heads cannot share 2 key/value heads.
    let g = attention_model(vec![int_attr("q_num_heads", 3), int_attr("kv_num_heads", 2)], &[Ok(1), Ok(2), Ok(12)]);
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let x = || Tensor::zeros(&[1, 2, 12], kiln::DType::F32);
    let err = m.run(&[x(), x(), x()]).unwrap_err().to_string();
    assert!(err.contains("\"att\"") && err.contains("3 query heads cannot share 2"), "{err}");
    // A hidden size the head count does not divide.
    let g = attention_model(vec![int_attr("q_num_heads", 3), int_attr("kv_num_heads", 3)], &[Ok(1), Ok(2), Ok(8)]);
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let x = || Tensor::zeros(&[1, 2, 8], kiln::DType::F32);
    let err = m.run(&[x(), x(), x()]).unwrap_err().to_string();
    assert!(err.contains("not a multiple of 3 heads"), "{err}");
}

#[test]
fn conv_transpose_weights_for_other_channels_are_an_error_naming_the_node() {
    let g = model(
        vec![node("up", "ConvTranspose", &["x", "w"], &["y"])],
        vec![value("x", &[Ok(1), Ok(3), Ok(4), Ok(4)])],
        vec![value("y", &[Ok(1), Ok(2), Ok(6), Ok(6)])],
        vec![floats("w", &[2, 2, 3, 3], &[0.5; 36])],
    );
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let err = m.run(&[Tensor::zeros(&[1, 3, 4, 4], kiln::DType::F32)]).unwrap_err().to_string();
    assert!(err.contains("\"up\"") && err.contains("ConvTranspose") && err.contains("3"), "{err}");
}

/// Resize of x `[batch, 1, 2, 2]` (batch symbolic) by `scales` (an initializer; none if empty),
/// opset 19.
fn resize_model(scales: &[f32], mode: &str) -> ModelProto {
    let mut n = node("up", "Resize", &["x", "", "scales"], &["y"]);
    n.attribute.push(AttributeProto {
        name: Some("mode".into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(mode.as_bytes().to_vec()),
        ..Default::default()
    });
    let mut g = model(
        vec![n],
        vec![value("x", &[Err("batch"), Ok(1), Ok(2), Ok(2)])],
        vec![value("y", &[Err("batch"), Ok(1), Ok(4), Ok(4)])],
        vec![floats("scales", &[scales.len() as i64], scales)],
    );
    g.opset_import[0].version = Some(19);
    g
}

#[test]
fn resize_keeps_a_symbolic_batch_and_needs_a_target_size() {
    let m = Model::from_bytes(&resize_model(&[1.0, 1.0, 2.0, 2.0], "nearest").encode_to_vec()).unwrap();
    for batch in [1usize, 3] {
        let data: Vec<f32> = (0..batch * 4).map(|i| i as f32).collect();
        let x = m.input_tensor(0, HostTensor::new(HostData::F32(data), vec![batch, 1, 2, 2]).unwrap(), Device::Cpu);
        let y = m.run(&[x.unwrap()]).unwrap().remove(0);
        assert_eq!(y.shape()[0].to_string(), "batch");
        let got = y.to_vec::<f32>().unwrap();
        // Each input element becomes a 2x2 block (half_pixel, round_prefer_floor at scale 2).
        for b in 0..batch {
            for r in 0..4 {
                for c in 0..4 {
                    assert_eq!(got[b * 16 + r * 4 + c], (b * 4 + (r / 2) * 2 + c / 2) as f32, "({b}, {r}, {c})");
                }
            }
        }
    }
    let m = Model::from_bytes(&resize_model(&[], "linear").encode_to_vec()).unwrap();
    let err = m.run(&[Tensor::zeros(&[1, 1, 2, 2], kiln::DType::F32)]).unwrap_err().to_string();
    assert!(err.contains("\"up\"") && err.contains("Resize") && err.contains("needs scales or sizes"), "{err}");
}

/// Einsum by brute force over every assignment of the labels (letters only, explicit output):
/// the reference the importer's contractions are checked against.
fn einsum_reference(equation: &str, operands: &[(&[usize], &[f32])]) -> (Vec<usize>, Vec<f32>) {
    let (lhs, out) = equation.split_once("->").unwrap();
    let specs: Vec<&[u8]> = lhs.split(',').map(str::as_bytes).collect();
    let mut size = std::collections::BTreeMap::new();
    for (spec, (dims, _)) in specs.iter().zip(operands) {
        for (&l, &d) in spec.iter().zip(dims.iter()) {
            size.insert(l, d);
        }
    }
    let labels: Vec<u8> = size.keys().copied().collect();
    let out_dims: Vec<usize> = out.bytes().map(|l| size[&l]).collect();
    let mut result = vec![0.0f32; out_dims.iter().product()];
    let total: usize = labels.iter().map(|l| size[l]).product();
    for mut k in 0..total {
        let mut at = std::collections::BTreeMap::new();
        for &l in labels.iter().rev() {
            at.insert(l, k % size[&l]);
            k /= size[&l];
        }
        let flat = |spec: &[u8], dims: &[usize]| spec.iter().zip(dims).fold(0, |acc, (l, d)| acc * d + at[l]);
        let term: f32 = specs.iter().zip(operands).map(|(spec, (dims, data))| data[flat(spec, dims)]).product();
        result[flat(out.as_bytes(), &out_dims)] += term;
    }
    (out_dims, result)
}

#[test]
fn einsum_contractions_match_a_brute_force_reference() {
    let cases: [(&str, &[&[usize]]); 6] = [
        ("bhqd,bhkd->bhqk", &[&[2, 3, 4, 5], &[2, 3, 6, 5]]),
        ("ij,jk->ki", &[&[3, 4], &[4, 5]]),
        ("i,j,k->ijk", &[&[2], &[3], &[4]]),
        ("ij,jk,kl->il", &[&[2, 3], &[3, 4], &[4, 2]]),
        ("bij,jk->bk", &[&[2, 3, 4], &[4, 5]]),
        ("iij,jk->ik", &[&[3, 3, 4], &[4, 2]]),
    ];
    for (equation, shapes) in cases {
        let names: Vec<String> = (0..shapes.len()).map(|i| format!("x{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut n = node("e", "Einsum", &refs, &["y"]);
        n.attribute.push(AttributeProto {
            name: Some("equation".into()),
            r#type: Some(AttributeType::String as i32),
            s: Some(equation.as_bytes().to_vec()),
            ..Default::default()
        });
        let inputs: Vec<ValueInfoProto> = names
            .iter()
            .zip(shapes)
            .map(|(name, dims)| value(name, &dims.iter().map(|&d| Ok(d as i64)).collect::<Vec<_>>()))
            .collect();
        let mut g = model(vec![n], inputs, vec![value("y", &[])], vec![]);
        g.graph.as_mut().unwrap().output[0].r#type = None;
        g.opset_import[0].version = Some(12);
        let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
        let data: Vec<Vec<f32>> = shapes
            .iter()
            .enumerate()
            .map(|(i, dims)| {
                (0..dims.iter().product::<usize>()).map(|j| ((j * 7 + i * 3) as f32 * 0.37).sin()).collect()
            })
            .collect();
        let tensors: Vec<Tensor> =
            data.iter().zip(shapes).map(|(d, dims)| Tensor::from_vec(d.clone(), *dims)).collect();
        let y = m.run(&tensors).unwrap_or_else(|e| panic!("{equation}: {e}")).remove(0);
        let operands: Vec<(&[usize], &[f32])> = shapes.iter().zip(&data).map(|(s, d)| (*s, d.as_slice())).collect();
        let (dims, want) = einsum_reference(equation, &operands);
        let got_dims: Vec<usize> = y.shape().iter().map(|d| d.as_const().unwrap() as usize).collect();
        assert_eq!(got_dims, dims, "{equation}");
        air::testing::assert_close(equation, &y.to_vec::<f32>().unwrap(), &want, air::testing::Tol::both(1e-5));
    }
}

#[test]
fn top_k_orders_ties_and_infinities_by_index() {
    let g = model(
        vec![node("top", "TopK", &["x", "k"], &["values", "indices"])],
        vec![value("x", &[Ok(5)])],
        vec![value("values", &[Ok(5)]), value("indices", &[Ok(5)])],
        vec![ints("k", &[1], &[5])],
    );
    let mut g = g;
    g.opset_import[0].version = Some(11);
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let x = Tensor::from_vec(vec![f32::NEG_INFINITY, 3.0, f32::NEG_INFINITY, 3.0, 1.0], &[5]);
    let out = m.run(&[x]).unwrap();
    let inf = f32::NEG_INFINITY;
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![3.0, 3.0, 1.0, inf, inf]);
    assert_eq!(out[1].to_vec::<i64>().unwrap(), vec![1, 3, 4, 0, 2]);
}

/// An `If` attribute holding `graph`.
fn branch_attr(name: &str, nodes: Vec<NodeProto>, output: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Graph as i32),
        g: Some(GraphProto {
            node: nodes,
            name: Some(name.into()),
            output: vec![ValueInfoProto { name: Some(output.into()), ..Default::default() }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn if_takes_the_branch_a_known_condition_picks_and_selects_at_run_time_otherwise() {
    // cond = Shape(x)[0] == 2: known at import. The branches give different shapes, so only the
    // branch taken can be imported. The then branch reads `doubled`, produced by a node listed
    // after the If: the If is ordered after it.
    let mut if_node = node("choose", "If", &["cond"], &["y"]);
    if_node.attribute = vec![
        branch_attr("then_branch", vec![node("t", "Identity", &["doubled"], &["t_out"])], "t_out"),
        branch_attr("else_branch", vec![node("e", "ReduceSum", &["x"], &["e_out"])], "e_out"),
    ];
    let nodes = vec![
        node("shape", "Shape", &["x"], &["s"]),
        node("first", "Gather", &["s", "zero"], &["n"]),
        node("is_two", "Equal", &["n", "two"], &["cond"]),
        if_node,
        node("double", "Add", &["x", "x"], &["doubled"]),
    ];
    let inits = vec![ints("zero", &[], &[0]), ints("two", &[], &[2])];
    let mut g = model(nodes, vec![value("x", &[Ok(2), Ok(3)])], vec![value("y", &[Ok(2), Ok(3)])], inits);
    g.graph.as_mut().unwrap().output[0].r#type = None;
    g.opset_import[0].version = Some(13);
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let y = m.run(&[x]).unwrap().remove(0);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);

    // A condition known only when the model runs: both branches, selected per element type.
    let mut if_node = node("choose", "If", &["c"], &["y"]);
    if_node.attribute = vec![
        branch_attr("then_branch", vec![node("t", "Neg", &["x"], &["t_out"])], "t_out"),
        branch_attr("else_branch", vec![node("e", "Abs", &["x"], &["e_out"])], "e_out"),
    ];
    let cond = typed_value("c", &[], DataType::Bool);
    let mut g = model(vec![if_node], vec![value("x", &[Ok(2)]), cond], vec![value("y", &[Ok(2)])], vec![]);
    g.opset_import[0].version = Some(13);
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let x = || Tensor::from_vec(vec![-1.0f32, 2.0], &[2]);
    for (c, want) in [(true, vec![1.0f32, -2.0]), (false, vec![1.0, 2.0])] {
        let y = m.run(&[x(), Tensor::from_vec(vec![c], &[] as &[usize])]).unwrap().remove(0);
        assert_eq!(y.to_vec::<f32>().unwrap(), want, "cond {c}");
    }

    // Branches of different shapes under such a condition: an error naming the node.
    let mut if_node = node("choose", "If", &["c"], &["y"]);
    if_node.attribute = vec![
        branch_attr("then_branch", vec![node("t", "Neg", &["x"], &["t_out"])], "t_out"),
        branch_attr("else_branch", vec![node("e", "ReduceSum", &["x"], &["e_out"])], "e_out"),
    ];
    let cond = typed_value("c", &[], DataType::Bool);
    let mut g = model(vec![if_node], vec![value("x", &[Ok(2)]), cond], vec![value("y", &[Ok(2)])], vec![]);
    g.opset_import[0].version = Some(13);
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let err = m.run(&[x(), Tensor::from_vec(vec![true], &[] as &[usize])]).unwrap_err().to_string();
    assert!(err.contains("\"choose\"") && err.contains("one type"), "{err}");

    // An op the importer does not know inside a branch is reported with the others.
    let mut if_node = node("choose", "If", &["c"], &["y"]);
    if_node.attribute = vec![
        branch_attr("then_branch", vec![node("odd", "NoSuchOp", &["x"], &["t_out"])], "t_out"),
        branch_attr("else_branch", vec![node("e", "Abs", &["x"], &["e_out"])], "e_out"),
    ];
    let g = model(vec![if_node], vec![value("x", &[Ok(2)]), value("c", &[])], vec![value("y", &[Ok(2)])], vec![]);
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let unsupported = m.unsupported();
    assert_eq!(unsupported.len(), 1);
    assert_eq!((unsupported[0].node.as_str(), unsupported[0].op_type.as_str()), ("odd", "NoSuchOp"));
}

#[test]
fn scan_runs_its_body_per_step_in_either_direction() {
    // A running sum: state s (2 values) plus each row of xs ([3, 2]), the rows taken from the end.
    let body = GraphProto {
        node: vec![node("add", "Add", &["s_in", "x_in"], &["s_out"]), node("copy", "Identity", &["s_out"], &["y"])],
        name: Some("body".into()),
        input: vec![value("s_in", &[Ok(2)]), value("x_in", &[Ok(2)])],
        output: vec![value("s_out", &[Ok(2)]), value("y", &[Ok(2)])],
        ..Default::default()
    };
    let mut scan = node("scan", "Scan", &["init", "xs"], &["total", "ys"]);
    scan.attribute = vec![
        AttributeProto {
            name: Some("body".into()),
            r#type: Some(AttributeType::Graph as i32),
            g: Some(body),
            ..Default::default()
        },
        int_attr("num_scan_inputs", 1),
        AttributeProto {
            name: Some("scan_input_directions".into()),
            r#type: Some(AttributeType::Ints as i32),
            ints: vec![1],
            ..Default::default()
        },
    ];
    let mut g = model(
        vec![scan],
        vec![value("init", &[Ok(2)]), value("xs", &[Ok(3), Ok(2)])],
        vec![value("total", &[Ok(2)]), value("ys", &[Ok(3), Ok(2)])],
        vec![],
    );
    g.opset_import[0].version = Some(16);
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let out = m
        .run(&[
            Tensor::from_vec(vec![0.5f32, -1.0], &[2]),
            Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]),
        ])
        .unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![9.5, 11.0]);
    // Step 0 added the last row.
    assert_eq!(out[1].to_vec::<f32>().unwrap(), vec![5.5, 5.0, 8.5, 9.0, 9.5, 11.0]);
}

#[test]
fn loop_runs_until_its_trip_count_or_its_condition_stops_it() {
    // y doubles each iteration; the body's condition is `iteration < 2`, so with a trip count of
    // 10 the loop stops after three iterations; each iteration's y is a scan output.
    let body = GraphProto {
        node: vec![
            node("double", "Add", &["y_in", "y_in"], &["y_out"]),
            node("limit", "Less", &["i", "two"], &["cond_out"]),
            node("copy", "Identity", &["y_out"], &["scan"]),
        ],
        name: Some("body".into()),
        input: vec![value("i", &[]), value("cond_in", &[]), value("y_in", &[Ok(2)])],
        output: vec![value("cond_out", &[]), value("y_out", &[Ok(2)]), value("scan", &[Ok(2)])],
        initializer: vec![ints("two", &[], &[2])],
        ..Default::default()
    };
    let mut lp = node("loop", "Loop", &["trips", "", "y"], &["y_final", "ys"]);
    lp.attribute = vec![AttributeProto {
        name: Some("body".into()),
        r#type: Some(AttributeType::Graph as i32),
        g: Some(body),
        ..Default::default()
    }];
    let mut g = model(
        vec![lp],
        vec![value("y", &[Ok(2)])],
        vec![value("y_final", &[Ok(2)]), value("ys", &[Ok(3), Ok(2)])],
        vec![ints("trips", &[], &[10])],
    );
    g.opset_import[0].version = Some(16);
    let m = Model::from_bytes(&g.encode_to_vec()).unwrap();
    let out = m.run(&[Tensor::from_vec(vec![1.0f32, -0.5], &[2])]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![8.0, -4.0]);
    assert_eq!(out[1].to_vec::<f32>().unwrap(), vec![2.0, -1.0, 4.0, -2.0, 8.0, -4.0]);
}

#[test]
fn cumsum_over_a_symbolic_axis_matches_a_direct_running_sum() {
    // Along a symbolic sequence (RoBERTa's positions) the sum is a masked sum over the triangle;
    // every combination of `exclusive` and `reverse` against the definition.
    for (exclusive, reverse) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let mut n = node("cs", "CumSum", &["x", "axis"], &["y"]);
        n.attribute.extend([int_attr("exclusive", exclusive), int_attr("reverse", reverse)]);
        let m = model(
            vec![n],
            vec![value("x", &[Ok(2), Err("seq")])],
            vec![value("y", &[Ok(2), Err("seq")])],
            vec![ints("axis", &[], &[1])],
        );
        let m = Model::from_bytes(&m.encode_to_vec()).unwrap();
        for seq in [1usize, 5] {
            let data: Vec<f32> = (0..2 * seq).map(|i| (i as f32 * 0.7).sin()).collect();
            let x = m.input_tensor(0, HostTensor::new(HostData::F32(data.clone()), vec![2, seq]).unwrap(), Device::Cpu);
            let y = m.run(&[x.unwrap()]).unwrap().remove(0);
            assert_eq!(y.shape()[1].to_string(), "seq");
            let got = y.to_vec::<f32>().unwrap();
            for r in 0..2 {
                for j in 0..seq {
                    let keep = |i: usize| match (reverse, exclusive) {
                        (0, 0) => i <= j,
                        (0, _) => i < j,
                        (_, 0) => i >= j,
                        _ => i > j,
                    };
                    let want: f32 = (0..seq).filter(|&i| keep(i)).map(|i| data[r * seq + i]).sum();
                    let g = got[r * seq + j];
                    assert!(
                        (g - want).abs() < 1e-5,
                        "exclusive {exclusive} reverse {reverse} seq {seq} ({r}, {j}): {g} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn tile_pad_and_einsum_keep_symbolic_dims() {
    // Tile `[2, seq]` by `[1, 2]`, pad the sequence by one zero in front, contract it with itself
    // over the sequence: `[2, 2*seq + 1]` then `[2, 2]`, for two lengths from one import.
    let tile = node("t", "Tile", &["x", "reps"], &["tiled"]);
    let pad = node("p", "Pad", &["tiled", "pads"], &["padded"]);
    let mut e = node("e", "Einsum", &["padded", "padded"], &["y"]);
    e.attribute.push(AttributeProto {
        name: Some("equation".into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(b"is,js->ij".to_vec()),
        ..Default::default()
    });
    let m = model(
        vec![tile, pad, e],
        vec![value("x", &[Ok(2), Err("seq")])],
        vec![value("y", &[Ok(2), Ok(2)])],
        vec![ints("reps", &[2], &[1, 2]), ints("pads", &[4], &[0, 1, 0, 0])],
    );
    let m = Model::from_bytes(&m.encode_to_vec()).unwrap();
    for seq in [1usize, 4] {
        let data: Vec<f32> = (0..2 * seq).map(|i| i as f32 + 1.0).collect();
        let x = m.input_tensor(0, HostTensor::new(HostData::F32(data.clone()), vec![2, seq]).unwrap(), Device::Cpu);
        let y = m.run(&[x.unwrap()]).unwrap().remove(0);
        let row = |r: usize| -> Vec<f32> {
            let mut v = vec![0.0];
            v.extend(data[r * seq..(r + 1) * seq].iter().chain(&data[r * seq..(r + 1) * seq]));
            v
        };
        let want: Vec<f32> = (0..2)
            .flat_map(|i| (0..2).map(move |j| (i, j)))
            .map(|(i, j)| row(i).iter().zip(row(j)).map(|(a, b)| a * b).sum())
            .collect();
        assert_eq!(y.to_vec::<f32>().unwrap(), want, "seq {seq}");
    }
}

fn ints_attr(name: &str, values: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: values.to_vec(),
        ..Default::default()
    }
}

#[test]
fn conv_over_a_symbolic_length_matches_a_direct_computation() {
    // A grouped, dilated, padded 1-D convolution over a symbolic sequence (4 channels in 2
    // groups to 2 outputs, kernel 3, dilation 2, pads 2 before and 1 after, a bias): one import
    // serves two lengths; the output length is `seq + 3 - 4`.
    let (c, m, k, dil, (pb, pa)) = (4usize, 2usize, 3usize, 2usize, (2usize, 1usize));
    let w: Vec<f32> = (0..m * (c / 2) * k).map(|i| (i as f32 * 0.37).sin()).collect();
    let bias = [0.25f32, -0.5];
    let mut n = node("conv", "Conv", &["x", "w", "b"], &["y"]);
    n.attribute.extend([
        int_attr("group", 2),
        ints_attr("dilations", &[dil as i64]),
        ints_attr("pads", &[pb as i64, pa as i64]),
    ]);
    let g = model(
        vec![n],
        vec![value("x", &[Ok(1), Ok(c as i64), Err("seq")])],
        vec![value("y", &[Ok(1), Ok(m as i64), Err("out")])],
        vec![floats("w", &[m as i64, (c / 2) as i64, k as i64], &w), floats("b", &[m as i64], &bias)],
    );
    let imported = Model::from_bytes(&g.encode_to_vec()).unwrap();
    for seq in [3usize, 7] {
        let x: Vec<f32> = (0..c * seq).map(|i| (i as f32 * 0.73).cos()).collect();
        let t =
            imported.input_tensor(0, HostTensor::new(HostData::F32(x.clone()), vec![1, c, seq]).unwrap(), Device::Cpu);
        let y = imported.run(&[t.unwrap()]).unwrap().remove(0);
        let len = seq + pb + pa - (k - 1) * dil;
        let got = y.to_vec::<f32>().unwrap();
        assert_eq!(y.dims().unwrap(), [1, m, len]);
        for o in 0..m {
            let group = o / (m / 2);
            for t in 0..len {
                let mut want = bias[o];
                for ci in 0..c / 2 {
                    for j in 0..k {
                        let pos = (t + j * dil) as i64 - pb as i64;
                        if (0..seq as i64).contains(&pos) {
                            want += w[(o * (c / 2) + ci) * k + j] * x[(group * (c / 2) + ci) * seq + pos as usize];
                        }
                    }
                }
                assert!((got[o * len + t] - want).abs() < 1e-5, "seq {seq} ({o}, {t}): {} vs {want}", got[o * len + t]);
            }
        }
    }
    // A length shorter than the dilated window's reach (5) less the padding (3) is an error when the program
    // runs, as onnxruntime's, not an empty output.
    let t = imported.input_tensor(0, HostTensor::new(HostData::F32(vec![0.0; c]), vec![1, c, 1]).unwrap(), Device::Cpu);
    let err = imported.run(&[t.unwrap()]).unwrap().remove(0).to_vec::<f32>().unwrap_err().to_string();
    assert!(err.contains("< 0"), "{err}");
    // Strided, over the same symbolic length: the output length is a floor-division symbol
    // (`⌊(seq + 3 - 5)/2⌋ + 1`) bound when the program runs.
    let mut n = node("strided", "Conv", &["x", "w"], &["y"]);
    n.attribute.extend([int_attr("group", 2), ints_attr("strides", &[2]), ints_attr("pads", &[1, 2])]);
    let g = model(
        vec![n],
        vec![value("x", &[Ok(1), Ok(c as i64), Err("seq")])],
        vec![value("y", &[Ok(1), Ok(m as i64), Err("out")])],
        vec![floats("w", &[m as i64, (c / 2) as i64, k as i64], &w)],
    );
    let imported = Model::from_bytes(&g.encode_to_vec()).unwrap();
    for seq in [4usize, 7, 8] {
        let x: Vec<f32> = (0..c * seq).map(|i| (i as f32 * 0.41).sin()).collect();
        let t =
            imported.input_tensor(0, HostTensor::new(HostData::F32(x.clone()), vec![1, c, seq]).unwrap(), Device::Cpu);
        let y = imported.run(&[t.unwrap()]).unwrap().remove(0);
        let got = y.to_vec::<f32>().unwrap();
        let len = (seq + 3 - k) / 2 + 1;
        assert_eq!(y.dims().unwrap(), [1, m, len], "seq {seq}");
        for o in 0..m {
            let group = o / (m / 2);
            for t in 0..len {
                let mut want = 0.0;
                for ci in 0..c / 2 {
                    for j in 0..k {
                        let pos = (2 * t + j) as i64 - 1;
                        if (0..seq as i64).contains(&pos) {
                            want += w[(o * (c / 2) + ci) * k + j] * x[(group * (c / 2) + ci) * seq + pos as usize];
                        }
                    }
                }
                assert!((got[o * len + t] - want).abs() < 1e-5, "strided, seq {seq} ({o}, {t})");
            }
        }
    }
}

#[test]
fn pools_over_a_symbolic_length_match_a_direct_computation() {
    // MaxPool (kernel 3, stride 2, pads 1 and 1) and AveragePool with ceil_mode (kernel 2,
    // stride 2: a last half window where the length is odd) over a symbolic sequence.
    let mut max = node("max", "MaxPool", &["x"], &["y"]);
    max.attribute.extend([ints_attr("kernel_shape", &[3]), ints_attr("strides", &[2]), ints_attr("pads", &[1, 1])]);
    let mut avg = node("avg", "AveragePool", &["x"], &["y"]);
    avg.attribute.extend([ints_attr("kernel_shape", &[2]), ints_attr("strides", &[2]), int_attr("ceil_mode", 1)]);
    for (n, kernel, pad, ceil) in [(max, 3usize, 1usize, false), (avg, 2, 0, true)] {
        let is_max = n.op_type.as_deref() == Some("MaxPool");
        let g = model(
            vec![n],
            vec![value("x", &[Ok(1), Ok(2), Err("seq")])],
            vec![value("y", &[Ok(1), Ok(2), Err("o")])],
            vec![],
        );
        let imported = Model::from_bytes(&g.encode_to_vec()).unwrap();
        for seq in [5usize, 6, 9] {
            let x: Vec<f32> = (0..2 * seq).map(|i| (i as f32 * 0.83).cos()).collect();
            let t = imported.input_tensor(
                0,
                HostTensor::new(HostData::F32(x.clone()), vec![1, 2, seq]).unwrap(),
                Device::Cpu,
            );
            let got = imported.run(&[t.unwrap()]).unwrap().remove(0).to_vec::<f32>().unwrap();
            let reach = seq + 2 * pad - kernel;
            let len = if ceil { reach.div_ceil(2) + 1 } else { reach / 2 + 1 };
            assert_eq!(got.len(), 2 * len, "seq {seq}");
            for ch in 0..2 {
                for o in 0..len {
                    let inside: Vec<f32> = (0..kernel)
                        .map(|j| (2 * o + j) as i64 - pad as i64)
                        .filter(|p| (0..seq as i64).contains(p))
                        .map(|p| x[ch * seq + p as usize])
                        .collect();
                    let want = if is_max {
                        inside.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                    } else {
                        inside.iter().sum::<f32>() / inside.len() as f32
                    };
                    assert!((got[ch * len + o] - want).abs() < 1e-6, "max {is_max}, seq {seq} ({ch}, {o})");
                }
            }
        }
    }
}

/// An int64 tensor value `name` of `dims` (`Err(param)` dims are symbolic).
fn int64_value(name: &str, dims: &[Result<i64, &str>]) -> ValueInfoProto {
    typed_value(name, dims, DataType::Int64)
}

#[test]
fn gather_nd_and_scatter_nd_over_symbolic_dims_match_a_direct_computation() {
    // `data[i, j]` for index pairs over a symbolic `[rows, cols]` (torch.export writes a mask
    // indexed by broadcast ranges this way), and writing values there (BART's shifted ids); one
    // import serves two sizes, negative indices counting from the end.
    let dims = [Err("rows"), Err("cols")];
    let gather = model(
        vec![node("g", "GatherND", &["data", "idx"], &["y"])],
        vec![value("data", &dims), int64_value("idx", &[Err("t"), Ok(2)])],
        vec![value("y", &[Err("t")])],
        vec![],
    );
    let scatter = model(
        vec![node("s", "ScatterND", &["data", "idx", "upd"], &["y"])],
        vec![value("data", &dims), int64_value("idx", &[Err("t"), Ok(2)]), value("upd", &[Err("t")])],
        vec![value("y", &dims)],
        vec![],
    );
    let (gather, scatter) =
        (Model::from_bytes(&gather.encode_to_vec()).unwrap(), Model::from_bytes(&scatter.encode_to_vec()).unwrap());
    for (rows, cols) in [(2usize, 3usize), (3, 5)] {
        let data: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.5).collect();
        let pairs: Vec<(i64, i64)> = vec![(0, 1), (rows as i64 - 1, -1), (-1, 0)];
        let idx: Vec<i64> = pairs.iter().flat_map(|&(i, j)| [i, j]).collect();
        let at = |(i, j): (i64, i64)| {
            let (i, j) = (i.rem_euclid(rows as i64) as usize, j.rem_euclid(cols as i64) as usize);
            i * cols + j
        };
        let host = |d: HostData, s: Vec<usize>| HostTensor::new(d, s).unwrap();
        let args = |m: &Model, upd: Option<Vec<f32>>| -> Vec<Tensor> {
            let mut a = vec![
                m.input_tensor(0, host(HostData::F32(data.clone()), vec![rows, cols]), Device::Cpu).unwrap(),
                m.input_tensor(1, host(HostData::I64(idx.clone()), vec![pairs.len(), 2]), Device::Cpu).unwrap(),
            ];
            if let Some(u) = upd {
                a.push(m.input_tensor(2, host(HostData::F32(u), vec![pairs.len()]), Device::Cpu).unwrap());
            }
            a
        };
        let got = gather.run(&args(&gather, None)).unwrap().remove(0).to_vec::<f32>().unwrap();
        assert_eq!(got, pairs.iter().map(|&p| data[at(p)]).collect::<Vec<_>>(), "{rows}x{cols}");
        let upd = vec![-1.0f32, -2.0, -3.0];
        let got = scatter.run(&args(&scatter, Some(upd.clone()))).unwrap().remove(0).to_vec::<f32>().unwrap();
        let mut want = data.clone();
        for (&p, &u) in pairs.iter().zip(&upd) {
            want[at(p)] = u;
        }
        assert_eq!(got, want, "{rows}x{cols}");
    }
}

fn floats_attr(name: &str, values: &[f32]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Floats as i32),
        floats: values.to_vec(),
        ..Default::default()
    }
}

fn strings_attr(name: &str, values: &[&str]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Strings as i32),
        strings: values.iter().map(|s| s.as_bytes().to_vec()).collect(),
        ..Default::default()
    }
}

fn string_attr(name: &str, value: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(value.as_bytes().to_vec()),
        ..Default::default()
    }
}

/// An `ai.onnx.ml` node's model over `X` `[N, 2]` with the given outputs.
fn ml_model(op: &str, attrs: Vec<AttributeProto>, outputs: &[&str]) -> Model {
    let mut n = node("ml", op, &["X"], outputs);
    n.domain = Some("ai.onnx.ml".into());
    n.attribute = attrs;
    let mut m =
        model(vec![n], vec![value("X", &[Err("N"), Ok(2)])], outputs.iter().map(|o| value(o, &[])).collect(), vec![]);
    m.opset_import.push(OperatorSetIdProto { domain: Some("ai.onnx.ml".into()), version: Some(3) });
    Model::from_bytes(&m.encode_to_vec()).unwrap()
}

/// Two trees: `x0 <= 0.5 ? 1 : (x1 < 2 ? 2 : 3)` (a missing `x1` goes true, a missing `x0`
/// false) and `x1 >= 1 ? 10 : 20` (missing: false), as `nodes_*` attributes.
fn two_trees(leaf: &str, weights: &[f32]) -> Vec<AttributeProto> {
    let ints = |name: &str, v: &[i64]| AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    };
    vec![
        ints("nodes_treeids", &[0, 0, 0, 0, 0, 1, 1, 1]),
        ints("nodes_nodeids", &[0, 1, 2, 3, 4, 0, 1, 2]),
        ints("nodes_featureids", &[0, 0, 1, 0, 0, 1, 0, 0]),
        floats_attr("nodes_values", &[0.5, 0.0, 2.0, 0.0, 0.0, 1.0, 0.0, 0.0]),
        strings_attr("nodes_modes", &["BRANCH_LEQ", "LEAF", "BRANCH_LT", "LEAF", "LEAF", "BRANCH_GTE", "LEAF", "LEAF"]),
        ints("nodes_truenodeids", &[1, 0, 3, 0, 0, 1, 0, 0]),
        ints("nodes_falsenodeids", &[2, 0, 4, 0, 0, 2, 0, 0]),
        ints("nodes_missing_value_tracks_true", &[0, 0, 1, 0, 0, 0, 0, 0]),
        ints(&format!("{leaf}_treeids"), &[0, 0, 0, 1, 1]),
        ints(&format!("{leaf}_nodeids"), &[1, 3, 4, 1, 2]),
        ints(&format!("{leaf}_ids"), &[0, 0, 0, 0, 0]),
        floats_attr(&format!("{leaf}_weights"), weights),
    ]
}

#[test]
fn tree_ensembles_walk_every_rule_and_missing_value_as_the_reference_does() {
    let x: Vec<f32> = vec![0.0, 5.0, 1.0, 1.5, 1.0, f32::NAN, f32::NAN, 3.0];
    let rows =
        |m: &Model| m.input_tensor(0, HostTensor::new(HostData::F32(x.clone()), vec![4, 2]).unwrap(), Device::Cpu);
    // Leaves by row: tree 0 gives 1, 2, 2 (missing x1 goes true), 3 (missing x0 goes false);
    // tree 1 gives 10, 10, 20 (missing goes false), 10.
    for (aggregate, want) in [("SUM", [11.5f32, 12.5, 22.5, 13.5]), ("AVERAGE", [6.0, 6.5, 11.5, 7.0])] {
        let mut attrs = two_trees("target", &[1.0, 2.0, 3.0, 10.0, 20.0]);
        attrs.extend([string_attr("aggregate_function", aggregate), floats_attr("base_values", &[0.5])]);
        let m = ml_model("TreeEnsembleRegressor", attrs, &["Y"]);
        let y = m.run(&[rows(&m).unwrap()]).unwrap().remove(0);
        assert_eq!(y.to_vec::<f32>().unwrap(), want, "{aggregate}");
    }
    // A binary classifier: one score per row (every weight for class 0), the first class's
    // score its negation under LOGISTIC.
    let mut attrs = two_trees("class", &[-1.0, 0.5, 2.0, 0.0, 0.0]);
    attrs.extend([
        AttributeProto {
            name: Some("classlabels_int64s".into()),
            r#type: Some(AttributeType::Ints as i32),
            ints: vec![7, 9],
            ..Default::default()
        },
        string_attr("post_transform", "LOGISTIC"),
    ]);
    let m = ml_model("TreeEnsembleClassifier", attrs, &["label", "scores"]);
    let out = m.run(&[rows(&m).unwrap()]).unwrap();
    assert_eq!(out[0].to_vec::<i64>().unwrap(), vec![7, 9, 9, 9]);
    let sigmoid = |v: f32| 1.0 / (1.0 + (-v).exp());
    let scores = out[1].to_vec::<f32>().unwrap();
    for (r, s) in [-1.0f32, 0.5, 0.5, 2.0].into_iter().enumerate() {
        for (c, want) in [sigmoid(-s), sigmoid(s)].into_iter().enumerate() {
            assert!((scores[r * 2 + c] - want).abs() < 1e-6, "row {r} column {c}: {scores:?}");
        }
    }
    // MIN over leaves that lack a weight for a target is an error naming the node.
    let mut attrs = two_trees("target", &[1.0, 2.0, 3.0, 10.0, 20.0]);
    attrs.extend([
        string_attr("aggregate_function", "MIN"),
        AttributeProto {
            name: Some("n_targets".into()),
            r#type: Some(AttributeType::Int as i32),
            i: Some(2),
            ..Default::default()
        },
    ]);
    let m = ml_model("TreeEnsembleRegressor", attrs, &["Y"]);
    let err = m.run(&[rows(&m).unwrap()]).unwrap_err().to_string();
    assert!(err.contains("\"ml\"") && err.contains("MIN over leaves"), "{err}");
}

#[test]
fn linear_classifier_post_transforms_follow_the_reference() {
    // Three classes, scores `x0 * [1, 0, -1] + [0, 0, 0.5]`: a zero score in the middle column,
    // which SOFTMAX_ZERO leaves out of the exponentials.
    let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
    let x = [0.5f32, 0.0, -2.0, 1.0];
    let scores = |x0: f64| [x0, 0.0, 0.5 - x0];
    // The reference's erfinv approximation (`onnx.reference.ops.aionnxml._common_classifier`).
    let probit = |v: f64| {
        let x = 2.0 * v - 1.0;
        let sgn = if x < 0.0 { -1.0 } else { 1.0 };
        if (1.0 - x) * (1.0 + x) == 0.0 {
            return 0.0;
        }
        let w = ((1.0 - x) * (1.0 + x)).ln();
        let a = 0.147;
        let t = 2.0 / (std::f64::consts::PI * a) + 0.5 * w;
        2f64.sqrt() * sgn * (-t + (t * t - w / a).sqrt()).sqrt()
    };
    type Reference = Box<dyn Fn([f64; 3]) -> [f64; 3]>;
    let transforms: [(&str, Reference); 4] = [
        ("LOGISTIC", Box::new(move |s: [f64; 3]| s.map(sigmoid))),
        (
            "SOFTMAX",
            Box::new(|s: [f64; 3]| {
                let m = s.iter().copied().fold(f64::MIN, f64::max);
                let e = s.map(|v| (v - m).exp());
                let sum: f64 = e.iter().sum();
                e.map(|v| v / sum)
            }),
        ),
        (
            "SOFTMAX_ZERO",
            Box::new(|s: [f64; 3]| {
                let m = s.iter().copied().fold(f64::MIN, f64::max);
                let e = s.map(|v| if v.abs() > 1e-7 { (v - m).exp() } else { v * (-m).exp() });
                let sum: f64 = e.iter().sum();
                e.map(|v| v / sum)
            }),
        ),
        ("PROBIT", Box::new(move |s: [f64; 3]| s.map(probit))),
    ];
    for (name, reference) in transforms {
        let attrs = vec![
            floats_attr("coefficients", &[1.0, 0.0, 0.0, 0.0, -1.0, 0.0]),
            floats_attr("intercepts", &[0.0, 0.0, 0.5]),
            AttributeProto {
                name: Some("classlabels_ints".into()),
                r#type: Some(AttributeType::Ints as i32),
                ints: vec![10, 20, 30],
                ..Default::default()
            },
            string_attr("post_transform", name),
        ];
        let m = ml_model("LinearClassifier", attrs, &["label", "scores"]);
        let t = m.input_tensor(0, HostTensor::new(HostData::F32(x.to_vec()), vec![2, 2]).unwrap(), Device::Cpu);
        let out = m.run(&[t.unwrap()]).unwrap();
        let (labels, got) = (out[0].to_vec::<i64>().unwrap(), out[1].to_vec::<f32>().unwrap());
        for (r, x0) in [0.5f64, -2.0].into_iter().enumerate() {
            let want = reference(scores(x0));
            for c in 0..3 {
                let g = got[r * 3 + c] as f64;
                assert!(
                    (g - want[c]).abs() < 1e-5 || (g.is_nan() && want[c].is_nan()),
                    "{name} row {r} column {c}: {g} vs {}",
                    want[c]
                );
            }
            let best = (0..3).fold(0, |b, c| if got[r * 3 + c] > got[r * 3 + b] { c } else { b });
            assert_eq!(labels[r], [10, 20, 30][best], "{name} row {r}");
        }
    }
}

#[test]
fn tree_ensembles_that_share_nodes_import_at_once_and_cycles_are_errors() {
    // Forty levels whose two branches meet again at the next node (2^40 paths, 41 nodes), then
    // a leaf: the depth is found per node, not per path, so this imports at once.
    let levels = 40i64;
    let ints = |name: &str, v: Vec<i64>| AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v,
        ..Default::default()
    };
    let chain = |next: &dyn Fn(i64) -> i64| -> Vec<AttributeProto> {
        let n = levels + 1;
        let mut modes: Vec<&str> = vec!["BRANCH_LEQ"; levels as usize];
        modes.push("LEAF");
        vec![
            ints("nodes_treeids", vec![0; n as usize]),
            ints("nodes_nodeids", (0..n).collect()),
            ints("nodes_featureids", vec![0; n as usize]),
            floats_attr("nodes_values", &vec![0.0; n as usize]),
            strings_attr("nodes_modes", &modes),
            ints("nodes_truenodeids", (0..n).map(next).collect()),
            ints("nodes_falsenodeids", (0..n).map(next).collect()),
            ints("target_treeids", vec![0]),
            ints("target_nodeids", vec![levels]),
            ints("target_ids", vec![0]),
            floats_attr("target_weights", &[2.5]),
        ]
    };
    let m = ml_model("TreeEnsembleRegressor", chain(&|i| (i + 1).min(levels)), &["Y"]);
    let x = m.input_tensor(0, HostTensor::new(HostData::F32(vec![1.0, 0.0]), vec![1, 2]).unwrap(), Device::Cpu);
    assert_eq!(m.run(&[x.unwrap()]).unwrap().remove(0).to_vec::<f32>().unwrap(), vec![2.5]);
    // The last branch leads back to the first: an error naming the node.
    let m =
        ml_model("TreeEnsembleRegressor", chain(&|i| if i == levels - 1 { 0 } else { (i + 1).min(levels) }), &["Y"]);
    let x = m.input_tensor(0, HostTensor::new(HostData::F32(vec![1.0, 0.0]), vec![1, 2]).unwrap(), Device::Cpu);
    let err = m.run(&[x.unwrap()]).unwrap_err().to_string();
    assert!(err.contains("\"ml\"") && err.contains("cycle"), "{err}");
}

/// `y = x ^ e` with the exponent `e` an initializer of one element.
fn pow_by(e: f32) -> ModelProto {
    model(
        vec![node("pow", "Pow", &["x", "e"], &["y"])],
        vec![value("x", &[Ok(5)])],
        vec![value("y", &[Ok(5)])],
        vec![floats("e", &[], &[e])],
    )
}

#[test]
fn a_constant_square_or_cube_is_multiplied_out_and_other_powers_stay_pow() {
    // As onnxruntime computes them: a general `pow` is a library call per element (an exported
    // GPT-2's GELU cube spent most of its steady call there).
    let data = [-1.5f32, -0.0, 0.25, 2.0, 3.0];
    for (e, pow_left) in [(2.0f32, false), (3.0, false), (2.5, true)] {
        let m = Model::from_bytes(&pow_by(e).encode_to_vec()).unwrap();
        let x =
            m.input_tensor(0, HostTensor::new(HostData::F32(data.to_vec()), vec![5]).unwrap(), Device::Cpu).unwrap();
        let y = m.run(&[x]).unwrap().remove(0);
        assert_eq!(y.graph_text().unwrap().contains("pow"), pow_left, "x ^ {e}: {}", y.graph_text().unwrap());
        let want: Vec<f32> = data.iter().map(|&v| v.powf(e)).collect();
        let got = y.to_vec::<f32>().unwrap();
        // NaN where a negative base meets a fractional power, in both.
        for (g, w) in got.iter().zip(&want) {
            assert!(
                g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-6 * w.abs(),
                "x ^ {e}: {got:?} vs {want:?}"
            );
        }
    }
}
