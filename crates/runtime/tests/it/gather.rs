//! `gather` and `scatter_add` on random shapes, axes, index dtypes and source views: the reference
//! interpreter, the kir executor (`lower::exec`) and the CPU device agree bit for bit, and an
//! index out of range (or an integer division by zero) is the same error on all three.

use air::dim::shape_of;
use air::op::{Gather, Input, Permute, ScatterAdd};
use air::{BinaryOp, Bindings, DType, Graph, HostData, HostTensor, NodeId, Op, TensorType};
use kiln_runtime::CpuDevice;
use proptest::prelude::*;

fn input(g: &mut Graph, slot: u32, dtype: DType, shape: &[usize]) -> NodeId {
    g.add_leaf(Op::Input(Input { slot }), TensorType::new(dtype, shape_of(shape))).unwrap()
}

fn index_tensor(dtype: DType, values: &[i64], shape: &[usize]) -> HostTensor {
    let data = match dtype {
        DType::I32 => HostData::I32(values.iter().map(|&v| v as i32).collect()),
        _ => HostData::I64(values.to_vec()),
    };
    HostTensor::new(data, shape.to_vec()).unwrap()
}

fn floats(n: usize, seed: u64) -> Vec<f32> {
    (0..n).map(|i| ((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 100.0 - 5.0).collect()
}

/// Runs `g` on the interpreter, the kir executor and the CPU device; the results (or the error
/// messages) of the three.
fn run_all(g: &Graph, inputs: &[HostTensor]) -> [Result<Vec<HostTensor>, String>; 3] {
    let b = Bindings::new();
    let interp = air::interp::eval(g, inputs, &b).map_err(|e| e.to_string());
    let exec = lower::compile(g, &lower::CompileOptions::default())
        .and_then(|p| lower::exec::run(&p, inputs, &b))
        .map_err(|e| e.to_string());
    let cpu = CpuDevice::new().and_then(|d| d.run(g, inputs, &b)).map_err(|e| e.to_string());
    [interp, exec, cpu]
}

fn assert_same(g: &Graph, inputs: &[HostTensor]) {
    let [interp, exec, cpu] = run_all(g, inputs);
    let want = interp.unwrap_or_else(|e| panic!("interp failed: {e}\n{g}"));
    for (name, got) in [("exec", exec), ("cpu", cpu)] {
        let got = got.unwrap_or_else(|e| panic!("{name} failed: {e}\n{g}"));
        assert_eq!(got.len(), want.len());
        for (o, (a, b)) in want.iter().zip(&got).enumerate() {
            assert_eq!(a.shape, b.shape, "{name}: output {o} shape\n{g}");
            assert_eq!(a.data, b.data, "{name}: output {o} differs from the interpreter\n{g}");
        }
    }
}

/// Every backend fails, with a message containing `expected`.
fn assert_fails(g: &Graph, inputs: &[HostTensor], expected: &str) {
    for (name, r) in ["interp", "exec", "cpu"].into_iter().zip(run_all(g, inputs)) {
        match r {
            Ok(_) => panic!("{name}: expected an error containing {expected:?}, got a result\n{g}"),
            Err(e) => assert!(e.contains(expected), "{name}: error {e:?} does not contain {expected:?}"),
        }
    }
}

#[derive(Debug, Clone)]
struct Case {
    src: Vec<usize>,
    axis: usize,
    index: Vec<usize>,
    values: Vec<i64>,
    dtype: DType,
    /// Feed the source as a permuted view of an input of permuted shape.
    permuted: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..=3)
        .prop_flat_map(|rank| (prop::collection::vec(1usize..=4, rank), 0..rank, any::<bool>(), any::<bool>()))
        .prop_flat_map(|(src, axis, wide, permuted)| {
            let index_dims: Vec<BoxedStrategy<usize>> = src
                .iter()
                .enumerate()
                .map(|(d, &s)| if d == axis { (1usize..=5).boxed() } else { (1usize..=s).boxed() })
                .collect();
            (Just(src), Just(axis), index_dims, Just(wide), Just(permuted))
        })
        .prop_flat_map(|(src, axis, index, wide, permuted)| {
            let n: usize = index.iter().product();
            let size = src[axis] as i64;
            let values = prop::collection::vec(0..size, n);
            let dtype = if wide { DType::I64 } else { DType::I32 };
            (Just(src), Just(axis), Just(index), values, Just(dtype), Just(permuted))
        })
        .prop_map(|(src, axis, index, values, dtype, permuted)| Case { src, axis, index, values, dtype, permuted })
}

/// `gather(src, index)`, doubled (a fused consumer), and `scatter_add(index', v)` into the
/// source's shape where `index'` is the index cut to the source's size off the axis.
fn build(c: &Case) -> (Graph, Vec<HostTensor>) {
    let mut g = Graph::new();
    let rank = c.src.len();
    let src_numel: usize = c.src.iter().product();
    let rev: Vec<usize> = (0..rank).rev().collect();
    let stored_shape: Vec<usize> = if c.permuted { rev.iter().map(|&d| c.src[d]).collect() } else { c.src.clone() };
    let stored = input(&mut g, 0, DType::F32, &stored_shape);
    let src = if c.permuted { g.add(Op::Permute(Permute { perm: rev.into() }), &[stored]).unwrap() } else { stored };
    let index = input(&mut g, 1, c.dtype, &c.index);
    let gathered = g.add(Op::Gather(Gather { axis: c.axis }), &[src, index]).unwrap();
    let doubled = g.add(Op::Binary(BinaryOp::Add), &[gathered, gathered]).unwrap();
    g.add_output(gathered);
    g.add_output(doubled);
    // Scatter: index of the source's shape off the axis (the index's values stay in range).
    let mut sc_index_shape = c.src.clone();
    sc_index_shape[c.axis] = c.index[c.axis];
    let sc_n: usize = sc_index_shape.iter().product();
    let sc_values: Vec<i64> = (0..sc_n).map(|i| c.values[i % c.values.len()]).collect();
    let sc_index = input(&mut g, 2, c.dtype, &sc_index_shape);
    let sc_vals = input(&mut g, 3, DType::F32, &sc_index_shape);
    let scatter = ScatterAdd { axis: c.axis, shape: shape_of(&c.src) };
    let scattered = g.add(Op::ScatterAdd(Box::new(scatter)), &[sc_index, sc_vals]).unwrap();
    g.add_output(scattered);
    let inputs = vec![
        HostTensor::from_vec(floats(src_numel, 1), stored_shape).unwrap(),
        index_tensor(c.dtype, &c.values, &c.index),
        index_tensor(c.dtype, &sc_values, &sc_index_shape),
        HostTensor::from_vec(floats(sc_n, 2), sc_index_shape).unwrap(),
    ];
    (g, inputs)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn gather_and_scatter_match_the_interpreter(c in case()) {
        let (g, inputs) = build(&c);
        assert_same(&g, &inputs);
    }

    #[test]
    fn a_bad_index_is_the_same_error_everywhere(c in case(), at in any::<prop::sample::Index>(), negative in any::<bool>()) {
        let mut c = c;
        let i = at.index(c.values.len());
        let size = c.src[c.axis] as i64;
        let bad = if negative { -1 - i as i64 } else { size + i as i64 };
        c.values[i] = bad;
        let (g, inputs) = build(&c);
        assert_fails(&g, &inputs, &format!("index {bad} out of range for size {size} in gather"));
    }
}

#[test]
fn scatter_add_reports_its_own_bad_index() {
    let mut g = Graph::new();
    let index = input(&mut g, 0, DType::I32, &[3, 2]);
    let values = input(&mut g, 1, DType::F32, &[3, 2]);
    let out =
        g.add(Op::ScatterAdd(Box::new(ScatterAdd { axis: 0, shape: shape_of(&[4, 2]) })), &[index, values]).unwrap();
    g.add_output(out);
    let good = [
        index_tensor(DType::I32, &[0, 3, 3, 3, 0, 1], &[3, 2]),
        HostTensor::from_vec(floats(6, 3), vec![3, 2]).unwrap(),
    ];
    assert_same(&g, &good);
    let bad = [
        index_tensor(DType::I32, &[0, 3, 4, 3, 0, 1], &[3, 2]),
        HostTensor::from_vec(floats(6, 3), vec![3, 2]).unwrap(),
    ];
    assert_fails(&g, &bad, "index 4 out of range for size 4 in scatter_add");
}

#[test]
fn integer_division_by_zero_is_an_error_and_float_division_stays_ieee() {
    for (op, name) in [(BinaryOp::Div, "div"), (BinaryOp::Mod, "mod")] {
        for dtype in [DType::I32, DType::I64] {
            let mut g = Graph::new();
            let a = input(&mut g, 0, dtype, &[5]);
            let b = input(&mut g, 1, dtype, &[5]);
            let q = g.add(Op::Binary(op), &[a, b]).unwrap();
            g.add_output(q);
            let ints = |v: &[i64]| index_tensor(dtype, v, &[5]);
            assert_same(&g, &[ints(&[7, -7, 9, 1, 0]), ints(&[2, 2, -4, 1, 3])]);
            assert_fails(
                &g,
                &[ints(&[7, -7, 9, 1, 0]), ints(&[2, 0, -4, 1, 3])],
                &format!("integer division by zero in {name}"),
            );
        }
    }
    let mut g = Graph::new();
    let a = input(&mut g, 0, DType::F32, &[2]);
    let b = input(&mut g, 1, DType::F32, &[2]);
    let q = g.add(Op::Binary(BinaryOp::Div), &[a, b]).unwrap();
    g.add_output(q);
    let got = CpuDevice::new()
        .unwrap()
        .run(
            &g,
            &[
                HostTensor::from_vec(vec![1.0f32, -1.0], vec![2]).unwrap(),
                HostTensor::from_vec(vec![0.0f32, 0.0], vec![2]).unwrap(),
            ],
            &Bindings::new(),
        )
        .unwrap();
    assert_eq!(got[0].as_slice::<f32>().unwrap(), &[f32::INFINITY, f32::NEG_INFINITY]);
}
