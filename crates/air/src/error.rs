//! The error type of the `air` crate.

/// Errors from building or checking graphs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AirError {
    /// A leaf's attributes do not fit its type; the message names the op.
    #[error("{0}")]
    Op(String),
    /// An op's type rule failed; the error names the op and the types.
    #[error(transparent)]
    Type(#[from] crate::op::TypeError),
    /// A node id that is not in the graph was used (an input of `Graph::add`, or the node given to
    /// `Graph::remove`).
    #[error("dead node: {0}")]
    DeadNode(String),
    /// `Graph::remove` was asked to remove a node that still has users or is an output.
    #[error("node in use: {0}")]
    InUse(String),
    /// A symbolic dim could not be evaluated.
    #[error(transparent)]
    Dim(#[from] crate::dim::DimError),
    /// The text form could not be parsed; the message names the line.
    #[error("parse error at line {line}: {msg}")]
    Parse {
        /// The 1-based line number.
        line: usize,
        /// What is wrong there.
        msg: String,
    },
    /// The verifier found these problems (every one, not the first).
    #[error("graph failed verification:\n{}", .0.join("\n"))]
    Verify(Vec<String>),
    /// A condition of the graph's symbolic shapes does not hold for the bindings (a shrink past the
    /// end of its input, a negative padding or dim); the same error every backend reports.
    #[error(transparent)]
    Bounds(#[from] crate::constraints::BoundsError),
    /// An edit would have made the graph cyclic; the message names the nodes.
    #[error("cycle: {0}")]
    Cycle(String),
    /// The interpreter could not evaluate a graph (missing input, bad input data, ...).
    #[error("interpreter: {0}")]
    Interp(String),
}

/// `std::result::Result` with [`AirError`] as the default error type.
pub type Result<T, E = AirError> = std::result::Result<T, E>;
