//! The one error type of the facade, `kiln::Error`.
//!
//! Ops never return `Result`: an op whose inputs are invalid returns an *error tensor* that carries
//! an [`Error::Op`] naming the op, the offending shapes or dtypes and the caller's source location.
//! Every op applied to an error tensor passes the first error on unchanged, and `realize`,
//! `to_vec`, `item` and `check` hand it back as `Err`.

use std::panic::Location;
use std::sync::Arc;

use air::{AirError, Symbol};
pub use runtime::{ErrorKind, RuntimeError};

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
    /// A device failed to compile or run a program, or returned data that does not match the
    /// graph: the runtime's error, whose [`kind`](Error::kind) says what went wrong (out of
    /// memory, unsupported, bad input, bounds, device lost, invalid program).
    #[error("{device}: {error}")]
    Runtime {
        /// The device that failed (`cpu`, `wgpu`).
        device: &'static str,
        /// What failed.
        error: SharedRuntimeError,
    },
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
    /// A `kiln::jit` function was misused: an argument escaped its trace, or a call's arguments
    /// do not fit the function.
    #[error("jit: {0}")]
    Jit(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A [`RuntimeError`] shared by the clones of the [`Error`] that carries it (it dereferences to
/// the error). Two are equal when they are the same error, or of the same kind with the same
/// message.
#[derive(Debug, Clone)]
pub struct SharedRuntimeError(Arc<RuntimeError>);

impl std::ops::Deref for SharedRuntimeError {
    type Target = RuntimeError;
    fn deref(&self) -> &RuntimeError {
        &self.0
    }
}

impl std::fmt::Display for SharedRuntimeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for SharedRuntimeError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || (self.0.kind() == other.0.kind() && self.0.to_string() == other.0.to_string())
    }
}

impl Error {
    /// The [`Error::Runtime`] of `device` for `error`.
    pub fn runtime(device: &'static str, error: RuntimeError) -> Error {
        Error::Runtime { device, error: SharedRuntimeError(Arc::new(error)) }
    }

    /// A device returned something that does not match the graph (an internal inconsistency,
    /// reported instead of used): a runtime error of kind `InvalidProgram`.
    pub(crate) fn internal(message: String) -> Error {
        Error::runtime("realize", RuntimeError::InvalidProgram(message))
    }

    /// The kind of a device's failure ([`Error::Runtime`]), `None` for the facade's own errors.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            Error::Runtime { error, .. } => Some(error.kind()),
            _ => None,
        }
    }

    /// An [`Error::Op`] for the op `op` called at `location`.
    pub(crate) fn op(op: &'static str, message: impl Into<String>, location: &'static Location<'static>) -> Error {
        Error::Op { op, message: message.into(), location }
    }
}

/// The message of a host allocation that was refused: `n` elements of `ty` for `what`.
pub(crate) fn out_of_memory(n: usize, ty: &str, what: &str) -> String {
    format!("out of memory: could not allocate {n} elements of {ty} for {what}")
}
