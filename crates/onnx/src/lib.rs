//! kiln-onnx: imports ONNX models into Kiln's lazy tensor graph.
//!
//! [`Model::load`] (or [`Model::from_bytes`]) decodes a `ModelProto`, decodes its initializers,
//! orders its nodes and checks every name resolves; malformed files are an [`Error`], never a
//! panic. [`Model::run`] then builds the lazy graph for the given inputs (nothing runs until the
//! outputs are realized), so an imported model compiles like any Kiln program: `kiln profile`,
//! the program caches and every device apply to it.
//!
//! ```no_run
//! # fn main() -> kiln_onnx::Result<()> {
//! let model = kiln_onnx::Model::load("mlp.onnx")?;
//! let x = kiln::Tensor::from_vec(vec![0.5f32; 4 * 16], &[4, 16]);
//! let outputs = model.run(&[x])?;
//! println!("{:?}", outputs[0].to_vec::<f32>()?);
//! # Ok(())
//! # }
//! ```
//!
//! Ops are imported with the semantics of the model's opset (attributes that became inputs,
//! Softmax's axis rule before opset 13...), from ONNX's default domain and from `ai.onnx.ml`
//! (scikit-learn's exports: linear models, scalers, tree ensembles, SVMs). An import that meets
//! ops it does not know reports all of them at once ([`Error::Unsupported`]).

mod data;
mod error;
mod model;
mod ops;
pub mod proto;

pub use data::{elem_type_name, from_tensor_proto, to_dtype};
pub use error::{Error, Result, UnsupportedOp};
pub use model::{Model, Session, ValueInfo};
pub use ops::is_supported;
