//! The in-process backend: ranks are threads of one process that meet in shared memory.
//!
//! Each collective is a numbered *round*: every rank leaves its contribution in the round's slot
//! and waits; the rank that completes the round computes the result once (reducing in rank
//! order, so it is deterministic) and every rank copies that one result. Waiting is bounded:
//! a rank that left the group (its handle dropped: the thread ended or panicked) fails the
//! round at once with [`ErrorKind::PeerGone`], and a rank that never comes fails it after the
//! group's timeout with [`ErrorKind::Timeout`]. Either failure marks the whole group failed, so
//! every other rank's current and later calls return [`ErrorKind::GroupFailed`] promptly.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::error::{DistError, ErrorKind, Op, ReduceOp, Result};
use crate::{BufMut, Collective, check_call};

/// Creates in-process groups; see [`ThreadGroup::new`].
#[derive(Debug)]
pub struct ThreadGroup;

impl ThreadGroup {
    /// How long a rank waits for the others by default before the collective fails.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

    /// The `n` handles (ranks `0..n`, in order) of a new group with the default timeout; move
    /// each to its own thread. Panics if `n` is 0 (a group has at least one rank).
    #[expect(clippy::new_ret_no_self, reason = "a group exists only as its ranks' handles")]
    pub fn new(n: usize) -> Vec<ThreadCollective> {
        ThreadGroup::with_timeout(n, ThreadGroup::DEFAULT_TIMEOUT)
    }

    /// [`ThreadGroup::new`] where a rank waits at most `timeout` for the others in a collective.
    pub fn with_timeout(n: usize, timeout: Duration) -> Vec<ThreadCollective> {
        assert!(n > 0, "a thread group needs at least one rank");
        let shared = Arc::new(Shared {
            size: n,
            timeout,
            state: Mutex::new(State { rounds: HashMap::new(), gone: vec![false; n], failed: None }),
            changed: Condvar::new(),
        });
        (0..n).map(|rank| ThreadCollective { rank, next_round: 0, shared: Arc::clone(&shared) }).collect()
    }
}

impl ThreadGroup {
    /// Runs `f` on every handle of `handles` (from [`ThreadGroup::new`]), each on its own scoped
    /// thread, and returns what each returned, by rank (`Err` with the panic of a rank that
    /// panicked; its handle is dropped while unwinding, so the other ranks fail rather than wait).
    pub fn run<R: Send>(
        handles: Vec<ThreadCollective>,
        f: impl Fn(ThreadCollective) -> R + Sync,
    ) -> Vec<std::thread::Result<R>> {
        let f = &f;
        std::thread::scope(|scope| {
            let threads: Vec<_> = handles.into_iter().map(|comm| scope.spawn(move || f(comm))).collect();
            threads.into_iter().map(|t| t.join()).collect()
        })
    }
}

/// One rank of an in-process group (from [`ThreadGroup::new`]). Dropping it tells the other
/// ranks this one is gone.
#[derive(Debug)]
pub struct ThreadCollective {
    rank: usize,
    next_round: u64,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug)]
struct State {
    rounds: HashMap<u64, Round>,
    gone: Vec<bool>,
    /// Why the group failed, once a round failed on some rank.
    failed: Option<String>,
}

#[derive(Debug)]
struct Round {
    parts: Vec<Option<(Op, Payload)>>,
    result: Option<std::result::Result<Arc<Payload>, ErrorKind>>,
    taken: usize,
}

/// A rank's contribution, or a round's result.
#[derive(Clone, Debug, PartialEq)]
enum Payload {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    Empty,
}

impl Payload {
    fn of(buf: &BufMut<'_>) -> Payload {
        match buf {
            BufMut::F32(v) => Payload::F32(v.to_vec()),
            BufMut::F64(v) => Payload::F64(v.to_vec()),
            BufMut::I32(v) => Payload::I32(v.to_vec()),
        }
    }

    fn describe(&self) -> String {
        match self {
            Payload::F32(v) => format!("{} f32", v.len()),
            Payload::F64(v) => format!("{} f64", v.len()),
            Payload::I32(v) => format!("{} i32", v.len()),
            Payload::Empty => "nothing".into(),
        }
    }

    /// Copies the payload into `buf` (same type and length: the round checked them).
    fn write_to(&self, buf: BufMut<'_>) {
        match (self, buf) {
            (Payload::F32(v), BufMut::F32(b)) => b.copy_from_slice(v),
            (Payload::F64(v), BufMut::F64(b)) => b.copy_from_slice(v),
            (Payload::I32(v), BufMut::I32(b)) => b.copy_from_slice(v),
            (p, b) => panic!("a round's result ({}) does not fit its buffer ({} {})", p.describe(), b.len(), b.dtype()),
        }
    }
}

/// An element type the thread backend reduces.
trait Elem: Copy + PartialOrd + std::ops::Add<Output = Self> {
    fn slice(p: &Payload) -> &[Self];
    fn wrap(v: Vec<Self>) -> Payload;
    fn divide(sum: Self, n: usize) -> Self;
}

macro_rules! elem {
    ($t:ty, $variant:ident, $divide:expr) => {
        impl Elem for $t {
            fn slice(p: &Payload) -> &[Self] {
                match p {
                    Payload::$variant(v) => v,
                    _ => &[],
                }
            }
            fn wrap(v: Vec<Self>) -> Payload {
                Payload::$variant(v)
            }
            fn divide(sum: Self, n: usize) -> Self {
                $divide(sum, n)
            }
        }
    };
}
elem!(f32, F32, |s: f32, n: usize| s / n as f32);
elem!(f64, F64, |s: f64, n: usize| s / n as f64);
// `check_call` refuses the mean of integers before a round starts.
elem!(i32, I32, |s: i32, n: usize| s / n as i32);

/// The elementwise reduction of `parts`, folded in rank order.
fn reduce<T: Elem>(op: ReduceOp, parts: &[&Payload]) -> Payload {
    let mut acc = T::slice(parts[0]).to_vec();
    for part in &parts[1..] {
        for (a, &b) in acc.iter_mut().zip(T::slice(part)) {
            *a = match op {
                ReduceOp::Sum | ReduceOp::Mean => *a + b,
                ReduceOp::Max if b > *a => b,
                ReduceOp::Min if b < *a => b,
                ReduceOp::Max | ReduceOp::Min => *a,
            };
        }
    }
    if op == ReduceOp::Mean {
        acc.iter_mut().for_each(|a| *a = T::divide(*a, parts.len()));
    }
    T::wrap(acc)
}

/// The result of a round whose every rank contributed, or why the ranks disagree.
fn combine(parts: &[(Op, Payload)]) -> std::result::Result<Payload, ErrorKind> {
    let (op, first) = &parts[0];
    for (rank, (other_op, payload)) in parts.iter().enumerate().skip(1) {
        if other_op != op {
            return Err(ErrorKind::Mismatch(format!("rank 0 called {op} but rank {rank} called {other_op}")));
        }
        if std::mem::discriminant(payload) != std::mem::discriminant(first)
            || payload_len(payload) != payload_len(first)
        {
            return Err(ErrorKind::Mismatch(format!(
                "rank 0 gave {} but rank {rank} gave {}",
                first.describe(),
                payload.describe()
            )));
        }
    }
    let payloads: Vec<&Payload> = parts.iter().map(|(_, p)| p).collect();
    Ok(match *op {
        Op::AllReduce(reduce_op) => match first {
            Payload::F32(_) => reduce::<f32>(reduce_op, &payloads),
            Payload::F64(_) => reduce::<f64>(reduce_op, &payloads),
            Payload::I32(_) => reduce::<i32>(reduce_op, &payloads),
            Payload::Empty => Payload::Empty,
        },
        Op::Broadcast { root } => payloads[root].clone(),
        Op::AllGather => match first {
            Payload::F32(_) => Payload::F32(payloads.iter().flat_map(|p| f32::slice(p)).copied().collect()),
            Payload::F64(_) => Payload::F64(payloads.iter().flat_map(|p| f64::slice(p)).copied().collect()),
            Payload::I32(_) => Payload::I32(payloads.iter().flat_map(|p| i32::slice(p)).copied().collect()),
            Payload::Empty => Payload::Empty,
        },
        Op::Barrier => Payload::Empty,
    })
}

fn payload_len(p: &Payload) -> usize {
    match p {
        Payload::F32(v) => v.len(),
        Payload::F64(v) => v.len(),
        Payload::I32(v) => v.len(),
        Payload::Empty => 0,
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ThreadCollective {
    /// The timeout of this group.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Joins the next round with `payload` and returns its result, or fails within the timeout.
    fn exchange(&mut self, op: Op, payload: Payload) -> Result<Arc<Payload>> {
        let (rank, size) = (self.rank, self.shared.size);
        let error = |kind| DistError { op, rank, size, kind };
        let id = self.next_round;
        self.next_round += 1;
        let shared = &*self.shared;
        let mut state = shared.lock();
        if let Some(reason) = &state.failed {
            return Err(error(ErrorKind::GroupFailed(reason.clone())));
        }
        let round = state.rounds.entry(id).or_insert_with(|| Round { parts: vec![None; size], result: None, taken: 0 });
        round.parts[rank] = Some((op, payload));
        if round.parts.iter().all(Option::is_some) {
            let parts: Vec<(Op, Payload)> = round.parts.iter_mut().filter_map(Option::take).collect();
            round.result = Some(combine(&parts).map(Arc::new));
            shared.changed.notify_all();
        }
        let start = Instant::now();
        loop {
            let State { rounds, gone, failed } = &mut *state;
            let round = rounds.get_mut(&id).expect("a round lives until every rank took its result");
            if let Some(result) = &round.result {
                let result = result.clone();
                round.taken += 1;
                if round.taken == size {
                    rounds.remove(&id);
                }
                return result.map_err(error);
            }
            if let Some(reason) = failed {
                return Err(error(ErrorKind::GroupFailed(reason.clone())));
            }
            let missing: Vec<usize> = (0..size).filter(|&r| round.parts[r].is_none()).collect();
            let kind = if let Some(&peer) = missing.iter().find(|&&r| gone[r]) {
                Some(ErrorKind::PeerGone { peer })
            } else if start.elapsed() >= shared.timeout {
                Some(ErrorKind::Timeout { waited: start.elapsed(), missing })
            } else {
                None
            };
            if let Some(kind) = kind {
                let e = error(kind);
                *failed = Some(e.to_string());
                shared.changed.notify_all();
                return Err(e);
            }
            let left = shared.timeout.saturating_sub(start.elapsed());
            state = shared.changed.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

impl Drop for ThreadCollective {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.gone[self.rank] = true;
        self.shared.changed.notify_all();
    }
}

impl Collective for ThreadCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let op = Op::AllReduce(op);
        check_call(op, self.rank, self.shared.size, (&buf, None))?;
        let result = self.exchange(op, Payload::of(&buf))?;
        result.write_to(buf);
        Ok(())
    }

    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> Result<()> {
        let op = Op::Broadcast { root };
        check_call(op, self.rank, self.shared.size, (&buf, None))?;
        let result = self.exchange(op, Payload::of(&buf))?;
        result.write_to(buf);
        Ok(())
    }

    fn all_gather(&mut self, send: BufMut<'_>, recv: BufMut<'_>) -> Result<()> {
        check_call(Op::AllGather, self.rank, self.shared.size, (&send, Some(&recv)))?;
        let result = self.exchange(Op::AllGather, Payload::of(&send))?;
        result.write_to(recv);
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        self.exchange(Op::Barrier, Payload::Empty).map(|_| ())
    }
}
