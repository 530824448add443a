//! Every tensor op against hand-computed values: small shapes, broadcasting, negative axes,
//! keepdim both ways, batched and 1-D matmul.

use kiln::prelude::*;

fn t(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape)
}

fn f32s(x: &Tensor) -> Vec<f32> {
    x.to_vec::<f32>().unwrap_or_else(|e| panic!("{e}"))
}

fn i64s(x: &Tensor) -> Vec<i64> {
    x.to_vec::<i64>().unwrap_or_else(|e| panic!("{e}"))
}

fn bools(x: &Tensor) -> Vec<bool> {
    x.to_vec::<bool>().unwrap_or_else(|e| panic!("{e}"))
}

#[track_caller]
fn close(got: &[f32], want: &[f32]) {
    air::testing::assert_close(&format!("got {got:?}, want {want:?}"), got, want, air::testing::Tol::both(1e-5));
}

#[track_caller]
fn close_map(x: &Tensor, input: &[f32], f: impl Fn(f64) -> f64) {
    let want: Vec<f32> = input.iter().map(|&v| f(v as f64) as f32).collect();
    close(&f32s(x), &want);
}

fn dims(x: &Tensor) -> Vec<usize> {
    x.dims().unwrap()
}

// ----- constructors -----

#[test]
fn from_vec_and_metadata() {
    let x = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], &[2, 3]);
    assert_eq!(x.dtype(), DType::I64);
    assert_eq!(dims(&x), vec![2, 3]);
    assert_eq!(x.ndim(), 2);
    assert_eq!(x.device(), Device::Cpu);
    assert!(x.is_realized());
    assert_eq!(i64s(&x), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(Tensor::scalar(2.5f32).item::<f32>().unwrap(), 2.5);
    assert_eq!(Tensor::scalar(true).dims().unwrap(), Vec::<usize>::new());
    let h = kiln::HostTensor::from_vec(vec![1i32, 2], vec![2]).unwrap();
    assert_eq!(Tensor::from_host(h).to_vec::<i32>().unwrap(), vec![1, 2]);
}

#[test]
fn zeros_ones_full() {
    assert_eq!(f32s(&Tensor::zeros(&[2, 2], DType::F32)), vec![0.0; 4]);
    assert_eq!(i64s(&Tensor::ones(&[3], DType::I64)), vec![1, 1, 1]);
    assert_eq!(bools(&Tensor::full(vec![2usize], true, DType::Bool)), vec![true, true]);
    assert_eq!(f32s(&Tensor::full(&[1, 2], 1.5, DType::F32)), vec![1.5, 1.5]);
    let x = t(&[1.0, 2.0], &[2]);
    assert_eq!(f32s(&x.full_like(7.0)), vec![7.0, 7.0]);
    assert_eq!(f32s(&x.zeros_like()), vec![0.0, 0.0]);
    assert_eq!(f32s(&x.ones_like()), vec![1.0, 1.0]);
    assert_eq!(f32s(&Tensor::zeros(&[0usize; 0], DType::F32)), vec![0.0]);
}

#[test]
fn arange_like_torch() {
    let a = Tensor::arange(0, 5, 1);
    assert_eq!(a.dtype(), DType::I64);
    assert_eq!(i64s(&a), vec![0, 1, 2, 3, 4]);
    assert_eq!(i64s(&Tensor::arange(2, 9, 3)), vec![2, 5, 8]);
    assert_eq!(i64s(&Tensor::arange(5, 0, -2)), vec![5, 3, 1]);
    assert_eq!(i64s(&Tensor::arange(3, 3, 1)), Vec::<i64>::new());
    let f = Tensor::arange(0.0, 1.0, 0.25);
    assert_eq!(f.dtype(), DType::F32);
    close(&f32s(&f), &[0.0, 0.25, 0.5, 0.75]);
    close(&f32s(&Tensor::arange(1, 2, 0.5)), &[1.0, 1.5]);
}

#[test]
fn random_is_seeded_and_in_range() {
    let a = f32s(&Tensor::rand_seeded(&[100], 7));
    let b = f32s(&Tensor::rand_seeded(&[100], 7));
    assert_eq!(a, b);
    assert!(a.iter().all(|&x| (0.0..1.0).contains(&x)));
    assert_ne!(a, f32s(&Tensor::rand_seeded(&[100], 8)));
    let n = f32s(&Tensor::randn_seeded(&[2000], 1));
    let mean = n.iter().sum::<f32>() / n.len() as f32;
    let var = n.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n.len() as f32;
    assert!(mean.abs() < 0.1 && (var - 1.0).abs() < 0.15, "mean {mean} var {var}");
    assert_eq!(Tensor::rand(&[2, 3]).dims().unwrap(), vec![2, 3]);
    assert_eq!(Tensor::randn(&[4]).dtype(), DType::F32);
}

#[test]
fn manual_seed_reproduces() {
    manual_seed(42);
    let a = f32s(&Tensor::randn(&[8]));
    manual_seed(42);
    let b = f32s(&Tensor::randn(&[8]));
    assert_eq!(a, b);
}

#[test]
fn each_thread_draws_from_its_own_generator() {
    let two_draws = || (f32s(&Tensor::randn(&[4])), f32s(&Tensor::randn(&[4])));
    manual_seed(9);
    let first = f32s(&Tensor::randn(&[4]));
    // Another thread's seed and draws between this thread's two draws leave its sequence alone.
    std::thread::spawn(|| {
        manual_seed(1);
        f32s(&Tensor::rand(&[64]))
    })
    .join()
    .unwrap();
    let second = f32s(&Tensor::randn(&[4]));
    let seeded_elsewhere = std::thread::spawn(move || {
        manual_seed(9);
        two_draws()
    });
    assert_eq!(seeded_elsewhere.join().unwrap(), (first, second));
    // Every thread starts from the same default seed.
    let fresh = [std::thread::spawn(two_draws), std::thread::spawn(two_draws)].map(|h| h.join().unwrap());
    assert_eq!(fresh[0], fresh[1]);
    manual_seed(9);
    assert_ne!(fresh[0], two_draws(), "the default seed is not 9");
}

// ----- element-wise binary -----

#[test]
fn arithmetic_broadcasts() {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let row = t(&[10.0, 20.0, 30.0], &[3]);
    let col = t(&[100.0, 200.0], &[2, 1]);
    assert_eq!(f32s(&(&a + &row)), vec![11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    assert_eq!(f32s(&(&a + &col)), vec![101.0, 102.0, 103.0, 204.0, 205.0, 206.0]);
    assert_eq!(f32s(&(&col - &row)), vec![90.0, 80.0, 70.0, 190.0, 180.0, 170.0]);
    assert_eq!(f32s(&(&a * &row)), vec![10.0, 40.0, 90.0, 40.0, 100.0, 180.0]);
    assert_eq!(f32s(&(&row / &a)), vec![10.0, 10.0, 10.0, 2.5, 4.0, 5.0]);
    assert_eq!(dims(&(&col + &row)), vec![2, 3]);
    // Owned operands and method spellings.
    assert_eq!(f32s(&(a.clone() + row.clone())), f32s(&a.add(&row)));
    assert_eq!(f32s(&a.sub(1.0)), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(f32s(&a.mul(&col)), vec![100.0, 200.0, 300.0, 800.0, 1000.0, 1200.0]);
    assert_eq!(f32s(&a.div(2.0)), vec![0.5, 1.0, 1.5, 2.0, 2.5, 3.0]);
}

#[test]
fn scalars_on_both_sides() {
    let x = t(&[1.0, 2.0, 4.0], &[3]);
    assert_eq!(f32s(&(&x + 2.0)), vec![3.0, 4.0, 6.0]);
    assert_eq!(f32s(&(2.0 + &x)), vec![3.0, 4.0, 6.0]);
    assert_eq!(f32s(&(10.0 - &x)), vec![9.0, 8.0, 6.0]);
    assert_eq!(f32s(&(&x - 1.0f32)), vec![0.0, 1.0, 3.0]);
    assert_eq!(f32s(&(3 * &x)), vec![3.0, 6.0, 12.0]);
    assert_eq!(f32s(&(8.0 / &x)), vec![8.0, 4.0, 2.0]);
    assert_eq!(f32s(&(x.clone() / 2)), vec![0.5, 1.0, 2.0]);
    assert_eq!(f32s(&-&x), vec![-1.0, -2.0, -4.0]);
    assert_eq!(f32s(&-x.clone()), vec![-1.0, -2.0, -4.0]);
    assert_eq!(f32s(&(1.0 - x)), vec![0.0, -1.0, -3.0]);
}

#[test]
fn dtype_promotion() {
    let i = Tensor::from_vec(vec![1i32, 2, 3], &[3]);
    let f = t(&[0.5, 0.5, 0.5], &[3]);
    let s = &i + &f;
    assert_eq!(s.dtype(), DType::F32);
    assert_eq!(f32s(&s), vec![1.5, 2.5, 3.5]);
    // Weak scalars: an int scalar keeps the tensor's dtype, a float scalar makes ints f32.
    assert_eq!((&i + 1).dtype(), DType::I32);
    assert_eq!((&i + 1).to_vec::<i32>().unwrap(), vec![2, 3, 4]);
    assert_eq!(f32s(&(&i * 0.5)), vec![0.5, 1.0, 1.5]);
    let l = Tensor::from_vec(vec![7i64, -7], &[2]);
    assert_eq!((&l + &i.narrow(0, 0, 2)).dtype(), DType::I64);
    // Integer division is true division, like torch.div.
    let q = &l / 2;
    assert_eq!(q.dtype(), DType::F32);
    assert_eq!(f32s(&q), vec![3.5, -3.5]);
    let h = Tensor::from_vec(vec![half::f16::from_f32(1.5)], &[1]);
    assert_eq!((&h * 2.0).dtype(), DType::F16);
    assert_eq!((&h * 2.0).to_vec::<half::f16>().unwrap(), vec![half::f16::from_f32(3.0)]);
}

#[test]
fn maximum_minimum_pow_mod() {
    let a = t(&[1.0, -2.0, 3.0, f32::NAN], &[4]);
    let b = t(&[0.0, 0.0, 5.0, 1.0], &[4]);
    close(&f32s(&a.maximum(&b)), &[1.0, 0.0, 5.0, f32::NAN]);
    close(&f32s(&a.minimum(&b)), &[0.0, -2.0, 3.0, f32::NAN]);
    close(&f32s(&a.maximum(0.5)), &[1.0, 0.5, 3.0, f32::NAN]);
    close(&f32s(&t(&[2.0, 3.0, 4.0], &[3]).pow(2.0)), &[4.0, 9.0, 16.0]);
    close(&f32s(&t(&[2.0, 9.0], &[2]).pow(t(&[3.0, 0.5], &[2]))), &[8.0, 3.0]);
    let p = Tensor::from_vec(vec![2i64, 3], &[2]).pow(2);
    assert_eq!(p.dtype(), DType::F32);
    close(&f32s(&p), &[4.0, 9.0]);
    let x = t(&[5.0, -5.0, 5.0, -5.0], &[4]);
    let y = t(&[3.0, 3.0, -3.0, -3.0], &[4]);
    close(&f32s(&x.fmod(&y)), &[2.0, -2.0, 2.0, -2.0]);
    close(&f32s(&x.remainder(&y)), &[2.0, 1.0, -1.0, -2.0]);
    let xi = Tensor::from_vec(vec![5i64, -5, 6], &[3]);
    assert_eq!(i64s(&xi.remainder(3)), vec![2, 1, 0]);
    assert_eq!(i64s(&xi.fmod(3)), vec![2, -2, 0]);
}

#[test]
fn comparisons() {
    let a = t(&[1.0, 2.0, 3.0, f32::NAN], &[4]);
    let b = t(&[2.0, 2.0, 2.0, 2.0], &[4]);
    assert_eq!(bools(&a.lt(&b)), vec![true, false, false, false]);
    assert_eq!(bools(&a.le(&b)), vec![true, true, false, false]);
    assert_eq!(bools(&a.gt(&b)), vec![false, false, true, false]);
    assert_eq!(bools(&a.ge(&b)), vec![false, true, true, false]);
    assert_eq!(bools(&a.eq(&b)), vec![false, true, false, false]);
    assert_eq!(bools(&a.ne(&b)), vec![true, false, true, true]);
    assert_eq!(bools(&a.gt(1.5)), vec![false, true, true, false]);
    let i = Tensor::from_vec(vec![1i64, 5], &[2]);
    assert_eq!(bools(&i.ge(5)), vec![false, true]);
    let m = Tensor::from_vec(vec![true, false], &[2]);
    assert_eq!(bools(&m.lt(true)), vec![false, true]);
    assert_eq!(bools(&m.logical_not()), vec![false, true]);
    assert_eq!(bools(&m.logical_and(true)), vec![true, false]);
    assert_eq!(bools(&m.logical_or(Tensor::from_vec(vec![false, true], &[2]))), vec![true, true]);
    assert_eq!(bools(&i.logical_not()), vec![false, false]);
}

#[test]
fn where_selects_and_broadcasts() {
    let c = Tensor::from_vec(vec![true, false, true], &[3]);
    let a = t(&[1.0, 2.0, 3.0], &[3]);
    let b = t(&[-1.0, -2.0], &[2, 1]);
    let w = c.where_cond(&a, &b);
    assert_eq!(dims(&w), vec![2, 3]);
    assert_eq!(f32s(&w), vec![1.0, -1.0, 3.0, 1.0, -2.0, 3.0]);
    assert_eq!(f32s(&where_cond(&c, &a, 0.0)), vec![1.0, 0.0, 3.0]);
    assert_eq!(f32s(&c.where_cond(9.0, &a)), vec![9.0, 2.0, 9.0]);
    let both = c.where_cond(1, 0);
    assert_eq!(both.dtype(), DType::I64);
    assert_eq!(i64s(&both), vec![1, 0, 1]);
    let mixed = c.where_cond(Tensor::from_vec(vec![1i32, 2, 3], &[3]), 0.5);
    assert_eq!(mixed.dtype(), DType::F32);
    assert_eq!(f32s(&mixed), vec![1.0, 0.5, 3.0]);
}

// ----- element-wise unary -----

const XS: [f32; 6] = [-3.0, -1.0, -0.5, 0.0, 0.5, 2.0];

fn xs() -> Tensor {
    t(&XS, &[2, 3])
}

#[test]
fn exp_log_sqrt_trig() {
    close_map(&xs().exp(), &XS, f64::exp);
    close_map(&xs().exp2(), &XS, f64::exp2);
    let pos = [0.25f32, 1.0, 2.0, 10.0];
    close_map(&t(&pos, &[4]).log(), &pos, f64::ln);
    close_map(&t(&pos, &[4]).log2(), &pos, f64::log2);
    close_map(&t(&pos, &[4]).sqrt(), &pos, f64::sqrt);
    close_map(&t(&pos, &[4]).rsqrt(), &pos, |x| 1.0 / x.sqrt());
    close_map(&t(&pos, &[4]).reciprocal(), &pos, |x| 1.0 / x);
    close_map(&xs().sin(), &XS, f64::sin);
    close_map(&xs().cos(), &XS, f64::cos);
    close_map(&xs().square(), &XS, |x| x * x);
    close(&f32s(&t(&[0.0, 0.5, 1.0, -2.0], &[4]).erf()), &[0.0, 0.520_499_9, 0.842_700_8, -0.995_322_3]);
    // Integer inputs are computed as f32.
    let e = Tensor::from_vec(vec![0i64, 1], &[2]).exp();
    assert_eq!(e.dtype(), DType::F32);
    close(&f32s(&e), &[1.0, std::f32::consts::E]);
}

#[test]
fn rounding_and_abs() {
    let v = [-2.5f32, -1.0, -0.25, 0.0, 0.75, 3.5];
    close_map(&t(&v, &[6]).trunc(), &v, f64::trunc);
    close_map(&t(&v, &[6]).floor(), &v, f64::floor);
    close_map(&t(&v, &[6]).ceil(), &v, f64::ceil);
    close_map(&t(&v, &[6]).abs(), &v, f64::abs);
    assert_eq!(i64s(&Tensor::from_vec(vec![-3i64, 0, 4], &[3]).abs()), vec![3, 0, 4]);
    close(&f32s(&t(&v, &[6]).clamp(-1.0, 1.0)), &[-1.0, -1.0, -0.25, 0.0, 0.75, 1.0]);
    close(&f32s(&t(&v, &[6]).clamp_min(0.0)), &[0.0, 0.0, 0.0, 0.0, 0.75, 3.5]);
    close(&f32s(&t(&v, &[6]).clamp_max(0.0)), &[-2.5, -1.0, -0.25, 0.0, 0.0, 0.0]);
}

#[test]
fn activations() {
    close_map(&xs().tanh(), &XS, f64::tanh);
    close_map(&xs().sigmoid(), &XS, |x| 1.0 / (1.0 + (-x).exp()));
    close_map(&xs().relu(), &XS, |x| x.max(0.0));
    close_map(&xs().silu(), &XS, |x| x / (1.0 + (-x).exp()));
    // GELU reference values from PyTorch (exact and tanh forms).
    let g = [-0.004_049_7f32, -0.158_655_3, -0.154_268_8, 0.0, 0.345_731_2, 1.954_5];
    close(&f32s(&xs().gelu()), &g);
    let gt = [-0.003_637_4f32, -0.158_808, -0.154_285_6, 0.0, 0.345_714_4, 1.954_597_7];
    close(&f32s(&xs().gelu_tanh()), &gt);
    close(&f32s(&xs().gelu_with(GeluApprox::Tanh)), &gt);
    // Saturation without NaN or inf.
    let big = t(&[-1000.0, -88.0, 88.0, 1000.0], &[4]);
    close(&f32s(&big.tanh()), &[-1.0, -1.0, 1.0, 1.0]);
    close(&f32s(&big.sigmoid()), &[0.0, 0.0, 1.0, 1.0]);
    close(&f32s(&big.silu()), &[-0.0, -0.0, 88.0, 1000.0]);
    close(&f32s(&t(&[f32::NAN], &[1]).relu()), &[f32::NAN]);
    assert_eq!(i64s(&Tensor::from_vec(vec![-2i64, 3], &[2]).relu()), vec![0, 3]);
}

#[test]
fn casts() {
    let x = t(&[-1.7, 0.0, 2.9], &[3]);
    assert_eq!(x.cast(DType::I32).to_vec::<i32>().unwrap(), vec![-1, 0, 2]);
    assert_eq!(bools(&x.to_dtype(DType::Bool)), vec![true, false, true]);
    assert_eq!(x.cast(DType::F64).to_vec::<f64>().unwrap(), vec![-1.7f32 as f64, 0.0, 2.9f32 as f64]);
    assert!(Tensor::ptr_eq(&x.cast(DType::F32), &x));
}

// ----- reductions -----

fn m23() -> Tensor {
    t(&[1.0, 5.0, 3.0, 4.0, 2.0, 6.0], &[2, 3])
}

#[test]
fn sum_over_axes() {
    let x = m23();
    let s = x.sum_keepdim(&[1]);
    assert_eq!(dims(&s), vec![2, 1]);
    assert_eq!(f32s(&s), vec![9.0, 12.0]);
    let s = x.sum(&[1]);
    assert_eq!(dims(&s), vec![2]);
    assert_eq!(f32s(&x.sum(-1)), vec![9.0, 12.0]);
    assert_eq!(f32s(&x.sum(&[0])), vec![5.0, 7.0, 9.0]);
    assert_eq!(dims(&x.sum_keepdim(0)), vec![1, 3]);
    let all = x.sum(&[0, -1]);
    assert_eq!(dims(&all), Vec::<usize>::new());
    assert_eq!(all.item::<f32>().unwrap(), 21.0);
    assert_eq!(x.sum_all().item::<f32>().unwrap(), 21.0);
    assert_eq!(dims(&x.sum_keepdim(&[1, 0])), vec![1, 1]);
    let i = Tensor::from_vec(vec![1i32, 2, 3], &[3]);
    assert_eq!(i.sum_all().dtype(), DType::I64);
    assert_eq!(i.sum_all().item::<i64>().unwrap(), 6);
    let b = Tensor::from_vec(vec![true, true, false], &[3]);
    assert_eq!(b.sum_all().item::<i64>().unwrap(), 2);
}

#[test]
fn max_min_mean() {
    let x = m23();
    assert_eq!(f32s(&x.max(&[1])), vec![5.0, 6.0]);
    assert_eq!(f32s(&x.max_keepdim(&[0])), vec![4.0, 5.0, 6.0]);
    assert_eq!(dims(&x.max_keepdim(&[0])), vec![1, 3]);
    assert_eq!(f32s(&x.min_keepdim(-1)), vec![1.0, 2.0]);
    assert_eq!(dims(&x.min_keepdim(-1)), vec![2, 1]);
    assert_eq!(f32s(&x.min(&[0])), vec![1.0, 2.0, 3.0]);
    assert_eq!(x.max_all().item::<f32>().unwrap(), 6.0);
    assert_eq!(x.min_all().item::<f32>().unwrap(), 1.0);
    close(&f32s(&x.mean(&[1])), &[3.0, 4.0]);
    close(&f32s(&x.mean_keepdim(&[0])), &[2.5, 3.5, 4.5]);
    close(&[x.mean_all().item::<f32>().unwrap()], &[3.5]);
    let i = Tensor::from_vec(vec![i64::MIN, 0, i64::MAX, -5], &[2, 2]);
    assert_eq!(i64s(&i.min(&[1])), vec![i64::MIN, -5]);
    assert_eq!(i64s(&i.max(&[1])), vec![0, i64::MAX]);
    let m = Tensor::from_vec(vec![1i32, 2], &[2]).mean_all();
    assert_eq!(m.dtype(), DType::F32);
    assert_eq!(m.item::<f32>().unwrap(), 1.5);
    let b = Tensor::from_vec(vec![true, false, false, false], &[2, 2]);
    assert_eq!(bools(&b.max(&[1])), vec![true, false]);
    assert_eq!(bools(&b.min(&[0])), vec![false, false]);
}

#[test]
fn softmax_family() {
    let x = t(&[1.0, 2.0, 3.0, 1000.0, 1000.0, 1000.0], &[2, 3]);
    let e = [1f64.exp(), 2f64.exp(), 3f64.exp()];
    let z: f64 = e.iter().sum();
    let third = 1.0 / 3.0;
    let want = [e[0] / z, e[1] / z, e[2] / z, third, third, third].map(|v| v as f32);
    close(&f32s(&x.softmax(-1)), &want);
    close(&f32s(&x.softmax(1)), &want);
    let logs = want.map(|v| (v as f64).ln() as f32);
    close(&f32s(&x.log_softmax(-1)), &logs);
    let col = x.softmax(0);
    assert_eq!(dims(&col), vec![2, 3]);
    close(&f32s(&col), &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    let lse = x.logsumexp(&[1]);
    close(&f32s(&lse), &[z.ln() as f32, (1000.0 + 3f64.ln()) as f32]);
    assert_eq!(dims(&x.logsumexp_keepdim(&[1])), vec![2, 1]);
    let inf = t(&[f32::NEG_INFINITY, f32::NEG_INFINITY], &[2]);
    close(&f32s(&inf.logsumexp(0)), &[f32::NEG_INFINITY]);
}

#[test]
fn argmax_argmin_first_occurrence() {
    let x = t(&[1.0, 3.0, 3.0, 2.0, 0.0, 0.0, 0.0, 5.0], &[2, 4]);
    let a = x.argmax(-1);
    assert_eq!(a.dtype(), DType::I64);
    assert_eq!(i64s(&a), vec![1, 3]);
    assert_eq!(dims(&x.argmax_keepdim(1)), vec![2, 1]);
    assert_eq!(i64s(&x.argmax(0)), vec![0, 0, 0, 1]);
    assert_eq!(i64s(&x.argmin(1)), vec![0, 0]);
    assert_eq!(i64s(&x.argmin_keepdim(0)), vec![1, 1, 1, 0]);
    assert_eq!(x.argmax_all().item::<i64>().unwrap(), 7);
    assert_eq!(x.argmin_all().item::<i64>().unwrap(), 4);
    let nan = t(&[1.0, f32::NAN, 7.0, f32::NAN], &[4]);
    assert_eq!(nan.argmax(0).item::<i64>().unwrap(), 1);
    let ints = Tensor::from_vec(vec![4i32, 9, 9], &[3]);
    assert_eq!(ints.argmax(0).item::<i64>().unwrap(), 1);
}

// ----- matmul -----

#[test]
fn matmul_2d() {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = t(&[7.0, 8.0, 9.0, 10.0, 11.0, 12.0], &[3, 2]);
    let c = a.matmul(&b);
    assert_eq!(dims(&c), vec![2, 2]);
    assert_eq!(f32s(&c), vec![58.0, 64.0, 139.0, 154.0]);
    let col = t(&[1.0, 1.0], &[2, 1]);
    assert_eq!(f32s(&a.transpose(0, 1).matmul(&col)), vec![5.0, 7.0, 9.0]);
}

#[test]
fn matmul_batched_and_broadcast() {
    // [2, 2, 3] @ [2, 3, 1]
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0], &[2, 2, 3]);
    let b = t(&[1.0, 1.0, 1.0, 2.0, 3.0, 4.0], &[2, 3, 1]);
    let c = a.matmul(&b);
    assert_eq!(dims(&c), vec![2, 2, 1]);
    assert_eq!(f32s(&c), vec![6.0, 15.0, 2.0, 3.0]);
    // [2, 2, 3] @ [3, 2]: the right operand broadcasts over the batch.
    let w = t(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]);
    let d = a.matmul(&w);
    assert_eq!(dims(&d), vec![2, 2, 2]);
    assert_eq!(f32s(&d), vec![4.0, 5.0, 10.0, 11.0, 1.0, 0.0, 0.0, 1.0]);
    // [3, 1, 2, 2] @ [2, 2, 1]: batch dims [3, 1] and [2] broadcast to [3, 2].
    let l = Tensor::arange(0, 12, 1).cast(DType::F32).reshape(&[3, 1, 2, 2]);
    let r = t(&[1.0, 0.0, 0.0, 1.0], &[2, 2, 1]);
    let o = l.matmul(&r);
    assert_eq!(dims(&o), vec![3, 2, 2, 1]);
    assert_eq!(f32s(&o), vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0, 8.0, 10.0, 9.0, 11.0]);
    // Mixed dtypes promote.
    let ia = Tensor::from_vec(vec![1i64, 2], &[1, 2]);
    let fb = t(&[0.5, 0.25], &[2, 1]);
    assert_eq!(f32s(&ia.matmul(&fb)), vec![1.0]);
    let ib = Tensor::from_vec(vec![3i64, 4], &[2, 1]);
    assert_eq!(i64s(&ia.matmul(&ib)), vec![11]);
}

#[test]
fn matmul_one_dimensional() {
    let v = t(&[1.0, 2.0, 3.0], &[3]);
    let m = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    let vm = v.matmul(&m);
    assert_eq!(dims(&vm), vec![2]);
    assert_eq!(f32s(&vm), vec![22.0, 28.0]);
    let mt = m.transpose(0, 1);
    let mv = mt.matmul(&v);
    assert_eq!(dims(&mv), vec![2]);
    assert_eq!(f32s(&mv), vec![22.0, 28.0]);
    let dot = v.matmul(&v);
    assert_eq!(dims(&dot), Vec::<usize>::new());
    assert_eq!(dot.item::<f32>().unwrap(), 14.0);
    // Batched matrix @ vector: [2, 2, 3] @ [3] -> [2, 2].
    let b = Tensor::arange(0, 12, 1).cast(DType::F32).reshape(&[2, 2, 3]);
    let bv = b.matmul(&v);
    assert_eq!(dims(&bv), vec![2, 2]);
    assert_eq!(f32s(&bv), vec![8.0, 26.0, 44.0, 62.0]);
    // Vector @ batched matrix: [3] @ [2, 3, 2] -> [2, 2].
    let c = Tensor::arange(0, 12, 1).cast(DType::F32).reshape(&[2, 3, 2]);
    let vb = v.matmul(&c);
    assert_eq!(dims(&vb), vec![2, 2]);
    assert_eq!(f32s(&vb), vec![16.0, 22.0, 52.0, 58.0]);
}

#[test]
fn matmul_builds_the_canonical_pattern() {
    let a = t(&[0.0; 6], &[2, 3]);
    let b = t(&[0.0; 12], &[3, 4]);
    let text = a.matmul(&b).graph_text().unwrap();
    let ops: Vec<&str> =
        text.lines().filter_map(|l| l.split('=').nth(1)).filter_map(|rhs| rhs.split_whitespace().next()).collect();
    assert_eq!(
        ops,
        vec!["input", "reshape", "expand", "input", "permute", "reshape", "expand", "mul", "reduce", "reshape"],
        "{text}"
    );
    assert!(text.contains("[2, 4, 3]"), "{text}");
    // An N of 1 keeps the (no-op) expand so the pattern has one shape.
    let v = t(&[0.0; 3], &[3, 1]);
    let text = a.matmul(&v).graph_text().unwrap();
    assert_eq!(text.matches("expand").count(), 2, "{text}");
}

// ----- movement -----

#[test]
fn reshape_permute_transpose() {
    let x = Tensor::arange(0, 6, 1);
    let r = x.reshape(&[2, -1]);
    assert_eq!(dims(&r), vec![2, 3]);
    assert_eq!(dims(&x.reshape(&[-1, 1])), vec![6, 1]);
    assert_eq!(i64s(&r.transpose(0, 1)), vec![0, 3, 1, 4, 2, 5]);
    assert_eq!(i64s(&r.transpose(-1, -2)), vec![0, 3, 1, 4, 2, 5]);
    let c = Tensor::arange(0, 24, 1).reshape(&[2, 3, 4]);
    let p = c.permute(&[2, 0, 1]);
    assert_eq!(dims(&p), vec![4, 2, 3]);
    assert_eq!(i64s(&p.narrow(0, 1, 1)), vec![1, 5, 9, 13, 17, 21]);
    assert_eq!(dims(&c.permute(&[-1, -3, -2])), vec![4, 2, 3]);
    assert!(Tensor::ptr_eq(&c.permute(&[0, 1, 2]), &c));
    assert!(Tensor::ptr_eq(&c.reshape(&[2, 3, 4]), &c));
    assert_eq!(i64s(&c.contiguous()), i64s(&c.detach()));
}

#[test]
fn expand_squeeze_unsqueeze_flatten() {
    let x = t(&[1.0, 2.0], &[2, 1]);
    let e = x.expand(&[3, 2, 3]);
    assert_eq!(dims(&e), vec![3, 2, 3]);
    assert_eq!(f32s(&e), [1.0, 1.0, 1.0, 2.0, 2.0, 2.0].repeat(3));
    assert_eq!(dims(&x.expand(&[-1, 4])), vec![2, 4]);
    assert_eq!(dims(&x.broadcast_to(&[2, 2])), vec![2, 2]);
    assert_eq!(dims(&x.squeeze(1)), vec![2]);
    assert_eq!(dims(&x.squeeze(-1)), vec![2]);
    assert_eq!(dims(&x.squeeze(0)), vec![2, 1]);
    let y = t(&[1.0, 2.0], &[1, 2, 1]);
    assert_eq!(dims(&y.squeeze_all()), vec![2]);
    assert_eq!(dims(&y.unsqueeze(0)), vec![1, 1, 2, 1]);
    assert_eq!(dims(&y.unsqueeze(-1)), vec![1, 2, 1, 1]);
    assert_eq!(dims(&y.unsqueeze(2)), vec![1, 2, 1, 1]);
    let z = Tensor::arange(0, 24, 1).reshape(&[2, 3, 4]);
    assert_eq!(dims(&z.flatten(0, -1)), vec![24]);
    assert_eq!(dims(&z.flatten(1, 2)), vec![2, 12]);
    assert_eq!(dims(&z.flatten(0, 1)), vec![6, 4]);
    assert_eq!(dims(&Tensor::scalar(1.0f32).flatten(0, -1)), vec![1]);
}

#[test]
fn narrow_slice_pad() {
    let x = Tensor::arange(0, 12, 1).reshape(&[3, 4]);
    assert_eq!(i64s(&x.narrow(0, 1, 2)), vec![4, 5, 6, 7, 8, 9, 10, 11]);
    assert_eq!(i64s(&x.narrow(-1, 2, 2)), vec![2, 3, 6, 7, 10, 11]);
    assert_eq!(i64s(&x.slice(1, 1, 3)), vec![1, 2, 5, 6, 9, 10]);
    assert_eq!(i64s(&x.slice(1, -1, 100)), vec![3, 7, 11]);
    assert_eq!(i64s(&x.slice(0, -2, -1)), vec![4, 5, 6, 7]);
    assert_eq!(dims(&x.slice(0, 2, 1)), vec![0, 4]);
    let p = t(&[1.0, 2.0], &[1, 2]).pad(&[(1, 0), (0, 2)], 9.0);
    assert_eq!(dims(&p), vec![2, 4]);
    assert_eq!(f32s(&p), vec![9.0, 9.0, 9.0, 9.0, 1.0, 2.0, 9.0, 9.0]);
    let q = Tensor::from_vec(vec![1i64], &[1]).pad(&[(2, 1)], 0);
    assert_eq!(i64s(&q), vec![0, 0, 1, 0]);
}

// ----- joining and indexing -----

#[test]
fn cat_and_stack() {
    let a = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let b = t(&[5.0, 6.0], &[2, 1]);
    let c = t(&[7.0, 8.0, 9.0, 10.0, 11.0, 12.0], &[2, 3]);
    let k = Tensor::cat(&[&a, &b, &c], 1);
    assert_eq!(dims(&k), vec![2, 6]);
    assert_eq!(f32s(&k), vec![1.0, 2.0, 5.0, 7.0, 8.0, 9.0, 3.0, 4.0, 6.0, 10.0, 11.0, 12.0]);
    assert_eq!(f32s(&cat(&[&a, &b], -1)), vec![1.0, 2.0, 5.0, 3.0, 4.0, 6.0]);
    let r = cat(&[&a, &a.mul(10.0)], 0);
    assert_eq!(dims(&r), vec![4, 2]);
    assert_eq!(f32s(&r), vec![1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0]);
    assert_eq!(f32s(&cat(&[&a], 0)), f32s(&a));
    let m = cat(&[&Tensor::from_vec(vec![true], &[1]), &Tensor::from_vec(vec![false, true], &[2])], 0);
    assert_eq!(bools(&m), vec![true, false, true]);
    let p = cat(&[&Tensor::from_vec(vec![1i64], &[1]), &t(&[0.5], &[1])], 0);
    assert_eq!(f32s(&p), vec![1.0, 0.5]);

    let s = Tensor::stack(&[&a, &a.add(4.0)], 0);
    assert_eq!(dims(&s), vec![2, 2, 2]);
    assert_eq!(f32s(&s), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let s = stack(&[&a, &a.add(4.0)], -1);
    assert_eq!(dims(&s), vec![2, 2, 2]);
    assert_eq!(f32s(&s), vec![1.0, 5.0, 2.0, 6.0, 3.0, 7.0, 4.0, 8.0]);
    assert_eq!(dims(&stack(&[&a, &a, &a], 1)), vec![2, 3, 2]);
}

#[test]
fn gather_like_torch() {
    let x = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let i = Tensor::from_vec(vec![2i64, 0, 1, 1], &[2, 2]);
    let g = x.gather(1, &i);
    assert_eq!(dims(&g), vec![2, 2]);
    assert_eq!(f32s(&g), vec![3.0, 1.0, 5.0, 5.0]);
    assert_eq!(f32s(&x.gather(-1, &i)), vec![3.0, 1.0, 5.0, 5.0]);
    let j = Tensor::from_vec(vec![1i64, 0, 1], &[1, 3]);
    assert_eq!(f32s(&x.gather(0, &j)), vec![4.0, 2.0, 6.0]);
    let k = Tensor::from_vec(vec![1i32, 1, 0, 0], &[2, 2]);
    assert_eq!(f32s(&x.gather(0, &k)), vec![4.0, 5.0, 1.0, 2.0]);
    let v = Tensor::from_vec(vec![10i64, 20, 30], &[3]);
    assert_eq!(i64s(&v.gather(0, &Tensor::from_vec(vec![2i64, 2, 0], &[3]))), vec![30, 30, 10]);
    // Rank 3, gather along the middle axis.
    let c = Tensor::arange(0, 12, 1).reshape(&[2, 3, 2]);
    let ci = Tensor::from_vec(vec![2i64, 0, 1, 1], &[2, 1, 2]);
    assert_eq!(i64s(&c.gather(1, &ci)), vec![4, 1, 8, 9]);
}

#[test]
fn index_select_rows() {
    let table = t(&[0.0, 0.5, 1.0, 1.5, 2.0, 2.5], &[3, 2]);
    let ids = Tensor::from_vec(vec![2i64, 0, 2, 1], &[4]);
    let e = table.index_select(0, &ids);
    assert_eq!(dims(&e), vec![4, 2]);
    assert_eq!(f32s(&e), vec![2.0, 2.5, 0.0, 0.5, 2.0, 2.5, 1.0, 1.5]);
    let cols = table.index_select(-1, &Tensor::from_vec(vec![1i64, 1, 0], &[3]));
    assert_eq!(dims(&cols), vec![3, 3]);
    assert_eq!(f32s(&cols), vec![0.5, 0.5, 0.0, 1.5, 1.5, 1.0, 2.5, 2.5, 2.0]);
    let flags = Tensor::from_vec(vec![true, false], &[2]);
    assert_eq!(bools(&flags.index_select(0, &Tensor::from_vec(vec![1i64, 0], &[2]))), vec![false, true]);
}

#[test]
fn composite_pipeline() {
    // A tiny attention-like block: softmax(q k^T / sqrt(d)) v.
    let q = t(&[1.0, 0.0, 0.0, 1.0], &[2, 2]);
    let k = t(&[1.0, 0.0, 0.0, 1.0], &[2, 2]);
    let v = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let scores = q.matmul(&k.transpose(0, 1)) / 2f32.sqrt();
    let out = scores.softmax(-1).matmul(&v);
    let s = 1.0 / (1.0 + (-(1.0f64 / 2f64.sqrt())).exp());
    let want = [s + 3.0 * (1.0 - s), 2.0 * s + 4.0 * (1.0 - s), (1.0 - s) + 3.0 * s, 2.0 * (1.0 - s) + 4.0 * s];
    close(&f32s(&out), &want.map(|x| x as f32));
}

#[test]
fn one_hot_marks_each_index() {
    let ids = Tensor::from_vec(vec![2i64, 0, 5, 1], &[2, 2]);
    let hot = ids.one_hot(3);
    assert_eq!(hot.dims().unwrap(), vec![2, 2, 3]);
    // Index 5 is out of range: an all-zero row.
    assert_eq!(hot.to_vec::<i64>().unwrap(), vec![0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0]);
    let err = Tensor::from_vec(vec![1.0f32], &[1]).one_hot(3).to_vec::<i64>().unwrap_err();
    assert!(err.to_string().contains("one_hot: indices must be integers"), "{err}");
}

#[test]
fn scatter_add_adds_duplicates_and_takes_a_smaller_index() {
    // torch.zeros(3, 4).scatter_add(0, index, src) with index and src of shape [2, 3].
    let base = t(&[1.0; 12], &[3, 4]);
    let index = Tensor::from_vec(vec![0i64, 2, 0, 0, 1, 0], &[2, 3]);
    let src = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let got = f32s(&base.scatter_add(0, &index, &src));
    #[rustfmt::skip]
    let want = vec![
        1.0 + 1.0 + 4.0, 1.0, 1.0 + 3.0 + 6.0, 1.0,
        1.0, 1.0 + 5.0, 1.0, 1.0,
        1.0, 1.0 + 2.0, 1.0, 1.0,
    ];
    assert_eq!(got, want);
    // Along dim 1, on i64 values.
    let base = Tensor::from_vec(vec![0i64; 6], &[2, 3]);
    let index = Tensor::from_vec(vec![2i64, 2, 0, 1], &[2, 2]);
    let src = Tensor::from_vec(vec![5i64, 7, 1, 1], &[2, 2]);
    assert_eq!(base.scatter_add(1, &index, &src).to_vec::<i64>().unwrap(), vec![0, 0, 12, 1, 1, 0]);
    // An index past the axis fails the realize; a src of another dtype is an error at once.
    let bad = t(&[0.0; 4], &[4]).scatter_add(0, &Tensor::from_vec(vec![4i64], &[1]), &t(&[1.0], &[1]));
    assert!(bad.to_vec::<f32>().is_err());
    let mixed =
        t(&[0.0; 4], &[4]).scatter_add(0, &Tensor::from_vec(vec![1i64], &[1]), &Tensor::from_vec(vec![1i64], &[1]));
    let e = mixed.to_vec::<f32>().unwrap_err().to_string();
    assert!(e.contains("scatter_add") && e.contains("dtype"), "{e}");
}

#[test]
fn inverse_trigonometric_functions_match_f64_within_a_few_ulps() {
    let xs: Vec<f32> = (0..=2000).map(|i| -1.0 + i as f32 / 1000.0).collect();
    let wide: Vec<f32> =
        (0..=2000).map(|i| (i as f32 - 1000.0) / 25.0).chain([f32::INFINITY, f32::NEG_INFINITY]).collect();
    let check = |name: &str, got: Vec<f32>, inputs: &[f32], f: fn(f64) -> f64| {
        for (&x, &g) in inputs.iter().zip(&got) {
            let want = f(x as f64);
            let err = (g as f64 - want).abs();
            assert!(err <= 4.0 * f32::EPSILON as f64 * want.abs().max(1e-3), "{name}({x}) = {g}, want {want}");
        }
    };
    check("atan", f32s(&t(&wide, &[wide.len()]).atan()), &wide, f64::atan);
    check("asin", f32s(&t(&xs, &[xs.len()]).asin()), &xs, f64::asin);
    check("acos", f32s(&t(&xs, &[xs.len()]).acos()), &xs, f64::acos);
    // Outside [-1, 1] there is no angle; NaN stays NaN.
    let odd = f32s(&t(&[1.5, -2.0, f32::NAN], &[3]).asin());
    assert!(odd.iter().all(|v| v.is_nan()), "{odd:?}");
    assert!(f32s(&t(&[f32::NAN], &[1]).atan())[0].is_nan());
    // The gradient of atan is 1 / (1 + x^2), a number everywhere (0 and the branch edges too).
    for x in [0.0f32, 0.3, 0.414_213_57, 1.0, 2.414_213_6, 10.0, -3.0] {
        let v = Tensor::from_vec(vec![x], &[1]).requires_grad_();
        let g = f32s(&kiln::grad(&v.atan().sum_all(), &[&v]).unwrap()[0]);
        let want = 1.0 / (1.0 + x * x);
        assert!((g[0] - want).abs() <= 1e-5 * want.max(1.0), "atan'({x}) = {}, want {want}", g[0]);
    }
}
