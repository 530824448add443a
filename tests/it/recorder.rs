//! `kiln::Recorder`: a call of a recorded function is the function's own lazy graph (same
//! results, same traced program, gradients through it), recorded the second time a signature is
//! called, and never recorded when that would change what the function computes.

use kiln::{Dim, HostTensor, Recorder, Tensor, jit};

fn vec2(rows: usize, cols: usize, seed: u32) -> Tensor {
    let v: Vec<f32> = (0..rows * cols).map(|i| ((i as u32 * 7 + seed * 13) % 11) as f32 * 0.25 - 1.2).collect();
    Tensor::from_vec(v, &[rows, cols])
}

/// `relu(x @ w + c)`, built directly.
fn direct(x: &Tensor, w: &Tensor, c: &Tensor) -> Tensor {
    x.matmul(w).add(c).relu()
}

/// [`direct`] through `recorder`, `c` captured.
fn mlp(recorder: &Recorder, x: &Tensor, w: &Tensor, c: &Tensor) -> Tensor {
    recorder.call(&[x, w], |a| direct(&a[0], &a[1], c)).unwrap().remove(0)
}

#[test]
fn calls_after_the_second_are_the_recorded_graph() {
    let recorder = Recorder::new();
    let (w, c) = (vec2(4, 3, 1), vec2(1, 3, 2));
    for i in 0..5 {
        let x = vec2(2, 4, 10 + i);
        let y = mlp(&recorder, &x, &w, &c);
        assert!(!y.is_realized(), "a call records, it does not compute");
        let plain = direct(&x, &w, &c);
        assert_eq!(y.graph_text().unwrap(), plain.graph_text().unwrap(), "call {i}");
        assert_eq!(y.to_vec::<f32>().unwrap(), plain.to_vec::<f32>().unwrap(), "call {i}");
        assert_eq!(recorder.recordings(), usize::from(i >= 1), "recorded on the second call");
    }
}

#[test]
fn new_weights_are_arguments_and_captured_data_is_a_constant() {
    let recorder = Recorder::new();
    let c = vec2(1, 3, 2);
    let x = vec2(2, 4, 3);
    for i in 0..4 {
        // A new weight tensor per call, as an optimizer step makes.
        let w = vec2(4, 3, 20 + i);
        let want = direct(&x, &w, &c).to_vec::<f32>().unwrap();
        assert_eq!(mlp(&recorder, &x, &w, &c).to_vec::<f32>().unwrap(), want, "call {i}");
    }
    assert_eq!(recorder.recordings(), 1);
    // A new signature records again.
    let x = vec2(5, 4, 3);
    let w = vec2(4, 3, 1);
    for _ in 0..3 {
        let want = direct(&x, &w, &c).to_vec::<f32>().unwrap();
        assert_eq!(mlp(&recorder, &x, &w, &c).to_vec::<f32>().unwrap(), want);
    }
    assert_eq!(recorder.recordings(), 2);
}

#[test]
fn symbolic_dims_share_one_recording() {
    let recorder = Recorder::new();
    let w = vec2(3, 2, 5);
    for n in [2usize, 5, 1, 4] {
        let v: Vec<f32> = (0..n * 3).map(|k| k as f32 * 0.1 - 0.3).collect();
        let x =
            Tensor::from_host_symbolic(HostTensor::from_vec(v, vec![n, 3]).unwrap(), &[Dim::sym("n"), Dim::from(3)]);
        let y = recorder.call(&[&x, &w], |a| a[0].matmul(&a[1]).exp()).unwrap().remove(0);
        assert_eq!(y.to_vec::<f32>().unwrap(), x.matmul(&w).exp().to_vec::<f32>().unwrap(), "n = {n}");
        assert_eq!(y.dims().unwrap(), vec![n, 2]);
    }
    assert_eq!(recorder.recordings(), 1);
}

#[test]
fn gradients_flow_through_a_recorded_call_and_share_its_forward() {
    let recorder = Recorder::new();
    let c = vec2(1, 3, 2);
    let x = vec2(2, 4, 3);
    for i in 0..3 {
        let w = vec2(4, 3, 30 + i).requires_grad_();
        let loss = mlp(&recorder, &x, &w, &c).mul(x.matmul(&w)).sum_all();
        let g = kiln::grad(&loss, &[&w]).unwrap().remove(0);
        let w2 = vec2(4, 3, 30 + i);
        let loss2 = direct(&x, &w2, &c).mul(x.matmul(&w2)).sum_all();
        let g2 = kiln::grad(&loss2, &[&w2]).unwrap().remove(0);
        kiln::realize(&[&loss, &g]).unwrap();
        assert_eq!(loss.item::<f32>().unwrap(), loss2.item::<f32>().unwrap(), "call {i}");
        assert_eq!(g.to_vec::<f32>().unwrap(), g2.to_vec::<f32>().unwrap(), "call {i}");
        // `backward` too, on a fresh call.
        let w3 = vec2(4, 3, 30 + i).requires_grad_();
        mlp(&recorder, &x, &w3, &c).sum_all().backward().unwrap();
        let w4 = vec2(4, 3, 30 + i).requires_grad_();
        x.matmul(&w4).add(&c).relu().sum_all().backward().unwrap();
        assert_eq!(w3.grad().unwrap().to_vec::<f32>().unwrap(), w4.grad().unwrap().to_vec::<f32>().unwrap());
    }
    assert_eq!(recorder.recordings(), 1);
    // Loss and gradient realized together run the forward once: the call walks its replay.
    let w = vec2(4, 3, 40);
    let loss = mlp(&recorder, &x, &w, &c).sum_all();
    let g = kiln::grad(&loss, &[&w]).unwrap().remove(0);
    let w2 = vec2(4, 3, 40);
    let loss2 = direct(&x, &w2, &c).sum_all();
    let g2 = kiln::grad(&loss2, &[&w2]).unwrap().remove(0);
    let nodes = kiln::trace(&[&loss, &g]).unwrap().graph.len();
    assert_eq!(nodes, kiln::trace(&[&loss2, &g2]).unwrap().graph.len());
}

#[test]
fn several_outputs_are_one_call() {
    let recorder = Recorder::new();
    let f = |x: &Tensor| recorder.call(&[x], |a| vec![a[0].exp(), a[0].neg(), a[0].exp().add(1.0)]).unwrap();
    for i in 0..3 {
        let x = vec2(2, 3, i);
        let y = f(&x);
        let nodes = kiln::trace(&[&y[0], &y[1], &y[2]]).unwrap().graph.len();
        let d = [x.exp(), x.neg(), x.exp().add(1.0)];
        assert_eq!(nodes, kiln::trace(&[&d[0], &d[1], &d[2]]).unwrap().graph.len());
        for (a, b) in y.iter().zip(&d) {
            assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        }
        // Two calls in one graph are two copies of the recording, each on its own arguments.
        let x2 = vec2(2, 3, i + 5);
        let z = f(&x2)[2].sub(&f(&x)[2]);
        let want = x2.exp().add(1.0).sub(x.exp().add(1.0));
        assert_eq!(z.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    }
    assert_eq!(recorder.recordings(), 1);
}

#[test]
fn a_tensor_given_twice_is_part_of_the_signature() {
    let recorder = Recorder::new();
    let f = |a: &Tensor, b: &Tensor, c: &Tensor| {
        recorder.call(&[a, b, c], |t| t[0].matmul(&t[1]).sub(t[0].matmul(&t[2]))).unwrap().remove(0)
    };
    let x = vec2(2, 3, 1);
    let (w, v) = (vec2(3, 3, 2), vec2(3, 3, 3));
    for _ in 0..3 {
        assert_eq!(f(&x, &w, &w).to_vec::<f32>().unwrap(), vec![0.0; 6]);
    }
    for _ in 0..3 {
        let want = x.matmul(&w).sub(x.matmul(&v)).to_vec::<f32>().unwrap();
        assert_eq!(f(&x, &w, &v).to_vec::<f32>().unwrap(), want);
    }
    assert_eq!(recorder.recordings(), 2);
}

#[test]
fn random_draws_and_marks_inside_are_never_recorded() {
    let recorder = Recorder::new();
    let x = vec2(2, 3, 1);
    let draws: Vec<Vec<f32>> = (0..4)
        .map(|_| recorder.call(&[&x], |a| a[0].add(Tensor::rand(&[2, 3]))).unwrap()[0].to_vec::<f32>().unwrap())
        .collect();
    assert_ne!(draws[2], draws[3], "dropout-like noise is drawn on every call");
    assert_eq!(recorder.recordings(), 0);
    let stops = Recorder::new();
    for _ in 0..3 {
        let w = vec2(3, 3, 2).requires_grad_();
        let y = stops.call(&[&x, &w], |a| a[0].matmul(&a[1]).stop_gradient().mul(a[0].matmul(&a[1]))).unwrap();
        let g = kiln::grad(&y[0].sum_all(), &[&w]).unwrap().remove(0);
        let w2 = vec2(3, 3, 2);
        let want = x.matmul(&w2).stop_gradient().mul(x.matmul(&w2)).sum_all();
        let want = kiln::grad(&want, &[&w2]).unwrap().remove(0);
        assert_eq!(g.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    }
    assert_eq!(stops.recordings(), 0);
}

#[test]
fn errors_stay_errors_and_calls_compose_with_jit() {
    let recorder = Recorder::new();
    let x = vec2(2, 3, 1);
    for _ in 0..3 {
        let bad = recorder.call(&[&x], |a| a[0].matmul(&a[0])).unwrap().remove(0);
        assert!(bad.to_vec::<f32>().unwrap_err().to_string().contains("matmul"));
    }
    assert_eq!(recorder.recordings(), 0);
    let w = vec2(3, 4, 2);
    let mut compiled =
        jit(|a: &[Tensor]| recorder.call(&[&a[0], &a[1]], |b| b[0].matmul(&b[1]).tanh()).unwrap().remove(0));
    for i in 0..4 {
        let x = vec2(2, 3, i);
        let got = compiled.call(&[&x, &w]).unwrap()[0].to_vec::<f32>().unwrap();
        assert_eq!(got, x.matmul(&w).tanh().to_vec::<f32>().unwrap());
    }
    let y = recorder.call(&[&x, &w], |b| b[0].matmul(&b[1]).tanh()).unwrap().remove(0);
    assert_eq!(y.to_vec::<f32>().unwrap(), x.matmul(&w).tanh().to_vec::<f32>().unwrap());
}

#[test]
fn a_call_that_reads_values_or_computes_is_never_recorded() {
    // A branch on an argument's value: a recording would replay the first call's branch.
    let recorder = Recorder::new();
    let f = |x: &Tensor| {
        recorder
            .call(&[x], |a| if a[0].sum_all().item::<f32>().unwrap() > 0.0 { a[0].exp() } else { a[0].neg() })
            .unwrap()
            .remove(0)
    };
    for sign in [1.0f32, 1.0, 1.0, -1.0, 1.0, -1.0] {
        let x = Tensor::from_vec(vec![sign, 2.0 * sign], &[2]);
        let want = if sign > 0.0 { x.exp() } else { x.neg() };
        assert_eq!(f(&x).to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap(), "sign {sign}");
    }
    assert_eq!(recorder.recordings(), 0);
    // A value computed inside and used as data: a recording would keep the first call's.
    let inner = Recorder::new();
    for i in 0..4 {
        let x = vec2(2, 3, i);
        let y = inner.call(&[&x], |a| Tensor::from_host(a[0].exp().to_host().unwrap()).add(1.0)).unwrap().remove(0);
        assert_eq!(y.to_vec::<f32>().unwrap(), x.exp().add(1.0).to_vec::<f32>().unwrap(), "call {i}");
    }
    assert_eq!(inner.recordings(), 0);
    // The sizes behind a symbolic shape are values too.
    let sizes = Recorder::new();
    for n in [2usize, 3, 2, 4] {
        let x = Tensor::from_host_symbolic(HostTensor::from_vec(vec![1.0f32; n], vec![n]).unwrap(), &[Dim::sym("n")]);
        let y = sizes.call(&[&x], |a| a[0].mul(a[0].dims().unwrap()[0] as f32)).unwrap().remove(0);
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![n as f32; n], "n = {n}");
    }
    assert_eq!(sizes.recordings(), 0);
}

#[test]
fn gradients_on_or_off_are_part_of_the_signature() {
    let recorder = Recorder::new();
    let f = |x: &Tensor| {
        recorder.call(&[x], |a| if kiln::is_grad_enabled() { a[0].exp() } else { a[0].neg() }).unwrap().remove(0)
    };
    let x = vec2(2, 3, 1);
    for _ in 0..3 {
        assert_eq!(f(&x).to_vec::<f32>().unwrap(), x.exp().to_vec::<f32>().unwrap());
    }
    for _ in 0..3 {
        let y = kiln::no_grad(|| f(&x));
        assert_eq!(y.to_vec::<f32>().unwrap(), x.neg().to_vec::<f32>().unwrap());
    }
    assert_eq!(recorder.recordings(), 2);
}

#[test]
fn a_function_of_no_tensors_runs_every_time() {
    // Its outputs could not be nodes whose inputs are the call's arguments: never recorded.
    let recorder = Recorder::new();
    for _ in 0..3 {
        let y = recorder.call(&[], |_| Tensor::from_vec(vec![1.0f32, 2.0], &[2]).exp()).unwrap().remove(0);
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            Tensor::from_vec(vec![1.0f32, 2.0], &[2]).exp().to_vec::<f32>().unwrap()
        );
    }
    assert_eq!(recorder.recordings(), 0);
}
