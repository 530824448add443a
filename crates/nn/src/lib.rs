//! nn: layers, models, losses, optimizers and training on the public `kiln` tensor API.
//!
//! Every layer is a [`Module`]: a `forward` from a lazy [`Tensor`] to a lazy tensor, plus a tree
//! of named parameters (`blocks.0.attn.q.weight`) that optimizers, [`save_safetensors`] and
//! [`load_safetensors`] visit. Layers only record ops; nothing runs until a tensor is realized,
//! and a training step (forward, `kiln::grad`, optimizer update) is realized as one graph whose
//! structure is the same every step, so a device's program cache compiles it once.
//!
//! ```
//! use kiln::prelude::*;
//! use kiln_nn::{Linear, Module};
//!
//! kiln::manual_seed(0);
//! let layer = Linear::new(3, 2, true);
//! let y = layer.forward(&Tensor::ones(&[4, 3], DType::F32));
//! assert_eq!(y.dims()?, vec![4, 2]);
//! assert_eq!(layer.named_parameters().iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["weight", "bias"]);
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! A layer declares each parameter once, on its field: `#[derive(Module)]` (crate
//! `kiln-nn-derive`) writes [`ModuleParams`] (`visit`, `visit_mut`, `set_training`) from the field
//! attributes `#[param]`, `#[buffer]`, `#[module]` (a child, a `Vec` of them, an `Option`, a
//! `Box<dyn Module>`; `#[module(flatten)]` drops its prefix) and `#[training]`, with
//! `rename = "..."` for a name other than the field's; the layer writes only `forward`.
//!
//! ```
//! use kiln::prelude::*;
//! use kiln_nn::{Linear, Module};
//!
//! #[derive(Module)]
//! struct Scaled {
//!     #[module]
//!     inner: Linear,
//!     #[param]
//!     scale: Tensor,
//!     /// Not a parameter: no attribute.
//!     name: String,
//! }
//!
//! impl Module for Scaled {
//!     fn forward(&self, x: &Tensor) -> Tensor {
//!         self.inner.forward(x).mul(&self.scale)
//!     }
//! }
//!
//! let layer = Scaled { inner: Linear::new(2, 2, false), scale: Tensor::ones(&[2], DType::F32), name: "s".into() };
//! let names: Vec<String> = layer.named_parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, ["inner.weight", "scale"]);
//! # assert_eq!(layer.name, "s");
//! ```

// The code `#[derive(Module)]` generates names this crate `::kiln_nn`, here as elsewhere.
extern crate self as kiln_nn;

mod activation;
mod attention;
mod conv;
pub mod ddp;
mod error;
pub mod functional;
mod generate;
pub mod gpt2;
mod init;
mod linear;
mod loss;
mod mobilenet;
mod module;
mod norm;
mod optim;
mod rnn;
mod serialize;
mod train;
mod transformer;
pub mod zoo;

pub use activation::{Activation, Dropout, Flatten};
pub use attention::CausalSelfAttention;
pub use conv::{AvgPool2d, Conv2d, MaxPool2d};
pub use ddp::{DistributedTrainer, ShardedSampler, StepTiming};
pub use error::{GenerateErrorKind, NnError, Result};
pub use generate::{CachedDecoder, Decoder, GenerateConfig, RecomputeDecoder, Sampling, generate};
pub use gpt2::{GPT2_NORM_EPS, Gpt2Options, gpt2_from_safetensors, load_gpt2, load_gpt2_with};
pub use kiln_nn_derive::Module;
pub use linear::{Embedding, Linear};
pub use loss::{ClassLossOptions, Loss, cross_entropy, cross_entropy_with, mse_loss, nll_loss, nll_loss_with};
pub use mobilenet::MobileNet;
#[doc(hidden)]
pub use module::__derive;
pub use module::{Module, ModuleParams, ParamKind, Sequential};
pub use norm::{BatchNorm2d, LayerNorm, RmsNorm};
pub use optim::{Adam, AdamW, Optimizer, Realize, Sgd, Step, StepInputs};
pub use rnn::{Gru, Lstm, SimpleRnn};
pub use serialize::{load_safetensors, load_state_dict, read_safetensors, save_safetensors, to_safetensors_bytes};
pub use train::{LossFn, Predictor, Trainer, predict};
pub use transformer::{Block, KvCache, Mlp, Transformer, TransformerConfig};
