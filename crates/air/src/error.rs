//! The error type of the `air` crate.

/// Errors from building or checking graphs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AirError {
    /// An op's type rule failed; the message names the op and the types.
    #[error("{0}")]
    Op(String),
    #[error("dead node: {0}")]
    DeadNode(String),
    #[error("node in use: {0}")]
    InUse(String),
    #[error(transparent)]
    Dim(#[from] crate::dim::DimError),
    /// The text form could not be parsed; the message names the line.
    #[error("parse error at line {line}: {msg}")]
    Parse { line: usize, msg: String },
    /// The verifier found these problems (every one, not the first).
    #[error("graph failed verification:\n{}", .0.join("\n"))]
    Verify(Vec<String>),
    /// The interpreter could not evaluate a graph (missing input, bad input data, ...).
    #[error("interpreter: {0}")]
    Interp(String),
}

pub type Result<T, E = AirError> = std::result::Result<T, E>;
