//! The op importers: one function per ONNX op (or family), each turning a node's inputs and
//! attributes into Kiln tensor ops with the semantics of the model's opset.
//!
//! `import` dispatches on the op type; `is_supported` is the same table, so the list of
//! unsupported ops a model reports is exactly what `import` would refuse.

mod attention;
mod einsum;
mod elementwise;
mod grid;
pub(crate) mod known;
mod ml;
mod nn;
mod reduce;
mod resize;
mod rnn;
mod shape;
mod spectral;
mod window;

use std::path::Path;

use kiln::{DType, Device, Dim, HostData, HostTensor, Tensor};

use crate::data::{from_tensor_proto, to_dtype};
use crate::error::Error;
use crate::proto::attribute_proto::AttributeType;
use crate::proto::{AttributeProto, GraphProto, NodeProto};

/// Why a node failed: a message (wrapped by the caller into [`Error::Node`]) or an error that is
/// already complete.
pub(crate) enum OpError {
    Message(String),
    Other(Error),
}

impl From<String> for OpError {
    fn from(m: String) -> OpError {
        OpError::Message(m)
    }
}

impl From<&str> for OpError {
    fn from(m: &str) -> OpError {
        OpError::Message(m.to_string())
    }
}

impl From<kiln::Error> for OpError {
    fn from(e: kiln::Error) -> OpError {
        OpError::Message(e.to_string())
    }
}

pub(crate) type OpResult<T> = std::result::Result<T, OpError>;

/// One node being imported: its proto, its opset, its input tensors (`None` for an omitted
/// optional input) and the device constants go to.
pub(crate) struct Ctx<'a> {
    pub node: &'a NodeProto,
    pub opset: i64,
    pub inputs: Vec<Option<Tensor>>,
    /// The inputs' values where they are known shape values (see [`known`]).
    pub known: Vec<Option<known::Known>>,
    pub device: Device,
    pub dir: Option<&'a Path>,
}

impl<'a> Ctx<'a> {
    pub fn op(&self) -> &str {
        self.node.op_type.as_deref().unwrap_or("")
    }

    /// Input `i`, which the op requires.
    pub fn input(&self, i: usize) -> OpResult<&Tensor> {
        self.opt(i).ok_or_else(|| OpError::Message(format!("input {i} is required")))
    }

    /// Input `i` if given (optional inputs may be omitted or named `""`).
    pub fn opt(&self, i: usize) -> Option<&Tensor> {
        self.inputs.get(i).and_then(Option::as_ref)
    }

    /// The given inputs (variadic ops).
    pub fn all(&self) -> Vec<&Tensor> {
        self.inputs.iter().flatten().collect()
    }

    /// The graph attribute `name` (an `If`'s branch, a loop's body), which the op requires.
    pub fn graph(&self, name: &str) -> OpResult<&'a GraphProto> {
        self.node
            .attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(name))
            .and_then(|a| a.g.as_ref())
            .ok_or_else(|| format!("the {name} attribute (a graph) is required").into())
    }

    /// The positive head count attribute `name`, which the op requires.
    pub fn head_count(&self, name: &str) -> OpResult<usize> {
        match self.int(name, 0)? {
            h if h > 0 => Ok(h as usize),
            _ => Err(format!("the attribute {name} (a positive head count) is required").into()),
        }
    }

    pub fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.node.attribute.iter().find(|a| a.name.as_deref() == Some(name))
    }

    fn typed(&self, name: &str, want: AttributeType) -> OpResult<Option<&AttributeProto>> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) => match a.r#type {
                Some(t) if t != want as i32 => Err(format!(
                    "attribute {name} is {} where {} is expected",
                    AttributeType::try_from(t).map(|t| t.as_str_name()).unwrap_or("of an unknown type"),
                    want.as_str_name()
                )
                .into()),
                _ => Ok(Some(a)),
            },
        }
    }

    pub fn int(&self, name: &str, default: i64) -> OpResult<i64> {
        Ok(self.typed(name, AttributeType::Int)?.and_then(|a| a.i).unwrap_or(default))
    }

    pub fn float(&self, name: &str, default: f32) -> OpResult<f32> {
        Ok(self.typed(name, AttributeType::Float)?.and_then(|a| a.f).unwrap_or(default))
    }

    pub fn ints(&self, name: &str) -> OpResult<Option<Vec<i64>>> {
        Ok(self.typed(name, AttributeType::Ints)?.map(|a| a.ints.clone()))
    }

    pub fn floats(&self, name: &str) -> OpResult<Option<Vec<f32>>> {
        Ok(self.typed(name, AttributeType::Floats)?.map(|a| a.floats.clone()))
    }

    pub fn strings(&self, name: &str) -> OpResult<Option<Vec<String>>> {
        Ok(self
            .typed(name, AttributeType::Strings)?
            .map(|a| a.strings.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect()))
    }

    pub fn string(&self, name: &str) -> OpResult<Option<String>> {
        Ok(self
            .typed(name, AttributeType::String)?
            .and_then(|a| a.s.as_ref())
            .map(|s| String::from_utf8_lossy(s).into_owned()))
    }

    pub fn tensor_attr(&self, name: &str) -> OpResult<Option<HostTensor>> {
        match self.typed(name, AttributeType::Tensor)?.and_then(|a| a.t.as_ref()) {
            None => Ok(None),
            Some(t) => from_tensor_proto(t, self.dir).map(Some).map_err(OpError::Other),
        }
    }

    /// The dtype of the ONNX element type attribute `name` (Cast's `to`).
    pub fn dtype_attr(&self, name: &str) -> OpResult<DType> {
        let t = self.int(name, 0)?;
        to_dtype(t as i32)
            .ok_or_else(|| format!("{name} = {} is not a supported type", crate::data::elem_type_name(t as i32)).into())
    }

    /// Input `i`'s values if it is a known shape value.
    pub fn known(&self, i: usize) -> Option<&known::Known> {
        self.known.get(i).and_then(Option::as_ref)
    }

    /// The values of integer input `i` as dims: symbolic where it is a known shape value computed
    /// from a symbolic dim, else its constant values.
    pub fn dim_values(&self, i: usize) -> OpResult<Vec<Dim>> {
        match self.known(i) {
            Some(k) => Ok(k.values.clone()),
            None => Ok(self.values_at(i)?.into_iter().map(Dim::Const).collect()),
        }
    }

    /// The values of integer input `i` (required), which the import needs as constants.
    pub fn values_at(&self, i: usize) -> OpResult<Vec<i64>> {
        self.opt_values(i)?.ok_or_else(|| format!("input {i} is required").into())
    }

    /// The values of an integer tensor the import needs as constants (a shape, axes, pads),
    /// realizing it if it is computed.
    pub fn values(&self, t: &Tensor) -> OpResult<Vec<i64>> {
        let host = t.to_host()?;
        Ok(match &*host.data {
            HostData::I64(v) => v.clone(),
            HostData::I32(v) => v.iter().map(|&x| x as i64).collect(),
            _ => return Err(format!("a {} tensor where integers are expected", host.dtype().name()).into()),
        })
    }

    /// The values of optional input `i`, if given; a known shape value must be concrete.
    pub fn opt_values(&self, i: usize) -> OpResult<Option<Vec<i64>>> {
        if let Some(k) = self.known(i) {
            let values: Vec<String> = k.values.iter().map(|d| d.to_string()).collect();
            return k
                .consts()
                .map(Some)
                .ok_or_else(|| format!("input {i} is [{}], where a constant is needed", values.join(", ")).into());
        }
        self.opt(i).map(|t| self.values(t)).transpose()
    }

    /// The one float of a scalar (or one-element) tensor.
    pub fn scalar_f64(&self, t: &Tensor) -> OpResult<f64> {
        let host = t.to_host()?;
        if host.numel() != 1 {
            return Err(format!("a tensor of {} elements where a scalar is expected", host.numel()).into());
        }
        Ok(host.data.get(0).as_f64())
    }

    /// A constant tensor on the model's device.
    pub fn constant(&self, host: HostTensor) -> Tensor {
        Tensor::from_host_on(host, self.device)
    }

    pub fn i64s(&self, values: Vec<i64>, shape: &[usize]) -> Tensor {
        match HostTensor::new(HostData::I64(values), shape.to_vec()) {
            Ok(h) => self.constant(h),
            Err(m) => Tensor::op_error("onnx", m),
        }
    }
}

/// The concrete dims of `t`, or an error naming the op that needs them.
pub(crate) fn dims(t: &Tensor) -> OpResult<Vec<usize>> {
    t.shape()
        .iter()
        .map(|d| d.as_const().map(|v| v as usize))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| format!("needs concrete dims, got {}", show(t)).into())
}

pub(crate) fn show(t: &Tensor) -> String {
    format!("[{}]", t.shape().iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}

/// `axis` (negative counts from the end) as an index into `rank` dims.
pub(crate) fn axis(axis: i64, rank: usize) -> OpResult<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a >= rank as i64 {
        return Err(format!("axis {axis} is out of range for rank {rank}").into());
    }
    Ok(a as usize)
}

type Handler = fn(&Ctx) -> OpResult<Vec<Tensor>>;

fn handler(op: &str) -> Option<Handler> {
    Some(match op {
        "Abs" | "Neg" | "Exp" | "Log" | "Sqrt" | "Reciprocal" | "Floor" | "Ceil" | "Sin" | "Cos" | "Tan" | "Tanh"
        | "Sigmoid" | "Relu" | "Erf" | "Sign" | "Identity" | "Not" | "Softplus" | "Softsign" | "Elu" | "Selu"
        | "Atan" | "Asin" | "Acos" | "LeakyRelu" | "HardSigmoid" | "HardSwish" | "ThresholdedRelu" | "Celu"
        | "Mish" | "Gelu" | "Round" | "IsNaN" | "IsInf" | "Sinh" | "Cosh" | "Asinh" | "Acosh" | "Atanh"
        | "BitwiseNot" | "Shrink" | "Swish" => elementwise::unary,
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual"
        | "And" | "Or" | "Xor" | "Mod" | "BitwiseAnd" | "BitwiseOr" | "BitwiseXor" | "PRelu" => elementwise::binary,
        "Max" | "Min" | "Sum" | "Mean" => elementwise::variadic,
        "Where" => elementwise::where_op,
        "Clip" => elementwise::clip,
        "Cast" | "CastLike" => elementwise::cast,
        "Dropout" => elementwise::dropout,
        "Reshape" => shape::reshape,
        "Transpose" => shape::transpose,
        "Concat" => shape::concat,
        "Flatten" => shape::flatten,
        "Squeeze" => shape::squeeze,
        "Unsqueeze" => shape::unsqueeze,
        "Expand" => shape::expand,
        "Slice" => shape::slice,
        "Gather" => shape::gather,
        "GatherElements" => shape::gather_elements,
        "GatherND" => shape::gather_nd,
        "ScatterElements" | "Scatter" => shape::scatter_elements,
        "ScatterND" => shape::scatter_nd,
        "TensorScatter" => shape::tensor_scatter,
        "Shape" => shape::shape,
        "Size" => shape::size,
        "Constant" => shape::constant,
        "ConstantOfShape" => shape::constant_of_shape,
        "Range" => shape::range,
        "Split" => shape::split,
        "Tile" => shape::tile,
        "Pad" => shape::pad,
        "Trilu" => shape::trilu,
        "EyeLike" => shape::eye_like,
        "OneHot" => shape::one_hot,
        "DepthToSpace" | "SpaceToDepth" => shape::depth_space,
        "ReverseSequence" => shape::reverse_sequence,
        "CenterCropPad" => shape::center_crop_pad,
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare"
        | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceProd" => reduce::reduce,
        "CumSum" | "CumProd" => reduce::cumulative,
        "TopK" => reduce::top_k,
        "ArgMax" | "ArgMin" => reduce::arg,
        "Softmax" | "LogSoftmax" | "Hardmax" => reduce::softmax,
        "Attention" => attention::attention,
        "RotaryEmbedding" => attention::rotary_embedding,
        "LinearAttention" => attention::linear_attention,
        "MatMul" => nn::matmul,
        "Einsum" => einsum::einsum,
        "DFT" => spectral::dft,
        "STFT" => spectral::stft,
        "HannWindow" | "HammingWindow" | "BlackmanWindow" => spectral::window_function,
        "Gemm" => nn::gemm,
        "LayerNormalization" => nn::layer_norm,
        "GroupNormalization" => nn::group_norm,
        "LRN" => nn::lrn,
        "RMSNormalization" => nn::rms_norm,
        "NegativeLogLikelihoodLoss" => nn::nll_loss,
        "SoftmaxCrossEntropyLoss" => nn::softmax_cross_entropy,
        "BatchNormalization" => nn::batch_norm,
        "InstanceNormalization" => nn::instance_norm,
        "LpNormalization" => nn::lp_norm,
        "MeanVarianceNormalization" => nn::mean_variance_norm,
        "Conv" => window::conv,
        "ConvTranspose" => window::conv_transpose,
        "Resize" | "Upsample" => resize::resize,
        "GridSample" => grid::grid_sample,
        "AffineGrid" => grid::affine_grid,
        "MaxPool" | "AveragePool" => window::pool,
        "GlobalAveragePool" | "GlobalMaxPool" => window::global_pool,
        "LpPool" => window::lp_pool,
        "MaxUnpool" => window::max_unpool,
        "CausalConvWithState" => window::causal_conv_with_state,
        "RNN" | "GRU" | "LSTM" => rnn::recurrent,
        _ => return None,
    })
}

/// The importers of the `ai.onnx.ml` domain (scikit-learn's exports).
fn ml_handler(op: &str) -> Option<Handler> {
    Some(match op {
        "LinearRegressor" => ml::linear_regressor,
        "LinearClassifier" => ml::linear_classifier,
        "Scaler" => ml::scaler,
        "Normalizer" => ml::normalizer,
        "Binarizer" => ml::binarizer,
        "ArrayFeatureExtractor" => ml::array_feature_extractor,
        "TreeEnsembleRegressor" => ml::tree_ensemble_regressor,
        "TreeEnsembleClassifier" => ml::tree_ensemble_classifier,
        "SVMRegressor" => ml::svm_regressor,
        "SVMClassifier" => ml::svm_classifier,
        _ => return None,
    })
}

/// The importer of `op` in `domain` (`""` and `ai.onnx` are ONNX's default domain).
fn domain_handler(domain: &str, op: &str) -> Option<Handler> {
    match domain {
        "" | "ai.onnx" => handler(op),
        "ai.onnx.ml" => ml_handler(op),
        _ => None,
    }
}

/// Whether the importer knows `op_type` of `domain` (`""` is ONNX's default domain) at `opset`.
pub fn is_supported(domain: &str, op_type: &str, _opset: i64) -> bool {
    // `If`, `Scan` and `Loop` are imported by the model (their bodies are graphs in its scope).
    domain_handler(domain, op_type).is_some() || (domain.is_empty() && matches!(op_type, "If" | "Scan" | "Loop"))
}

/// Imports one node: its output tensors, in order.
pub(crate) fn import(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    match domain_handler(ctx.node.domain.as_deref().unwrap_or(""), ctx.op()) {
        Some(h) => h(ctx),
        None => Err(format!("{} is not supported", ctx.op()).into()),
    }
}
