//! The error type of the `lower` crate: one enum for compiling, planning and executing programs.

use air::dim::DimError;

/// Everything that can go wrong between an `air::Graph` and a run of its `Program`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LowerError {
    /// The input graph is malformed (failed verification, a dead output, a type the scheduler
    /// cannot lower). The message names the node.
    #[error("invalid graph: {0}")]
    InvalidGraph(String),
    /// A construct the scheduler does not lower yet.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A symbolic dim could not be evaluated (unbound symbol, overflow).
    #[error(transparent)]
    Dim(#[from] DimError),
    /// A condition of the graph's symbolic shapes fails for the bindings (`Program::checks`).
    #[error(transparent)]
    Bounds(#[from] air::BoundsError),
    /// The program was run with inputs that do not match it.
    #[error("bad inputs: {0}")]
    BadInputs(String),
    /// A data-dependent check failed during a run: an index out of range, an integer division
    /// by zero. The message names the op and the offending value or the kind of failure.
    #[error("{0}")]
    Data(String),
    /// A kir program broke one of its invariants (a bug in the producer of the program).
    #[error("malformed program: {0}")]
    Malformed(String),
}

impl From<air::AirError> for LowerError {
    fn from(e: air::AirError) -> LowerError {
        LowerError::InvalidGraph(e.to_string())
    }
}
