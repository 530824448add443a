//! The MPI backend (cargo feature `mpi`): one rank per process, over the system's MPI through
//! rsmpi (`MPI_COMM_WORLD`, launched by `mpirun`).
//!
//! # Bounded waits
//!
//! Every collective runs as MPI's non-blocking form (`MPI_Ireduce`, `MPI_Ibcast`,
//! `MPI_Iallgather`, `MPI_Ibarrier`) and the calling thread polls it with `MPI_Test` until it
//! completes or the group's timeout has passed since the call began. A poll that finds the
//! operation unfinished spins briefly, then yields, then sleeps (up to a millisecond), so a rank
//! waiting for a slow peer does not burn a core. Past the deadline the call returns
//! [`ErrorKind::Timeout`] naming the operation, the rank, the group's size and the wait (MPI does
//! not say which peer is missing, so `missing` is empty).
//!
//! # A failed group stays failed
//!
//! A started MPI collective cannot be cancelled: the operation left pending after a timeout may
//! still read or write its buffers whenever MPI makes progress. So a collective never hands MPI
//! the caller's slices: it copies them into staging buffers owned by the [`MpiCollective`] and
//! copies the result back only once the operation has completed. After a timeout the staging
//! buffers of the pending operation are moved aside and never freed, read or written again (they
//! are deliberately leaked when the collective is dropped), and the collective is *poisoned*:
//! every later call returns [`ErrorKind::GroupFailed`] at once, naming the first failure.
//!
//! Dropping a poisoned collective does not call `MPI_Finalize`. Open MPI 4.1's finalize waits for
//! every rank (a fence), so with a hung peer it never returns; the pending operation would also
//! violate finalize's precondition. The process instead exits without finalizing, which its
//! launcher reports (see below). A collective that never failed finalizes MPI when dropped.
//!
//! # What the launcher does (Open MPI 4.1, as `scripts/test-mpi.sh` tests it)
//!
//! - A hung peer (alive, never joining): the others get `Err(Timeout)` after the timeout. When
//!   such a rank then exits with a non-zero status, plain `mpirun` ends the job (the hung rank
//!   too) and exits with that status.
//! - A dead peer under plain `mpirun` (killed, crashed): `mpirun` notices and ends every other
//!   rank of the job at once (they get no `Err`), then exits non-zero naming the rank that died.
//! - A dead peer under `mpirun --enable-recovery`: the surviving ranks keep running, their
//!   pending collective reaches the deadline and they get `Err(Timeout)`, and can log, save and
//!   exit. Under that option `mpirun` does not end the job when a rank exits with an error (a
//!   hung peer keeps the job alive until it ends by itself) and it exits 0 whatever the ranks
//!   returned, so the ranks must report failure themselves (logs, files). (`--mca
//!   orte_abort_on_non_zero_status 0` is no substitute: the survivors get their `Err`, but
//!   `mpirun` itself never ends after a rank is killed.)
//!
//! Results are the same bits on every rank: a reduction goes to rank 0 (`MPI_Ireduce`) and is
//! broadcast from there, since `MPI_Allreduce` does not promise identical rounding everywhere.

use std::time::{Duration, Instant};

use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};

use crate::error::{DistError, ErrorKind, Op, ReduceOp, Result};
use crate::{BufMut, Collective, check_call};

/// The rank of this process in `MPI_COMM_WORLD`.
pub struct MpiCollective {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    timeout: Duration,
    /// The buffers MPI reads and writes (see the module doc), reused from call to call.
    staging: Staging,
    /// The first failure, after which the group is unusable.
    failed: Option<Failure>,
    /// Finalizes MPI when dropped; `None` only while the collective is being dropped.
    universe: Option<Universe>,
}

/// Why a collective is poisoned, and the buffers its pending operation may still use.
struct Failure {
    error: DistError,
    /// Never freed, read or written: MPI may write into them at any time.
    abandoned: Staging,
}

impl MpiCollective {
    /// How long a collective may wait for the other ranks by default.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

    /// Initializes MPI (threading level `Funneled`: only the calling thread uses MPI) with the
    /// default timeout. Fails if MPI was initialized already in this process.
    pub fn init() -> Result<MpiCollective> {
        MpiCollective::with_timeout(MpiCollective::DEFAULT_TIMEOUT)
    }

    /// [`MpiCollective::init`] with a collective timeout of `timeout`: a call that has not
    /// completed `timeout` after it began returns [`ErrorKind::Timeout`].
    pub fn with_timeout(timeout: Duration) -> Result<MpiCollective> {
        let Some((universe, _)) = mpi::initialize_with_threading(Threading::Funneled) else {
            return Err(DistError {
                op: Op::Barrier,
                rank: 0,
                size: 0,
                kind: ErrorKind::Backend("MPI was initialized already in this process".into()),
            });
        };
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        Ok(MpiCollective {
            world,
            rank,
            size,
            timeout,
            staging: Staging::default(),
            failed: None,
            universe: Some(universe),
        })
    }

    /// The collective timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The error that poisoned this collective, if a collective failed.
    pub fn failure(&self) -> Option<&DistError> {
        self.failed.as_ref().map(|f| &f.error)
    }

    /// An error if an earlier call failed; every call checks it first.
    fn check_healthy(&self, op: Op) -> Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(failure) => Err(self.error(op, ErrorKind::GroupFailed(failure.error.to_string()))),
        }
    }

    fn error(&self, op: Op, kind: ErrorKind) -> DistError {
        DistError { op, rank: self.rank, size: self.size, kind }
    }

    /// Turns the outcome of one call's MPI operations into its result. A call that ran out of
    /// time poisons the collective and sets its staging buffers aside for good.
    fn finish(&mut self, op: Op, started: Instant, completed: bool) -> Result<()> {
        if completed {
            return Ok(());
        }
        let error = self.error(op, ErrorKind::Timeout { waited: started.elapsed(), missing: Vec::new() });
        let abandoned = std::mem::take(&mut self.staging);
        self.failed = Some(Failure { error: error.clone(), abandoned });
        Err(error)
    }

    fn all_reduce_of<T: Element>(&mut self, buf: &mut [T], op: ReduceOp, deadline: Instant) -> bool {
        let [send, recv] = T::staging(&mut self.staging);
        send.clear();
        send.extend_from_slice(buf);
        recv.clear();
        recv.resize(buf.len(), T::default());
        let root = self.world.process_at_rank(0);
        let reduced = if self.rank == 0 {
            mpi::request::scope(|scope| {
                wait(root.immediate_reduce_into_root(scope, &send[..], &mut recv[..], system_op(op)), deadline)
            })
        } else {
            mpi::request::scope(|scope| wait(root.immediate_reduce_into(scope, &send[..], system_op(op)), deadline))
        };
        let done =
            reduced && mpi::request::scope(|scope| wait(root.immediate_broadcast_into(scope, &mut recv[..]), deadline));
        if done {
            buf.copy_from_slice(recv);
        }
        done
    }

    fn broadcast_of<T: Element>(&mut self, buf: &mut [T], root: usize, deadline: Instant) -> bool {
        let [data, _] = T::staging(&mut self.staging);
        data.clear();
        if self.rank == root {
            data.extend_from_slice(buf);
        } else {
            data.resize(buf.len(), T::default());
        }
        let root_process = self.world.process_at_rank(root as i32);
        let done =
            mpi::request::scope(|scope| wait(root_process.immediate_broadcast_into(scope, &mut data[..]), deadline));
        if done && self.rank != root {
            buf.copy_from_slice(data);
        }
        done
    }

    fn all_gather_of<T: Element>(&mut self, send: &[T], recv: &mut [T], deadline: Instant) -> bool {
        let [staged_send, staged_recv] = T::staging(&mut self.staging);
        staged_send.clear();
        staged_send.extend_from_slice(send);
        staged_recv.clear();
        staged_recv.resize(recv.len(), T::default());
        let world = &self.world;
        let done = mpi::request::scope(|scope| {
            wait(world.immediate_all_gather_into(scope, &staged_send[..], &mut staged_recv[..]), deadline)
        });
        if done {
            recv.copy_from_slice(staged_recv);
        }
        done
    }
}

impl Drop for MpiCollective {
    fn drop(&mut self) {
        let Some(failure) = self.failed.take() else {
            // `Universe`'s drop calls `MPI_Finalize`.
            drop(self.universe.take());
            return;
        };
        eprintln!(
            "kiln-dist: rank {} of {}: not finalizing MPI after a failed collective ({}); the launcher will report \
             that this process exited without MPI_Finalize",
            self.rank, self.size, failure.error
        );
        // The pending operation may still write into these, and MPI may still use the
        // communicator: neither is freed, and MPI is not finalized.
        std::mem::forget(failure.abandoned);
        std::mem::forget(self.universe.take());
    }
}

fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => SystemOperation::sum(),
        ReduceOp::Max => SystemOperation::max(),
        ReduceOp::Min => SystemOperation::min(),
    }
}

/// Polls `request` until it completes (true) or `deadline` passes (false). An operation left
/// pending is released from its scope without being completed: the caller must then keep the
/// buffers it uses alive and untouched for the rest of the process (see the module doc).
fn wait<'a, D: ?Sized, S: Scope<'a>>(request: Request<'a, D, S>, deadline: Instant) -> bool {
    let mut pending = Some(request);
    let completed =
        poll_until(deadline, || match pending.take().expect("the request is pending between polls").test() {
            Ok(_status) => true,
            Err(request) => {
                pending = Some(request);
                false
            }
        });
    if let Some(request) = pending {
        // SAFETY: `into_raw` wants the request completed while its buffers live. It will not be:
        // the caller moves the staging buffers (whose heap memory is what MPI holds) into the
        // collective's `Failure`, which never frees or touches them, so whatever MPI later
        // writes lands in memory nobody else uses. The raw handle is dropped unused.
        let _ = unsafe { request.into_raw() };
    }
    completed
}

/// How long a waiting rank polls without pausing, then polls yielding its core, before it
/// sleeps between polls.
const SPIN: Duration = Duration::from_micros(200);
const YIELD: Duration = Duration::from_millis(2);
/// The first and the longest sleep between polls (doubling in between).
const FIRST_SLEEP: Duration = Duration::from_micros(50);
const LONGEST_SLEEP: Duration = Duration::from_millis(1);

/// Calls `done` until it returns true (then true) or `deadline` passes (then false), pausing
/// between calls with a growing backoff. `done` is called at least once.
fn poll_until(deadline: Instant, mut done: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    let mut sleep = FIRST_SLEEP;
    loop {
        if done() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let waited = now - started;
        if waited < SPIN {
            std::hint::spin_loop();
        } else if waited < YIELD {
            std::thread::yield_now();
        } else {
            std::thread::sleep(sleep.min(deadline - now));
            sleep = (sleep * 2).min(LONGEST_SLEEP);
        }
    }
}

/// The staging buffers of each element type: two per type (a reduction's send and receive
/// buffers, an all-gather's).
#[derive(Default)]
struct Staging {
    f32: [Vec<f32>; 2],
    f64: [Vec<f64>; 2],
    i32: [Vec<i32>; 2],
}

/// An element type a collective moves, with its staging buffers.
trait Element: Equivalence + Copy + Default {
    fn staging(staging: &mut Staging) -> &mut [Vec<Self>; 2];
}

impl Element for f32 {
    fn staging(staging: &mut Staging) -> &mut [Vec<f32>; 2] {
        &mut staging.f32
    }
}

impl Element for f64 {
    fn staging(staging: &mut Staging) -> &mut [Vec<f64>; 2] {
        &mut staging.f64
    }
}

impl Element for i32 {
    fn staging(staging: &mut Staging) -> &mut [Vec<i32>; 2] {
        &mut staging.i32
    }
}

impl Collective for MpiCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let call = Op::AllReduce(op);
        self.check_healthy(call)?;
        check_call(call, self.rank, self.size, (&buf, None))?;
        let started = Instant::now();
        let deadline = started + self.timeout;
        let n = self.size;
        let done = match buf {
            BufMut::F32(b) => {
                let done = self.all_reduce_of(b, op, deadline);
                if done && op == ReduceOp::Mean {
                    b.iter_mut().for_each(|x| *x /= n as f32);
                }
                done
            }
            BufMut::F64(b) => {
                let done = self.all_reduce_of(b, op, deadline);
                if done && op == ReduceOp::Mean {
                    b.iter_mut().for_each(|x| *x /= n as f64);
                }
                done
            }
            BufMut::I32(b) => self.all_reduce_of(b, op, deadline),
        };
        self.finish(call, started, done)
    }

    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> Result<()> {
        let call = Op::Broadcast { root };
        self.check_healthy(call)?;
        check_call(call, self.rank, self.size, (&buf, None))?;
        let started = Instant::now();
        let deadline = started + self.timeout;
        let done = match buf {
            BufMut::F32(b) => self.broadcast_of(b, root, deadline),
            BufMut::F64(b) => self.broadcast_of(b, root, deadline),
            BufMut::I32(b) => self.broadcast_of(b, root, deadline),
        };
        self.finish(call, started, done)
    }

    fn all_gather(&mut self, send: BufMut<'_>, recv: BufMut<'_>) -> Result<()> {
        self.check_healthy(Op::AllGather)?;
        check_call(Op::AllGather, self.rank, self.size, (&send, Some(&recv)))?;
        let started = Instant::now();
        let deadline = started + self.timeout;
        let done = match (send, recv) {
            (BufMut::F32(s), BufMut::F32(r)) => self.all_gather_of(s, r, deadline),
            (BufMut::F64(s), BufMut::F64(r)) => self.all_gather_of(s, r, deadline),
            (BufMut::I32(s), BufMut::I32(r)) => self.all_gather_of(s, r, deadline),
            _ => unreachable!("check_call compared the buffers' types"),
        };
        self.finish(Op::AllGather, started, done)
    }

    fn barrier(&mut self) -> Result<()> {
        self.check_healthy(Op::Barrier)?;
        let started = Instant::now();
        let done = wait(self.world.immediate_barrier(), started + self.timeout);
        self.finish(Op::Barrier, started, done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_until_returns_once_done() {
        let mut calls = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        assert!(poll_until(deadline, || {
            calls += 1;
            calls == 3
        }));
        assert_eq!(calls, 3);
    }

    #[test]
    fn poll_until_gives_up_at_the_deadline_without_spinning() {
        let timeout = Duration::from_millis(300);
        let started = Instant::now();
        let mut calls = 0u64;
        assert!(!poll_until(started + timeout, || {
            calls += 1;
            false
        }));
        let waited = started.elapsed();
        assert!(waited >= timeout, "gave up after {waited:?}, before the deadline");
        assert!(waited < timeout + Duration::from_millis(200), "gave up only after {waited:?}");
        // Spinning the whole time would poll millions of times; sleeping up to 1 ms after the
        // first 2 ms leaves a few thousand at most.
        assert!(calls < 20_000, "{calls} polls in {waited:?}: the wait does not back off");
    }
}
