//! The one error type of the facade, `kiln::Error`.
//!
//! Ops never return `Result`: an op whose inputs are invalid returns an *error tensor* that carries
//! an [`Error::Op`] naming the op, the offending shapes or dtypes and the caller's source location.
//! Every op applied to an error tensor passes the first error on unchanged, and `realize`,
//! `to_vec`, `item` and `check` hand it back as `Err`.

use std::panic::Location;

use air::{AirError, Symbol};

/// Everything that can go wrong in Kiln's facade.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An op was applied to invalid inputs (shape or dtype mismatch, bad axis, ...).
    #[error("{op}: {message} at {location}")]
    Op {
        /// The user-facing name of the op (`matmul`, `softmax`, ...).
        op: &'static str,
        /// What is wrong, naming the shapes and dtypes involved.
        message: String,
        /// Where the user called the op.
        location: &'static Location<'static>,
    },
    /// The IR rejected a graph or the interpreter failed.
    #[error(transparent)]
    Air(#[from] AirError),
    /// An unknown or unavailable device (for example a bad `KILN_DEVICE`), or mixed devices.
    #[error("device: {0}")]
    Device(String),
    /// A backend failed or returned data that does not match the graph.
    #[error("backend: {0}")]
    Backend(String),
    /// Two source tensors bind one symbol to different values.
    #[error("symbol `{symbol}` is bound to both {first} and {second}")]
    Binding {
        /// The symbol with two values.
        symbol: Symbol,
        /// The value bound first.
        first: i64,
        /// The conflicting value.
        second: i64,
    },
    /// A question about a shape that has no answer (the concrete dims of a symbolic shape).
    #[error("shape: {0}")]
    Shape(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Op`] for the op `op` called at `location`.
    pub(crate) fn op(op: &'static str, message: impl Into<String>, location: &'static Location<'static>) -> Error {
        Error::Op { op, message: message.into(), location }
    }
}

/// The message of a host allocation that was refused: `n` elements of `ty` for `what`.
pub(crate) fn out_of_memory(n: usize, ty: &str, what: &str) -> String {
    format!("out of memory: could not allocate {n} elements of {ty} for {what}")
}
