//! Conditions of symbolic shapes, checked once per binding set on every device (issue #10): a
//! `narrow` past the end of its input, a negative padding or dim is an error naming the op, the
//! values and the caller's line on `interp`, `cpu` and `wgpu` alike, never garbage, zeros or a
//! crash; valid bindings still give the right values; and a proptest of random symbolic graphs
//! (shrink, pad, expand, reshape, element-wise over shapes with two symbols) run with random
//! bindings shows every backend agrees with the interpreter, on values and on errors.
//!
//! The wgpu device is skipped with a printed reason when this machine has no GPU adapter, unless
//! `KILN_REQUIRE_VULKAN=1`. `PROPTEST_CASES` sets the number of random graphs (default 24).

use std::sync::OnceLock;

use air::op::{Expand, Input, Pad, Reshape, Shrink};
use air::{
    BinaryOp, Bindings, BoundsError, DType, Dim, Graph, HostTensor, NodeId, Op, Scalar, Symbol, TensorType, UnaryOp,
};
use kiln::{Device, Error, Tensor};
use proptest::prelude::*;
use runtime::CpuDevice;
#[cfg(feature = "wgpu")]
use runtime::wgpu::WgpuDevice;
use smallvec::smallvec;

#[cfg(feature = "wgpu")]
fn gpu_required() -> bool {
    std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v.trim() == "1")
}

/// The process's wgpu device, or `None` (with the reason printed once) on a machine without one.
#[cfg(feature = "wgpu")]
fn gpu() -> Option<&'static WgpuDevice> {
    static GPU: OnceLock<Option<WgpuDevice>> = OnceLock::new();
    GPU.get_or_init(|| match WgpuDevice::new() {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(!gpu_required(), "KILN_REQUIRE_VULKAN=1 but no wgpu device: {e}");
            eprintln!("skipping the wgpu device: no usable adapter ({e})");
            None
        }
    })
    .as_ref()
}

/// Every device of the facade this machine can run.
fn devices() -> Vec<Device> {
    #[cfg_attr(not(feature = "wgpu"), allow(unused_mut))]
    let mut out = vec![Device::Interp, Device::Cpu];
    #[cfg(feature = "wgpu")]
    if gpu().is_some() && kiln::backend::wgpu_device().is_ok() {
        out.push(Device::Wgpu);
    }
    out
}

/// `x` (f32 `[4]` holding 1..=4) narrowed to `0..n`, with `n` bound to `len` through a second
/// input (a bool `[n]`), on `device`; returns the tensor and the line of the `narrow` call.
fn narrowed(device: Device, len: usize) -> (Tensor, u32) {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]).to_device(device).unwrap();
    let n = Tensor::from_host_symbolic(HostTensor::from_vec(vec![false; len], vec![len]).unwrap(), &[Dim::sym("n")])
        .to_device(device)
        .unwrap();
    let (part, line) = (x.narrow(0, 0, Dim::sym("n")), line!());
    // Reads the `n` input, so the program binds `n` (its zeros add nothing).
    (&part + &n.cast(DType::F32), line)
}

/// Asserts `e` is an `Error::Op` from `op` at this file's `line` whose message holds `text`.
fn assert_op_error(e: &Error, op: &str, line: u32, text: &str) {
    match e {
        Error::Op { op: got, message, location } => {
            assert_eq!(*got, op, "{e}");
            assert!(message.contains(text), "`{message}` should say `{text}`");
            assert_eq!((location.file(), location.line()), (file!(), line), "{e}");
        }
        other => panic!("expected an op error from {op}, got {other:?}"),
    }
}

#[test]
fn narrow_past_the_end_is_an_error_on_every_device() {
    for device in devices() {
        for len in [1000, 50_000_000] {
            let (y, line) = narrowed(device, len);
            let e = y.to_vec::<f32>().expect_err(&format!("narrow to {len} of [4] on {device}"));
            assert_op_error(&e, "narrow", line, &format!("range end n = {len} > size 4"));
            assert!(e.to_string().contains("shrink"), "the air op is named too: {e}");
        }
        // A binding that fits gives the right values, from the same (cached) program.
        let (y, _) = narrowed(device, 3);
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0], "on {device}");
        let (y, _) = narrowed(device, 4);
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0], "on {device}");
    }
}

#[test]
fn max_over_a_symbolic_axis_bound_to_zero_is_an_error_on_every_device() {
    for device in devices() {
        let x = |len: usize| {
            Tensor::from_host_symbolic(HostTensor::from_vec(vec![1.5f32; len], vec![len]).unwrap(), &[Dim::sym("m")])
                .to_device(device)
                .unwrap()
        };
        // PyTorch raises for `amax` over an empty axis; a symbolic extent bound to 0 must not give
        // the identity (-inf).
        let (bad, line) = (x(0).max(0), line!());
        let e = bad.to_vec::<f32>().expect_err(&format!("max over an empty axis on {device}"));
        assert_op_error(&e, "max", line, "reducing m = 0 elements");
        assert_eq!(x(3).max(0).to_vec::<f32>().unwrap(), vec![1.5], "on {device}");
    }
}

#[test]
fn a_cached_program_names_the_line_of_the_current_graph() {
    for device in devices() {
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]).to_device(device).unwrap();
        let bind = |len: usize| {
            Tensor::from_host_symbolic(HostTensor::from_vec(vec![0.0f32; len], vec![len]).unwrap(), &[Dim::sym("k")])
                .to_device(device)
                .unwrap()
        };
        // The first graph compiles with a valid binding; the second, structurally identical but
        // built on another line, hits the program cache and must name its own line.
        let ok = &x.narrow(0, 1, Dim::sym("k")) + &bind(2);
        assert_eq!(ok.to_vec::<f32>().unwrap(), vec![2.0, 3.0], "on {device}");
        let (bad, line) = (&x.narrow(0, 1, Dim::sym("k")) + &bind(9), line!());
        let e = bad.to_vec::<f32>().unwrap_err();
        assert_op_error(&e, "narrow", line, "range end k + 1 = 10 > size 4");
    }
}

#[test]
fn expand_to_a_negative_dim_is_an_error_on_every_device() {
    for device in devices() {
        let one = Tensor::from_vec(vec![5.0f32], &[1]).to_device(device).unwrap();
        let n = |len: usize| {
            Tensor::from_host_symbolic(HostTensor::from_vec(vec![0.0f32; len], vec![len]).unwrap(), &[Dim::sym("n")])
                .to_device(device)
                .unwrap()
        };
        let target = &Dim::sym("n") - 2;
        let (wide, line) = (one.expand(vec![target]), line!());
        let y = wide.sum_all() + n(1).sum_all();
        let e = y.item::<f32>().unwrap_err();
        assert_op_error(&e, "expand", line, "size n - 2 = -1 < 0");
        let y = one.expand(vec![target]).sum_all() + n(5).sum_all();
        assert_eq!(y.item::<f32>().unwrap(), 15.0, "on {device}");
    }
}

// ----- the air level: the same error from the interpreter and the compiled backends -----

fn f32s(shape: &[Dim]) -> TensorType {
    TensorType::new(DType::F32, shape.iter().cloned().collect::<air::Shape>())
}

fn bindings(pairs: &[(&str, i64)]) -> Bindings {
    pairs.iter().map(|&(s, v)| (Symbol::new(s), v)).collect()
}

/// Runs `graph` on the interpreter, the CPU and (if present) wgpu; every result must be the
/// interpreter's: the same values, or the same bounds error.
fn run_everywhere(graph: &Graph, inputs: &[HostTensor], bind: &Bindings) -> Result<Vec<HostTensor>, BoundsError> {
    static CPU: OnceLock<CpuDevice> = OnceLock::new();
    let cpu = CPU.get_or_init(|| CpuDevice::new().unwrap());
    let want = air::interp::eval(graph, inputs, bind);
    #[cfg_attr(not(feature = "wgpu"), allow(unused_mut))]
    let mut got = vec![("cpu", cpu.run(graph, inputs, bind).map_err(|e| e.to_string()))];
    #[cfg(feature = "wgpu")]
    if let Some(gpu) = gpu() {
        got.push(("wgpu", gpu.run(graph, inputs, bind).map_err(|e| e.to_string())));
    }
    let bounds = |e: &air::AirError| match e {
        air::AirError::Bounds(b) => b.clone(),
        other => panic!("the interpreter failed with a non-bounds error: {other}"),
    };
    for (name, result) in got {
        match (&want, result) {
            (Ok(w), Ok(g)) => {
                for (w, g) in w.iter().zip(&g) {
                    assert_eq!(w.shape, g.shape, "{name}: output shape");
                    let (w, g) = (w.as_slice::<f32>().unwrap(), g.as_slice::<f32>().unwrap());
                    for (a, b) in w.iter().zip(g) {
                        assert!(
                            (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
                            "{name}: {g:?} but the interpreter gives {w:?}"
                        );
                    }
                }
            }
            (Err(e), Err(g)) => assert_eq!(bounds(e).to_string(), g, "{name} and the interpreter differ"),
            (Ok(_), Err(g)) => panic!("{name} failed where the interpreter succeeded: {g}"),
            (Err(e), Ok(_)) => panic!("{name} succeeded where the interpreter failed: {e}"),
        }
    }
    want.map_err(|e| bounds(&e))
}

fn input(g: &mut Graph, slot: u32, shape: &[Dim]) -> NodeId {
    g.add_leaf(Op::Input(Input { slot }), f32s(shape)).unwrap()
}

fn data(len: usize) -> Vec<f32> {
    (0..len).map(|i| i as f32 * 0.5 - 1.0).collect()
}

#[test]
fn pad_and_reshape_violations_are_the_same_error_everywhere() {
    let (n, m) = (Dim::sym("n"), Dim::sym("m"));
    // pad [3] by (n - 2, 1), then add a [n + 2] input.
    let mut g = Graph::new();
    let x = input(&mut g, 0, &[3.into()]);
    let y = input(&mut g, 1, &[&n + 2]);
    let p = g.add(Op::Pad(Pad { padding: vec![(&n - 2, 1.into())], value: Scalar::Float(0.0) }), &[x]).unwrap();
    let s = g.add(Op::Binary(BinaryOp::Add), &[p, y]).unwrap();
    g.add_output(s);
    let x_data = HostTensor::from_vec(vec![1.0f32, 2.0, 3.0], vec![3]).unwrap();
    let run = |len: usize| {
        let y_data = HostTensor::from_vec(vec![0.0f32; len + 2], vec![len + 2]).unwrap();
        run_everywhere(&g, &[x_data.clone(), y_data], &bindings(&[("n", len as i64)]))
    };
    let e = run(1).unwrap_err();
    assert_eq!(e.to_string(), "pad: axis 0: padding before n - 2 = -1 < 0");
    let ok = run(3).unwrap();
    assert_eq!(ok[0].as_slice::<f32>().unwrap(), &[0.0, 1.0, 2.0, 3.0, 0.0]);

    // reshape [n*m] to [n, m]: the element counts are equal as polynomials, but n = -1, m = -2
    // give an input of 2 elements and a result of shape [-1, -2].
    let mut g = Graph::new();
    let x = input(&mut g, 0, &[n * m]);
    let r = g.add(Op::Reshape(Reshape { shape: smallvec![n, m] }), &[x]).unwrap();
    let neg = g.add(Op::Unary(UnaryOp::Neg), &[r]).unwrap();
    g.add_output(neg);
    let run = |len: usize, n: i64, m: i64| {
        let x = HostTensor::from_vec(data(len), vec![len]).unwrap();
        run_everywhere(&g, &[x], &bindings(&[("n", n), ("m", m)]))
    };
    let e = run(2, -1, -2).unwrap_err();
    assert_eq!(e.to_string(), "reshape: axis 0 of the result: size n = -1 < 0");
    let ok = run(6, 2, 3).unwrap();
    assert_eq!(ok[0].shape, vec![2, 3]);
    assert_eq!(ok[0].as_slice::<f32>().unwrap(), &data(6).iter().map(|v| -v).collect::<Vec<_>>()[..]);
    // A reshape whose element counts differ as polynomials is `infer`'s error, not a run-time one.
    assert!(g.add(Op::Reshape(Reshape { shape: smallvec![m] }), &[x]).is_err());
}

#[test]
fn a_shrink_the_optimizer_removes_is_still_checked() {
    // pad by (0, n) then shrink back to 0..3: the rewrites may fold the pair away, but the
    // conditions come from the graph as given, so n < 0 is still an error on every backend.
    let n = Dim::sym("n");
    let mut g = Graph::new();
    let x = input(&mut g, 0, &[3.into()]);
    let p = g.add(Op::Pad(Pad { padding: vec![(0.into(), n)], value: Scalar::Float(0.0) }), &[x]).unwrap();
    let s = g.add(Op::Shrink(Shrink { ranges: vec![(0.into(), 3.into())] }), &[p]).unwrap();
    let e = g.add(Op::Unary(UnaryOp::Neg), &[s]).unwrap();
    g.add_output(e);
    let x_data = HostTensor::from_vec(vec![1.0f32, 2.0, 3.0], vec![3]).unwrap();
    let err = run_everywhere(&g, std::slice::from_ref(&x_data), &bindings(&[("n", -2)])).unwrap_err();
    assert_eq!(err.op, "pad");
    let ok = run_everywhere(&g, &[x_data], &bindings(&[("n", 2)])).unwrap();
    assert_eq!(ok[0].as_slice::<f32>().unwrap(), &[-1.0, -2.0, -3.0]);
}

// ----- random symbolic graphs -----

/// One step of a random chain on a rank-2 value.
#[derive(Clone, Debug)]
enum Step {
    /// Shrink `axis` to `start..start + len`, each a constant or symbolic.
    Shrink { axis: usize, start: usize, len: usize },
    /// Pad `axis` by amounts from `AMOUNTS`.
    Pad { axis: usize, before: usize, after: usize },
    /// Expand a size-1 `axis` (after a shrink to one element) to a dim from `DIMS`.
    Expand { axis: usize, to: usize },
    /// Flatten and reshape back.
    Reshape,
    /// `x + x`, `neg`, or `max(x, 0)`.
    Elementwise(usize),
}

fn dims() -> [Dim; 5] {
    let (n, m) = (Dim::sym("n"), Dim::sym("m"));
    [2.into(), n, m, &n - 2, &m + 1]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..2usize, 0..5usize, 0..5usize).prop_map(|(axis, start, len)| Step::Shrink { axis, start, len }),
        (0..2usize, 0..5usize, 0..5usize).prop_map(|(axis, before, after)| Step::Pad { axis, before, after }),
        (0..2usize, 0..5usize).prop_map(|(axis, to)| Step::Expand { axis, to }),
        Just(Step::Reshape),
        (0..3usize).prop_map(Step::Elementwise),
    ]
}

/// Starts and lengths: constants and symbolic dims, some of which go past the end for some values.
fn offset(i: usize) -> Dim {
    let (n, m) = (Dim::sym("n"), Dim::sym("m"));
    [0.into(), 1.into(), n, &m - 1, n - m][i]
}

/// Builds the chain on an input of shape `[d0, d1]` (indices into `dims()`); a step whose type rule
/// rejects it statically is skipped (that is `infer`'s job, tested elsewhere).
fn build(d0: usize, d1: usize, steps: &[Step]) -> Graph {
    let all = dims();
    let mut g = Graph::new();
    let mut cur = input(&mut g, 0, &[all[d0], all[d1]]);
    for s in steps {
        let shape = g.ty(cur).shape.clone();
        let op = match *s {
            Step::Shrink { axis, start, len } => {
                let start = offset(start);
                let end = start + offset(len);
                let ranges = (0..2).map(|a| if a == axis { (start, end) } else { (0.into(), shape[a]) });
                Op::Shrink(Shrink { ranges: ranges.collect() })
            }
            Step::Pad { axis, before, after } => {
                let padding =
                    (0..2).map(|a| if a == axis { (offset(before), offset(after)) } else { (0.into(), 0.into()) });
                Op::Pad(Pad { padding: padding.collect(), value: Scalar::Float(0.25) })
            }
            Step::Expand { axis, to } => {
                let one = (0..2).map(|a| if a == axis { (0.into(), 1.into()) } else { (0.into(), shape[a]) });
                let Ok(single) = g.add(Op::Shrink(Shrink { ranges: one.collect() }), &[cur]) else { continue };
                cur = single;
                let target = (0..2).map(|a| if a == axis { all[to] } else { shape[a] });
                Op::Expand(Expand { shape: target.collect() })
            }
            Step::Reshape => {
                let Ok(flat) = g.add(Op::Reshape(Reshape { shape: smallvec![shape[0] * shape[1]] }), &[cur]) else {
                    continue;
                };
                cur = flat;
                Op::Reshape(Reshape { shape })
            }
            Step::Elementwise(0) => {
                if let Ok(id) = g.add(Op::Binary(BinaryOp::Add), &[cur, cur]) {
                    cur = id;
                }
                continue;
            }
            Step::Elementwise(1) => Op::Unary(UnaryOp::Neg),
            Step::Elementwise(_) => {
                let zero =
                    g.add_leaf(Op::Const(air::op::Const { value: Scalar::Float(0.0) }), g.ty(cur).clone()).unwrap();
                if let Ok(id) = g.add(Op::Binary(BinaryOp::Max), &[cur, zero]) {
                    cur = id;
                }
                continue;
            }
        };
        if let Ok(id) = g.add(op, &[cur]) {
            cur = id;
        }
    }
    g.add_output(cur);
    g.remove_dead();
    g
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_symbolic_graphs_agree_with_the_interpreter(
        d0 in 0..5usize,
        d1 in 0..5usize,
        steps in prop::collection::vec(step(), 1..5),
        bound in prop::collection::vec((0..7i64, 0..7i64), 1..4),
    ) {
        let graph = build(d0, d1, &steps);
        let ty = graph.ty(graph.input_nodes()[0].1).clone();
        for (n, m) in bound {
            let bind = bindings(&[("n", n), ("m", m)]);
            // Inputs must exist for the values; a negative input dim is the input's problem.
            let Ok(shape) = air::interp::eval_dims(&ty.shape, &bind) else { continue };
            let len = shape.iter().product();
            let x = HostTensor::from_vec(data(len), shape).unwrap();
            let _ = run_everywhere(&graph, &[x], &bind);
        }
    }
}
/// Found by the property test above: rows `0..m` of a broadcast row, shrunk to none, then padded
/// by one row. The padding's mask had kept the broadcast's range `0..m` (it cannot clamp a
/// symbolic bound to the shrunk size 0), so with `m = 1` the CPU read the row instead of the pad.
#[test]
fn padding_a_dim_shrunk_to_nothing_reads_only_the_padding() {
    let steps = [
        Step::Pad { axis: 1, before: 0, after: 1 },
        Step::Expand { axis: 0, to: 2 },
        Step::Shrink { axis: 0, start: 0, len: 0 },
        Step::Pad { axis: 0, before: 0, after: 1 },
    ];
    let graph = build(0, 0, &steps);
    let ty = graph.ty(graph.input_nodes()[0].1).clone();
    for m in 0..3 {
        let bind = bindings(&[("n", 0), ("m", m)]);
        let shape = air::interp::eval_dims(&ty.shape, &bind).unwrap();
        let x = HostTensor::from_vec(data(shape.iter().product()), shape).unwrap();
        let out = run_everywhere(&graph, &[x], &bind).expect("in bounds");
        assert_eq!(out[0].as_slice::<f32>().unwrap(), &[0.25; 3], "m = {m}");
    }
}
