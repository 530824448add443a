//! The one error type of the code generators: every fallible step reports here, nothing panics.

use thiserror::Error;

/// Why a kernel could not be compiled or called.
/// `Clone`: a kernel that appears several times in a batch gives each its own copy of the error.
#[derive(Clone, Debug, Error)]
pub enum CodegenError {
    /// The host CPU is not supported by Cranelift, or its flags could not be set.
    #[error("host ISA unavailable: {0}")]
    Isa(String),
    /// Cranelift rejected a declaration, a definition or the final linking step.
    #[error("cranelift: {0}")]
    Cranelift(String),
    /// Matmul kernels are run by the runtime with a GEMM library, not compiled here.
    #[error("matmul kernels are not compiled by the CPU code generator (the runtime runs them with a GEMM)")]
    Matmul,
    /// The kernel uses a construct or dtype combination this backend does not handle.
    #[error("unsupported kernel: {0}")]
    Unsupported(String),
    /// The kernel breaks a kir convention (an undefined register, a buffer out of range, ...).
    #[error("invalid kernel: {0}")]
    Invalid(String),
    /// A compiled kernel was called with the wrong number of buffers or symbols.
    #[error("kernel expects {expected} {what}, got {got}")]
    Arity { what: &'static str, expected: usize, got: usize },
}

/// `Result` with [`CodegenError`].
pub type Result<T, E = CodegenError> = std::result::Result<T, E>;
