//! Error tensors: ops on invalid inputs record an error naming the op, the shapes or dtypes and
//! the caller's file:line; later ops pass it on; realizing returns it. Nothing panics.

use kiln::prelude::*;
use kiln::{HostTensor, stats};

fn t(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape)
}

/// The error message of realizing `x`, checked to name this file and `line`.
#[track_caller]
fn message(x: &Tensor, line: u32) -> String {
    let e = x.realize().map(|_| ()).unwrap_err().to_string();
    let at = format!(" at tests/it/tensor_errors.rs:{line}:");
    assert!(e.contains(&at), "`{e}` should contain `{at}`");
    e
}

#[test]
fn matmul_mismatch_names_shapes_and_caller() {
    let a = t(&[0.0; 6], &[2, 3]);
    let b = t(&[0.0; 20], &[4, 5]);
    let line = line!() + 1;
    let bad = a.matmul(&b);
    let e = message(&bad, line);
    assert!(
        e.starts_with(
            "matmul: shapes [2, 3] and [4, 5] do not match (contracting dims 3 vs 4) at tests/it/tensor_errors.rs:"
        ),
        "{e}"
    );
    match bad.error() {
        Some(kiln::Error::Op { op, location, .. }) => {
            assert_eq!(*op, "matmul");
            assert_eq!(location.file(), "tests/it/tensor_errors.rs");
            assert_eq!(location.line(), line);
        }
        other => panic!("expected an op error, got {other:?}"),
    }
}

#[test]
fn errors_are_found_without_computing() {
    let start = stats::graphs_executed();
    let bad = t(&[0.0; 2], &[2]).reshape(&[3]);
    assert!(bad.error().is_some());
    assert!(bad.check().is_err());
    assert!(t(&[0.0], &[1]).check().is_ok());
    assert!(t(&[0.0], &[1]).error().is_none());
    assert!(format!("{bad:?}").contains("reshape"));
    assert_eq!(stats::graphs_executed(), start);
}

#[test]
fn the_first_error_propagates() {
    let a = t(&[1.0, 2.0, 3.0], &[3]);
    let b = t(&[1.0, 2.0], &[2]);
    let line = line!() + 1;
    let bad = &a + &b;
    let later = bad.exp().sum_all().mul(&a).matmul(&t(&[0.0], &[1]));
    let second = later.reshape(&[7, 7]);
    let e = message(&second, line);
    assert!(e.starts_with("add: shapes [3] and [2] cannot be broadcast together (dim 3 vs 2)"), "{e}");
    assert_eq!(later.error(), bad.error());
    assert!(cat(&[&a, &bad], 0).error() == bad.error());
    assert!(a.where_cond(&bad, 0.0).error().is_some());
    let from_scalar_side = 2.0 - &bad;
    assert_eq!(from_scalar_side.error(), bad.error());
    assert!(bad.to_vec::<f32>().is_err());
    assert!(bad.item::<f32>().is_err());
    assert!(bad.dims().is_err());
    assert!(bad.to_host().is_err());
    assert!(bad.clone().into_vec::<f32>().is_err());
    assert!(bad.graph_text().is_err());
    assert!(kiln::realize(&[&a, &bad]).is_err());
}

#[test]
fn operator_errors_point_at_the_operator() {
    let a = t(&[1.0, 2.0], &[2, 1]);
    let b = t(&[1.0, 2.0, 3.0], &[1, 3]);
    let c = t(&[1.0, 2.0], &[2]);
    let line = line!() + 1;
    let bad = (&a * &b) - &t(&[0.0; 4], &[4]);
    let e = message(&bad, line);
    assert!(e.starts_with("sub: shapes [2, 3] and [4] cannot be broadcast"), "{e}");
    let line = line!() + 1;
    let bad = 1.0 / &t(&[0.0; 4], &[4]).reshape(&[5]);
    assert!(message(&bad, line).starts_with("reshape: cannot reshape f32[4] to [5]"));
    assert!((&a * &c).check().is_ok(), "[2, 1] * [2] broadcasts to [2, 2]");
}

#[test]
fn bad_axes_and_arguments() {
    let x = t(&[0.0; 6], &[2, 3]);
    let first_line = line!();
    let cases: Vec<(Tensor, &str)> = vec![
        (x.sum(&[2]), "sum: dim 2 out of range for rank 2 (expected -2 to 1) (shape [2, 3])"),
        (x.sum_keepdim(&[1, -1]), "sum: dims [1, -1] repeat an axis"),
        (x.max(-3), "max: dim -3 out of range"),
        (x.softmax(5), "softmax: dim 5 out of range"),
        (x.argmax(2), "argmax: dim 2 out of range"),
        (x.permute(&[0, 0]), "permute: [0, 0] is not a permutation of the axes of shape [2, 3]"),
        (x.permute(&[0]), "permute: [0] is not a permutation"),
        (x.transpose(0, 2), "transpose: dim 2 out of range"),
        (x.reshape(&[4, -1]), "reshape: cannot reshape [2, 3] to [4, -1]"),
        (x.reshape(&[-1, -1]), "reshape: cannot reshape [2, 3] to [-1, -1]"),
        (x.expand(&[4, 3]), "expand: cannot expand [2, 3] to [4, 3]"),
        (x.expand(&[3]), "expand: cannot expand [2, 3] to [3] (fewer dims)"),
        (x.squeeze(3), "squeeze: dim 3 out of range"),
        (x.unsqueeze(4), "unsqueeze: dim 4 out of range for rank 3"),
        (x.flatten(1, 0), "flatten: start dim 1 comes after end dim 0"),
        (x.narrow(1, 2, 2), "narrow: start 2 + length 2 out of range for dim 1 of shape [2, 3]"),
        (x.narrow(0, -1, 1), "narrow: start -1 + length 1 out of range"),
        (x.pad(&[(1, 1)], 0.0), "pad: 1 (before, after) pairs for shape [2, 3] of rank 2"),
        (x.where_cond(&x, &x), "where: condition must be bool, got f32"),
        (x.gather(1, &x), "gather: index must be an integer tensor, got f32"),
        (
            x.gather(1, &Tensor::from_vec(vec![0i64; 2], &[2])),
            "gather: index shape [2] must have the rank of shape [2, 3]",
        ),
        (
            x.gather(0, &Tensor::from_vec(vec![0i64; 8], &[2, 4])),
            "gather: index shape [2, 4] exceeds shape [2, 3] along dim 1",
        ),
        (
            x.index_select(0, &Tensor::from_vec(vec![0i64; 4], &[2, 2])),
            "index_select: index must be a 1-D integer tensor, got i64[2, 2]",
        ),
        (Tensor::cat(&[&x, &t(&[0.0; 2], &[2])], 0), "cat: shapes [2, 3] and [2] differ outside dim 0"),
        (Tensor::cat(&[], 0), "cat: needs at least one tensor"),
        (Tensor::stack(&[&x, &x.reshape(&[3, 2])], 0), "stack: shapes [2, 3] and [3, 2] differ"),
        (Tensor::stack(&[&x], 3), "stack: dim 3 out of range"),
        (x.matmul(&Tensor::scalar(1.0f32)), "matmul: both operands need at least one dim"),
        (
            x.matmul(&t(&[0.0; 12], &[2, 3, 2]).reshape(&[3, 2, 2])),
            "matmul: shapes [2, 3] and [3, 2, 2] do not match (contracting dims 3 vs 2)",
        ),
        (
            t(&[0.0; 12], &[2, 2, 3]).matmul(&t(&[0.0; 18], &[3, 3, 2])),
            "matmul: batch dims of shapes [2, 2, 3] and [3, 3, 2] cannot be broadcast together",
        ),
        (
            Tensor::from_vec(vec![true], &[1]).matmul(&Tensor::from_vec(vec![true], &[1])),
            "matmul: unsupported dtype bool",
        ),
        (Tensor::from_vec(vec![true], &[1]).neg(), "neg: negating a bool tensor is not supported"),
        (Tensor::from_vec(vec![true], &[1]).sub(true), "sub: subtracting two bool tensors is not supported"),
        (Tensor::from_vec(vec![1.0f32; 5], &[2, 3]), "from_vec: 5 elements do not fill shape [2, 3]"),
        (Tensor::from_vec(vec![1.0f32; 5], &[-1]), "from_vec: shape [-1] must be concrete"),
        (Tensor::zeros(&[2, -3], DType::F32), "full: negative dim in shape [2, -3]"),
        (Tensor::arange(0, 5, 0), "arange: invalid range 0..5 step 0"),
        (Tensor::rand(&[Dim::sym("n")]), "rand: shape [n] must be concrete"),
        (x.slice(2, 0, 1), "slice: dim 2 out of range"),
        (x.reshape(vec![Dim::sym("n")]), "reshape: cannot reshape f32[2, 3] to [n]"),
        (x.exp().with_dims(&[2, 3]), "with_dims: only a tensor that holds data"),
        (x.with_dims(&[Dim::sym("a")]), "with_dims: dims [a] do not match the rank"),
        (x.with_dims(&[Dim::from(2), Dim::from(4)]), "with_dims: dim 4 is 4 but the data has 3"),
        (x.with_dims(&[Dim::sym("a"), Dim::sym("a")]), "with_dims: symbol `a` is bound to both 2 and 3"),
        (x.with_dims(&[Dim::sym("a"), &Dim::sym("b") * 2]), "with_dims: dim 2*b: symbol `b` has no value bound"),
    ];
    let last_line = line!();
    for (bad, want) in &cases {
        let e = bad.check().unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with(want), "got `{text}`, want a message starting `{want}`");
        let kiln::Error::Op { location, .. } = e else { panic!("not an op error: {text}") };
        assert_eq!(location.file(), "tests/it/tensor_errors.rs");
        assert!((first_line..last_line).contains(&location.line()), "{text}");
    }
}

#[test]
fn data_access_errors() {
    let x = t(&[1.0, 2.0], &[2]);
    let line = line!() + 1;
    let e = x.to_vec::<i64>().unwrap_err().to_string();
    assert_eq!(e.split(" at ").next().unwrap(), "to_vec: asked for i64 elements of a tensor of dtype f32");
    assert!(e.contains(&format!("tests/it/tensor_errors.rs:{line}:")), "{e}");
    let e = x.item::<f32>().unwrap_err().to_string();
    assert!(e.starts_with("item: a tensor of shape [2] has 2 elements, not 1"), "{e}");
    assert!(x.sum_all().item::<i32>().unwrap_err().to_string().starts_with("item: asked for i32"));
    assert!(x.clone().into_vec::<bool>().unwrap_err().to_string().starts_with("into_vec: asked for bool"));
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0], "a failed read leaves the tensor usable");
}

#[test]
fn conflicting_symbol_values_fail_at_realize() {
    let a = Tensor::from_host_symbolic(HostTensor::from_vec(vec![1.0f32; 3], vec![3]).unwrap(), &[Dim::sym("seq")]);
    let b = Tensor::from_host_symbolic(HostTensor::from_vec(vec![1.0f32; 7], vec![7]).unwrap(), &[Dim::sym("seq")]);
    let sum = &a + &b; // Same symbolic shape, so the op itself is fine.
    assert!(sum.check().is_ok());
    let e = sum.realize().map(|_| ()).unwrap_err();
    assert_eq!(e, kiln::Error::Binding { symbol: kiln::Dim::sym("seq").symbols()[0].clone(), first: 3, second: 7 });
    assert_eq!(e.to_string(), "symbol `seq` is bound to both 3 and 7");
    // Shapes that differ symbolically do not broadcast.
    let c = Tensor::from_host_symbolic(HostTensor::from_vec(vec![1.0f32; 3], vec![3]).unwrap(), &[Dim::sym("len")]);
    let line = line!() + 1;
    let bad = &a * &c;
    assert!(
        message(&bad, line).starts_with("mul: shapes [seq] and [len] cannot be broadcast together (dim seq vs len)")
    );
}

#[test]
fn unbound_symbols_are_errors_not_panics() {
    let z = Tensor::zeros(&[Dim::sym("n")], DType::F32);
    assert!(z.check().is_ok());
    let e = z.to_vec::<f32>().unwrap_err().to_string();
    assert!(e.contains('n'), "{e}");
}
