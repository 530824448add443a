//! dist: collectives for data-parallel training (all-reduce, broadcast, all-gather, barrier)
//! behind one [`Collective`] trait, over threads ([`ThreadGroup`]) or MPI (`MpiCollective`, cargo
//! feature `mpi`).
//!
//! The crate knows nothing of tensors or devices: a collective moves host slices of `f32`, `f64`
//! or `i32`. `kiln_nn::ddp` builds data-parallel training on it. Every call returns a
//! [`Result`] whose error names the operation, the rank and the group's size.
//!
//! Results are *bitwise identical on every rank*: the thread backend reduces contributions in
//! rank order once and hands every rank the same result; the MPI backend reduces to rank 0 and
//! broadcasts the result (rather than `MPI_Allreduce`, whose algorithms do not promise the same
//! rounding everywhere). Identical gradients give identical parameters after the optimizer step.
//!
//! ```
//! use kiln_dist::{Collective, ReduceOp, ThreadGroup};
//!
//! let handles = ThreadGroup::new(3);
//! let threads: Vec<_> = handles
//!     .into_iter()
//!     .map(|mut comm| {
//!         std::thread::spawn(move || {
//!             let mut x = vec![comm.rank() as f32; 2];
//!             comm.all_reduce(x.as_mut_slice().into(), ReduceOp::Sum)?;
//!             Ok::<_, kiln_dist::DistError>(x)
//!         })
//!     })
//!     .collect();
//! for t in threads {
//!     assert_eq!(t.join().unwrap()?, vec![3.0, 3.0]);
//! }
//! # Ok::<(), kiln_dist::DistError>(())
//! ```

mod error;
#[cfg(feature = "mpi")]
mod mpi_backend;
mod thread;

pub use error::{DistError, ErrorKind, Op, ReduceOp, Result};
#[cfg(feature = "mpi")]
pub use mpi_backend::MpiCollective;
pub use thread::{ThreadCollective, ThreadGroup};

/// A mutable host buffer a collective reads and writes in place.
#[derive(Debug)]
pub enum BufMut<'a> {
    /// 32-bit floats.
    F32(&'a mut [f32]),
    /// 64-bit floats.
    F64(&'a mut [f64]),
    /// 32-bit integers.
    I32(&'a mut [i32]),
}

impl BufMut<'_> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            BufMut::F32(v) => v.len(),
            BufMut::F64(v) => v.len(),
            BufMut::I32(v) => v.len(),
        }
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type's name (`f32`, `f64`, `i32`).
    pub fn dtype(&self) -> &'static str {
        match self {
            BufMut::F32(_) => "f32",
            BufMut::F64(_) => "f64",
            BufMut::I32(_) => "i32",
        }
    }
}

impl<'a> From<&'a mut [f32]> for BufMut<'a> {
    fn from(v: &'a mut [f32]) -> Self {
        BufMut::F32(v)
    }
}

impl<'a> From<&'a mut [f64]> for BufMut<'a> {
    fn from(v: &'a mut [f64]) -> Self {
        BufMut::F64(v)
    }
}

impl<'a> From<&'a mut [i32]> for BufMut<'a> {
    fn from(v: &'a mut [i32]) -> Self {
        BufMut::I32(v)
    }
}

/// A group of `size` ranks that call the same collectives in the same order.
///
/// Every rank must make the same sequence of calls with buffers of the same type and length (and
/// the same root): that is the contract of MPI collectives, and the thread backend checks it
/// (a disagreement is an [`ErrorKind::Mismatch`] on every rank). A rank that is gone or hung
/// makes the others fail within the group's timeout rather than wait forever (see each
/// backend for how).
pub trait Collective {
    /// This rank, in `0..size`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn size(&self) -> usize;

    /// Replaces `buf` on every rank with the elementwise reduction over the ranks' buffers
    /// (the same bits on every rank). [`ReduceOp::Mean`] is for floats only.
    fn all_reduce(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()>;

    /// Copies `root`'s `buf` into every other rank's `buf` (of the same length).
    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> Result<()>;

    /// Writes every rank's `send` (all of the same length `n`) into `recv`, rank `r`'s at
    /// `r * n..(r + 1) * n`; `recv` is `size * n` long and of `send`'s type.
    fn all_gather(&mut self, send: BufMut<'_>, recv: BufMut<'_>) -> Result<()>;

    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<()>;

    /// [`Collective::all_gather`] of `f32`s into a new vector.
    fn all_gather_f32(&mut self, send: &[f32]) -> Result<Vec<f32>> {
        let mut send = send.to_vec();
        let mut recv = vec![0f32; send.len() * self.size()];
        self.all_gather(send.as_mut_slice().into(), recv.as_mut_slice().into())?;
        Ok(recv)
    }
}

impl<C: Collective + ?Sized> Collective for Box<C> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn all_reduce(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        (**self).all_reduce(buf, op)
    }
    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> Result<()> {
        (**self).broadcast(buf, root)
    }
    fn all_gather(&mut self, send: BufMut<'_>, recv: BufMut<'_>) -> Result<()> {
        (**self).all_gather(send, recv)
    }
    fn barrier(&mut self) -> Result<()> {
        (**self).barrier()
    }
}

/// Checks what does not depend on the other ranks: a root in range, a mean of floats, a receive
/// buffer `size` times the send buffer. Both backends call it first.
pub(crate) fn check_call(op: Op, rank: usize, size: usize, lens: (&BufMut<'_>, Option<&BufMut<'_>>)) -> Result<()> {
    let fail = |detail: String| Err(DistError { op, rank, size, kind: ErrorKind::Invalid(detail) });
    let (buf, recv) = lens;
    match op {
        Op::Broadcast { root } if root >= size => fail(format!("root {root} is not a rank of a group of {size}")),
        Op::AllReduce(ReduceOp::Mean) if matches!(buf, BufMut::I32(_)) => {
            fail("the mean of i32 buffers is not defined (reduce with sum and divide)".into())
        }
        Op::AllGather => match recv {
            Some(recv) if recv.dtype() != buf.dtype() => {
                fail(format!("the receive buffer holds {} but the send buffer {}", recv.dtype(), buf.dtype()))
            }
            Some(recv) if recv.len() != buf.len() * size => fail(format!(
                "the receive buffer holds {} elements, not {} ({} ranks x {})",
                recv.len(),
                buf.len() * size,
                size,
                buf.len()
            )),
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}
