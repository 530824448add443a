//! `kiln::jit`: compiled functions agree with running the closure eagerly, trace once per
//! signature, redraw random inputs per call, differentiate inside the trace, reuse output
//! storage, and report misuse as `Error::Jit`.

use crate::support;

use support::{data_ptr, devices};

use kiln::{DType, Dim, Error, HostTensor, Tensor, jit};

#[test]
fn a_compiled_function_matches_the_closure_and_traces_once_per_signature() {
    for device in devices() {
        let w = Tensor::from_vec_on(vec![0.5f32, -1.0, 2.0, 0.25, 1.5, -0.75], &[3, 2], device);
        let b = Tensor::from_vec_on(vec![0.1f32, -0.2], &[2], device);
        let model = |x: &Tensor| x.matmul(&w).add(&b).relu().sum(&[1]);
        let mut f = jit(|a: &[Tensor]| model(&a[0]));
        for (i, rows) in [2usize, 2, 5, 2].into_iter().enumerate() {
            let x: Vec<f32> = (0..rows * 3).map(|k| (k as f32 * 0.37 + i as f32).sin()).collect();
            let x = Tensor::from_vec_on(x, &[rows, 3], device);
            let got = f.call(&[&x]).unwrap();
            assert_eq!(got.len(), 1);
            assert!(got[0].is_realized());
            let want = model(&x).to_vec::<f32>().unwrap();
            assert_eq!(got[0].to_vec::<f32>().unwrap(), want, "{device} call {i}");
            assert_eq!(got[0].dims().unwrap(), vec![rows]);
        }
        // Shapes [2, 3] and [5, 3]: two traces for four calls.
        assert_eq!(f.traces(), 2, "{device}");
    }
}

#[test]
fn symbolic_arguments_share_one_trace() {
    let mut f = jit(|a: &[Tensor]| a[0].mul(2.0).exp().sum(&[0]));
    for n in [3usize, 7, 1] {
        let v: Vec<f32> = (0..n).map(|k| k as f32 * 0.1).collect();
        let x = Tensor::from_host_symbolic(HostTensor::from_vec(v.clone(), vec![n]).unwrap(), &[Dim::sym("n")]);
        let got = f.call(&[&x]).unwrap()[0].item::<f32>().unwrap();
        let want: f32 = v.iter().map(|x| (2.0 * x).exp()).sum();
        assert!((got - want).abs() <= 1e-5 * want.abs(), "n = {n}: {got} vs {want}");
    }
    assert_eq!(f.traces(), 1);
}

#[test]
fn captured_tensors_are_constants_and_arguments_are_not() {
    let c = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
    let mut f = jit(|a: &[Tensor]| a[0].add(&c));
    let x = Tensor::from_vec(vec![10.0f32, 20.0], &[2]);
    assert_eq!(f.call(&[&x]).unwrap()[0].to_vec::<f32>().unwrap(), vec![11.0, 22.0]);
    let x = Tensor::from_vec(vec![-1.0f32, -2.0], &[2]);
    assert_eq!(f.call(&[&x]).unwrap()[0].to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
}

#[test]
fn lazy_arguments_are_realized_and_outputs_may_repeat_or_pass_an_argument_through() {
    let mut f = jit(|a: &[Tensor]| {
        let y = a[0].neg();
        vec![y.clone(), a[1].clone(), y]
    });
    let x = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).mul(3.0);
    let z = Tensor::from_vec(vec![7i32], &[1]);
    let out = f.call(&[&x, &z]).unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![-3.0, 6.0]);
    assert_eq!(out[1].to_vec::<i32>().unwrap(), vec![7]);
    assert_eq!(out[2].to_vec::<f32>().unwrap(), vec![-3.0, 6.0]);
}

#[test]
fn random_draws_are_fresh_on_every_call_as_when_the_closure_runs() {
    let x = Tensor::from_vec(vec![0.0f32; 4], &[4]);
    let closure = |x: &Tensor| x.add(Tensor::rand(&[4])).add(Tensor::rand_seeded(&[4], 9).mul(10.0));
    kiln::manual_seed(5);
    let eager1 = closure(&x).to_vec::<f32>().unwrap();
    let eager2 = closure(&x).to_vec::<f32>().unwrap();
    kiln::manual_seed(5);
    let mut f = jit(|a: &[Tensor]| closure(&a[0]));
    let call1 = f.call(&[&x]).unwrap()[0].to_vec::<f32>().unwrap();
    let call2 = f.call(&[&x]).unwrap()[0].to_vec::<f32>().unwrap();
    assert_eq!(call1, eager1);
    assert_eq!(call2, eager2);
    assert_ne!(call1, call2);
}

#[test]
fn gradients_taken_inside_the_trace_match_eager_gradients() {
    let loss = |w: &Tensor, x: &Tensor| x.matmul(w).tanh().square().mean(&[0, 1]);
    let mut f = jit(|a: &[Tensor]| -> kiln::Result<Vec<Tensor>> {
        let l = loss(&a[0], &a[1]);
        let g = kiln::grad(&l, &[&a[0]])?;
        Ok(vec![l, g[0].clone()])
    });
    for step in 0..3 {
        let w: Vec<f32> = (0..6).map(|k| (k + step) as f32 * 0.2 - 0.5).collect();
        let w = Tensor::from_vec(w, &[3, 2]);
        let x = Tensor::from_vec((0..12).map(|k| k as f32 * 0.1).collect(), &[4, 3]);
        let out = f.call(&[&w, &x]).unwrap();
        let l = loss(&w, &x);
        let g = kiln::grad(&l, &[&w]).unwrap();
        kiln::realize(&[&l, &g[0]]).unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), l.to_vec::<f32>().unwrap());
        assert_eq!(out[1].to_vec::<f32>().unwrap(), g[0].to_vec::<f32>().unwrap());
    }
    assert_eq!(f.traces(), 1);
}

#[test]
fn output_storage_nobody_holds_is_reused() {
    let mut f = jit(|a: &[Tensor]| a[0].mul(2.0));
    let x = Tensor::from_vec(vec![1.0f32; 1 << 16], &[1 << 16]);
    let y1 = f.call(&[&x]).unwrap().remove(0);
    let first = data_ptr(&y1);
    // Still held: the next output must not share its storage.
    let y2 = f.call(&[&x]).unwrap().remove(0);
    assert_ne!(data_ptr(&y2), first);
    assert_eq!(y1.to_vec::<f32>().unwrap()[0], 2.0);
    drop(y1);
    let y3 = f.call(&[&x]).unwrap().remove(0);
    assert_eq!(data_ptr(&y3), first, "the dropped output's array is written again");
    assert!(y3.to_vec::<f32>().unwrap().iter().all(|&v| v == 2.0));
    assert!(y2.to_vec::<f32>().unwrap().iter().all(|&v| v == 2.0));
}

#[test]
fn call_into_writes_into_the_storage_of_a_given_tensor() {
    let mut f = jit(|a: &[Tensor]| a[0].add(1.0));
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
    let out = Tensor::from_vec(vec![0.0f32; 3], &[3]);
    let ptr = data_ptr(&out);
    let y = f.call_into(&[&x], vec![out]).unwrap().remove(0);
    assert_eq!(data_ptr(&y), ptr);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0]);
    // A shared tensor is left alone.
    let shared = Tensor::from_vec(vec![0.0f32; 3], &[3]);
    let keep = shared.clone();
    let y = f.call_into(&[&x], vec![shared]).unwrap().remove(0);
    assert_ne!(data_ptr(&y), data_ptr(&keep));
    assert_eq!(keep.to_vec::<f32>().unwrap(), vec![0.0; 3]);
}

#[test]
fn realizing_an_argument_while_tracing_is_a_jit_error() {
    let mut f = jit(|a: &[Tensor]| -> kiln::Result<Tensor> {
        let s = a[0].sum(&[0]).item::<f32>()?;
        Ok(a[0].mul(s as f64))
    });
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
    let e = f.call(&[&x]).unwrap_err();
    assert!(matches!(e, Error::Jit(_)), "{e}");
    assert!(e.to_string().contains("while it was traced"), "{e}");
    assert_eq!(f.traces(), 0);
}

#[test]
fn a_tensor_built_from_an_argument_and_kept_is_an_error_when_realized_later() {
    let mut kept = None;
    let mut f = jit(|a: &[Tensor]| {
        kept = Some(a[0].exp());
        a[0].neg()
    });
    let x = Tensor::from_vec(vec![1.0f32], &[1]);
    f.call(&[&x]).unwrap();
    drop(f);
    let e = kept.unwrap().to_vec::<f32>().unwrap_err();
    assert!(matches!(e, Error::Jit(_)), "{e}");
}

#[test]
fn an_error_tensor_returned_by_the_closure_is_the_calls_error() {
    let mut f = jit(|a: &[Tensor]| a[0].matmul(&a[0]));
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let e = f.call(&[&x]).unwrap_err();
    assert!(e.to_string().contains("matmul"), "{e}");
    // An argument that is an error tensor is that error.
    let bad = Tensor::zeros(&[2], DType::F32).reshape(&[3]);
    assert!(f.call(&[&bad]).is_err());
}

#[test]
fn a_jit_call_inside_a_trace_runs_inline() {
    let mut inner = jit(|a: &[Tensor]| a[0].mul(3.0));
    let mut outer = jit(|a: &[Tensor]| -> kiln::Result<Tensor> { Ok(inner.call(&[&a[0]])?.remove(0).add(1.0)) });
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
    assert_eq!(outer.call(&[&x]).unwrap()[0].to_vec::<f32>().unwrap(), vec![4.0, 7.0]);
    assert_eq!(outer.call(&[&x]).unwrap()[0].to_vec::<f32>().unwrap(), vec![4.0, 7.0]);
    assert_eq!(outer.traces(), 1);
}

#[test]
fn an_argument_given_again_binds_its_data_and_a_replaced_one_is_read_anew() {
    let mut f = jit(|a: &[Tensor]| a[0].matmul(&a[1]));
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2]);
    let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2]);
    for _ in 0..3 {
        assert_eq!(f.call(&[&x, &w]).unwrap()[0].to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    }
    // A new tensor of the same type in the same slot: its own data, no new trace.
    let w = Tensor::from_vec(vec![0.0f32, 1.0, 1.0, 0.0], &[2, 2]);
    assert_eq!(f.call(&[&x, &w]).unwrap()[0].to_vec::<f32>().unwrap(), vec![2.0, 1.0]);
    assert_eq!(f.call(&[&w.narrow(0, 0, 1), &w]).unwrap()[0].to_vec::<f32>().unwrap(), vec![1.0, 0.0]);
    assert_eq!(f.traces(), 1);
    // Another shape in the slot the last calls kept: a new signature.
    let w3 = Tensor::from_vec(vec![1.0f32; 6], &[2, 3]);
    assert_eq!(f.call(&[&x, &w3]).unwrap()[0].to_vec::<f32>().unwrap(), vec![3.0; 3]);
    assert_eq!(f.traces(), 2);
}

#[test]
fn a_loop_that_replaces_its_argument_with_the_output_cycles_through_two_arrays() {
    // What a training step does with its parameters: the old value, kept by the call to bind it
    // faster, is let go when a new tensor takes its slot, so its array is reused.
    let mut f = jit(|a: &[Tensor]| a[0].add(1.0));
    let mut p = Tensor::from_vec(vec![0.0f32; 1 << 14], &[1 << 14]);
    let mut arrays = Vec::new();
    for _ in 0..8 {
        p = f.call(&[&p]).unwrap().remove(0);
        arrays.push(data_ptr(&p));
    }
    assert_eq!(p.to_vec::<f32>().unwrap()[0], 8.0);
    arrays.sort();
    arrays.dedup();
    assert!(arrays.len() <= 3, "{} distinct output arrays over 8 steps", arrays.len());
}
