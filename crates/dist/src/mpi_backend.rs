//! The MPI backend (cargo feature `mpi`): one rank per process, over the system's MPI through rsmpi
//! (`MPI_COMM_WORLD`, launched by `mpirun`).
//!
//! # Bounded waits
//!
//! Every collective runs as MPI's non-blocking form (`MPI_Ireduce`, `MPI_Ibcast`, `MPI_Iallgather`,
//! `MPI_Ibarrier`) and the calling thread polls it with `MPI_Test` until it completes or the
//! group's timeout has passed since the call began. Between polls it spins briefly, then yields its
//! core, and once the call has taken longer than its data could need, it sleeps (up to a
//! millisecond), so a rank waiting out a hung peer does not burn a core (see `Patience`). Past the
//! deadline the call returns [`ErrorKind::Timeout`] naming the operation, the rank, the group's
//! size and the wait (MPI does not say which peer is missing, so `missing` is empty). There is no
//! watchdog thread and nothing ends the process: the caller decides.
//!
//! # A failed group stays failed
//!
//! A started MPI collective cannot be cancelled: the operation left pending after a timeout may
//! still read or write its buffers whenever MPI makes progress. So a collective never hands MPI the
//! caller's slices: it copies them into staging buffers owned by the [`MpiCollective`] and copies
//! the result back only once the operation has completed (one copy in and one out per call; the
//! staging buffers are reused, so steady calls allocate nothing). After a timeout the staging
//! buffers of the pending operation are moved aside and never freed, read or written again (they
//! are deliberately leaked when the collective is dropped), and the collective is *poisoned*: every
//! later call returns [`ErrorKind::GroupFailed`] at once, naming the first failure.
//!
//! Dropping a poisoned collective does not call `MPI_Finalize` (it prints one line saying so). Open
//! MPI 4.1's finalize waits for every rank, so with a hung peer it never returns (tested); and
//! finalizing with an operation pending is erroneous in MPI anyway. The process goes on (to log,
//! save a checkpoint) and exits without finalizing, which its launcher reports (see below). MPI
//! cannot be initialized again in that process. A collective that never failed finalizes MPI when
//! dropped.
//!
//! # What the launcher does (Open MPI 4.1, as `scripts/test-mpi.sh` tests it)
//!
//! - A hung peer (alive, never joining): the others get `Err(Timeout)` after the timeout. When
//!   such a rank then exits with a non-zero status, plain `mpirun` ends the job (the hung rank
//!   too) and exits with that status. No rank hangs and no job outlives the timeout by more than the time
//!   the ranks take to exit.
//! - A dead peer under plain `mpirun` (killed, crashed): `mpirun` notices and ends every other rank
//!   of the job at once (they get no `Err`), then exits non-zero naming the rank that died.
//! - A dead peer under `mpirun --enable-recovery -n N program` (the launch line for ranks that must
//!   outlive a dead peer): the surviving ranks keep running, their pending collective reaches the
//!   deadline and they get `Err(Timeout)`, and can log, save and exit. Under that option `mpirun`
//!   does not end the job when a rank exits with an error (a hung peer keeps the job alive until it
//!   ends by itself) and it exits 0 whatever the ranks returned, so the ranks must report failure
//!   themselves (logs, files). (`--mca orte_abort_on_non_zero_status 0` is no substitute: the
//!   survivors get their `Err`, but `mpirun` itself never ends after a rank is killed.)
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

    fn all_reduce_of<T: Element>(&mut self, buf: &mut [T], op: ReduceOp, started: Instant) -> bool {
        let patience = &Patience::new(started, self.timeout, std::mem::size_of_val(buf));
        let [send, recv] = T::staging(&mut self.staging);
        send.clear();
        send.extend_from_slice(buf);
        // MPI overwrites `recv` whole: only its length matters (unchanged from call to call
        // when the buckets are, so this costs nothing then).
        recv.resize(buf.len(), T::default());
        let root = self.world.process_at_rank(0);
        let reduced = if self.rank == 0 {
            mpi::request::scope(|scope| {
                wait(root.immediate_reduce_into_root(scope, &send[..], &mut recv[..], system_op(op)), patience)
            })
        } else {
            mpi::request::scope(|scope| wait(root.immediate_reduce_into(scope, &send[..], system_op(op)), patience))
        };
        let done =
            reduced && mpi::request::scope(|scope| wait(root.immediate_broadcast_into(scope, &mut recv[..]), patience));
        if done {
            buf.copy_from_slice(recv);
        }
        done
    }

    fn broadcast_of<T: Element>(&mut self, buf: &mut [T], root: usize, started: Instant) -> bool {
        let patience = &Patience::new(started, self.timeout, std::mem::size_of_val(buf));
        let [data, _] = T::staging(&mut self.staging);
        if self.rank == root {
            data.clear();
            data.extend_from_slice(buf);
        } else {
            data.resize(buf.len(), T::default());
        }
        let root_process = self.world.process_at_rank(root as i32);
        let done =
            mpi::request::scope(|scope| wait(root_process.immediate_broadcast_into(scope, &mut data[..]), patience));
        if done && self.rank != root {
            buf.copy_from_slice(data);
        }
        done
    }

    fn all_gather_of<T: Element>(&mut self, send: &[T], recv: &mut [T], started: Instant) -> bool {
        let patience = &Patience::new(started, self.timeout, std::mem::size_of_val(recv));
        let [staged_send, staged_recv] = T::staging(&mut self.staging);
        staged_send.clear();
        staged_send.extend_from_slice(send);
        staged_recv.resize(recv.len(), T::default());
        let world = &self.world;
        let done = mpi::request::scope(|scope| {
            wait(world.immediate_all_gather_into(scope, &staged_send[..], &mut staged_recv[..]), patience)
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
        // One write, so that a launcher merging the ranks' output keeps the line whole.
        let message = format!(
            "kiln-dist: rank {} of {}: not finalizing MPI after a failed collective ({}); the launcher will report \
             that this process exited without MPI_Finalize\n",
            self.rank, self.size, failure.error
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr(), message.as_bytes());
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

/// Polls `request` until it completes (true) or the deadline passes (false). An operation left
/// pending is released from its scope without being completed: the caller must then keep the
/// buffers it uses alive and untouched for the rest of the process (see the module doc).
fn wait<'a, D: ?Sized, S: Scope<'a>>(request: Request<'a, D, S>, patience: &Patience) -> bool {
    let mut pending = Some(request);
    let completed =
        poll_until(patience, || match pending.take().expect("the request is pending between polls").test() {
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

/// How a call waits: until when, and how long it polls without sleeping.
///
/// MPI makes progress on a pending operation only inside MPI calls, here `MPI_Test`: a large
/// message moves in many fragments, each needing both sides to poll, so a rank that sleeps while
/// data flows slows the collective down by its sleeps (a 4 MiB all-reduce took a second with
/// 1 ms sleeps from the start, against 6 ms spinning). A rank therefore polls without sleeping
/// (spinning briefly, then yielding its core to any other runnable thread between polls) for
/// [`BUSY_FOR`] plus [`BUSY_PER_BYTE`] per byte of the call, long enough for a collective whose
/// peers are all there; past that it is waiting for a peer and sleeps between polls, from
/// [`FIRST_SLEEP`] doubling to [`LONGEST_SLEEP`], so a rank waiting out a hung peer's timeout
/// does not burn a core.
struct Patience {
    deadline: Instant,
    busy_for: Duration,
}

/// How long a wait spins before it yields between polls.
const SPIN: Duration = Duration::from_micros(50);
/// How long any wait polls without sleeping.
const BUSY_FOR: Duration = Duration::from_millis(100);
/// How much longer a wait polls without sleeping per byte of the call's data.
const BUSY_PER_BYTE: Duration = Duration::from_nanos(16);
/// The first sleep between polls.
const FIRST_SLEEP: Duration = Duration::from_micros(50);
/// The longest sleep between polls (the sleeps double up to it).
const LONGEST_SLEEP: Duration = Duration::from_millis(1);

impl Patience {
    /// A call begun at `started` that may take `timeout` and moves `bytes` bytes per rank.
    fn new(started: Instant, timeout: Duration, bytes: usize) -> Patience {
        let per_byte = BUSY_PER_BYTE.saturating_mul(u32::try_from(bytes).unwrap_or(u32::MAX));
        Patience { deadline: started + timeout, busy_for: BUSY_FOR.saturating_add(per_byte) }
    }
}

/// Calls `done` until it returns true (then true) or the deadline passes (then false), pausing
/// between calls as [`Patience`] says. `done` is called at least once.
fn poll_until(patience: &Patience, mut done: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    let mut sleep = FIRST_SLEEP;
    loop {
        if done() {
            return true;
        }
        let now = Instant::now();
        if now >= patience.deadline {
            return false;
        }
        let waited = now - started;
        if waited < SPIN {
            std::hint::spin_loop();
        } else if waited < patience.busy_for {
            std::thread::yield_now();
        } else {
            std::thread::sleep(sleep.min(patience.deadline - now));
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
        let n = self.size;
        let done = match buf {
            BufMut::F32(b) => {
                let done = self.all_reduce_of(b, op, started);
                if done && op == ReduceOp::Mean {
                    b.iter_mut().for_each(|x| *x /= n as f32);
                }
                done
            }
            BufMut::F64(b) => {
                let done = self.all_reduce_of(b, op, started);
                if done && op == ReduceOp::Mean {
                    b.iter_mut().for_each(|x| *x /= n as f64);
                }
                done
            }
            BufMut::I32(b) => self.all_reduce_of(b, op, started),
        };
        self.finish(call, started, done)
    }

    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> Result<()> {
        let call = Op::Broadcast { root };
        self.check_healthy(call)?;
        check_call(call, self.rank, self.size, (&buf, None))?;
        let started = Instant::now();
        let done = match buf {
            BufMut::F32(b) => self.broadcast_of(b, root, started),
            BufMut::F64(b) => self.broadcast_of(b, root, started),
            BufMut::I32(b) => self.broadcast_of(b, root, started),
        };
        self.finish(call, started, done)
    }

    fn all_gather(&mut self, send: BufMut<'_>, recv: BufMut<'_>) -> Result<()> {
        self.check_healthy(Op::AllGather)?;
        check_call(Op::AllGather, self.rank, self.size, (&send, Some(&recv)))?;
        let started = Instant::now();
        let done = match (send, recv) {
            (BufMut::F32(s), BufMut::F32(r)) => self.all_gather_of(s, r, started),
            (BufMut::F64(s), BufMut::F64(r)) => self.all_gather_of(s, r, started),
            (BufMut::I32(s), BufMut::I32(r)) => self.all_gather_of(s, r, started),
            _ => unreachable!("check_call compared the buffers' types"),
        };
        self.finish(Op::AllGather, started, done)
    }

    fn barrier(&mut self) -> Result<()> {
        self.check_healthy(Op::Barrier)?;
        let started = Instant::now();
        let done = wait(self.world.immediate_barrier(), &Patience::new(started, self.timeout, 0));
        self.finish(Op::Barrier, started, done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_until_returns_once_done() {
        let mut calls = 0;
        let patience = Patience::new(Instant::now(), Duration::from_secs(60), 0);
        assert!(poll_until(&patience, || {
            calls += 1;
            calls == 3
        }));
        assert_eq!(calls, 3);
    }

    #[test]
    fn poll_until_gives_up_at_the_deadline_without_spinning() {
        let timeout = Duration::from_millis(300);
        let started = Instant::now();
        // Sleeping after 5 ms of polling.
        let busy_for = Duration::from_millis(5);
        let patience = Patience { deadline: started + timeout, busy_for };
        let mut calls_after_busy = 0u64;
        assert!(!poll_until(&patience, || {
            // The first 5 ms spin and yield, which polls as often as the machine allows (tens of
            // thousands of times on a fast, idle core): only the calls after them are counted.
            if started.elapsed() > busy_for + Duration::from_millis(1) {
                calls_after_busy += 1;
            }
            false
        }));
        let waited = started.elapsed();
        assert!(waited >= timeout, "gave up after {waited:?}, before the deadline");
        assert!(waited < timeout + Duration::from_millis(200), "gave up only after {waited:?}");
        // Sleeping from 50 us, doubling up to 1 ms, polls about 300 times in the remaining
        // ~294 ms; spinning or yielding would poll hundreds of thousands of times.
        assert!(calls_after_busy < 1_000, "{calls_after_busy} polls after the busy phase: the wait does not back off");
    }
}
