//! The MPI backend (cargo feature `mpi`): one rank per process, over the system's MPI through
//! rsmpi (`MPI_COMM_WORLD`, launched by `mpirun`).
//!
//! Failure behaviour. An MPI collective cannot be interrupted and rsmpi does not return MPI's
//! error codes, so this backend cannot turn a dead peer into an `Err` from the blocked call.
//! What happens instead, as tested with Open MPI 4.1 (`scripts/test-mpi.sh`):
//! - A rank that dies (killed, crashed, exited without finalizing): `mpirun` notices and
//!   terminates every other rank of the job, then exits non-zero naming the rank that died.
//! - A rank that hangs (alive, never joining the collective): nothing in MPI notices. A
//!   watchdog thread of each [`MpiCollective`] watches every call; past the timeout it prints
//!   the operation, the rank and how long it waited, and exits the process with
//!   [`MpiCollective::TIMEOUT_EXIT_CODE`], after which `mpirun` ends the job as above.
//!
//! Either way every rank ends within a bounded time and the launcher reports an error; no job
//! hangs. Results are the same bits on every rank: a reduction goes to rank 0 (`MPI_Reduce`) and
//! is broadcast from there, since `MPI_Allreduce` does not promise identical rounding
//! everywhere.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};

use crate::error::{DistError, ErrorKind, Op, ReduceOp, Result};
use crate::{BufMut, Collective, check_call};

/// The rank of this process in `MPI_COMM_WORLD`.
pub struct MpiCollective {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    watchdog: Watchdog,
    /// Finalizes MPI when dropped: declared last so it is dropped after `world`.
    _universe: Universe,
}

impl MpiCollective {
    /// The exit code of a process whose collective timed out.
    pub const TIMEOUT_EXIT_CODE: i32 = 70;

    /// How long a collective may take by default before the watchdog ends the process.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

    /// Initializes MPI (threading level `Funneled`: only the calling thread uses MPI) with the
    /// default timeout. Fails if MPI was initialized already in this process.
    pub fn init() -> Result<MpiCollective> {
        MpiCollective::with_timeout(MpiCollective::DEFAULT_TIMEOUT)
    }

    /// [`MpiCollective::init`] with a collective timeout of `timeout`.
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
        let watchdog = Watchdog::start(rank, size, timeout).map_err(|e| DistError {
            op: Op::Barrier,
            rank,
            size,
            kind: ErrorKind::Backend(format!("cannot start the watchdog thread: {e}")),
        })?;
        Ok(MpiCollective { world, rank, size, watchdog, _universe: universe })
    }

    /// The collective timeout.
    pub fn timeout(&self) -> Duration {
        self.watchdog.timeout
    }

    /// Runs `f` (one MPI call) under the watchdog.
    fn guarded<R>(&self, op: Op, f: impl FnOnce(&SimpleCommunicator) -> R) -> R {
        self.watchdog.arm(op);
        let result = f(&self.world);
        self.watchdog.disarm();
        result
    }
}

fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => SystemOperation::sum(),
        ReduceOp::Max => SystemOperation::max(),
        ReduceOp::Min => SystemOperation::min(),
    }
}

/// Reduces `buf` to rank 0 and broadcasts the result back into `buf` on every rank.
fn reduce_then_broadcast<T: Equivalence + Copy>(world: &SimpleCommunicator, buf: &mut [T], op: ReduceOp) {
    let root = world.process_at_rank(0);
    if world.rank() == 0 {
        let send = buf.to_vec();
        root.reduce_into_root(&send[..], buf, system_op(op));
    } else {
        root.reduce_into(&buf[..], system_op(op));
    }
    root.broadcast_into(buf);
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
        check_call(call, self.rank, self.size, (&buf, None))?;
        let n = self.size;
        self.guarded(call, |world| match buf {
            BufMut::F32(b) => {
                reduce_then_broadcast(world, b, op);
                if op == ReduceOp::Mean {
                    b.iter_mut().for_each(|x| *x /= n as f32);
                }
            }
            BufMut::F64(b) => {
                reduce_then_broadcast(world, b, op);
                if op == ReduceOp::Mean {
                    b.iter_mut().for_each(|x| *x /= n as f64);
                }
            }
            BufMut::I32(b) => reduce_then_broadcast(world, b, op),
        });
        Ok(())
    }

    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> Result<()> {
        let call = Op::Broadcast { root };
        check_call(call, self.rank, self.size, (&buf, None))?;
        self.guarded(call, |world| {
            let root = world.process_at_rank(root as i32);
            match buf {
                BufMut::F32(b) => root.broadcast_into(b),
                BufMut::F64(b) => root.broadcast_into(b),
                BufMut::I32(b) => root.broadcast_into(b),
            }
        });
        Ok(())
    }

    fn all_gather(&mut self, send: BufMut<'_>, recv: BufMut<'_>) -> Result<()> {
        check_call(Op::AllGather, self.rank, self.size, (&send, Some(&recv)))?;
        self.guarded(Op::AllGather, |world| match (send, recv) {
            (BufMut::F32(s), BufMut::F32(r)) => world.all_gather_into(&s[..], r),
            (BufMut::F64(s), BufMut::F64(r)) => world.all_gather_into(&s[..], r),
            (BufMut::I32(s), BufMut::I32(r)) => world.all_gather_into(&s[..], r),
            _ => unreachable!("check_call compared the buffers' types"),
        });
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        self.guarded(Op::Barrier, |world| world.barrier());
        Ok(())
    }
}

/// A thread that ends the process when an MPI call runs past the timeout.
struct Watchdog {
    timeout: Duration,
    shared: Arc<(Mutex<Armed>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Armed {
    /// The call in progress and when it started.
    call: Option<(Op, Instant)>,
    stop: bool,
}

impl Watchdog {
    fn start(rank: usize, size: usize, timeout: Duration) -> std::io::Result<Watchdog> {
        let shared = Arc::new((Mutex::new(Armed::default()), Condvar::new()));
        let watched = Arc::clone(&shared);
        let thread = std::thread::Builder::new().name("kiln-dist-watchdog".into()).spawn(move || {
            let (lock, wake) = &*watched;
            let mut armed = lock.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if armed.stop {
                    return;
                }
                armed = match armed.call {
                    None => wake.wait(armed).unwrap_or_else(PoisonError::into_inner),
                    Some((op, started)) => {
                        let waited = started.elapsed();
                        if waited >= timeout {
                            let error =
                                DistError { op, rank, size, kind: ErrorKind::Timeout { waited, missing: Vec::new() } };
                            eprintln!("kiln-dist: {error} (a peer is hung or gone); ending this process");
                            std::process::exit(MpiCollective::TIMEOUT_EXIT_CODE);
                        }
                        wake.wait_timeout(armed, timeout - waited).unwrap_or_else(PoisonError::into_inner).0
                    }
                };
            }
        })?;
        Ok(Watchdog { timeout, shared, thread: Some(thread) })
    }

    fn set(&self, f: impl FnOnce(&mut Armed)) {
        let (lock, wake) = &*self.shared;
        f(&mut lock.lock().unwrap_or_else(PoisonError::into_inner));
        wake.notify_all();
    }

    fn arm(&self, op: Op) {
        self.set(|a| a.call = Some((op, Instant::now())));
    }

    fn disarm(&self) {
        self.set(|a| a.call = None);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.set(|a| a.stop = true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
