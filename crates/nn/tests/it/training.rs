//! Training loops and inference helpers: `fit` reduces the loss, dropout only acts in training
//! mode, `predict` runs without gradients, and a symbolic sequence length gives one program for
//! every length.

use kiln::{DType, Device, Dim, HostTensor, Tensor};
use kiln_nn::*;

#[test]
fn fit_reduces_the_loss_of_small_models_on_both_devices() {
    for device in [Device::Interp, Device::Cpu] {
        kiln::manual_seed(7);
        let mut model =
            Sequential::new().push(Linear::new(4, 16, true)).push(Activation::Silu).push(Linear::new(16, 2, true));
        model.to_device(device).unwrap();
        let x = Tensor::randn(&[32, 4]).to_device(device).unwrap();
        let y = x.narrow(1, 0, 2).mul(2.0).sin().realize().unwrap().clone();
        let mut trainer = Trainer::new(model, Sgd::new(0.1, 0.9), Loss::Mse);
        let losses = trainer.fit(&[(x.clone(), y.clone())], 30).unwrap();
        assert!(losses[29] < 0.5 * losses[0], "{device}: {losses:?}");
        assert_eq!(trainer.distinct_step_graphs(), 1, "{device}: every step has one structure");
    }
}

#[test]
fn classifier_with_conv_and_adamw_learns() {
    kiln::manual_seed(11);
    let model = Sequential::new()
        .push(Conv2d::new(1, 4, (3, 3), (1, 1), (1, 1), 1, true).unwrap())
        .push(Activation::Relu)
        .push(MaxPool2d::new((2, 2)))
        .push(Flatten)
        .push(Linear::new(4 * 3 * 3, 3, true));
    let x = Tensor::randn(&[6, 1, 6, 6]);
    let labels = Tensor::from_vec(vec![0i64, 1, 2, 0, 1, 2], &[6]);
    let mut trainer = Trainer::new(model, AdamW::new(0.05), Loss::CrossEntropy);
    let losses = trainer.fit(&[(x, labels)], 15).unwrap();
    assert!(losses[14] < 0.5 * losses[0], "{losses:?}");
}

#[test]
fn a_compiled_training_step_moves_batchnorms_running_statistics() {
    // BatchNorm first, so its batch statistics depend on the batches only: the running statistics
    // after the steps follow `(1 - 0.1) * running + 0.1 * batch` (unbiased variance) per channel.
    kiln::manual_seed(5);
    let model = Sequential::new().push(BatchNorm2d::new(2, 1e-5)).push(Flatten).push(Linear::new(2 * 3 * 3, 1, true));
    let batches: Vec<(Tensor, Tensor)> = (0..3)
        .map(|i| (Tensor::randn(&[4, 2, 3, 3]).mul(1.0 + i as f64).add(i as f64), Tensor::randn(&[4, 1])))
        .collect();
    let mut trainer = Trainer::new(model, Sgd::new(0.05, 0.0), Loss::Mse);
    trainer.fit(&batches, 1).unwrap();
    assert_eq!(trainer.distinct_step_graphs(), 1);
    let (mut mean, mut var) = (vec![0.0f64; 2], vec![1.0f64; 2]);
    for (x, _) in &batches {
        let x = x.to_vec::<f32>().unwrap();
        for c in 0..2 {
            let values: Vec<f64> =
                (0..4).flat_map(|n| (0..9).map(move |k| (n * 2 + c) * 9 + k)).map(|i| f64::from(x[i])).collect();
            let m = values.iter().sum::<f64>() / 36.0;
            let v = values.iter().map(|x| (x - m).powi(2)).sum::<f64>() / 35.0;
            mean[c] = 0.9 * mean[c] + 0.1 * m;
            var[c] = 0.9 * var[c] + 0.1 * v;
        }
    }
    let state: std::collections::HashMap<String, Tensor> =
        trainer.model.state_dict().into_iter().map(|(n, t, _)| (n, t)).collect();
    let got = |name: &str| state[name].to_vec::<f32>().unwrap().iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
    for (name, want) in [("0.running_mean", &mean), ("0.running_var", &var)] {
        let got = got(name);
        assert!(
            got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-5 * (1.0 + w.abs())),
            "{name}: {got:?} vs {want:?}"
        );
    }
    // Prediction runs in eval mode: the running statistics normalize, and stay as they are.
    let mut predictor = Predictor::new();
    assert_eq!(predictor.predict(&mut trainer.model, &batches[0].0).unwrap().dims().unwrap(), [4, 1]);
    assert_eq!(got("0.running_var"), var_f32(&trainer.model));
}

/// The model's first running variance, as the state dict holds it now.
fn var_f32(model: &Sequential) -> Vec<f64> {
    let state = model.state_dict();
    let (_, t, _) = state.iter().find(|(n, _, _)| n == "0.running_var").expect("a BatchNorm buffer");
    t.to_vec::<f32>().unwrap().iter().map(|&v| f64::from(v)).collect()
}

#[test]
fn dropout_acts_only_in_training() {
    kiln::manual_seed(3);
    let x = Tensor::ones(&[1000], DType::F32);
    let mut dropout = Dropout::new(0.5);
    assert_eq!(dropout.forward(&x).sum_all().item::<f32>().unwrap(), 1000.0);
    dropout.set_training(true);
    let y = dropout.forward(&x).to_vec::<f32>().unwrap();
    let zeros = y.iter().filter(|&&v| v == 0.0).count();
    assert!((350..650).contains(&zeros), "{zeros} of 1000 dropped");
    assert!(y.iter().all(|&v| v == 0.0 || v == 2.0), "kept values are scaled by 1 / (1 - p)");
    let mut model = Sequential::new().push(Dropout::new(0.9));
    model.set_training(true);
    assert_eq!(predict(&mut model, &x).unwrap().sum_all().item::<f32>().unwrap(), 1000.0, "predict turns dropout off");
}

#[test]
fn transformer_runs_with_a_symbolic_sequence_length() {
    kiln::manual_seed(5);
    let model = Transformer::from_config(TransformerConfig {
        dim: 16,
        n_heads: 4,
        n_layers: 1,
        norm_eps: 1e-5,
        vocab_size: 13,
        max_seq_len: 8,
    })
    .unwrap();
    let mut texts = Vec::new();
    for seq in [3usize, 5] {
        let ids: Vec<i64> = (0..2 * seq as i64).map(|i| (i * 5) % 13).collect();
        let concrete = model.forward(&Tensor::from_vec(ids.clone(), &[2, seq]));
        let host = HostTensor::from_vec(ids, vec![2, seq]).unwrap();
        let symbolic = model.forward(&Tensor::from_host_symbolic(host, vec![Dim::from(2), Dim::sym("seq")]));
        texts.push(symbolic.graph_text().unwrap());
        let (a, b) = (concrete.to_vec::<f32>().unwrap(), symbolic.to_vec::<f32>().unwrap());
        assert_eq!(a.len(), 2 * seq * 13);
        air::testing::assert_close(
            &format!("seq {seq}: symbolic vs concrete"),
            &b,
            &a,
            air::testing::Tol { atol: 1e-6, rtol: 0.0 },
        );
    }
    assert_eq!(texts[0], texts[1], "one program serves every sequence length");
}
