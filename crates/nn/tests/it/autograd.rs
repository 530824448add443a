//! The facade's autograd (`kiln::grad`, `Tensor::backward`, `no_grad`, `stop_gradient`) checked
//! against finite differences and against hand-derived gradients.

use kiln::Tensor;
use kiln_nn::{Linear, Module, mse_loss};

/// Central differences of `f` at `x` (f64 arithmetic on f32 data, step 1e-3).
fn finite_differences(x: &[f32], shape: &[usize], f: &dyn Fn(&Tensor) -> Tensor) -> Vec<f64> {
    let h = 1e-3f32;
    (0..x.len())
        .map(|i| {
            let mut plus = x.to_vec();
            let mut minus = x.to_vec();
            plus[i] += h;
            minus[i] -= h;
            let fp = f(&Tensor::from_vec(plus, shape)).item::<f32>().unwrap() as f64;
            let fm = f(&Tensor::from_vec(minus, shape)).item::<f32>().unwrap() as f64;
            (fp - fm) / (2.0 * h as f64)
        })
        .collect()
}

#[test]
fn grad_matches_finite_differences() {
    let data: Vec<f32> = (0..12).map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0).collect();
    let f = |x: &Tensor| -> Tensor {
        let y = x.reshape(&[3, 4]);
        y.matmul(&y.transpose(0, 1)).softmax(-1).mul(y.sum_keepdim(1).tanh()).sum_all().add(y.gelu().mean_all())
    };
    let x = Tensor::from_vec(data.clone(), &[12]);
    let g = kiln::grad(&f(&x), &[&x]).unwrap().remove(0).to_vec::<f32>().unwrap();
    let fd = finite_differences(&data, &[12], &f);
    let g: Vec<f64> = g.iter().map(|&v| v.into()).collect();
    let compared = air::testing::assert_close(
        "analytic gradient vs finite differences",
        &g,
        &fd,
        air::testing::Tol { atol: 2e-3, rtol: 0.0 },
    )
    .compared;
    assert_eq!(compared, 12, "every element of x has a finite difference");
}

#[test]
fn backward_fills_grad_of_marked_tensors_and_accumulates() {
    let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).requires_grad_();
    let x = Tensor::from_vec(vec![4.0f32, 5.0, 6.0], &[3]);
    assert!(w.requires_grad() && !x.requires_grad());
    let loss = w.mul(&x).sum_all();
    loss.backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), vec![4.0, 5.0, 6.0]);
    assert!(x.grad().is_none(), "unmarked tensors get no gradient");
    // A second backward adds to the gradient, like PyTorch.
    w.square().sum_all().backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), vec![6.0, 9.0, 12.0]);
    w.zero_grad();
    assert!(w.grad().is_none());
}

#[test]
fn backward_needs_a_scalar_and_a_loss_realized_with_gradients_on() {
    let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).requires_grad_();
    let err = w.mul(2.0).backward().unwrap_err().to_string();
    assert!(err.contains("one-element"), "{err}");
    // Realized on its own, the loss keeps its graph (PyTorch's `loss.item(); loss.backward()`).
    let loss = w.square().sum_all();
    assert_eq!(loss.item::<f32>().unwrap(), 5.0);
    loss.backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    // Realized inside no_grad, it does not.
    let loss = w.square().sum_all();
    kiln::no_grad(|| loss.realize()).unwrap();
    let err = loss.backward().unwrap_err().to_string();
    assert!(err.contains("realized"), "{err}");
}

#[test]
fn losses_realized_together_each_keep_their_graph() {
    // Two losses sharing `w^2`, and a root unrelated to `w`, realized as one program: one walk
    // decides for all three roots which keep their inputs.
    let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).requires_grad_();
    let shared = w.square();
    let (l1, l2) = (shared.sum_all(), shared.mul(3.0).sum_all());
    let other = Tensor::from_vec(vec![0.5f32, 1.5], &[2]).exp().sum_all();
    kiln::realize(&[&l1, &l2, &other]).unwrap();
    assert_eq!(kiln::grad(&l1, &[&w]).unwrap()[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    assert_eq!(kiln::grad(&l2, &[&w]).unwrap()[0].to_vec::<f32>().unwrap(), vec![6.0, 12.0]);
}

/// An optimizer step realizes without gradient tracking, as PyTorch's: the new parameters are
/// constants, not values that keep the step's graph (and every older parameter) alive.
#[test]
fn optimizer_steps_do_not_keep_the_graph() {
    use kiln_nn::{Optimizer, Sgd};
    let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).requires_grad_();
    let loss = w.square().sum_all();
    let grads = kiln::grad(&loss, &[&w]).unwrap();
    let step = Sgd::new(0.1, 0.0).step(std::slice::from_ref(&w), &grads, &[&loss]).unwrap();
    let new = &step.params[0];
    assert_eq!(new.to_vec::<f32>().unwrap(), vec![0.8, 1.6]);
    let err = kiln::grad(&new.sum_all(), &[&w]).unwrap_err().to_string();
    assert!(err.contains("depends on none"), "{err}");
}

#[test]
fn no_grad_disables_marks_and_backward() {
    assert!(kiln::is_grad_enabled());
    let w = Tensor::from_vec(vec![1.0f32], &[1]);
    kiln::no_grad(|| {
        assert!(!kiln::is_grad_enabled());
        assert!(!w.requires_grad_().requires_grad(), "requires_grad_ marks nothing inside no_grad");
        assert!(w.sum_all().backward().is_err());
        assert!(kiln::grad(&w.sum_all(), &[&w]).is_err());
    });
    assert!(kiln::is_grad_enabled());
}

#[test]
fn stop_gradient_cuts_the_graph() {
    let x = Tensor::from_vec(vec![3.0f32], &[1]);
    // d/dx (x * stop(x)) = stop(x) = 3, not 2x = 6.
    let y = x.mul(x.stop_gradient()).sum_all();
    assert_eq!(kiln::grad(&y, &[&x]).unwrap()[0].to_vec::<f32>().unwrap(), vec![3.0]);
}

#[test]
fn unreached_tensors_get_zeros_and_forward_runs_once() {
    let a = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
    let b = Tensor::from_vec(vec![5.0f32], &[1]);
    let loss = a.exp().sum_all();
    let grads = kiln::grad(&loss, &[&a, &b]).unwrap();
    assert_eq!(grads[1].to_vec::<f32>().unwrap(), vec![0.0]);
    // Loss and gradient realized together: one graph.
    let before = kiln::stats::graphs_executed();
    kiln::realize(&[&loss, &grads[0]]).unwrap();
    assert_eq!(kiln::stats::graphs_executed() - before, 1);
    let e = [1f32.exp(), 2f32.exp()];
    let g = grads[0].to_vec::<f32>().unwrap();
    assert!((g[0] - e[0]).abs() < 1e-5 && (g[1] - e[1]).abs() < 1e-5);
}

#[test]
fn module_parameters_are_marked_for_backward() {
    kiln::manual_seed(3);
    let layer = Linear::new(2, 1, true);
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2]);
    let loss = mse_loss(&layer.forward(&x), &Tensor::from_vec(vec![0.0f32], &[1, 1]));
    loss.backward().unwrap();
    let out = layer.forward(&x).item::<f32>().unwrap();
    // d/db (out - 0)^2 = 2 * out; d/dw = 2 * out * x.
    let gb = layer.bias.as_ref().unwrap().grad().unwrap().to_vec::<f32>().unwrap();
    let gw = layer.weight.grad().unwrap().to_vec::<f32>().unwrap();
    assert!((gb[0] - 2.0 * out).abs() < 1e-5);
    assert!((gw[0] - 2.0 * out).abs() < 1e-5 && (gw[1] - 4.0 * out).abs() < 1e-5);
}
