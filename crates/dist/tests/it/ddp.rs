//! Data-parallel training on the in-process backend: ranks stay bitwise identical and match one
//! process trained on the global batch; a dead or hung rank is an `Err` on the others, not a
//! hang; a checkpoint resumes with the same losses.

use crate::scenario;

use std::time::{Duration, Instant};

use kiln_dist::{Collective, ErrorKind, ThreadCollective, ThreadGroup};
use kiln_nn::{Adam, DistributedTrainer, Loss, NnError, ShardedSampler};
use scenario::*;

type RankResult = kiln_nn::Result<RankRun>;

/// Runs `f` on every handle of `handles`, each on its own thread; returns the results by rank.
fn on_threads<R: Send>(handles: Vec<ThreadCollective>, f: impl Fn(ThreadCollective) -> R + Sync) -> Vec<R> {
    ThreadGroup::run(handles, f).into_iter().map(|r| r.expect("a rank panicked")).collect()
}

#[test]
fn two_ranks_stay_identical_and_match_one_process_on_the_global_batch() {
    const STEPS: usize = 10;
    let weights = initial_weights(&TEST);
    let shared = weights.clone();
    let results: Vec<RankResult> =
        on_threads(ThreadGroup::new(2), move |comm| train_ranks(comm, &TEST, &shared, STEPS, |_, _| {}));
    let results: Vec<_> = results.into_iter().map(|r| r.expect("rank trains")).collect();
    let (losses0, params0) = (&results[0].losses, &results[0].params);
    let (losses1, params1) = (&results[1].losses, &results[1].params);
    assert!(bitwise_equal(params0, params1), "ranks' parameters differ: max {:e}", max_difference(params0, params1));
    assert!(results.iter().all(|r| r.identical_across_ranks), "the all-gather check agrees");
    assert_eq!(losses0, losses1, "every rank reports the global loss");
    let (ref_losses, ref_params) = train_reference(&TEST, &weights, 2, STEPS);
    let worst = max_difference(params0, &ref_params);
    eprintln!("2 ranks vs one process, {STEPS} steps: max parameter difference {worst:.2e}");
    eprintln!("losses {losses0:?}\nreference {ref_losses:?}");
    assert!(worst <= 1e-6, "max parameter difference {worst:e} from one process on the global batch");
    for (a, b) in losses0.iter().zip(&ref_losses) {
        assert!((a - b).abs() <= 1e-5, "losses {losses0:?} vs {ref_losses:?}");
    }
    assert!(losses0[STEPS - 1] < losses0[0], "the loss goes down: {losses0:?}");
    let moved = max_difference(params0, &parameters(&model_from(&TEST, &weights)));
    assert!(moved > 1e-3, "training moved the parameters ({moved:e})");
}

#[test]
fn a_rank_that_leaves_is_an_error_on_the_others_not_a_hang() {
    let weights = initial_weights(&TEST);
    let started = Instant::now();
    // Rank 1 panics after its third step: its handle is dropped while unwinding.
    let results: Vec<std::thread::Result<RankResult>> = ThreadGroup::run(ThreadGroup::new(2), move |comm| {
        train_ranks(comm, &TEST, &weights, 10, |rank, step| {
            if rank == 1 && step == 2 {
                panic!("rank 1 dies");
            }
        })
    });
    assert!(results[1].is_err(), "rank 1 died");
    let Ok(Err(NnError::Dist(e))) = &results[0] else { panic!("rank 0 should fail with a collective error") };
    assert_eq!(e.rank, 0);
    assert_eq!(e.kind, ErrorKind::PeerGone { peer: 1 }, "{e}");
    assert!(e.to_string().contains("all_reduce(mean) on rank 0 of 2"), "{e}");
    assert!(started.elapsed() < ThreadGroup::DEFAULT_TIMEOUT, "failed promptly, not by the timeout");
}

#[test]
fn a_hung_rank_times_out_on_the_others() {
    let weights = initial_weights(&TEST);
    let timeout = Duration::from_millis(1500);
    let results: Vec<(RankResult, Duration)> = on_threads(ThreadGroup::with_timeout(3, timeout), move |comm| {
        let w = weights.clone();
        let mut stalled_at = None;
        let result = train_ranks(comm, &TEST, &w, 10, |rank, step| {
            if rank == 2 && step == 1 {
                stalled_at = Some(Instant::now());
                // Hangs (alive, holding its handle) well past the others' timeout.
                std::thread::sleep(4 * timeout);
            }
        });
        (result, stalled_at.map(|t| t.elapsed()).unwrap_or_default())
    });
    for (rank, (result, _)) in results.iter().enumerate() {
        let Err(NnError::Dist(e)) = result else { panic!("rank {rank} should fail") };
        eprintln!("rank {rank}: {e}");
        match rank {
            // One of ranks 0 and 1 times out first; the other sees the group failed.
            0 | 1 => assert!(
                matches!(&e.kind, ErrorKind::Timeout { missing, .. } if missing == &[2])
                    || matches!(e.kind, ErrorKind::GroupFailed(_)),
                "{e}"
            ),
            _ => assert!(matches!(e.kind, ErrorKind::GroupFailed(_)), "the late rank finds the group failed: {e}"),
        }
    }
    assert!(
        results.iter().any(|(r, _)| matches!(r, Err(NnError::Dist(e)) if matches!(e.kind, ErrorKind::Timeout { .. })))
    );
}

#[test]
fn a_checkpoint_resumes_with_the_same_losses_and_parameters() {
    let dir = std::env::temp_dir().join(format!("kiln-dist-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ckpt.safetensors");
    let weights = initial_weights(&TEST);
    // Adam: its step count enters the bias corrections, so a wrong restore changes the losses.
    let run = move |comm: ThreadCollective, resume: Option<std::path::PathBuf>, save: Option<std::path::PathBuf>| {
        let (rank, size) = (comm.rank(), comm.size());
        let model = model_from(&TEST, &weights);
        let mut trainer = DistributedTrainer::new(model, Adam::new(0.01), Loss::CrossEntropy, comm)?;
        let (x, y) = dataset(&TEST, size * TEST.local_batch * 6);
        let batches =
            ShardedSampler::new(size * TEST.local_batch * 6, rank, size, SEED)?.local_batches(0, TEST.local_batch);
        let first = if let Some(p) = &resume {
            trainer.load_checkpoint(p)?;
            trainer.steps() as usize
        } else {
            0
        };
        let mut losses = Vec::new();
        for (step, b) in batches.iter().enumerate().skip(first) {
            losses.push(trainer.step(&ShardedSampler::take(&x, b), &ShardedSampler::take(&y, b))?);
            if step == 2
                && let Some(p) = &save
            {
                trainer.save_checkpoint(p)?;
            }
        }
        Ok::<_, NnError>((losses, parameters(&trainer.model)))
    };
    let run = std::sync::Arc::new(run);
    let (r, p) = (run.clone(), path.clone());
    let straight = on_threads(ThreadGroup::new(2), move |c| r(c, None, Some(p.clone())).unwrap());
    assert!(path.exists(), "rank 0 wrote the checkpoint");
    let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert_eq!(leftovers.len(), 1, "no temporary file is left: {leftovers:?}");
    let (r, p) = (run.clone(), path.clone());
    let resumed = on_threads(ThreadGroup::new(2), move |c| r(c, Some(p.clone()), None).unwrap());
    for rank in 0..2 {
        assert_eq!(resumed[rank].0, straight[rank].0[3..], "rank {rank}: losses of steps 4-6 after resuming");
        assert!(bitwise_equal(&resumed[rank].1, &straight[rank].1), "rank {rank}: final parameters");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_sampler_shards_each_global_batch_in_rank_order() {
    let samplers: Vec<ShardedSampler> = (0..3).map(|r| ShardedSampler::new(50, r, 3, 9).unwrap()).collect();
    let global = samplers[0].global_batches(1, 4);
    assert_eq!(global.len(), 4, "50 samples make 4 global batches of 12, the rest is dropped");
    let locals: Vec<_> = samplers.iter().map(|s| s.local_batches(1, 4)).collect();
    for (step, g) in global.iter().enumerate() {
        let joined: Vec<usize> = locals.iter().flat_map(|l| l[step].clone()).collect();
        assert_eq!(&joined, g, "step {step}");
    }
    let mut all: Vec<usize> = global.concat();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 48, "no sample twice in an epoch");
    assert_eq!(samplers[1].local_batches(1, 4), samplers[1].local_batches(1, 4), "deterministic");
    assert_ne!(samplers[1].epoch_order(1), samplers[1].epoch_order(2), "each epoch shuffles anew");
    assert!(ShardedSampler::new(10, 3, 3, 0).is_err(), "rank 3 of 3");
}
