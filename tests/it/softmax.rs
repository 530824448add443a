//! Softmax, log_softmax and masked (attention-style) softmax: how the CPU device schedules them
//! (kernel count, no per-element divide) and their values and gradients against the reference
//! interpreter and against the formulas computed here in f64.

use air::Dim;
use air::testing::{Tol, assert_close};
use kiln::{Device, Tensor};

/// The compiled CPU program that realizes `outputs`, printed as kernel IR, and its launch count.
fn cpu_program(outputs: &[&Tensor]) -> (String, usize) {
    let traced = kiln::trace(outputs).expect("trace");
    let device = kiln::backend::cpu_device().expect("cpu device");
    let exe = device.compile(&traced.graph).expect("compile");
    (exe.program().to_string(), exe.launches())
}

fn on(device: Device, t: Tensor) -> Tensor {
    t.to_device(device).expect("move to device")
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec().expect("realize")
}

/// `x` softmax along the last axis of a `[rows, cols]` row-major array, in f64.
fn softmax_f64(x: &[f32], cols: usize) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let e: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / s)
        })
        .collect()
}

#[test]
fn softmax_computes_each_exponential_once_without_a_per_element_divide() {
    let x = on(Device::Cpu, Tensor::randn_seeded(&[6, 37], 1));
    let y = x.softmax(-1);
    let (program, launches) = cpu_program(&[&y]);
    // max, the exponentials, their sum with its reciprocal as the epilogue, and the exponentials
    // times the reciprocal.
    assert_eq!(launches, 4, "{program}");
    assert_eq!(program.matches(" exp2 ").count(), 1, "the exponentials are computed once:\n{program}");
    assert!(!program.contains(" div "), "softmax divides per element:\n{program}");
    assert!(program.contains(" recip "), "no reciprocal of the sum:\n{program}");
    let want = softmax_f64(&values(&x), 37);
    let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
    assert_close("softmax vs f64", &values(&y), &want, Tol::both(1e-6));
}

#[test]
fn softmax_family_matches_the_interpreter_with_gradients() {
    // Each device computes its values and gradients from the same seeded data.
    let run = |device: Device| -> Vec<Vec<f32>> {
        let x = on(device, Tensor::randn_seeded(&[5, 3, 19], 2).mul(4.0));
        let w = on(device, Tensor::randn_seeded(&[5, 3, 19], 3));
        let s = x.softmax(-1);
        let s0 = x.softmax(0);
        let ls = x.log_softmax(1);
        let loss = s.mul(&w).sum_all().add(s0.mul(&w).sum_all()).add(ls.mul(&w).sum_all());
        let grads = kiln::grad(&loss, &[&x, &w]).expect("grad");
        let mut out = vec![values(&s), values(&s0), values(&ls), values(&loss)];
        out.extend(grads.iter().map(values));
        out
    };
    let want = run(Device::Interp);
    let got = run(Device::Cpu);
    let names = ["softmax", "softmax dim 0", "log_softmax", "loss", "grad x", "grad w"];
    for ((name, g), w) in names.iter().zip(&got).zip(&want) {
        assert_close(&format!("{name} on cpu vs interp"), g, w, Tol::both(1e-5));
    }
}

#[test]
fn softmax_gradient_is_the_analytic_one() {
    // d/dx sum(w * softmax(x)) = s * (w - sum(w * s)) per row.
    let (rows, cols) = (4, 23);
    let x = Tensor::randn_seeded(&[rows, cols], 4).mul(3.0);
    let w = Tensor::randn_seeded(&[rows, cols], 5);
    let loss = x.softmax(-1).mul(&w).sum_all();
    let grads = kiln::grad(&loss, &[&x]).expect("grad");
    let (xv, wv) = (values(&x), values(&w));
    let s = softmax_f64(&xv, cols);
    let mut want = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row = r * cols..(r + 1) * cols;
        let dot: f64 = row.clone().map(|i| wv[i] as f64 * s[i]).sum();
        want.extend(row.map(|i| (s[i] * (wv[i] as f64 - dot)) as f32));
    }
    assert_close("softmax gradient vs formula", &values(&grads[0]), &want, Tol::both(1e-5));
}

#[test]
fn causal_masked_softmax_matches_the_interpreter() {
    // The attention block's pattern: an iota-compare mask selects -inf above the diagonal.
    let run = |device: Device| -> (Vec<f32>, Vec<f32>) {
        let n = 11i64;
        let scores = on(device, Tensor::randn_seeded(&[2, 3, 11, 11], 6));
        let positions = Tensor::arange_on(0.0, n as f64, 1.0, device);
        let mask = positions.reshape(&[1, n]).gt(positions.reshape(&[n, 1]));
        let p = mask.where_cond(f64::NEG_INFINITY, scores.mul(0.5)).softmax(-1);
        let g = kiln::grad(&p.mul(&scores).sum_all(), &[&scores]).expect("grad");
        (values(&p), values(&g[0]))
    };
    let (want, want_grad) = run(Device::Interp);
    let (got, got_grad) = run(Device::Cpu);
    assert_close("masked softmax on cpu vs interp", &got, &want, Tol::both(1e-5));
    assert_close("masked softmax gradient on cpu vs interp", &got_grad, &want_grad, Tol::both(1e-5));
    // Above the diagonal the probabilities are exactly 0; the first row is one-hot.
    for (i, row) in got.chunks(11).enumerate() {
        let q = i % 11;
        assert!(row[q + 1..].iter().all(|&v| v == 0.0), "row {i}: {row:?}");
    }
    assert!(got.chunks(11).step_by(11).all(|row| row[0] == 1.0));
}

/// Over a symbolic row (the reduces of softmax, log_softmax, a layer norm and their gradients
/// computed per row by the kernels that read them: `lower`'s row reduces), values and gradients
/// on the CPU match the interpreter, at two row lengths, with one program per device for both.
#[test]
fn symbolic_row_reductions_and_their_gradients_match_the_interpreter() {
    let run = |device: Device, n: usize| -> Vec<Vec<f32>> {
        let host = Tensor::randn_seeded(&[3, n], n as u64).mul(3.0);
        host.realize().expect("realize");
        let x = on(device, host.with_dims(vec![Dim::Const(3), Dim::sym("seq")]));
        let w = on(device, Tensor::randn_seeded(&[3, n], 7 + n as u64));
        let w = w.with_dims(vec![Dim::Const(3), Dim::sym("seq")]);
        let s = x.softmax(-1);
        let ls = x.log_softmax(-1);
        let mean = x.mean_keepdim(1);
        let d = x.sub(&mean);
        let norm = d.mul(d.mul(&d).mean_keepdim(1).add(1e-5f32).rsqrt());
        let loss = s.mul(&w).sum_all().add(ls.mul(&w).sum_all()).add(norm.mul(&w).sum_all());
        let grads = kiln::grad(&loss, &[&x]).expect("grad");
        vec![values(&s), values(&ls), values(&norm), values(&loss), values(&grads[0])]
    };
    // The forward softmax alone is one launch: both of its reduces computed per row inside it.
    let host = Tensor::randn_seeded(&[3, 6], 1);
    host.realize().expect("realize");
    let x = on(Device::Cpu, host.with_dims(vec![Dim::Const(3), Dim::sym("seq")]));
    let (program, launches) = cpu_program(&[&x.softmax(-1)]);
    assert_eq!(launches, 1, "{program}");
    for n in [5, 23] {
        let want = run(Device::Interp, n);
        let got = run(Device::Cpu, n);
        for ((name, g), w) in ["softmax", "log_softmax", "layer norm", "loss", "grad x"].iter().zip(&got).zip(&want) {
            assert_close(&format!("{name} over a symbolic row of {n} on cpu vs interp"), g, w, Tol::both(1e-5));
        }
    }
}
