//! Data-parallel training of a model with BatchNorm: the running statistics a training-mode
//! forward updates are returned by the compiled gradient program and made rank 0's on every rank
//! (PyTorch's DistributedDataParallel broadcasts buffers the same way), so ranks stay identical.

use kiln::Tensor;
use kiln_dist::ThreadGroup;
use kiln_nn::{BatchNorm2d, DistributedTrainer, Flatten, Linear, Loss, Module, Sequential, Sgd};

/// Rank `rank`'s slice of step `step`'s global batch of 4 (a fixed formula: the global random
/// generator is shared by the rank threads).
fn batch(step: usize, rank: usize) -> (Tensor, Tensor) {
    let wave = |n: usize, f: f64| -> Vec<f32> {
        (0..n).map(|i| ((i as f64 * f + step as f64).sin() * (1.0 + step as f64)) as f32).collect()
    };
    let x = Tensor::from_vec(wave(4 * 18, 0.37), &[4, 2, 3, 3]);
    let y = Tensor::from_vec(wave(4, 1.3), &[4, 1]);
    (x.narrow(0, 2 * rank, 2), y.narrow(0, 2 * rank, 2))
}

/// The running mean and variance of a single BatchNorm, after the steps, updated only from
/// rank 0's slices: `(1 - 0.1) * running + 0.1 * batch` with the unbiased variance.
fn rank0_statistics(steps: usize) -> Vec<f64> {
    let (mut mean, mut var) = (vec![0.0f64; 2], vec![1.0f64; 2]);
    for step in 0..steps {
        let x = batch(step, 0).0.to_vec::<f32>().unwrap();
        for c in 0..2 {
            let v: Vec<f64> =
                (0..2).flat_map(|n| (0..9).map(move |k| (n * 2 + c) * 9 + k)).map(|i| f64::from(x[i])).collect();
            let m = v.iter().sum::<f64>() / 18.0;
            let s = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / 17.0;
            mean[c] = 0.9 * mean[c] + 0.1 * m;
            var[c] = 0.9 * var[c] + 0.1 * s;
        }
    }
    mean.into_iter().chain(var).collect()
}

#[test]
fn batchnorm_statistics_are_rank_zeros_on_every_rank() {
    const STEPS: usize = 3;
    let results = ThreadGroup::run(ThreadGroup::new(2), |comm| -> kiln_nn::Result<Vec<f64>> {
        let model = Sequential::new().push(BatchNorm2d::new(2, 1e-5)).push(Flatten).push(Linear::new(18, 1, true));
        let mut trainer = DistributedTrainer::new(model, Sgd::new(0.05, 0.0), Loss::Mse, comm)?;
        for step in 0..STEPS {
            let (x, y) = batch(step, trainer.rank());
            trainer.step(&x, &y)?;
        }
        let mut stats = Vec::new();
        for (name, t, _) in trainer.model.state_dict() {
            if name.starts_with("0.running_") {
                stats.extend(t.to_vec::<f32>()?.into_iter().map(f64::from));
            }
        }
        Ok(stats)
    });
    let stats: Vec<Vec<f64>> = results.into_iter().map(|r| r.expect("no panic").expect("rank trains")).collect();
    assert_eq!(stats[0], stats[1], "ranks hold the same running statistics");
    let want = rank0_statistics(STEPS);
    assert!(
        stats[0].iter().zip(&want).all(|(g, w)| (g - w).abs() < 1e-5 * (1.0 + w.abs())),
        "{:?} vs rank 0's {want:?}",
        stats[0]
    );
}
