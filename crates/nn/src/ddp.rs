//! Data-parallel training (PyTorch's DistributedDataParallel) over a `kiln_dist::Collective`:
//! [`DistributedTrainer`], the sharded sampler [`ShardedSampler`], and checkpoints.
//!
//! Every rank holds a whole copy of the model and trains on its own slice of each global batch.
//! [`DistributedTrainer::new`] broadcasts rank 0's parameters and buffers, so every rank starts
//! from the same weights. A step then runs in three parts:
//! 1. the *gradient program*, one compiled function (`kiln::jit`) of the batch and the model's
//!    tensors returning the loss and the gradients;
//! 2. on the host, the gradients (and the loss) are averaged over the ranks with one all-reduce
//!    (mean) per bucket of about [`DistributedTrainer::bucket_bytes`] bytes;
//! 3. the *update program*, one compiled function of the parameters, the averaged gradients and
//!    the optimizer's state and scalars ([`Optimizer::update`]), which gives the new parameters.
//!
//! A single-process [`crate::Trainer`] runs 1 and 3 as one program. Here they are two, because
//! the all-reduce is a host call between them: a collective inside a compiled program would
//! need a host op that the VM knows and that blocks on the other ranks, which the runtime does
//! not have. Each of the two programs is still traced and compiled once, so a step costs two
//! program runs plus the communication. Every rank gets the same averaged gradients (the
//! collectives return the same bits everywhere), runs the same update program on them, and so
//! keeps the same parameters bitwise, with any [`Optimizer`].

use std::path::Path;
use std::time::{Duration, Instant};

use kiln::{DType, JitCache, Tensor};
use kiln_dist::{BufMut, Collective, ReduceOp};

use crate::error::{NnError, Result};
use crate::module::{Module, ParamKind};
use crate::optim::{Optimizer, StepInputs};
use crate::serialize::{read_safetensors, tensors_to_safetensors_bytes};
use crate::train::{LossFn, model_tensors, set_tensors, with_tensors_updating};

/// Where the time of the last [`DistributedTrainer::step`] went.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTiming {
    /// The whole step.
    pub total: Duration,
    /// The all-reduces of the gradients (including waiting for the slowest rank).
    pub communication: Duration,
}

/// A model, an optimizer and a loss trained data-parallel: each rank calls
/// [`DistributedTrainer::step`] with its own slice of the global batch (see [`ShardedSampler`]),
/// and every rank's parameters stay identical. See the [module docs](self) for how a step runs.
pub struct DistributedTrainer<M: Module, O: Optimizer> {
    /// The model being trained (its parameters are replaced after every step).
    pub model: M,
    /// The optimizer (its state is realized with every step).
    pub optimizer: O,
    /// The size of a gradient bucket in bytes: gradients are averaged one bucket (one all-reduce)
    /// at a time, each bucket holding whole tensors, at least one (PyTorch's default: 25 MiB).
    pub bucket_bytes: usize,
    comm: Box<dyn Collective>,
    loss: Box<dyn LossFn>,
    steps: u64,
    grad_jit: JitCache,
    update_jit: JitCache,
    timing: StepTiming,
    /// Visit positions of the buffers the forward updates (found when the step is traced).
    updated_buffers: Vec<usize>,
}

impl<M: Module, O: Optimizer> DistributedTrainer<M, O> {
    /// The default [`DistributedTrainer::bucket_bytes`]: 25 MiB.
    pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

    /// A trainer on the rank of `comm`; every rank calls it (it is a collective): rank 0's
    /// parameters and buffers are broadcast to the others. The model is put in training mode.
    /// Every parameter and buffer must be `f32`.
    pub fn new(
        mut model: M,
        optimizer: O,
        loss: impl LossFn + 'static,
        comm: impl Collective + 'static,
    ) -> Result<DistributedTrainer<M, O>> {
        let mut comm: Box<dyn Collective> = Box::new(comm);
        model.set_training(true);
        let tensors = model_tensors(&model);
        let mut host = host_f32(&model, &tensors)?;
        for range in buckets(&host, Self::DEFAULT_BUCKET_BYTES) {
            let mut flat: Vec<f32> = host[range.clone()].concat();
            comm.broadcast(flat.as_mut_slice().into(), 0)?;
            scatter(&flat, &mut host[range]);
        }
        let mut host = host.into_iter();
        let mut failed = None;
        model.visit_mut(&mut |_, t, kind| {
            let Some(data) = host.next() else { return };
            match from_host(data, t) {
                Ok(new) => *t = if kind == ParamKind::Weight { new.requires_grad_() } else { new },
                Err(e) => failed = failed.take().or(Some(e)),
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(DistributedTrainer {
            model,
            optimizer,
            bucket_bytes: Self::DEFAULT_BUCKET_BYTES,
            comm,
            loss: Box::new(loss),
            steps: 0,
            grad_jit: JitCache::new(),
            update_jit: JitCache::new(),
            timing: StepTiming::default(),
            updated_buffers: Vec::new(),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.comm.size()
    }

    /// The collective the trainer communicates through (for the caller's own collectives
    /// between steps: they must come in the same order on every rank).
    pub fn collective(&mut self) -> &mut dyn Collective {
        &mut *self.comm
    }

    /// How many steps have been taken (restored by [`DistributedTrainer::load_checkpoint`]).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Where the time of the last step went.
    pub fn last_step_timing(&self) -> StepTiming {
        self.timing
    }

    /// How many times the gradient and the update programs were traced: `(1, 1)` when every
    /// step reused the first step's programs.
    pub fn traces(&self) -> (usize, usize) {
        (self.grad_jit.traces(), self.update_jit.traces())
    }

    /// One training step on this rank's slice `(x, y)` of the global batch (every rank calls it,
    /// with slices of the same shape). Returns the loss averaged over the ranks: for a loss that
    /// is a mean over the batch, the loss of the global batch.
    pub fn step(&mut self, x: &Tensor, y: &Tensor) -> Result<f32> {
        let started = Instant::now();
        let tensors = model_tensors(&self.model);
        let mut kinds = Vec::with_capacity(tensors.len());
        self.model.visit(&mut |_, _, kind| kinds.push(kind));
        let is_weight: Vec<bool> = kinds.iter().map(|k| *k == ParamKind::Weight).collect();
        let params: Vec<Tensor> = tensors.iter().zip(&is_weight).filter(|(_, w)| **w).map(|(t, _)| t.clone()).collect();
        let n_tensors = tensors.len();

        // 1. The gradient program: loss and gradients.
        let mut args: Vec<&Tensor> = vec![x, y];
        args.extend(&tensors);
        let (model, loss_fn, updated_buffers) = (&mut self.model, &mut self.loss, &mut self.updated_buffers);
        let mut out = self.grad_jit.call(&args, |a: &[Tensor]| -> Result<Vec<Tensor>> {
            let stand_ins = &a[2..2 + n_tensors];
            let params: Vec<&Tensor> = stand_ins.iter().zip(&is_weight).filter(|(_, w)| **w).map(|(t, _)| t).collect();
            let (loss, buffers) = with_tensors_updating(model, stand_ins, |m| loss_fn.loss(&m.forward(&a[0]), &a[1]))?;
            let mut out = vec![loss.clone()];
            out.extend(kiln::grad(&loss, &params)?);
            *updated_buffers = buffers.iter().map(|(i, _)| *i).collect();
            out.extend(buffers.into_iter().map(|(_, t)| t));
            Ok(out)
        })?;
        if out.len() != 1 + params.len() + self.updated_buffers.len() {
            return Err(NnError::Config("the model's parameter list changed during a step".into()));
        }
        // Buffers the forward updated (BatchNorm's running statistics): rank 0's values on every
        // rank, as PyTorch's DistributedDataParallel broadcasts them (`broadcast_buffers=True`).
        let buffers = out.split_off(1 + params.len());
        let mut synced = Vec::with_capacity(buffers.len());
        for b in &buffers {
            let mut data = f32_data(b, "a buffer", b)?;
            self.comm.broadcast(data.as_mut_slice().into(), 0)?;
            synced.push(from_host(data, b)?);
        }
        set_tensors(&mut self.model, &self.updated_buffers, synced);

        // 2. The mean over the ranks of the gradients and the loss, bucket by bucket.
        let (loss, grads) = out.split_first().expect("length checked above");
        let mut host = Vec::with_capacity(grads.len() + 1);
        for (g, p) in grads.iter().zip(&params) {
            host.push(f32_data(g, "a gradient", p)?);
        }
        host.push(vec![loss.item::<f32>()?]);
        let comm_started = Instant::now();
        for range in buckets(&host, self.bucket_bytes) {
            let mut flat: Vec<f32> = host[range.clone()].concat();
            self.comm.all_reduce(flat.as_mut_slice().into(), ReduceOp::Mean)?;
            scatter(&flat, &mut host[range]);
        }
        let communication = comm_started.elapsed();
        let global_loss = host.pop().and_then(|l| l.first().copied()).expect("the loss was pushed last");
        let grads: Vec<Tensor> =
            host.into_iter().zip(grads).map(|(data, g)| from_host(data, g)).collect::<Result<_>>()?;

        // 3. The update program: the optimizer's step on the averaged gradients.
        let inputs = self.optimizer.inputs(&params)?;
        let (n_params, n_state) = (params.len(), inputs.state.len());
        let mut args: Vec<&Tensor> = params.iter().collect();
        args.extend(&grads);
        args.extend(&inputs.state);
        args.extend(&inputs.scalars);
        let optimizer = &self.optimizer;
        let out = self.update_jit.call(&args, |a: &[Tensor]| -> Result<Vec<Tensor>> {
            let step = StepInputs {
                state: a[2 * n_params..2 * n_params + n_state].to_vec(),
                scalars: a[2 * n_params + n_state..].to_vec(),
            };
            let (mut new_params, new_state) = optimizer.update(&a[..n_params], &a[n_params..2 * n_params], &step)?;
            new_params.extend(new_state);
            Ok(new_params)
        })?;
        if out.len() != n_params + n_state {
            return Err(NnError::Config("the optimizer's update changed its number of outputs".into()));
        }
        let mut out = out.into_iter();
        let mut new_params = out.by_ref().take(n_params);
        self.model.visit_mut(&mut |_, t, kind| {
            if kind == ParamKind::Weight
                && let Some(p) = new_params.next()
            {
                *t = p.requires_grad_();
            }
        });
        self.optimizer.commit(out.collect());
        self.steps += 1;
        self.timing = StepTiming { total: started.elapsed(), communication };
        Ok(global_loss)
    }

    /// Writes a checkpoint (every rank calls it): rank 0 writes the model's parameters and
    /// buffers (`model.<name>`), the optimizer's state (`optimizer.<i>`) and the step count
    /// (`step`) as one safetensors file, atomically (a temporary file in the same directory,
    /// then a rename): a crash leaves the previous checkpoint or the new one, never a torn file.
    /// Returns after every rank reached this point and the file is in place.
    pub fn save_checkpoint(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let written = if self.comm.rank() == 0 { self.write_checkpoint(path) } else { Ok(()) };
        // Every rank learns whether rank 0 succeeded, so none goes on believing it saved.
        let mut ok = [i32::from(written.is_ok())];
        self.comm.broadcast(BufMut::I32(&mut ok), 0)?;
        written?;
        if ok[0] == 0 {
            return Err(NnError::Config(format!("rank 0 failed to write the checkpoint {}", path.display())));
        }
        Ok(())
    }

    fn write_checkpoint(&self, path: &Path) -> Result<()> {
        let mut entries: Vec<(String, Tensor)> = Vec::new();
        for (name, t, _) in self.model.state_dict() {
            entries.push((format!("model.{name}"), t));
        }
        for (i, t) in self.optimizer.state().into_iter().enumerate() {
            entries.push((format!("optimizer.{i}"), t));
        }
        let step = i64::try_from(self.steps).map_err(|_| NnError::Config("step count overflows i64".into()))?;
        entries.push(("step".into(), Tensor::from_vec(vec![step], &[1])));
        let bytes = tensors_to_safetensors_bytes(&entries)?;
        write_atomically(path, &bytes)
    }

    /// Resumes from a checkpoint of [`DistributedTrainer::save_checkpoint`] (every rank calls it
    /// and reads the file, which must be visible to all, as on a shared filesystem): the model's
    /// tensors, the optimizer's state and the step count. The learning rate and other
    /// hyperparameters are the optimizer's own, not the checkpoint's.
    pub fn load_checkpoint(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let bytes = std::fs::read(path.as_ref())?;
        let tensors = read_safetensors(&bytes)?;
        let model: std::collections::HashMap<String, Tensor> = tensors
            .iter()
            .filter_map(|(name, t)| name.strip_prefix("model.").map(|n| (n.to_string(), t.clone())))
            .collect();
        let count = tensors.keys().filter(|n| n.starts_with("optimizer.")).count();
        let device = model_tensors(&self.model).first().map(|t| t.device());
        let mut state = Vec::with_capacity(count);
        for i in 0..count {
            let t = tensors.get(&format!("optimizer.{i}")).ok_or_else(|| {
                NnError::SafeTensors(format!("the checkpoint has {count} optimizer tensors but no `optimizer.{i}`"))
            })?;
            state.push(match device {
                Some(d) => t.to_device(d)?,
                None => t.clone(),
            });
        }
        let step = tensors
            .get("step")
            .ok_or_else(|| NnError::SafeTensors("the checkpoint has no `step`".into()))?
            .to_vec::<i64>()?;
        let step = step.first().and_then(|&s| u64::try_from(s).ok()).ok_or_else(|| {
            NnError::SafeTensors(format!("the checkpoint's `step` is {step:?}, not one non-negative count"))
        })?;
        crate::serialize::load_state_dict(&mut self.model, &model, true)?;
        self.optimizer.restore(state, step)?;
        self.steps = step;
        self.comm.barrier()?;
        Ok(())
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let name = path.file_name().ok_or_else(|| NnError::Config(format!("{} is not a file path", path.display())))?;
    let tmp = path.with_file_name(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(result?)
}

/// The data of every tensor of `model` (visit order) as host `f32`s.
fn host_f32<M: Module + ?Sized>(model: &M, tensors: &[Tensor]) -> Result<Vec<Vec<f32>>> {
    let mut names = Vec::with_capacity(tensors.len());
    model.visit(&mut |name, _, _| names.push(name.to_string()));
    tensors.iter().zip(&names).map(|(t, name)| f32_data(t, &format!("`{name}`"), t)).collect()
}

/// `t`'s data as `f32`s, or an error naming `what` (a tensor like `like`).
fn f32_data(t: &Tensor, what: &str, like: &Tensor) -> Result<Vec<f32>> {
    if t.dtype() != DType::F32 {
        return Err(NnError::Config(format!(
            "data-parallel training moves f32 tensors; {what} of shape {:?} is {}",
            like.dims().unwrap_or_default(),
            t.dtype()
        )));
    }
    Ok(t.to_vec::<f32>()?)
}

/// A tensor holding `data` with the shape and device of `like`.
fn from_host(data: Vec<f32>, like: &Tensor) -> Result<Tensor> {
    Ok(Tensor::from_vec_on(data, like.dims()?, like.device()))
}

/// Consecutive ranges of `tensors` of about `bucket_bytes` each (whole tensors, at least one).
fn buckets(tensors: &[Vec<f32>], bucket_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, t) in tensors.iter().enumerate() {
        bytes += std::mem::size_of_val(t.as_slice());
        if bytes >= bucket_bytes {
            out.push(start..i + 1);
            (start, bytes) = (i + 1, 0);
        }
    }
    if start < tensors.len() {
        out.push(start..tensors.len());
    }
    out
}

/// Splits `flat` back into `parts` (whose lengths sum to its length).
fn scatter(flat: &[f32], parts: &mut [Vec<f32>]) {
    let mut offset = 0;
    for part in parts {
        let n = part.len();
        part.copy_from_slice(&flat[offset..offset + n]);
        offset += n;
    }
}

/// Which samples of a dataset each rank trains on, deterministic by seed (PyTorch's
/// DistributedSampler, dropping the last incomplete global batch).
///
/// Every epoch the sample indices `0..len` are shuffled with `(seed, epoch)`; the same on every
/// rank. Global batch `s` is positions `s * G..(s + 1) * G` of that order (`G = size * batch`),
/// and rank `r` takes positions `s * G + r * batch..s * G + (r + 1) * batch` of it, so the ranks'
/// batches of step `s`, put together in rank order, are exactly the global batch one process
/// would take ([`ShardedSampler::global_batches`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardedSampler {
    len: usize,
    rank: usize,
    size: usize,
    seed: u64,
}

impl ShardedSampler {
    /// A sampler of `len` samples for `rank` of `size` ranks.
    pub fn new(len: usize, rank: usize, size: usize, seed: u64) -> Result<ShardedSampler> {
        if rank >= size {
            return Err(NnError::Config(format!("rank {rank} is not a rank of a group of {size}")));
        }
        Ok(ShardedSampler { len, rank, size, seed })
    }

    /// The order of the samples in `epoch` (every rank computes the same).
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        let mut state = self.seed ^ epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for i in (1..order.len()).rev() {
            let j = (splitmix64(&mut state) % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        order
    }

    /// This rank's batches of `batch` samples in `epoch`, one per step.
    pub fn local_batches(&self, epoch: u64, batch: usize) -> Vec<Vec<usize>> {
        let global = self.size * batch;
        if batch == 0 {
            return Vec::new();
        }
        let order = self.epoch_order(epoch);
        order.chunks_exact(global).map(|g| g[self.rank * batch..(self.rank + 1) * batch].to_vec()).collect()
    }

    /// The global batches of `epoch` (every rank's `batch` samples of a step, in rank order): what
    /// one process trains on to match the ranks together.
    pub fn global_batches(&self, epoch: u64, batch: usize) -> Vec<Vec<usize>> {
        if batch == 0 {
            return Vec::new();
        }
        self.epoch_order(epoch).chunks_exact(self.size * batch).map(<[usize]>::to_vec).collect()
    }

    /// The rows `indices` of `data` (along its first dimension): a batch of a dataset tensor.
    pub fn take(data: &Tensor, indices: &[usize]) -> Tensor {
        let ids: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        let n = ids.len();
        data.index_select(0, &Tensor::from_vec_on(ids, &[n], data.device()))
    }
}

/// The next number of a SplitMix64 sequence.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
