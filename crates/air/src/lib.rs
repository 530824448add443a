//! air: Kiln's typed-attribute tensor graph IR.
//!
//! A `Graph` is a DAG of `Node`s stored in a slotmap and addressed by `NodeId` (`n12`). Each node is
//! an `Op` whose attributes are a typed struct (never a string-keyed bag), its inputs, and the type
//! (`DType` plus a `Shape` of possibly symbolic `Dim`s) of its value. A users side table makes
//! `users(id)` O(1); the topological order is computed once and cached until the next edit.
//!
//! air knows nothing about kernels, devices or backends. Besides the graph it has the verifier,
//! the text form (printer and parser), a Graphviz export and the reference interpreter, the
//! oracle every backend is tested against.

#![warn(missing_docs)]

pub mod constraints;
pub mod dim;
pub mod dot;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod host;
pub mod interp;
pub mod key;
pub mod op;
pub mod scalar;
pub mod testing;
pub mod text;
pub mod verify;
pub mod work;

pub use constraints::{BoundsError, Check};
pub use dim::{Bindings, Dim, Shape, Symbol};
pub use dot::to_dot;
pub use dtype::{DType, Scalar};
pub use error::{AirError, Result};
pub use graph::{Graph, Node, NodeId};
pub use host::{Element, HostData, HostTensor};
pub use interp::eval;
pub use key::GraphKey;
pub use op::{BinaryOp, Op, OpClass, OpKind, ReduceOp, TensorType, TypeError, UnaryOp};
pub use text::{PrintOptions, parse, print, print_renumbered};
pub use verify::verify;
