//! The realize cache (`src/trace_cache.rs`): a lazy graph realized again with a structure seen
//! before runs the program loaded then, and only when the structure is really the same. Graphs
//! that differ in a constant, an operand's order, sharing, a dtype, a shape or a symbol's value
//! compute their own values (checked against plain Rust arithmetic, a reference that shares no
//! code with Kiln), and a proptest realizes many random expressions over two inputs, most of them
//! one small change away from another, on one thread (one cache).

use air::{DType, Dim, HostTensor};
use kiln::{Device, Tensor};
use proptest::prelude::*;

/// Held by the tests that count realize-cache hits and by the one that clears the CPU device's
/// caches: a clear on another test thread would turn a counted hit into a miss.
static HITS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`HITS`], whoever panicked while holding it.
fn hits_lock() -> std::sync::MutexGuard<'static, ()> {
    HITS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn x4() -> Tensor {
    Tensor::from_vec(vec![1.0f32, -2.0, 3.5, 0.25], &[4])
}

fn y4() -> Tensor {
    Tensor::from_vec(vec![0.5f32, 4.0, -1.0, 2.0], &[4])
}

#[test]
fn a_structure_realized_again_runs_the_kept_program_on_new_data() {
    let _hits = hits_lock();
    let f = |x: &Tensor, y: &Tensor| x.mul(3.0).sub(y).maximum(0.0);
    let hits = kiln::stats::realize_cache_hits();
    assert_eq!(f(&x4(), &y4()).to_vec::<f32>().unwrap(), vec![2.5, 0.0, 11.5, 0.0]);
    let runs = kiln::stats::cpu_runs();
    let other = Tensor::from_vec(vec![-1.0f32, 1.0, 2.0, 3.0], &[4]);
    assert_eq!(f(&other, &x4()).to_vec::<f32>().unwrap(), vec![0.0, 5.0, 2.5, 8.75]);
    assert_eq!(kiln::stats::realize_cache_hits(), hits + 1, "the second realize is a realize-cache hit");
    assert_eq!(kiln::stats::cpu_runs(), runs + 1, "and runs native code once");
}

#[test]
fn one_change_away_is_another_program() {
    let (x, y) = (x4(), y4());
    let xs = [1.0f32, -2.0, 3.5, 0.25];
    let ys = [0.5f32, 4.0, -1.0, 2.0];
    let map = |f: &dyn Fn(f32, f32) -> f32| xs.iter().zip(&ys).map(|(&a, &b)| f(a, b)).collect::<Vec<f32>>();
    // Each pair is built twice, so both members are realize-cache hits the second time round.
    for _ in 0..2 {
        // A constant.
        assert_eq!(x.add(1.0).to_vec::<f32>().unwrap(), map(&|a, _| a + 1.0));
        assert_eq!(x.add(2.0).to_vec::<f32>().unwrap(), map(&|a, _| a + 2.0));
        // The operands' order.
        assert_eq!(x.sub(&y).to_vec::<f32>().unwrap(), map(&|a, b| a - b));
        assert_eq!(y.sub(&x).to_vec::<f32>().unwrap(), map(&|a, b| b - a));
        // One input twice, or two inputs.
        assert_eq!(x.sub(x.neg()).to_vec::<f32>().unwrap(), map(&|a, _| a + a));
        assert_eq!(x.sub(y.neg()).to_vec::<f32>().unwrap(), map(&|a, b| a + b));
        // A shared subexpression, or two equal ones (the same values, other structures).
        let n = x.mul(&y);
        assert_eq!(n.add(&n).to_vec::<f32>().unwrap(), map(&|a, b| 2.0 * a * b));
        assert_eq!(x.mul(&y).add(x.mul(&y)).to_vec::<f32>().unwrap(), map(&|a, b| 2.0 * a * b));
        // The op.
        assert_eq!(x.mul(&y).to_vec::<f32>().unwrap(), map(&|a, b| a * b));
        assert_eq!(x.maximum(&y).to_vec::<f32>().unwrap(), map(&|a, b| a.max(b)));
        // The dtype.
        let xi = Tensor::from_vec(vec![1i32, -2, 3, 0], &[4]);
        assert_eq!(xi.add(1).to_vec::<i32>().unwrap(), vec![2, -1, 4, 1]);
        assert_eq!(xi.cast(DType::F32).add(1.0).to_vec::<f32>().unwrap(), vec![2.0, -1.0, 4.0, 1.0]);
        // The shape.
        let x2 = Tensor::from_vec(vec![1.0f32, -2.0, 3.5, 0.25], &[2, 2]);
        assert_eq!(x2.add(1.0).sum(1).to_vec::<f32>().unwrap(), vec![1.0, 5.75]);
        assert_eq!(x.add(1.0).sum(0).to_vec::<f32>().unwrap(), vec![6.75]);
    }
}

#[test]
fn a_symbol_bound_to_other_values_shares_the_program() {
    let _hits = hits_lock();
    let sym = |len: usize| {
        let data: Vec<f32> = (0..len).map(|i| i as f32).collect();
        Tensor::from_host_symbolic(HostTensor::from_vec(data, vec![len]).unwrap(), &[Dim::sym("n")])
    };
    let hits = kiln::stats::realize_cache_hits();
    for len in [3usize, 7, 1, 7] {
        let got = sym(len).mul(2.0).sum(0).to_vec::<f32>().unwrap();
        assert_eq!(got, vec![(len * (len - 1)) as f32], "n = {len}");
    }
    assert_eq!(kiln::stats::realize_cache_hits(), hits + 3, "one structure, four bindings");
}

#[test]
fn clearing_the_device_caches_clears_the_realize_cache() {
    let _hits = hits_lock();
    let f = || x4().mul(-7.5).add(0.125).to_vec::<f32>().unwrap();
    let want: Vec<f32> = [1.0f32, -2.0, 3.5, 0.25].iter().map(|a| a * -7.5 + 0.125).collect();
    assert_eq!(f(), want);
    kiln::backend::cpu_device().unwrap().clear_caches();
    let hits = kiln::stats::realize_cache_hits();
    assert_eq!(f(), want);
    assert_eq!(kiln::stats::realize_cache_hits(), hits, "after clear_caches the graph is traced and compiled");
    assert_eq!(f(), want);
    assert_eq!(kiln::stats::realize_cache_hits(), hits + 1);
}

#[test]
fn every_device_hits_with_its_own_values() {
    for device in [Device::Interp, Device::Cpu] {
        for scale in [2.0f32, 2.0, -1.0, -1.0] {
            let x = x4().to_device(device).unwrap();
            let got = x.mul(scale).neg().to_vec::<f32>().unwrap();
            let want: Vec<f32> = [1.0f32, -2.0, 3.5, 0.25].iter().map(|a| -(a * scale)).collect();
            assert_eq!(got, want, "on {device}, scale {scale}");
        }
    }
}

/// A small expression over inputs `x` and `y` (four elements each).
#[derive(Clone, Debug)]
enum Expr {
    X,
    Y,
    Const(f32),
    Neg(Box<Expr>),
    Add(Box<Expr>, Box<Expr>),
    Sub(Box<Expr>, Box<Expr>),
    Mul(Box<Expr>, Box<Expr>),
    Max(Box<Expr>, Box<Expr>),
}

fn expr() -> impl Strategy<Value = Expr> {
    // Few leaves, two constants: random expressions collide in structure often.
    let leaf = prop_oneof![Just(Expr::X), Just(Expr::Y), Just(Expr::Const(1.0)), Just(Expr::Const(2.0))];
    leaf.prop_recursive(3, 12, 2, |e| {
        prop_oneof![
            e.clone().prop_map(|a| Expr::Neg(Box::new(a))),
            (e.clone(), e.clone()).prop_map(|(a, b)| Expr::Add(Box::new(a), Box::new(b))),
            (e.clone(), e.clone()).prop_map(|(a, b)| Expr::Sub(Box::new(a), Box::new(b))),
            (e.clone(), e.clone()).prop_map(|(a, b)| Expr::Mul(Box::new(a), Box::new(b))),
            (e.clone(), e).prop_map(|(a, b)| Expr::Max(Box::new(a), Box::new(b))),
        ]
    })
}

impl Expr {
    fn build(&self, x: &Tensor, y: &Tensor) -> Tensor {
        match self {
            Expr::X => x.clone(),
            Expr::Y => y.clone(),
            Expr::Const(c) => x.mul(0.0).add(*c),
            Expr::Neg(a) => a.build(x, y).neg(),
            Expr::Add(a, b) => a.build(x, y).add(b.build(x, y)),
            Expr::Sub(a, b) => a.build(x, y).sub(b.build(x, y)),
            Expr::Mul(a, b) => a.build(x, y).mul(b.build(x, y)),
            Expr::Max(a, b) => a.build(x, y).maximum(b.build(x, y)),
        }
    }

    fn eval(&self, x: f32, y: f32) -> f32 {
        match self {
            Expr::X => x,
            Expr::Y => y,
            Expr::Const(c) => x * 0.0 + c,
            Expr::Neg(a) => -a.eval(x, y),
            Expr::Add(a, b) => a.eval(x, y) + b.eval(x, y),
            Expr::Sub(a, b) => a.eval(x, y) - b.eval(x, y),
            Expr::Mul(a, b) => a.eval(x, y) * b.eval(x, y),
            Expr::Max(a, b) => a.eval(x, y).max(b.eval(x, y)),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Each case realizes its expression and a few neighbours (its subexpressions and the same
    /// expression on swapped inputs), twice each, on the CPU: values always match the reference.
    #[test]
    fn random_expressions_realize_their_own_values(e in expr()) {
        let xs = [1.5f32, -2.0, 0.5, 3.0];
        let ys = [-0.5f32, 2.5, 1.0, -3.0];
        let (x, y) = (Tensor::from_vec(xs.to_vec(), &[4]), Tensor::from_vec(ys.to_vec(), &[4]));
        for _ in 0..2 {
            for (a, b, av, bv) in [(&x, &y, xs, ys), (&y, &x, ys, xs)] {
                let got = e.build(a, b).to_vec::<f32>().unwrap();
                let want: Vec<f32> = av.iter().zip(&bv).map(|(&p, &q)| e.eval(p, q)).collect();
                for (g, w) in got.iter().zip(&want) {
                    prop_assert!((g - w).abs() <= 1e-4 * w.abs().max(1.0), "{e:?}: {got:?} vs {want:?}");
                }
            }
        }
    }
}
