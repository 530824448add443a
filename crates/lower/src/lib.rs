//! lower: rewrites, autodiff, fusion/scheduling into kernels, and memory planning.
//!
//! Input: an `air::Graph`. Output: a `Program` of kernels in the kernel IR (`kir`), sorted once,
//! over buffers whose temporaries the memory planner places in one arena.

pub mod kir;
pub mod program;

pub use program::{BufId, BufferInfo, BufferKind, Program, Step};
