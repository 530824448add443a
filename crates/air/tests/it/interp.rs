//! Tests of the reference interpreter: hand-computed values for every op and dtype class, edge
//! cases, errors, and property tests of the movement ops and reductions.

use kiln_air as air;

use air::dim::shape_of;
use air::interp::eval;
use air::op::{Cast, Const, Expand, Input, Iota, Pad, Permute, Reduce, Reshape, Shrink};
use air::{AirError, BinaryOp, Bindings, DType, Dim, Element, Graph, HostTensor, NodeId, Op, ReduceOp, Scalar, Shape};
use air::{Symbol, TensorType, UnaryOp};
use half::{bf16, f16};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// Helpers: the only code that builds graphs and runs them.

fn tensor<T: Element>(values: Vec<T>, shape: &[usize]) -> HostTensor {
    HostTensor::from_vec(values, shape.to_vec()).unwrap()
}

fn input(g: &mut Graph, slot: u32, dtype: DType, shape: impl Into<Shape>) -> NodeId {
    g.add_leaf(Op::Input(Input { slot }), TensorType::new(dtype, shape)).unwrap()
}

fn run(g: &Graph, inputs: &[HostTensor]) -> Vec<HostTensor> {
    eval(g, inputs, &Bindings::new()).unwrap()
}

fn values<T: Element>(t: &HostTensor) -> Vec<T> {
    t.as_slice::<T>().unwrap_or_else(|| panic!("expected {}, got {}", T::DTYPE, t.dtype())).to_vec()
}

/// Applies a unary op to a 1-d tensor and returns the result elements.
fn unary<T: Element>(op: UnaryOp, x: Vec<T>) -> Vec<T> {
    let mut g = Graph::new();
    let a = input(&mut g, 0, T::DTYPE, shape_of(&[x.len()]));
    let y = g.add(Op::Unary(op), &[a]).unwrap();
    g.add_output(y);
    let n = x.len();
    values(&run(&g, &[tensor(x, &[n])])[0])
}

/// Applies a binary op to two 1-d tensors and returns the result elements.
fn binary<T: Element, U: Element>(op: BinaryOp, x: Vec<T>, y: Vec<T>) -> Vec<U> {
    let mut g = Graph::new();
    let n = x.len();
    let a = input(&mut g, 0, T::DTYPE, shape_of(&[n]));
    let b = input(&mut g, 1, T::DTYPE, shape_of(&[n]));
    let z = g.add(Op::Binary(op), &[a, b]).unwrap();
    g.add_output(z);
    values(&run(&g, &[tensor(x, &[n]), tensor(y, &[n])])[0])
}

fn cast<T: Element, U: Element>(x: Vec<T>) -> Vec<U> {
    let mut g = Graph::new();
    let n = x.len();
    let a = input(&mut g, 0, T::DTYPE, shape_of(&[n]));
    let z = g.add(Op::Cast(Cast { to: U::DTYPE }), &[a]).unwrap();
    g.add_output(z);
    values(&run(&g, &[tensor(x, &[n])])[0])
}

/// Applies one single-input op to `x` and returns the result.
fn apply(op: Op, x: HostTensor) -> HostTensor {
    let mut g = Graph::new();
    let a = input(&mut g, 0, x.dtype(), shape_of(&x.shape));
    let y = g.add(op, &[a]).unwrap();
    g.add_output(y);
    run(&g, &[x]).remove(0)
}

fn reduce(op: ReduceOp, axes: &[usize]) -> Op {
    Op::Reduce(Reduce { op, axes: axes.iter().copied().collect() })
}
fn reshape(shape: &[usize]) -> Op {
    Op::Reshape(Reshape { shape: shape_of(shape) })
}
fn permute(perm: &[usize]) -> Op {
    Op::Permute(Permute { perm: perm.iter().copied().collect() })
}
fn expand(shape: &[usize]) -> Op {
    Op::Expand(Expand { shape: shape_of(shape) })
}
fn pad(padding: &[(i64, i64)], value: Scalar) -> Op {
    Op::Pad(Pad { padding: padding.iter().map(|&(a, b)| (Dim::Const(a), Dim::Const(b))).collect(), value })
}
fn shrink(ranges: &[(i64, i64)]) -> Op {
    Op::Shrink(Shrink { ranges: ranges.iter().map(|&(a, b)| (Dim::Const(a), Dim::Const(b))).collect() })
}

fn arange_f32(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

fn bind(pairs: &[(&str, i64)]) -> Bindings {
    pairs.iter().map(|&(s, v)| (Symbol::new(s), v)).collect()
}

fn interp_error(result: Result<Vec<HostTensor>, AirError>) -> String {
    match result {
        Err(AirError::Interp(msg)) => msg,
        other => panic!("expected an interpreter error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Unary ops.

#[test]
fn unary_f32() {
    assert_eq!(unary(UnaryOp::Neg, vec![1.5f32, -0.0, 0.0]), vec![-1.5, 0.0, -0.0]);
    assert_eq!(unary(UnaryOp::Exp2, vec![3.0f32, 0.0, -1.0, f32::NEG_INFINITY]), vec![8.0, 1.0, 0.5, 0.0]);
    assert_eq!(unary(UnaryOp::Log2, vec![8.0f32, 1.0, 0.5, 0.0]), vec![3.0, 0.0, -1.0, f32::NEG_INFINITY]);
    assert!(unary(UnaryOp::Log2, vec![-1.0f32])[0].is_nan());
    assert_eq!(unary(UnaryOp::Sin, vec![0.0f32])[0], 0.0);
    assert!((unary(UnaryOp::Sin, vec![std::f32::consts::FRAC_PI_2])[0] - 1.0).abs() < 1e-7);
    assert_eq!(unary(UnaryOp::Sqrt, vec![4.0f32, 2.25, 0.0]), vec![2.0, 1.5, 0.0]);
    assert!(unary(UnaryOp::Sqrt, vec![-4.0f32])[0].is_nan());
    assert_eq!(unary(UnaryOp::Recip, vec![4.0f32, -0.5, 0.0]), vec![0.25, -2.0, f32::INFINITY]);
    let erf = unary(UnaryOp::Erf, vec![0.0f32, 1.0, -1.0, 10.0]);
    assert_eq!(erf[0], 0.0);
    assert!((erf[1] - 0.842_700_8).abs() < 1e-7, "{erf:?}");
    assert!((erf[2] + 0.842_700_8).abs() < 1e-7, "{erf:?}");
    assert_eq!(erf[3], 1.0);
    assert_eq!(unary(UnaryOp::Trunc, vec![2.7f32, -2.7, -0.5, 3.0]), vec![2.0, -2.0, -0.0, 3.0]);
}

#[test]
fn unary_f64() {
    assert_eq!(unary(UnaryOp::Neg, vec![1.5f64]), vec![-1.5]);
    assert_eq!(unary(UnaryOp::Exp2, vec![10.0f64, -2.0]), vec![1024.0, 0.25]);
    assert_eq!(unary(UnaryOp::Log2, vec![1024.0f64]), vec![10.0]);
    assert_eq!(unary(UnaryOp::Sqrt, vec![2.0f64]), vec![std::f64::consts::SQRT_2]);
    assert_eq!(unary(UnaryOp::Recip, vec![8.0f64]), vec![0.125]);
    assert!((unary(UnaryOp::Erf, vec![0.5f64])[0] - 0.520_499_877_813_046_5).abs() < 1e-15);
    assert!((unary(UnaryOp::Sin, vec![1.0f64])[0] - 0.841_470_984_807_896_5).abs() < 1e-15);
    assert_eq!(unary(UnaryOp::Trunc, vec![-1e300f64, 1.999_999]), vec![-1e300, 1.0]);
}

#[test]
fn unary_f16_and_bf16_round_to_storage() {
    // 1/3 rounded to f16 (11 significant bits) and to bf16 (8 significant bits).
    assert_eq!(unary(UnaryOp::Recip, vec![f16::from_f32(3.0)]), vec![f16::from_f32(0.333_251_95)]);
    assert_eq!(unary(UnaryOp::Recip, vec![bf16::from_f32(3.0)]), vec![bf16::from_f32(0.333_984_38)]);
    assert_eq!(unary(UnaryOp::Sqrt, vec![f16::from_f32(2.25)]), vec![f16::from_f32(1.5)]);
    assert_eq!(unary(UnaryOp::Neg, vec![bf16::from_f32(2.0)]), vec![bf16::from_f32(-2.0)]);
    // exp2(16) = 65536 overflows f16 (max 65504) but not bf16.
    assert_eq!(unary(UnaryOp::Exp2, vec![f16::from_f32(16.0)]), vec![f16::INFINITY]);
    assert_eq!(unary(UnaryOp::Exp2, vec![bf16::from_f32(16.0)]), vec![bf16::from_f32(65536.0)]);
    assert_eq!(unary(UnaryOp::Trunc, vec![f16::from_f32(-2.5)]), vec![f16::from_f32(-2.0)]);
    let erf = unary(UnaryOp::Erf, vec![f16::from_f32(1.0)])[0];
    assert_eq!(erf, f16::from_f32(0.842_700_8));
}

#[test]
fn unary_ints_and_bools() {
    assert_eq!(unary(UnaryOp::Neg, vec![5i32, -7, i32::MIN]), vec![-5, 7, i32::MIN]);
    assert_eq!(unary(UnaryOp::Not, vec![5i32, 0, -1]), vec![-6, -1, 0]);
    assert_eq!(unary(UnaryOp::Neg, vec![i64::MIN, 3]), vec![i64::MIN, -3]);
    assert_eq!(unary(UnaryOp::Not, vec![0i64]), vec![-1]);
    assert_eq!(unary(UnaryOp::Not, vec![true, false]), vec![false, true]);
}

// ---------------------------------------------------------------------------------------------
// Binary ops.

#[test]
fn binary_f32_arithmetic() {
    let a = vec![1.0f32, -7.5, 7.5, 2.0, 0.0];
    let b = vec![2.0f32, 2.0, -2.0, 10.0, 0.0];
    assert_eq!(binary::<f32, f32>(BinaryOp::Add, a.clone(), b.clone()), vec![3.0, -5.5, 5.5, 12.0, 0.0]);
    assert_eq!(binary::<f32, f32>(BinaryOp::Sub, a.clone(), b.clone()), vec![-1.0, -9.5, 9.5, -8.0, 0.0]);
    assert_eq!(binary::<f32, f32>(BinaryOp::Mul, a.clone(), b.clone()), vec![2.0, -15.0, -15.0, 20.0, 0.0]);
    let div = binary::<f32, f32>(BinaryOp::Div, a.clone(), b.clone());
    assert_eq!(&div[..4], &[0.5, -3.75, -3.75, 0.2]);
    assert!(div[4].is_nan());
    // Remainder has the sign of the dividend.
    let rem = binary::<f32, f32>(BinaryOp::Mod, a.clone(), b.clone());
    assert_eq!(&rem[..4], &[1.0, -1.5, 1.5, 2.0]);
    assert!(rem[4].is_nan());
    assert_eq!(binary::<f32, f32>(BinaryOp::Pow, vec![2.0, 9.0, 0.0], vec![10.0, 0.5, 0.0]), vec![1024.0, 3.0, 1.0]);
    assert_eq!(binary::<f32, f32>(BinaryOp::Max, a.clone(), b.clone()), vec![2.0, 2.0, 7.5, 10.0, 0.0]);
    assert_eq!(binary::<f32, f32>(BinaryOp::Min, a, b), vec![1.0, -7.5, -2.0, 2.0, 0.0]);
}

#[test]
fn binary_f64_arithmetic() {
    assert_eq!(binary::<f64, f64>(BinaryOp::Add, vec![0.1], vec![0.2]), vec![0.1 + 0.2]);
    assert_eq!(binary::<f64, f64>(BinaryOp::Div, vec![1.0], vec![3.0]), vec![1.0 / 3.0]);
    assert_eq!(binary::<f64, f64>(BinaryOp::Mod, vec![-7.0], vec![3.0]), vec![-1.0]);
    assert_eq!(binary::<f64, f64>(BinaryOp::Pow, vec![2.0], vec![-2.0]), vec![0.25]);
    assert_eq!(binary::<f64, f64>(BinaryOp::Max, vec![f64::NEG_INFINITY], vec![-1e308]), vec![-1e308]);
}

#[test]
fn binary_half_rounds_after_each_op() {
    // f16 has 11 significant bits: 2048 + 1 rounds (to even) back to 2048.
    let x = vec![f16::from_f32(2048.0)];
    let one = vec![f16::from_f32(1.0)];
    assert_eq!(binary::<f16, f16>(BinaryOp::Add, x.clone(), one.clone()), x);
    let prod = binary::<f16, f16>(BinaryOp::Mul, vec![f16::from_f32(1.5)], vec![f16::from_f32(3.0)]);
    assert_eq!(prod, vec![f16::from_f32(4.5)]);
    // bf16 has 8: 256 + 1 is 256.
    let y = vec![bf16::from_f32(256.0)];
    assert_eq!(binary::<bf16, bf16>(BinaryOp::Add, y.clone(), vec![bf16::from_f32(1.0)]), y);
    let third = binary::<bf16, bf16>(BinaryOp::Div, vec![bf16::from_f32(1.0)], vec![bf16::from_f32(3.0)]);
    assert_eq!(third, vec![bf16::from_f32(0.333_984_38)]);
    // Chained: each add rounds, so adding 1 twice to 2048 stays 2048 (f32 would reach 2050).
    let mut g = Graph::new();
    let a = input(&mut g, 0, DType::F16, shape_of(&[1]));
    let b = input(&mut g, 1, DType::F16, shape_of(&[1]));
    let s1 = g.add(Op::Binary(BinaryOp::Add), &[a, b]).unwrap();
    let s2 = g.add(Op::Binary(BinaryOp::Add), &[s1, b]).unwrap();
    g.add_output(s2);
    let out = run(&g, &[tensor(x.clone(), &[1]), tensor(one, &[1])]);
    assert_eq!(values::<f16>(&out[0]), x);
}

#[test]
fn float_max_min_propagate_nan_and_order_zeros() {
    let nan = f32::NAN;
    let max = binary::<f32, f32>(BinaryOp::Max, vec![nan, 1.0, nan, -0.0, 0.0], vec![1.0, nan, nan, 0.0, -0.0]);
    assert!(max[0].is_nan() && max[1].is_nan() && max[2].is_nan());
    assert!(max[3] == 0.0 && max[3].is_sign_positive());
    assert!(max[4] == 0.0 && max[4].is_sign_positive());
    let min = binary::<f32, f32>(BinaryOp::Min, vec![nan, 1.0, -0.0, 0.0], vec![1.0, nan, 0.0, -0.0]);
    assert!(min[0].is_nan() && min[1].is_nan());
    assert!(min[2] == 0.0 && min[2].is_sign_negative());
    assert!(min[3] == 0.0 && min[3].is_sign_negative());
    let max16 = binary::<f16, f16>(BinaryOp::Max, vec![f16::NAN, f16::ONE], vec![f16::ONE, f16::ZERO]);
    assert!(max16[0].is_nan());
    assert_eq!(max16[1], f16::ONE);
    let min64 = binary::<f64, f64>(BinaryOp::Min, vec![f64::NAN], vec![f64::NEG_INFINITY]);
    assert!(min64[0].is_nan());
    let maxbf = binary::<bf16, bf16>(BinaryOp::Max, vec![bf16::ONE], vec![bf16::NAN]);
    assert!(maxbf[0].is_nan());
}

#[test]
fn binary_i32() {
    let a = vec![7i32, -7, 7, -7, 5, i32::MIN, i32::MAX];
    let b = vec![2i32, 2, -2, -2, 0, -1, 1];
    let (qa, qb) = (vec![7i32, -7, 7, -7, i32::MIN, i32::MAX], vec![2i32, 2, -2, -2, -1, 1]);
    assert_eq!(binary::<i32, i32>(BinaryOp::Div, qa.clone(), qb.clone()), vec![3, -3, -3, 3, i32::MIN, i32::MAX]);
    assert_eq!(binary::<i32, i32>(BinaryOp::Mod, qa, qb), vec![1, -1, 1, -1, 0, 0]);
    assert_eq!(binary::<i32, i32>(BinaryOp::Add, a.clone(), b.clone()), vec![9, -5, 5, -9, 5, i32::MAX, i32::MIN]);
    let diff = binary::<i32, i32>(BinaryOp::Sub, a.clone(), b.clone());
    assert_eq!(diff, vec![5, -9, 9, -5, 5, i32::MIN + 1, i32::MAX - 1]);
    assert_eq!(binary::<i32, i32>(BinaryOp::Mul, vec![i32::MAX, -3], vec![2, 4]), vec![-2, -12]);
    assert_eq!(binary::<i32, i32>(BinaryOp::Max, a.clone(), b.clone()), vec![7, 2, 7, -2, 5, -1, i32::MAX]);
    assert_eq!(binary::<i32, i32>(BinaryOp::Min, a, b), vec![2, -7, -2, -7, 0, i32::MIN, 1]);
    assert_eq!(binary::<i32, i32>(BinaryOp::And, vec![12, -1], vec![10, 6]), vec![8, 6]);
    assert_eq!(binary::<i32, i32>(BinaryOp::Or, vec![12, 0], vec![10, 0]), vec![14, 0]);
}

#[test]
fn integer_division_by_zero_is_an_error() {
    for (op, name) in [(BinaryOp::Div, "div"), (BinaryOp::Mod, "mod")] {
        let mut g = Graph::new();
        let a = input(&mut g, 0, DType::I32, shape_of(&[2]));
        let b = input(&mut g, 1, DType::I32, shape_of(&[2]));
        let z = g.add(Op::Binary(op), &[a, b]).unwrap();
        g.add_output(z);
        let e = eval(&g, &[tensor(vec![9i32, 9], &[2]), tensor(vec![3i32, 0], &[2])], &Bindings::new()).unwrap_err();
        assert!(e.to_string().contains(&format!("integer division by zero in {name}")), "{e}");
    }
}

#[test]
fn binary_i64() {
    assert_eq!(binary::<i64, i64>(BinaryOp::Add, vec![i64::MAX], vec![1]), vec![i64::MIN]);
    assert_eq!(binary::<i64, i64>(BinaryOp::Div, vec![-9, i64::MIN], vec![4, -1]), vec![-2, i64::MIN]);
    assert_eq!(binary::<i64, i64>(BinaryOp::Mod, vec![-9, i64::MIN], vec![4, -1]), vec![-1, 0]);
    assert_eq!(binary::<i64, i64>(BinaryOp::Mul, vec![1 << 62], vec![4]), vec![0]);
    assert_eq!(binary::<i64, i64>(BinaryOp::And, vec![0b1100], vec![0b1010]), vec![0b1000]);
    assert_eq!(binary::<i64, i64>(BinaryOp::Max, vec![-1], vec![-2]), vec![-1]);
}

#[test]
fn comparisons() {
    let nan = f32::NAN;
    let a = vec![1.0f32, 2.0, nan, nan, -0.0];
    let b = vec![2.0f32, 2.0, 1.0, nan, 0.0];
    assert_eq!(binary::<f32, bool>(BinaryOp::CmpLt, a.clone(), b.clone()), vec![true, false, false, false, false]);
    assert_eq!(binary::<f32, bool>(BinaryOp::CmpEq, a.clone(), b.clone()), vec![false, true, false, false, true]);
    assert_eq!(binary::<f32, bool>(BinaryOp::CmpNe, a, b), vec![true, false, true, true, false]);
    assert_eq!(binary::<i32, bool>(BinaryOp::CmpLt, vec![-1, 3], vec![0, 3]), vec![true, false]);
    assert_eq!(binary::<i64, bool>(BinaryOp::CmpEq, vec![-1, 3], vec![0, 3]), vec![false, true]);
    assert_eq!(binary::<f64, bool>(BinaryOp::CmpLt, vec![-1.0], vec![f64::NAN]), vec![false]);
    assert_eq!(binary::<f16, bool>(BinaryOp::CmpLt, vec![f16::ONE], vec![f16::from_f32(1.001)]), vec![true]);
    assert_eq!(binary::<bf16, bool>(BinaryOp::CmpNe, vec![bf16::ONE], vec![bf16::ONE]), vec![false]);
    let (f, t) = (false, true);
    assert_eq!(binary::<bool, bool>(BinaryOp::CmpEq, vec![f, f, t, t], vec![f, t, f, t]), vec![t, f, f, t]);
}

#[test]
fn bool_logic() {
    let (f, t) = (false, true);
    let a = vec![f, f, t, t];
    let b = vec![f, t, f, t];
    assert_eq!(binary::<bool, bool>(BinaryOp::And, a.clone(), b.clone()), vec![f, f, f, t]);
    assert_eq!(binary::<bool, bool>(BinaryOp::Or, a.clone(), b.clone()), vec![f, t, t, t]);
    assert_eq!(binary::<bool, bool>(BinaryOp::Max, a.clone(), b.clone()), vec![f, t, t, t]);
    assert_eq!(binary::<bool, bool>(BinaryOp::Min, a.clone(), b.clone()), vec![f, f, f, t]);
    assert_eq!(binary::<bool, bool>(BinaryOp::CmpNe, a, b), vec![f, t, t, f]);
}

/// Runs `where(cond, a, b)` on 1-d tensors.
fn select<T: Element>(cond: Vec<bool>, a: Vec<T>, b: Vec<T>) -> Vec<T> {
    let n = cond.len();
    let mut g = Graph::new();
    let c = input(&mut g, 0, DType::Bool, shape_of(&[n]));
    let x = input(&mut g, 1, T::DTYPE, shape_of(&[n]));
    let y = input(&mut g, 2, T::DTYPE, shape_of(&[n]));
    let w = g.add(Op::Where, &[c, x, y]).unwrap();
    g.add_output(w);
    values(&run(&g, &[tensor(cond, &[n]), tensor(a, &[n]), tensor(b, &[n])])[0])
}

#[test]
fn where_picks_per_element() {
    let c = vec![true, false, false, true];
    assert_eq!(select(c.clone(), vec![1.0f32, 2., 3., 4.], vec![-1.0, -2., -3., -4.]), vec![1.0, -2.0, -3.0, 4.0]);
    assert_eq!(select(c.clone(), vec![1.0f64, 2., 3., 4.], vec![-1.0, -2., -3., -4.]), vec![1.0, -2.0, -3.0, 4.0]);
    assert_eq!(select(c.clone(), vec![1i64, 2, 3, 4], vec![5, 6, 7, 8]), vec![1, 6, 7, 4]);
    assert_eq!(select(c.clone(), vec![1i32, 2, 3, 4], vec![5, 6, 7, 8]), vec![1, 6, 7, 4]);
    assert_eq!(select(c.clone(), vec![true; 4], vec![false; 4]), c);
    let (one, zero) = (f16::ONE, f16::ZERO);
    assert_eq!(select(c.clone(), vec![one; 4], vec![zero; 4]), vec![one, zero, zero, one]);
    let (one, zero) = (bf16::ONE, bf16::ZERO);
    assert_eq!(select(c, vec![one; 4], vec![zero; 4]), vec![one, zero, zero, one]);
    assert_eq!(select(vec![], Vec::<f32>::new(), vec![]), vec![]);
}

// ---------------------------------------------------------------------------------------------
// Casts and leaves.

#[test]
fn casts_float_to_int_truncate_and_saturate() {
    let x = vec![2.7f32, -2.7, f32::NAN, 1e10, -1e10, f32::INFINITY];
    assert_eq!(cast::<f32, i32>(x.clone()), vec![2, -2, 0, i32::MAX, i32::MIN, i32::MAX]);
    assert_eq!(cast::<f32, i64>(x), vec![2, -2, 0, 10_000_000_000, -10_000_000_000, i64::MAX]);
    assert_eq!(cast::<f64, i32>(vec![-0.99, 2147483647.9]), vec![0, i32::MAX]);
    assert_eq!(cast::<f16, i32>(vec![f16::from_f32(-3.5)]), vec![-3]);
    assert_eq!(cast::<bf16, i64>(vec![bf16::from_f32(-3.5)]), vec![-3]);
}

#[test]
fn casts_bool_and_ints() {
    assert_eq!(cast::<bool, f32>(vec![true, false]), vec![1.0, 0.0]);
    assert_eq!(cast::<bool, i64>(vec![true, false]), vec![1, 0]);
    assert_eq!(cast::<bool, bf16>(vec![true]), vec![bf16::ONE]);
    assert_eq!(cast::<f32, bool>(vec![0.0, -0.0, f32::NAN, 0.5]), vec![false, false, true, true]);
    assert_eq!(cast::<i32, bool>(vec![0, -3]), vec![false, true]);
    // i64 -> i32 keeps the low 32 bits.
    assert_eq!(cast::<i64, i32>(vec![(1 << 32) + 5, -1, 1 << 31]), vec![5, -1, i32::MIN]);
    assert_eq!(cast::<i32, i64>(vec![-5]), vec![-5]);
    assert_eq!(cast::<i64, f32>(vec![16_777_217]), vec![16_777_216.0]);
    assert_eq!(cast::<i64, f64>(vec![-3]), vec![-3.0]);
}

#[test]
fn casts_between_floats_round_to_nearest_even() {
    // 2049 is halfway between the f16 neighbours 2048 and 2050: ties to even.
    assert_eq!(cast::<i32, f16>(vec![2049, 2051]), vec![f16::from_f32(2048.0), f16::from_f32(2052.0)]);
    assert_eq!(cast::<f32, f16>(vec![65520.0, 1e-8]), vec![f16::INFINITY, f16::ZERO]);
    let near_one = cast::<f32, bf16>(vec![1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0]);
    assert_eq!(near_one, vec![bf16::ONE, bf16::from_f32(1.0 + 4.0 / 256.0)]);
    assert_eq!(cast::<f16, f32>(vec![f16::from_f32(0.1)]), vec![f16::from_f32(0.1).to_f32()]);
    assert_eq!(cast::<f64, f32>(vec![0.1]), vec![0.1f32]);
    assert_eq!(cast::<bf16, f16>(vec![bf16::from_f32(3.0)]), vec![f16::from_f32(3.0)]);
    assert_eq!(cast::<f32, f64>(vec![0.1]), vec![0.1f32 as f64]);
    // f64 -> f16 goes through f32: 2048 + 1 + 2^-20 rounds to 2049 in f32, then ties to 2048.
    assert_eq!(cast::<f64, f16>(vec![2049.0 + 1.0 / 1048576.0]), vec![f16::from_f32(2048.0)]);
}

#[test]
fn const_and_iota() {
    let mut g = Graph::new();
    let leaf = |g: &mut Graph, op: Op, dtype: DType, shape: &[usize]| {
        g.add_leaf(op, TensorType::new(dtype, shape_of(shape))).unwrap()
    };
    let c16 = leaf(&mut g, Op::Const(Const { value: Scalar::Float(0.1) }), DType::F16, &[2]);
    let ci = leaf(&mut g, Op::Const(Const { value: Scalar::Int(-3) }), DType::I32, &[2, 1]);
    let cb = leaf(&mut g, Op::Const(Const { value: Scalar::Bool(true) }), DType::Bool, &[]);
    let i1 = leaf(&mut g, Op::Iota(Iota { axis: 1 }), DType::F32, &[2, 3]);
    let i0 = leaf(&mut g, Op::Iota(Iota { axis: 0 }), DType::I64, &[2, 3]);
    let ib = leaf(&mut g, Op::Iota(Iota { axis: 0 }), DType::BF16, &[258]);
    let ie = leaf(&mut g, Op::Iota(Iota { axis: 1 }), DType::I32, &[3, 0]);
    for n in [c16, ci, cb, i1, i0, ib, ie] {
        g.add_output(n);
    }
    let out = run(&g, &[]);
    assert_eq!(values::<f16>(&out[0]), vec![f16::from_f32(0.1); 2]);
    assert_eq!((values::<i32>(&out[1]), out[1].shape.clone()), (vec![-3, -3], vec![2, 1]));
    assert_eq!((values::<bool>(&out[2]), out[2].shape.clone()), (vec![true], vec![]));
    assert_eq!(values::<f32>(&out[3]), vec![0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
    assert_eq!(values::<i64>(&out[4]), vec![0, 0, 0, 1, 1, 1]);
    // bf16 holds 256 and 258 but not 257, which rounds to even (256).
    let ib = values::<bf16>(&out[5]);
    assert_eq!((ib[255], ib[256], ib[257]), (bf16::from_f32(255.0), bf16::from_f32(256.0), bf16::from_f32(256.0)));
    assert_eq!((values::<i32>(&out[6]), out[6].shape.clone()), (vec![], vec![3, 0]));
}

// ---------------------------------------------------------------------------------------------
// Reductions.

#[test]
fn reduce_sum_and_max_keep_axes() {
    let x = tensor(vec![1.0f32, 2., 3., 4., 5., 6.], &[2, 3]);
    let s1 = apply(reduce(ReduceOp::Sum, &[1]), x.clone());
    assert_eq!((values::<f32>(&s1), s1.shape), (vec![6.0, 15.0], vec![2, 1]));
    let s0 = apply(reduce(ReduceOp::Sum, &[0]), x.clone());
    assert_eq!((values::<f32>(&s0), s0.shape), (vec![5.0, 7.0, 9.0], vec![1, 3]));
    let all = apply(reduce(ReduceOp::Sum, &[0, 1]), x.clone());
    assert_eq!((values::<f32>(&all), all.shape), (vec![21.0], vec![1, 1]));
    let none = apply(reduce(ReduceOp::Sum, &[]), x.clone());
    assert_eq!(none, x);
    let m = apply(reduce(ReduceOp::Max, &[0]), tensor(vec![1.0f32, -2., 3., 4., -5., -6.], &[2, 3]));
    assert_eq!(values::<f32>(&m), vec![4.0, -2.0, 3.0]);

    // [2, 3, 2] arange, reduce axes 0 and 2: out[j] = sum over i, k of 6i + 2j + k.
    let y = tensor((0..12).map(|v| v as i64).collect(), &[2, 3, 2]);
    let s = apply(reduce(ReduceOp::Sum, &[0, 2]), y.clone());
    assert_eq!((values::<i64>(&s), s.shape), (vec![14, 22, 30], vec![1, 3, 1]));
    let m = apply(reduce(ReduceOp::Max, &[1]), y);
    assert_eq!((values::<i64>(&m), m.shape), (vec![4, 5, 10, 11], vec![2, 1, 2]));
}

#[test]
fn reduce_dtypes() {
    let s = apply(reduce(ReduceOp::Sum, &[0]), tensor(vec![i32::MAX, 1, 5], &[3]));
    assert_eq!(values::<i32>(&s), vec![i32::MIN + 5]);
    let m = apply(reduce(ReduceOp::Max, &[0]), tensor(vec![-5i32, -2, -9], &[3]));
    assert_eq!(values::<i32>(&m), vec![-2]);
    let s = apply(reduce(ReduceOp::Sum, &[0]), tensor(vec![0.1f64, 0.2, 0.3], &[3]));
    assert_eq!(values::<f64>(&s), vec![0.1 + 0.2 + 0.3]);
    // f32 sums accumulate in f64: 1e8 + 1 + ... + 1 - 1e8 keeps the ones (an f32 sum would not).
    let mut v = vec![1e8f32];
    v.extend(std::iter::repeat_n(1.0f32, 10));
    v.push(-1e8);
    let s = apply(reduce(ReduceOp::Sum, &[0]), tensor(v, &[12]));
    assert_eq!(values::<f32>(&s), vec![10.0]);
    // 4096 ones sum to 4096 in f16 (an f16 accumulator would stall at 2048).
    let s = apply(reduce(ReduceOp::Sum, &[0]), tensor(vec![f16::ONE; 4096], &[4096]));
    assert_eq!(values::<f16>(&s), vec![f16::from_f32(4096.0)]);
    let s = apply(reduce(ReduceOp::Sum, &[0]), tensor(vec![bf16::ONE; 300], &[300]));
    assert_eq!(values::<bf16>(&s), vec![bf16::from_f32(300.0)]);
    let m = apply(reduce(ReduceOp::Max, &[0]), tensor(vec![bf16::ONE, bf16::from_f32(-3.0)], &[2]));
    assert_eq!(values::<bf16>(&m), vec![bf16::ONE]);
}

#[test]
fn reduce_max_propagates_nan_and_empty_reductions_give_identities() {
    let m = apply(reduce(ReduceOp::Max, &[1]), tensor(vec![1.0f32, f32::NAN, 3.0, 4.0, 5.0, 6.0], &[2, 3]));
    let m = values::<f32>(&m);
    assert!(m[0].is_nan());
    assert_eq!(m[1], 6.0);
    let m = apply(reduce(ReduceOp::Max, &[0]), tensor(vec![f16::NAN, f16::ONE], &[2]));
    assert!(values::<f16>(&m)[0].is_nan());

    let empty = tensor(Vec::<f32>::new(), &[2, 0]);
    let s = apply(reduce(ReduceOp::Sum, &[1]), empty.clone());
    assert_eq!((values::<f32>(&s), s.shape), (vec![0.0, 0.0], vec![2, 1]));
    let m = apply(reduce(ReduceOp::Max, &[1]), empty.clone());
    assert_eq!(values::<f32>(&m), vec![f32::NEG_INFINITY; 2]);
    let s = apply(reduce(ReduceOp::Sum, &[0]), empty);
    assert_eq!((values::<f32>(&s), s.shape), (vec![], vec![1, 0]));
    let m = apply(reduce(ReduceOp::Max, &[0]), tensor(Vec::<i64>::new(), &[0]));
    assert_eq!(values::<i64>(&m), vec![i64::MIN]);
}

// ---------------------------------------------------------------------------------------------
// Movement.

#[test]
fn reshape_keeps_row_major_order() {
    let x = tensor(arange_f32(6), &[2, 3]);
    let y = apply(reshape(&[3, 2]), x.clone());
    assert_eq!((values::<f32>(&y), y.shape.clone()), (arange_f32(6), vec![3, 2]));
    assert!(std::sync::Arc::ptr_eq(&x.data, &y.data), "reshape shares the buffer");
    let z = apply(reshape(&[1, 6, 1]), x);
    assert_eq!(z.shape, vec![1, 6, 1]);
    let s = apply(reshape(&[]), tensor(vec![7i32], &[1, 1]));
    assert_eq!((values::<i32>(&s), s.shape), (vec![7], vec![]));
}

#[test]
fn permute_moves_axes() {
    let x = tensor(arange_f32(6), &[2, 3]);
    let t = apply(permute(&[1, 0]), x);
    assert_eq!((values::<f32>(&t), t.shape), (vec![0., 3., 1., 4., 2., 5.], vec![3, 2]));
    // [2, 3, 4] arange; out[i, j, k] = in[j, k, i] (output axis 0 is input axis 2, ...).
    let x = tensor((0..24).collect::<Vec<i32>>(), &[2, 3, 4]);
    let y = apply(permute(&[2, 0, 1]), x);
    assert_eq!(y.shape, vec![4, 2, 3]);
    let y = values::<i32>(&y);
    for i in 0..4 {
        for j in 0..2 {
            for k in 0..3 {
                assert_eq!(y[i * 6 + j * 3 + k], (j * 12 + k * 4 + i) as i32);
            }
        }
    }
    let e = apply(permute(&[2, 0, 1]), tensor(Vec::<bool>::new(), &[1, 0, 2]));
    assert_eq!(e.shape, vec![2, 1, 0]);
}

#[test]
fn expand_repeats_size_one_axes() {
    let x = tensor(vec![1i64, 2, 3], &[3, 1]);
    let y = apply(expand(&[3, 4]), x);
    assert_eq!(values::<i64>(&y), vec![1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
    let x = tensor(vec![1.0f64, 2.0], &[1, 2]);
    let y = apply(expand(&[3, 2]), x);
    assert_eq!(values::<f64>(&y), vec![1., 2., 1., 2., 1., 2.]);
    let y = apply(expand(&[0, 2]), tensor(vec![1.0f64, 2.0], &[1, 2]));
    assert_eq!((values::<f64>(&y), y.shape), (vec![], vec![0, 2]));
    let y = apply(expand(&[2, 2]), tensor(vec![true], &[1, 1]));
    assert_eq!(values::<bool>(&y), vec![true; 4]);
}

#[test]
fn pad_and_shrink() {
    let x = tensor(vec![1i32, 2, 3, 4], &[2, 2]);
    let p = apply(pad(&[(1, 0), (0, 2)], Scalar::Int(9)), x.clone());
    assert_eq!(p.shape, vec![3, 4]);
    #[rustfmt::skip]
    assert_eq!(values::<i32>(&p), vec![
        9, 9, 9, 9,
        1, 2, 9, 9,
        3, 4, 9, 9,
    ]);
    let s = apply(shrink(&[(1, 3), (0, 2)]), p);
    assert_eq!(s, x);
    let s = apply(shrink(&[(0, 2), (1, 2)]), x.clone());
    assert_eq!((values::<i32>(&s), s.shape), (vec![2, 4], vec![2, 1]));
    let s = apply(shrink(&[(1, 1), (0, 2)]), x);
    assert_eq!((values::<i32>(&s), s.shape), (vec![], vec![0, 2]));
    let p = apply(pad(&[(2, 1)], Scalar::Float(-0.5)), tensor(vec![f16::ONE], &[1]));
    let h = f16::from_f32(-0.5);
    assert_eq!(values::<f16>(&p), vec![h, h, f16::ONE, h]);
    let p = apply(pad(&[(1, 1)], Scalar::Bool(true)), tensor(Vec::<bool>::new(), &[0]));
    assert_eq!(values::<bool>(&p), vec![true, true]);
}

#[test]
fn movement_composed() {
    // x = [[0, 1, 2], [3, 4, 5]]
    // permute [1, 0] -> [[0, 3], [1, 4], [2, 5]]
    // reshape [2, 3] -> [[0, 3, 1], [4, 2, 5]]
    // shrink [(0, 2), (1, 3)] -> [[3, 1], [2, 5]]
    // pad [(0, 1), (1, 0)] with -1 -> [[-1, 3, 1], [-1, 2, 5], [-1, -1, -1]]
    let mut g = Graph::new();
    let x = input(&mut g, 0, DType::F32, shape_of(&[2, 3]));
    let p = g.add(permute(&[1, 0]), &[x]).unwrap();
    let r = g.add(reshape(&[2, 3]), &[p]).unwrap();
    let s = g.add(shrink(&[(0, 2), (1, 3)]), &[r]).unwrap();
    let d = g.add(pad(&[(0, 1), (1, 0)], Scalar::Float(-1.0)), &[s]).unwrap();
    g.add_output(d);
    g.add_output(s);
    let out = run(&g, &[tensor(arange_f32(6), &[2, 3])]);
    assert_eq!(out[0].shape, vec![3, 3]);
    assert_eq!(values::<f32>(&out[0]), vec![-1., 3., 1., -1., 2., 5., -1., -1., -1.]);
    assert_eq!((values::<f32>(&out[1]), out[1].shape.clone()), (vec![3., 1., 2., 5.], vec![2, 2]));
}

// ---------------------------------------------------------------------------------------------
// Graph-level behaviour: symbols, outputs, liveness, errors.

#[test]
fn symbolic_dims_use_bindings() {
    let seq = Dim::sym("seq");
    let dims = |d: &[Dim]| Shape::from_vec(d.to_vec());
    let (zero, two) = (Dim::Const(0), Dim::Const(2));
    let mut g = Graph::new();
    let x = input(&mut g, 0, DType::F32, dims(&[seq, two]));
    let column = TensorType::new(DType::F32, dims(&[seq, Dim::Const(1)]));
    let io = g.add_leaf(Op::Iota(Iota { axis: 0 }), column).unwrap();
    let ie = g.add(Op::Expand(Expand { shape: dims(&[seq, two]) }), &[io]).unwrap();
    let sum = g.add(Op::Binary(BinaryOp::Add), &[x, ie]).unwrap();
    // Pad seq - 1 rows after, keep the first 2*seq - 1 rows, then flatten to 4*seq - 2.
    let padding = vec![(zero, &seq - 1), (zero, zero)];
    let padded = g.add(Op::Pad(Pad { padding, value: Scalar::Float(7.0) }), &[sum]).unwrap();
    let ranges = vec![(zero, &(&seq * 2) - 1), (zero, two)];
    let kept = g.add(Op::Shrink(Shrink { ranges }), &[padded]).unwrap();
    let flat = g.add(Op::Reshape(Reshape { shape: dims(&[&(&seq * 4) - 2]) }), &[kept]).unwrap();
    g.add_output(flat);
    let x3 = tensor(vec![10.0f32, 20., 30., 40., 50., 60.], &[3, 2]);
    let out = eval(&g, &[x3], &bind(&[("seq", 3)])).unwrap();
    assert_eq!(out[0].shape, vec![10]);
    assert_eq!(values::<f32>(&out[0]), vec![10., 20., 31., 41., 52., 62., 7., 7., 7., 7.]);
    let out = eval(&g, &[tensor(vec![1.0f32, 2.], &[1, 2])], &bind(&[("seq", 1)])).unwrap();
    assert_eq!(values::<f32>(&out[0]), vec![1., 2.]);
}

#[test]
fn outputs_in_order_with_repeats_and_shared_values() {
    let mut g = Graph::new();
    let a = input(&mut g, 0, DType::I32, shape_of(&[2]));
    let b = g.add(Op::Unary(UnaryOp::Neg), &[a]).unwrap();
    let c = g.add(Op::Binary(BinaryOp::Mul), &[b, b]).unwrap();
    let d = g.add(Op::Binary(BinaryOp::Add), &[c, b]).unwrap();
    // A node the outputs do not need is never evaluated (its input slot is never read).
    let unused = input(&mut g, 5, DType::F32, shape_of(&[9]));
    let _dead = g.add(Op::Unary(UnaryOp::Sqrt), &[unused]).unwrap();
    g.add_output(d);
    g.add_output(b);
    g.add_output(d);
    g.add_output(a);
    let out = run(&g, &[tensor(vec![3i32, -4], &[2])]);
    assert_eq!(out.len(), 4);
    assert_eq!(values::<i32>(&out[0]), vec![6, 20]);
    assert_eq!(values::<i32>(&out[1]), vec![-3, 4]);
    assert_eq!(out[2], out[0]);
    assert_eq!(values::<i32>(&out[3]), vec![3, -4]);
    assert!(run(&Graph::new(), &[]).is_empty());
}

#[test]
fn long_chain_frees_as_it_goes() {
    // A chain of 2000 adds over 10k elements: correct, and intermediates are dropped as they die.
    let mut g = Graph::new();
    let x = input(&mut g, 0, DType::I64, shape_of(&[10_000]));
    let mut cur = x;
    for _ in 0..2000 {
        cur = g.add(Op::Binary(BinaryOp::Add), &[cur, x]).unwrap();
    }
    g.add_output(cur);
    let out = run(&g, &[tensor(vec![1i64; 10_000], &[10_000])]);
    assert_eq!(values::<i64>(&out[0]), vec![2001; 10_000]);
}

#[test]
fn input_type_mismatches_are_errors() {
    let seq = Dim::sym("seq");
    let mut g = Graph::new();
    let x = input(&mut g, 0, DType::F32, Shape::from_vec(vec![seq, Dim::Const(4)]));
    let y = input(&mut g, 1, DType::F32, shape_of(&[3, 4]));
    g.add_output(x);
    g.add_output(y);
    let good = || tensor(vec![0.0f32; 12], &[3, 4]);
    let seq3 = bind(&[("seq", 3)]);
    assert!(eval(&g, &[good(), good()], &seq3).is_ok());

    let msg = interp_error(eval(&g, &[tensor(vec![0.0f64; 12], &[3, 4]), good()], &seq3));
    assert!(msg.contains(&format!("{x}")) && msg.contains("f32[seq, 4]") && msg.contains("f64[3, 4]"), "{msg}");
    let msg = interp_error(eval(&g, &[tensor(vec![0.0f32; 15], &[3, 5]), good()], &seq3));
    assert!(msg.contains("f32[seq, 4] (= f32[3, 4])") && msg.contains("f32[3, 5]"), "{msg}");
    let msg = interp_error(eval(&g, &[good(), tensor(vec![0.0f32; 12], &[4, 3])], &seq3));
    assert!(msg.contains(&format!("{y}")) && msg.contains("f32[4, 3]"), "{msg}");
    let msg = interp_error(eval(&g, &[good()], &seq3));
    assert!(msg.contains("slot 1 is missing"), "{msg}");
    // A tensor whose data does not fill its shape (the fields are public) is caught too.
    let bad = HostTensor { data: std::sync::Arc::new(air::HostData::F32(vec![0.0; 5])), shape: vec![3, 4] };
    let msg = interp_error(eval(&g, &[bad, good()], &seq3));
    assert!(msg.contains("5 elements"), "{msg}");
}

#[test]
fn unbound_symbols_and_negative_dims_are_errors() {
    let mut g = Graph::new();
    let x = input(&mut g, 0, DType::F32, Shape::from_vec(vec![Dim::sym("seq")]));
    g.add_output(x);
    let msg = interp_error(eval(&g, &[tensor(vec![0.0f32; 3], &[3])], &Bindings::new()));
    assert!(msg.contains(&format!("{x}")) && msg.contains("`seq`") && msg.contains("f32[seq]"), "{msg}");

    let mut g = Graph::new();
    let shape = Shape::from_vec(vec![&Dim::sym("n") - 5]);
    let c = g.add_leaf(Op::Const(Const { value: Scalar::Int(1) }), TensorType::new(DType::I32, shape)).unwrap();
    g.add_output(c);
    let msg = interp_error(eval(&g, &[], &Bindings::new()));
    assert!(msg.contains("`n`") && msg.contains("const"), "{msg}");
    // A negative dim is a broken shape condition, reported before anything is evaluated.
    let e = eval(&g, &[], &bind(&[("n", 2)])).unwrap_err();
    assert_eq!(e.to_string(), "const: axis 0 of the result: size n - 5 = -3 < 0");
    assert_eq!(values::<i32>(&eval(&g, &[], &bind(&[("n", 7)])).unwrap()[0]), vec![1, 1]);
}

#[test]
fn absurd_sizes_are_errors_not_panics() {
    let n = Dim::sym("n");
    let big = bind(&[("n", 1 << 62)]);
    let mut g = Graph::new();
    let c = g
        .add_leaf(Op::Const(Const { value: Scalar::Int(0) }), TensorType::new(DType::I64, Shape::from_vec(vec![n, n])))
        .unwrap();
    g.add_output(c);
    assert!(interp_error(eval(&g, &[], &big)).contains("too many elements"));

    let mut g = Graph::new();
    let x = input(&mut g, 0, DType::F32, shape_of(&[1, 1]));
    let e = g.add(Op::Expand(Expand { shape: Shape::from_vec(vec![n, n]) }), &[x]).unwrap();
    g.add_output(e);
    assert!(interp_error(eval(&g, &[tensor(vec![1.0f32], &[1, 1])], &big)).contains("too many elements"));

    let mut g = Graph::new();
    let x = input(&mut g, 0, DType::F32, shape_of(&[1]));
    let padding = vec![(n, n)];
    let p = g.add(Op::Pad(Pad { padding, value: Scalar::Float(0.0) }), &[x]).unwrap();
    g.add_output(p);
    let huge = bind(&[("n", i64::MAX)]);
    // The size of the result (`2*n + 1`) overflows: the shape conditions cannot be checked.
    let e = eval(&g, &[tensor(vec![1.0f32], &[1])], &huge).unwrap_err();
    assert!(matches!(&e, AirError::Bounds(b) if b.op == "pad" && b.message.contains("overflow")), "{e}");

    // An input whose shape's element count overflows: `add_leaf` refuses it, as the verifier
    // does; added unchecked, the interpreter refuses it (the fields are public).
    let mut g = Graph::new();
    let overflowing = TensorType::new(DType::F32, shape_of(&[1 << 62, 8]));
    let refused = g.add_leaf(Op::Input(Input { slot: 0 }), overflowing.clone()).unwrap_err();
    assert!(refused.to_string().contains("input: the element count of shape"), "{refused}");
    let x =
        g.add_unchecked(air::Node { op: Op::Input(Input { slot: 0 }), inputs: Default::default(), ty: overflowing });
    g.add_output(x);
    let bad = HostTensor { data: std::sync::Arc::new(air::HostData::F32(vec![])), shape: vec![1 << 62, 8] };
    assert!(interp_error(eval(&g, &[bad], &Bindings::new())).contains("input slot 0"));
}

#[test]
fn ill_typed_unchecked_graphs_are_errors_not_panics() {
    use air::Node;
    let ty = |dtype: DType, shape: &[usize]| TensorType::new(dtype, shape_of(shape));
    let f32_4 = ty(DType::F32, &[4]);
    let cases: Vec<(Op, Vec<DType>, TensorType)> = vec![
        (Op::Binary(BinaryOp::Add), vec![DType::F32, DType::I32], f32_4.clone()),
        (Op::Binary(BinaryOp::Pow), vec![DType::I32, DType::I32], ty(DType::I32, &[4])),
        (Op::Binary(BinaryOp::And), vec![DType::F32, DType::F32], f32_4.clone()),
        (Op::Binary(BinaryOp::Sub), vec![DType::Bool, DType::Bool], ty(DType::Bool, &[4])),
        (Op::Unary(UnaryOp::Not), vec![DType::F32], f32_4.clone()),
        (Op::Unary(UnaryOp::Sqrt), vec![DType::I64], ty(DType::I64, &[4])),
        (Op::Unary(UnaryOp::Neg), vec![DType::Bool], ty(DType::Bool, &[4])),
        (Op::Unary(UnaryOp::Neg), vec![DType::F32], ty(DType::F32, &[5])),
        (Op::Where, vec![DType::F32, DType::F32, DType::F32], f32_4.clone()),
        (reduce(ReduceOp::Sum, &[1]), vec![DType::F32], f32_4.clone()),
        (reduce(ReduceOp::Sum, &[0]), vec![DType::Bool], ty(DType::Bool, &[1])),
        (reshape(&[5]), vec![DType::F32], ty(DType::F32, &[5])),
        (permute(&[0, 0]), vec![DType::F32], f32_4.clone()),
        (expand(&[4, 4]), vec![DType::F32], ty(DType::F32, &[4, 4])),
        (expand(&[8]), vec![DType::F32], ty(DType::F32, &[8])),
        (shrink(&[(2, 6)]), vec![DType::F32], f32_4.clone()),
        (shrink(&[(3, 1)]), vec![DType::F32], f32_4.clone()),
        (pad(&[(1, 1), (1, 1)], Scalar::Float(0.0)), vec![DType::F32], f32_4.clone()),
        (Op::Binary(BinaryOp::Add), vec![DType::F32], f32_4.clone()),
    ];
    for (op, dtypes, out_ty) in cases {
        let mut g = Graph::new();
        let mut ins = Vec::new();
        let mut data = Vec::new();
        for (slot, &dtype) in dtypes.iter().enumerate() {
            ins.push(input(&mut g, slot as u32, dtype, shape_of(&[4])));
            data.push(HostTensor::new(air::HostData::filled(dtype, 4, Scalar::Int(1)), vec![4]).unwrap());
        }
        let label = format!("{op:?}");
        let n = g.add_unchecked(Node { op, inputs: ins.into_iter().collect(), ty: out_ty });
        g.add_output(n);
        let msg = interp_error(eval(&g, &data, &Bindings::new()));
        assert!(msg.starts_with(&format!("{n} (")), "{label}: {msg}");
    }
    let mut g = Graph::new();
    let bad_iota = Node { op: Op::Iota(Iota { axis: 3 }), inputs: Default::default(), ty: f32_4 };
    let n = g.add_unchecked(bad_iota);
    g.add_output(n);
    assert!(interp_error(eval(&g, &[], &Bindings::new())).contains("axis 3"));
}

#[test]
fn a_million_elements_is_quick() {
    let n = 1 << 20;
    let mut g = Graph::new();
    let a = input(&mut g, 0, DType::F32, shape_of(&[1024, 1024]));
    let b = g.add(Op::Binary(BinaryOp::Mul), &[a, a]).unwrap();
    let c = g.add(permute(&[1, 0]), &[b]).unwrap();
    let d = g.add(reduce(ReduceOp::Sum, &[1]), &[c]).unwrap();
    g.add_output(d);
    let start = std::time::Instant::now();
    let out = run(&g, &[tensor(vec![2.0f32; n], &[1024, 1024])]);
    assert_eq!(values::<f32>(&out[0]), vec![4096.0; 1024]);
    // Generous: the point is linear-time index arithmetic, not a benchmark.
    assert!(start.elapsed().as_secs() < 20, "took {:?}", start.elapsed());
}

// ---------------------------------------------------------------------------------------------
// Property tests.

fn shapes(max_rank: usize, max_dim: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0..=max_dim, 0..=max_rank)
}

fn shape_and_perm() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    shapes(4, 4).prop_flat_map(|shape| {
        let rank = shape.len();
        (Just(shape), Just((0..rank).collect::<Vec<_>>()).prop_shuffle())
    })
}

fn numbered(shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    tensor((0..n as i32).collect(), shape)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn permute_then_inverse_is_identity((shape, perm) in shape_and_perm()) {
        let x = numbered(&shape);
        let mut inverse = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i;
        }
        let y = apply(permute(&perm), x.clone());
        let expected: Vec<usize> = perm.iter().map(|&a| shape[a]).collect();
        prop_assert_eq!(&y.shape, &expected);
        prop_assert_eq!(apply(permute(&inverse), y), x);
    }

    #[test]
    fn reshape_round_trips(shape in shapes(4, 4), split in 0usize..5) {
        let x = numbered(&shape);
        let n = x.numel();
        let flat = apply(reshape(&[n]), x.clone());
        prop_assert_eq!(values::<i32>(&flat), values::<i32>(&x));
        // Through a two-axis shape when `split` divides the count.
        let mid = if split > 0 && n.is_multiple_of(split) { vec![split, n / split] } else { vec![1, n] };
        let back = apply(reshape(&shape), apply(reshape(&mid), flat));
        prop_assert_eq!(back, x);
    }

    #[test]
    fn pad_then_shrink_is_identity(
        (shape, padding) in shapes(4, 3).prop_flat_map(|s| {
            let rank = s.len();
            (Just(s), prop::collection::vec((0i64..3, 0i64..3), rank))
        })
    ) {
        let x = numbered(&shape);
        let padded = apply(pad(&padding, Scalar::Int(-1)), x.clone());
        let ranges: Vec<(i64, i64)> =
            padding.iter().zip(&shape).map(|(&(before, _), &n)| (before, before + n as i64)).collect();
        let expected: Vec<usize> = padding.iter().zip(&shape).map(|(&(a, b), &n)| n + (a + b) as usize).collect();
        prop_assert_eq!(&padded.shape, &expected);
        let pad_count = values::<i32>(&padded).iter().filter(|&&v| v == -1).count();
        prop_assert_eq!(pad_count, padded.numel() - x.numel());
        prop_assert_eq!(apply(shrink(&ranges), padded), x);
    }

    #[test]
    fn sum_over_all_axes_is_the_plain_sum(
        (shape, data) in shapes(4, 5).prop_flat_map(|s| {
            let n: usize = s.iter().product();
            (Just(s), prop::collection::vec(-100.0f64..100.0, n))
        })
    ) {
        let axes: Vec<usize> = (0..shape.len()).collect();
        let out = apply(reduce(ReduceOp::Sum, &axes), tensor(data.clone(), &shape));
        prop_assert_eq!(&out.shape, &vec![1; shape.len()]);
        let expected: f64 = data.iter().sum();
        let got = values::<f64>(&out)[0];
        prop_assert!((got - expected).abs() <= 1e-9 * (1.0 + expected.abs()), "{} vs {}", got, expected);

        let as_f32: Vec<f32> = data.iter().map(|&v| v as f32).collect();
        let out = apply(reduce(ReduceOp::Sum, &axes), tensor(as_f32.clone(), &shape));
        let expected: f64 = as_f32.iter().map(|&v| v as f64).sum();
        prop_assert_eq!(values::<f32>(&out)[0], expected as f32);

        let max = apply(reduce(ReduceOp::Max, &axes), tensor(data.clone(), &shape));
        let expected = data.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        prop_assert_eq!(values::<f64>(&max)[0], expected);
    }

    #[test]
    fn float_elementwise_matches_scalar_rust(
        pairs in prop::collection::vec((-1e3f32..1e3, -1e3f32..1e3), 0..64)
    ) {
        let (a, b): (Vec<f32>, Vec<f32>) = pairs.into_iter().unzip();
        let check = |op: BinaryOp, f: fn(f32, f32) -> f32| {
            let got = binary::<f32, f32>(op, a.clone(), b.clone());
            for i in 0..a.len() {
                let want = f(a[i], b[i]);
                let same = got[i] == want || (got[i].is_nan() && want.is_nan());
                assert!(same, "{op:?} {} {}: {} vs {want}", a[i], b[i], got[i]);
            }
        };
        check(BinaryOp::Add, |x, y| x + y);
        check(BinaryOp::Sub, |x, y| x - y);
        check(BinaryOp::Mul, |x, y| x * y);
        check(BinaryOp::Div, |x, y| x / y);
        check(BinaryOp::Mod, |x, y| x % y);
        check(BinaryOp::Max, f32::max);
        check(BinaryOp::Min, f32::min);
        let lt = binary::<f32, bool>(BinaryOp::CmpLt, a.clone(), b.clone());
        prop_assert!(lt.iter().enumerate().all(|(i, &l)| l == (a[i] < b[i])));

        let sqrt = unary(UnaryOp::Sqrt, a.iter().map(|x| x.abs()).collect());
        prop_assert!(sqrt.iter().zip(&a).all(|(&s, &x)| s == x.abs().sqrt()));
        let exp2 = unary(UnaryOp::Exp2, a.iter().map(|x| x / 100.0).collect());
        for (&e, &x) in exp2.iter().zip(&a) {
            let want = (x / 100.0).exp2();
            prop_assert!((e - want).abs() <= 2e-7 * want, "exp2({}) = {} vs {}", x / 100.0, e, want);
        }
        let sin = unary(UnaryOp::Sin, a.clone());
        prop_assert!(sin.iter().zip(&a).all(|(&s, &x)| (s - x.sin()).abs() <= 1e-6));

        // f16: compute in f32, round once to storage.
        let h: Vec<f16> = a.iter().map(|&x| f16::from_f32(x)).collect();
        let k: Vec<f16> = b.iter().map(|&x| f16::from_f32(x)).collect();
        let got = binary::<f16, f16>(BinaryOp::Mul, h.clone(), k.clone());
        for i in 0..h.len() {
            prop_assert_eq!(got[i], f16::from_f32(h[i].to_f32() * k[i].to_f32()));
        }
    }

    #[test]
    fn int_elementwise_matches_scalar_rust(pairs in prop::collection::vec((any::<i32>(), -5i32..5), 0..64)) {
        // A zero divisor is an error (`integer_division_by_zero_is_an_error`); use 3 instead.
        let (a, b): (Vec<i32>, Vec<i32>) = pairs.into_iter().map(|(x, y)| (x, if y == 0 { 3 } else { y })).unzip();
        let check = |op: BinaryOp, f: fn(i64, i64) -> i64| {
            let got = binary::<i32, i32>(op, a.clone(), b.clone());
            for i in 0..a.len() {
                // Compute exactly in i64, then wrap to i32.
                let want = f(a[i] as i64, b[i] as i64) as i32;
                assert_eq!(got[i], want, "{:?} {} {}", op, a[i], b[i]);
            }
        };
        check(BinaryOp::Add, |x, y| x + y);
        check(BinaryOp::Sub, |x, y| x - y);
        check(BinaryOp::Mul, |x, y| x * y);
        check(BinaryOp::Div, |x, y| x / y);
        check(BinaryOp::Mod, |x, y| x % y);
        check(BinaryOp::Max, |x, y| x.max(y));
        check(BinaryOp::Min, |x, y| x.min(y));
        check(BinaryOp::And, |x, y| x & y);
        check(BinaryOp::Or, |x, y| x | y);
        let as_f32 = cast::<i32, f32>(a.clone());
        prop_assert!(as_f32.iter().zip(&a).all(|(&f, &i)| f == i as f32));
        let back = cast::<f32, i32>(as_f32.clone());
        prop_assert!(back.iter().zip(&as_f32).all(|(&i, &f)| i == f as i32));
    }
}
