//! The error type of the runtime: every failure a caller can cause or meet, never a panic.

use air::{DType, Symbol};

/// Errors from compiling or running a program on a device.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Lowering the graph to kernels failed.
    #[error(transparent)]
    Lower(#[from] lower::LowerError),
    /// Compiling a kernel to native code failed.
    #[error(transparent)]
    Codegen(#[from] codegen::CodegenError),
    /// The caller passed the wrong number of inputs.
    #[error("expected {expected} inputs, got {got}")]
    InputCount { expected: usize, got: usize },
    /// An input's dtype or shape does not match the graph's input node.
    #[error("input slot {slot}: expected {expected}, got {got}")]
    InputMismatch { slot: u32, expected: String, got: String },
    /// A condition of the graph's symbolic shapes fails for the bindings (a shrink past the end
    /// of its input, a negative padding or dim): the error the interpreter gives too, naming the
    /// op and its node's position in the graph (`air::constraints`).
    #[error(transparent)]
    Bounds(#[from] air::BoundsError),
    /// A symbol the program needs has no value in the bindings.
    #[error("symbol `{0}` has no value bound")]
    Unbound(Symbol),
    /// A dim evaluated to a negative or overflowing size.
    #[error("bad size: {0}")]
    BadSize(String),
    /// Out of host memory: an allocation (arena, output, readback) was refused. Every host
    /// allocation whose size a user chooses is reserved fallibly and reported here, never an
    /// abort.
    #[error("out of memory: could not allocate {bytes} bytes for {what}")]
    Alloc { bytes: usize, what: &'static str },
    /// The program asks for something this device does not do.
    #[error("unsupported on {device}: {what}")]
    Unsupported { device: &'static str, what: String },
    /// The program is inconsistent (an internal bug upstream, reported instead of run).
    #[error("invalid program: {0}")]
    InvalidProgram(String),
}

impl RuntimeError {
    pub(crate) fn unsupported_dtype(what: &str, dtype: DType) -> RuntimeError {
        RuntimeError::Unsupported { device: "cpu", what: format!("{what} of dtype {dtype}") }
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
