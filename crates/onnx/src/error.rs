//! Errors of an import: malformed files, unsupported ops (all at once), and node failures that
//! name the node, its op type and the opset.

use std::fmt;

/// An op a model uses that the importer does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedOp {
    /// The node's name (`""` when the file gives none).
    pub node: String,
    /// The op type, prefixed by its domain when that is not the default one.
    pub op_type: String,
    /// The opset version the model imports for the op's domain.
    pub opset: i64,
}

impl fmt::Display for UnsupportedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (node {:?}, opset {})", self.op_type, self.node, self.opset)
    }
}

/// Why an import or a run failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("onnx: cannot read {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The bytes are not a `ModelProto` (truncated, wrong wire types...).
    #[error("onnx: not a valid ModelProto: {0}")]
    Decode(String),
    /// The model decodes but is inconsistent: no graph, a dangling input name, a cycle, a tensor
    /// whose data does not match its dims...
    #[error("onnx: invalid model: {0}")]
    Invalid(String),
    /// The model uses ops the importer does not know: every one of them, in node order.
    #[error("onnx: {} unsupported op(s): {}", .0.len(), list(.0))]
    Unsupported(Vec<UnsupportedOp>),
    /// A node could not be imported with its inputs (bad attributes, shapes, dtypes).
    #[error("onnx: node {node:?} ({op_type}, opset {opset}): {message}")]
    Node {
        /// The node's name.
        node: String,
        /// Its op type.
        op_type: String,
        /// The opset version of its domain.
        opset: i64,
        /// What went wrong.
        message: String,
    },
    /// The inputs given to [`crate::Model::run`] do not match the graph's inputs.
    #[error("onnx: inputs: {0}")]
    Inputs(String),
    /// Kiln failed realizing a value the import needed (a shape given as a tensor).
    #[error(transparent)]
    Kiln(#[from] kiln::Error),
}

fn list(ops: &[UnsupportedOp]) -> String {
    ops.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(", ")
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
