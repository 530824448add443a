//! The one error type of `kiln-dist`: which collective failed, on which rank, and why.

use std::fmt;
use std::time::Duration;

/// A reduction of [`crate::Collective::all_reduce`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The elementwise sum.
    Sum,
    /// The elementwise sum divided by the number of ranks (floats only).
    Mean,
    /// The elementwise maximum.
    Max,
    /// The elementwise minimum.
    Min,
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        })
    }
}

/// A collective operation, as errors name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`crate::Collective::all_reduce`].
    AllReduce(ReduceOp),
    /// [`crate::Collective::broadcast`] from `root`.
    Broadcast {
        /// The rank whose data everyone receives.
        root: usize,
    },
    /// [`crate::Collective::all_gather`].
    AllGather,
    /// [`crate::Collective::barrier`].
    Barrier,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::AllReduce(op) => write!(f, "all_reduce({op})"),
            Op::Broadcast { root } => write!(f, "broadcast(root {root})"),
            Op::AllGather => f.write_str("all_gather"),
            Op::Barrier => f.write_str("barrier"),
        }
    }
}

/// What went wrong in a collective.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ErrorKind {
    /// Some ranks did not join the collective within the group's timeout (hung, or dead without
    /// the group noticing).
    #[error("timed out after {waited:?}{}", waiting_for(missing))]
    Timeout {
        /// How long this rank waited.
        waited: Duration,
        /// The ranks that had not joined (empty where the backend cannot tell: MPI).
        missing: Vec<usize>,
    },
    /// A rank left the group (its handle was dropped: its thread ended or panicked) before
    /// joining the collective.
    #[error("rank {peer} left the group before joining")]
    PeerGone {
        /// The rank that left.
        peer: usize,
    },
    /// An earlier collective failed on some rank (on MPI: on this rank); the group cannot be used
    /// any more.
    #[error("the group failed earlier: {0}")]
    GroupFailed(String),
    /// The ranks called different collectives, or gave buffers of different types or lengths.
    #[error("ranks disagree: {0}")]
    Mismatch(String),
    /// The backend could not start or run (MPI initialized twice, a thread that could not be
    /// spawned).
    #[error("backend: {0}")]
    Backend(String),
    /// The call itself is invalid (a root out of range, the mean of integers, a receive buffer of
    /// the wrong length).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

fn waiting_for(missing: &[usize]) -> String {
    if missing.is_empty() { String::new() } else { format!(" waiting for rank(s) {missing:?}") }
}

/// A failed collective: the operation, the rank that reports it and the group's size.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{op} on rank {rank} of {size}: {kind}")]
pub struct DistError {
    /// The collective.
    pub op: Op,
    /// The rank that reports the error.
    pub rank: usize,
    /// The number of ranks in the group.
    pub size: usize,
    /// What went wrong.
    pub kind: ErrorKind,
}

/// `Result` with [`DistError`].
pub type Result<T, E = DistError> = std::result::Result<T, E>;
