//! The data-parallel training scenario shared by the in-process tests (`tests/it/ddp.rs`) and the
//! MPI example (`examples/train_ddp.rs`): a 2-layer Transformer, a synthetic next-token dataset,
//! the ranks' training and the single-process reference on the global batches.

#![allow(dead_code)]

use kiln::Tensor;
use kiln_dist::Collective;
use kiln_nn::{DistributedTrainer, Loss, Module, Sgd, ShardedSampler, Trainer, Transformer, TransformerConfig};

/// The sizes of a run: the model, the sequence length and the sequences per rank per step.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub config: TransformerConfig,
    pub seq: usize,
    pub local_batch: usize,
}

/// The tests' run: a 2-layer model small enough for CI.
pub const TEST: Sizes = Sizes {
    config: TransformerConfig { dim: 16, n_heads: 2, n_layers: 2, norm_eps: 1e-5, vocab_size: 17, max_seq_len: 8 },
    seq: 6,
    local_batch: 2,
};

/// The timing run: the 2-layer Transformer of `kiln bench models`' anchor (dim 64, 8 heads,
/// vocab 64), 32 tokens, 8 sequences per rank.
pub const BENCH: Sizes = Sizes {
    config: TransformerConfig { dim: 64, n_heads: 8, n_layers: 2, norm_eps: 1e-5, vocab_size: 64, max_seq_len: 32 },
    seq: 32,
    local_batch: 8,
};

/// The sampler's seed.
pub const SEED: u64 = 2026;

/// The next number of a SplitMix64 sequence (the dataset's generator: no global RNG, so tests
/// running in parallel cannot disturb it).
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `n` sequences of `seq + 1` tokens: inputs `[n, seq]` and next-token targets `[n, seq]`.
pub fn dataset(sizes: &Sizes, n: usize) -> (Tensor, Tensor) {
    let seq = sizes.seq;
    let mut state = 7;
    let vocab = sizes.config.vocab_size as u64;
    let (mut x, mut y) = (Vec::with_capacity(n * seq), Vec::with_capacity(n * seq));
    for _ in 0..n {
        // A learnable rule plus noise: mostly `t + 3 mod vocab`.
        let mut t = next(&mut state) % vocab;
        for _ in 0..seq {
            let u = if next(&mut state).is_multiple_of(4) { next(&mut state) % vocab } else { (t + 3) % vocab };
            x.push(t as i64);
            y.push(u as i64);
            t = u;
        }
    }
    (Tensor::from_vec(x, &[n, seq]), Tensor::from_vec(y, &[n, seq]))
}

/// The initial weights every run starts from (safetensors bytes), from a fixed seed.
pub fn initial_weights(sizes: &Sizes) -> Vec<u8> {
    kiln::manual_seed(1234);
    kiln_nn::to_safetensors_bytes(&Transformer::from_config(sizes.config).expect("config")).expect("serialize")
}

/// A model holding `weights`.
pub fn model_from(sizes: &Sizes, weights: &[u8]) -> Transformer {
    let mut model = Transformer::from_config(sizes.config).expect("config");
    kiln_nn::load_state_dict(&mut model, &kiln_nn::read_safetensors(weights).expect("parse"), true).expect("load");
    model
}

/// The optimizer of every run.
pub fn optimizer() -> Sgd {
    Sgd::new(0.1, 0.9)
}

/// The parameters of a model, by name, as host vectors.
pub fn parameters(model: &dyn Module) -> Vec<(String, Vec<f32>)> {
    model.named_parameters().into_iter().map(|(n, t)| (n, t.to_vec::<f32>().expect("read"))).collect()
}

/// What one rank's training gave.
pub struct RankRun {
    /// The loss of every step (averaged over the ranks).
    pub losses: Vec<f32>,
    /// The final parameters.
    pub params: Vec<(String, Vec<f32>)>,
    /// Whether every rank's final parameters hold the same bits (compared through an
    /// all-gather).
    pub identical_across_ranks: bool,
    /// The mean time of the steps after the first two (which trace and compile).
    pub step_time: std::time::Duration,
    /// The mean time those steps spent in the gradients' all-reduces.
    pub communication_time: std::time::Duration,
}

/// `steps` data-parallel steps on the rank of `comm`: rank 0 starts from `weights`, the others
/// from other random weights (the trainer broadcasts rank 0's). `after_step(rank, step)` runs
/// after each step (a test's hook to stop or stall a rank).
pub fn train_ranks(
    comm: impl Collective + 'static,
    sizes: &Sizes,
    weights: &[u8],
    steps: usize,
    mut after_step: impl FnMut(usize, usize),
) -> kiln_nn::Result<RankRun> {
    let (rank, size) = (comm.rank(), comm.size());
    let model =
        if rank == 0 { model_from(sizes, weights) } else { Transformer::from_config(sizes.config).expect("config") };
    let mut trainer = DistributedTrainer::new(model, optimizer(), Loss::CrossEntropy, comm)?;
    // Small buckets, so that a step makes several all-reduces.
    trainer.bucket_bytes = 4096;
    let n = size * sizes.local_batch * steps;
    let (x, y) = dataset(sizes, n);
    let sampler = ShardedSampler::new(n, rank, size, SEED)?;
    let mut losses = Vec::with_capacity(steps);
    let (mut step_time, mut communication_time) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    for (step, batch) in sampler.local_batches(0, sizes.local_batch).iter().enumerate() {
        losses.push(trainer.step(&ShardedSampler::take(&x, batch), &ShardedSampler::take(&y, batch))?);
        if step >= 2 {
            step_time += trainer.last_step_timing().total;
            communication_time += trainer.last_step_timing().communication;
        }
        after_step(rank, step);
    }
    assert_eq!(trainer.traces(), (1, 1), "each of the two step programs is traced once");
    let params = parameters(&trainer.model);
    let flat: Vec<f32> = params.iter().flat_map(|(_, v)| v.iter().copied()).collect();
    let all = trainer.collective().all_gather_f32(&flat)?;
    let identical_across_ranks =
        all.chunks_exact(flat.len()).all(|other| other.iter().zip(&flat).all(|(a, b)| a.to_bits() == b.to_bits()));
    let timed = steps.saturating_sub(2).max(1) as u32;
    Ok(RankRun {
        losses,
        params,
        identical_across_ranks,
        step_time: step_time / timed,
        communication_time: communication_time / timed,
    })
}

/// One process trained with [`Trainer`] on the global batches of `size` ranks.
pub fn train_reference(
    sizes: &Sizes,
    weights: &[u8],
    size: usize,
    steps: usize,
) -> (Vec<f32>, Vec<(String, Vec<f32>)>) {
    let mut trainer = Trainer::new(model_from(sizes, weights), optimizer(), Loss::CrossEntropy);
    let n = size * sizes.local_batch * steps;
    let (x, y) = dataset(sizes, n);
    let sampler = ShardedSampler::new(n, 0, size, SEED).expect("sampler");
    let losses = sampler
        .global_batches(0, sizes.local_batch)
        .iter()
        .map(|b| trainer.step(&ShardedSampler::take(&x, b), &ShardedSampler::take(&y, b)).expect("step"))
        .collect();
    (losses, parameters(&trainer.model))
}

/// The largest absolute difference between two parameter lists (same names, same order).
pub fn max_difference(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0f32;
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        for (x, y) in va.iter().zip(vb) {
            worst = worst.max((x - y).abs());
        }
    }
    worst
}

/// Whether two parameter lists hold the same bits.
pub fn bitwise_equal(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((na, va), (nb, vb))| {
            na == nb && va.len() == vb.len() && va.iter().zip(vb).all(|(x, y)| x.to_bits() == y.to_bits())
        })
}
