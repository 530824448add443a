//! lower: rewrites, autodiff, fusion/scheduling into kernels, and memory planning.
//!
//! Input: an `air::Graph`. Output: a `Program` of kernels in the kernel IR (`kir`), sorted once,
//! over buffers whose temporaries the memory planner places in one arena.

#![warn(missing_docs)]

pub mod autodiff;
pub mod batch;
pub mod compile;
pub mod error;
pub mod exec;
pub mod kir;
pub mod memplan;
pub mod offsets;
pub mod program;
pub mod rewrite;
pub mod saturate;
pub mod schedule;
pub mod view;

pub use autodiff::{AutodiffError, grad, grad_with_seed};
pub use compile::{
    CompileOptions, NoObserver, OptLevel, Pass, PassObserver, PassOutput, compile, compile_observed, compile_taking,
};
pub use error::LowerError;
pub use memplan::{MemoryPlan, MemoryStats};
pub use program::{BufId, BufferInfo, BufferKind, CheckKind, DataCheck, Program, Step};
