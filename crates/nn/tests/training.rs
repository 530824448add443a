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
fn dropout_acts_only_in_training() {
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
