//! Loading Hugging Face GPT-2 checkpoints (safetensors) into Kiln's [`Transformer`].
//!
//! The Hugging Face layout (`GPT2LMHeadModel` or `GPT2Model`, names with or without the
//! `transformer.` prefix) maps onto Kiln's parameters as follows; GPT-2's `Conv1D` stores its
//! weight `[in, out]`, the transpose of a [`Linear`] weight, so every projection is transposed:
//!
//! | Hugging Face                          | Kiln                                              |
//! |---------------------------------------|---------------------------------------------------|
//! | `wte.weight` `[vocab, dim]`           | `wte.weight`, and `head.weight` (tied)            |
//! | `wpe.weight` `[positions, dim]`       | `wpe.weight`                                      |
//! | `h.{i}.ln_1`, `h.{i}.ln_2`, `ln_f`    | `blocks.{i}.ln1`, `blocks.{i}.ln2`, `ln_f`        |
//! | `h.{i}.attn.c_attn` `[dim, 3 dim]`    | `blocks.{i}.attn.{q,k,v}`: columns split in thirds|
//! | `h.{i}.attn.c_proj` `[dim, dim]`      | `blocks.{i}.attn.o`                               |
//! | `h.{i}.mlp.c_fc` `[dim, hidden]`      | `blocks.{i}.mlp.fc`                               |
//! | `h.{i}.mlp.c_proj` `[hidden, dim]`    | `blocks.{i}.mlp.proj`                             |
//! | `lm_head.weight` `[vocab, dim]`       | `head.weight` when stored and untied; else `wte`  |
//!
//! The sizes come from the shapes (`dim` and `vocab` from `wte`, the positions from `wpe`, the
//! MLP width from `c_fc`, the layers from the `h.{i}` present). The number of heads is not in the
//! weights: it comes from [`Gpt2Options::n_heads`] or from Hugging Face's `config.json` beside the
//! file (`n_head`), which also gives `layer_norm_epsilon` (1e-5 when absent),
//! `activation_function` and `tie_word_embeddings` (see [`Gpt2Options::tie_word_embeddings`]);
//! every size it declares must agree with the shapes. The old causal-mask
//! buffers `h.{i}.attn.bias` and `h.{i}.attn.masked_bias` are ignored; any other tensor is an
//! error (cross-attention and extra heads are not supported), so nothing is silently dropped.
//! Weights may be f32, f16, bf16 or f64; the model is f32.
//!
//! Every problem (a missing tensor, a wrong shape or dtype, an unknown tensor) is collected and
//! reported at once as [`NnError::Mismatch`], naming the tensor as the file spells it.

use std::collections::HashMap;
use std::path::Path;

use kiln::HostData;
use safetensors::{Dtype, SafeTensors};

use crate::activation::Activation;
use crate::attention::CausalSelfAttention;
use crate::error::{NnError, Result};
use crate::init::param;
use crate::linear::{Embedding, Linear};
use crate::norm::LayerNorm;
use crate::serialize::from_le_bytes;
use crate::transformer::{Block, Mlp, Transformer, TransformerConfig};

/// GPT-2's LayerNorm epsilon (`layer_norm_epsilon` of Hugging Face's `GPT2Config`).
pub const GPT2_NORM_EPS: f64 = 1e-5;

/// What is known about a GPT-2 checkpoint beyond its tensors. `n_heads` is required (here or from
/// `config.json`); every other field is optional: a size that is given must agree with the
/// weights' shapes, and the rest are inferred from them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gpt2Options {
    /// Attention heads per block (`n_head`). Not recorded in the weights.
    pub n_heads: Option<usize>,
    /// LayerNorm epsilon (`layer_norm_epsilon`); [`GPT2_NORM_EPS`] when `None`.
    pub norm_eps: Option<f64>,
    /// The MLP activation (`activation_function`); GPT-2's tanh GELU (`gelu_new`) when `None`.
    pub activation: Option<Activation>,
    /// Model width (`n_embd`), checked against `wte`.
    pub dim: Option<usize>,
    /// Number of blocks (`n_layer`), checked against the `h.{i}` present.
    pub n_layers: Option<usize>,
    /// Vocabulary size (`vocab_size`), checked against `wte`.
    pub vocab_size: Option<usize>,
    /// Learned positions (`n_positions`), checked against `wpe`.
    pub max_seq_len: Option<usize>,
    /// MLP width (`n_inner`, `4 * dim` when `None`), checked against `c_fc`.
    pub hidden: Option<usize>,
    /// Whether the LM head is the token embedding (`tie_word_embeddings`). `Some(false)` requires
    /// `lm_head.weight`; `Some(true)` uses `wte` and requires a stored `lm_head.weight` to equal
    /// it (Hugging Face ties them on load); `None` uses `lm_head.weight` when stored, else `wte`.
    pub tie_word_embeddings: Option<bool>,
}

impl Gpt2Options {
    /// Options giving only the number of heads.
    pub fn with_heads(n_heads: usize) -> Gpt2Options {
        Gpt2Options { n_heads: Some(n_heads), ..Gpt2Options::default() }
    }

    /// The options a Hugging Face `config.json` (`GPT2Config`) states: `n_head`,
    /// `layer_norm_epsilon`, `activation_function`, `n_embd`, `n_layer`, `vocab_size`,
    /// `n_positions`, `n_inner` (`null` counts as absent). A config Kiln's model cannot follow
    /// (`model_type` other than `gpt2`, cross-attention, unscaled or layer-scaled attention, an
    /// unknown activation) is an error rather than a model that computes something else.
    pub fn from_config_json(text: &str) -> Result<Gpt2Options> {
        let err = |message: String| NnError::Config(format!("GPT-2 config.json: {message}"));
        let json: serde_json::Value = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
        let object = json.as_object().ok_or_else(|| err("not a JSON object".into()))?;
        let field = |key: &str| object.get(key).filter(|v| !v.is_null());
        let size = |key: &str| -> Result<Option<usize>> {
            field(key)
                .map(|v| {
                    v.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| err(format!("`{key}` is {v}, not a size")))
                })
                .transpose()
        };
        let flag = |key: &str, supported: bool| -> Result<()> {
            match field(key) {
                None => Ok(()),
                Some(v) if v.as_bool() == Some(supported) => Ok(()),
                Some(v) => Err(err(format!("`{key}: {v}` is not supported (Kiln's GPT-2 needs {supported})"))),
            }
        };
        if let Some(kind) = field("model_type")
            && kind.as_str() != Some("gpt2")
        {
            return Err(err(format!("`model_type` is {kind}, not \"gpt2\"")));
        }
        flag("add_cross_attention", false)?;
        flag("scale_attn_weights", true)?;
        flag("scale_attn_by_inverse_layer_idx", false)?;
        let tie_word_embeddings = field("tie_word_embeddings")
            .map(|v| v.as_bool().ok_or_else(|| err(format!("`tie_word_embeddings` is {v}, not a boolean"))))
            .transpose()?;
        let norm_eps = field("layer_norm_epsilon")
            .map(|v| v.as_f64().ok_or_else(|| err(format!("`layer_norm_epsilon` is {v}, not a number"))))
            .transpose()?;
        let activation = field("activation_function")
            .map(|v| match v.as_str() {
                // `gelu_new`, `gelu_fast` and `gelu_pytorch_tanh` are all the tanh approximation.
                Some("gelu_new" | "gelu_fast" | "gelu_pytorch_tanh") => Ok(Activation::GeluTanh),
                Some("gelu") => Ok(Activation::Gelu),
                Some("relu") => Ok(Activation::Relu),
                Some("silu" | "swish") => Ok(Activation::Silu),
                Some("tanh") => Ok(Activation::Tanh),
                Some("sigmoid") => Ok(Activation::Sigmoid),
                Some("linear") => Ok(Activation::Identity),
                _ => Err(err(format!("`activation_function` {v} is not supported"))),
            })
            .transpose()?;
        Ok(Gpt2Options {
            n_heads: size("n_head")?,
            norm_eps,
            activation,
            dim: size("n_embd")?,
            n_layers: size("n_layer")?,
            vocab_size: size("vocab_size")?,
            max_seq_len: size("n_positions")?,
            hidden: size("n_inner")?,
            tie_word_embeddings,
        })
    }

    /// `self` completed by `other` (whose origin `source` names in errors): a field set in both
    /// must agree.
    fn merge(&self, other: &Gpt2Options, source: &str) -> Result<Gpt2Options> {
        let mut conflicts = Vec::new();
        fn pick<T: PartialEq + std::fmt::Debug + Copy>(
            name: &str,
            mine: Option<T>,
            theirs: Option<T>,
            source: &str,
            conflicts: &mut Vec<String>,
        ) -> Option<T> {
            match (mine, theirs) {
                (Some(a), Some(b)) if a != b => {
                    conflicts.push(format!("{name}: the options say {a:?} but {source} says {b:?}"));
                    Some(a)
                }
                (a, b) => a.or(b),
            }
        }
        let merged = Gpt2Options {
            n_heads: pick("n_heads", self.n_heads, other.n_heads, source, &mut conflicts),
            norm_eps: pick("norm_eps", self.norm_eps, other.norm_eps, source, &mut conflicts),
            activation: pick("activation", self.activation, other.activation, source, &mut conflicts),
            dim: pick("dim", self.dim, other.dim, source, &mut conflicts),
            n_layers: pick("n_layers", self.n_layers, other.n_layers, source, &mut conflicts),
            vocab_size: pick("vocab_size", self.vocab_size, other.vocab_size, source, &mut conflicts),
            max_seq_len: pick("max_seq_len", self.max_seq_len, other.max_seq_len, source, &mut conflicts),
            hidden: pick("hidden", self.hidden, other.hidden, source, &mut conflicts),
            tie_word_embeddings: pick(
                "tie_word_embeddings",
                self.tie_word_embeddings,
                other.tie_word_embeddings,
                source,
                &mut conflicts,
            ),
        };
        if conflicts.is_empty() {
            Ok(merged)
        } else {
            Err(NnError::Config(format!("GPT-2 options disagree with {source}: {}", conflicts.join("; "))))
        }
    }
}

/// Loads a Hugging Face GPT-2 safetensors file, taking the number of heads (and epsilon,
/// activation) from the `config.json` beside it. See [`load_gpt2_with`].
pub fn load_gpt2(path: impl AsRef<Path>) -> Result<Transformer> {
    load_gpt2_with(path, &Gpt2Options::default())
}

/// Loads a Hugging Face GPT-2 safetensors file with `options`, completed by the `config.json`
/// beside the file when there is one (a value given in both must agree). Without `n_heads` in
/// either, it is an error. See the [module docs](crate::gpt2) for the layout.
pub fn load_gpt2_with(path: impl AsRef<Path>, options: &Gpt2Options) -> Result<Transformer> {
    let path = path.as_ref();
    let in_file =
        |e: std::io::Error, p: &Path| NnError::Io(std::io::Error::new(e.kind(), format!("{}: {e}", p.display())));
    let config_path = path.with_file_name("config.json");
    let options = if config_path.is_file() {
        let text = std::fs::read_to_string(&config_path).map_err(|e| in_file(e, &config_path))?;
        let declared = Gpt2Options::from_config_json(&text).map_err(|e| match e {
            NnError::Config(m) => NnError::Config(format!("{}: {m}", config_path.display())),
            other => other,
        })?;
        options.merge(&declared, &config_path.display().to_string())?
    } else {
        options.clone()
    };
    let bytes = std::fs::read(path).map_err(|e| in_file(e, path))?;
    gpt2_from_safetensors(&bytes, &options).map_err(|e| match e {
        NnError::SafeTensors(m) => NnError::SafeTensors(format!("{}: {m}", path.display())),
        NnError::Mismatch(mut problems) => {
            problems.insert(0, format!("in {}:", path.display()));
            NnError::Mismatch(problems)
        }
        other => other,
    })
}

/// Builds a [`Transformer`] from the bytes of a Hugging Face GPT-2 safetensors file; `options`
/// must give `n_heads` (see [`Gpt2Options::from_config_json`] to read them from a config).
pub fn gpt2_from_safetensors(bytes: &[u8], options: &Gpt2Options) -> Result<Transformer> {
    let file = SafeTensors::deserialize(bytes).map_err(|e| NnError::SafeTensors(e.to_string()))?;
    let mut reader = Reader::new(&file)?;
    let sizes = reader.sizes(options)?;
    let weights = reader.read_all(&sizes);
    reader.finish()?;
    build(sizes, weights)
}

/// The sizes of the model being loaded, inferred from the shapes and checked against `options`.
struct Sizes {
    config: TransformerConfig,
    hidden: usize,
    activation: Activation,
    tie_word_embeddings: Option<bool>,
}

/// A projection `in -> out` as Kiln stores it: weight `[out, in]`, bias `[out]`.
struct Projection {
    weight: Vec<f32>,
    bias: Vec<f32>,
    shape: [usize; 2],
}

/// One block's weights, already in Kiln's layout.
struct BlockWeights {
    ln1: [Vec<f32>; 2],
    qkvo: [Projection; 4],
    ln2: [Vec<f32>; 2],
    fc: Projection,
    proj: Projection,
}

/// Every weight of the model, in Kiln's layout.
struct Weights {
    wte: Vec<f32>,
    wpe: Vec<f32>,
    blocks: Vec<BlockWeights>,
    ln_f: [Vec<f32>; 2],
    /// `lm_head.weight` when stored; `None` ties the head to `wte`.
    head: Option<Vec<f32>>,
}

/// One tensor of the file.
struct Entry<'a> {
    /// The name as the file spells it.
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: &'a [u8],
    used: bool,
}

/// The file's tensors by their name without the `transformer.` prefix, and the problems found so
/// far.
struct Reader<'a> {
    entries: HashMap<String, Entry<'a>>,
    /// `transformer.` when the file uses it (to name missing tensors as the file would).
    prefix: &'static str,
    problems: Vec<String>,
}

const PREFIX: &str = "transformer.";

impl<'a> Reader<'a> {
    fn new(file: &SafeTensors<'a>) -> Result<Reader<'a>> {
        let mut entries: HashMap<String, Entry<'a>> = HashMap::new();
        let mut problems = Vec::new();
        let mut prefixed = false;
        let mut names: Vec<(String, safetensors::tensor::TensorView<'a>)> = file.tensors();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, view) in names {
            let key = match name.strip_prefix(PREFIX) {
                Some(rest) => {
                    prefixed = true;
                    rest.to_string()
                }
                None => name.clone(),
            };
            if let Some(other) = entries.get(&key) {
                problems.push(format!("`{}` and `{name}` are the same tensor", other.name));
                continue;
            }
            let entry =
                Entry { name, dtype: view.dtype(), shape: view.shape().to_vec(), data: view.data(), used: false };
            entries.insert(key, entry);
        }
        if entries.is_empty() && problems.is_empty() {
            return Err(NnError::Mismatch(vec!["the file holds no tensors (is it a GPT-2 checkpoint?)".into()]));
        }
        Ok(Reader { entries, prefix: if prefixed { PREFIX } else { "" }, problems })
    }

    /// The name of `key` as the file spells it (or would).
    fn display(&self, key: &str) -> String {
        match self.entries.get(key) {
            Some(e) => e.name.clone(),
            None if key == "lm_head.weight" => key.to_string(),
            None => format!("{}{key}", self.prefix),
        }
    }

    /// The shape of a tensor every GPT-2 has, or an error naming it.
    fn shape_of(&self, key: &str, rank: usize) -> Result<Vec<usize>> {
        match self.entries.get(key) {
            Some(e) if e.shape.len() == rank => Ok(e.shape.clone()),
            Some(e) => Err(NnError::Mismatch(vec![format!(
                "`{}` has shape {:?}; GPT-2 needs a rank-{rank} tensor",
                e.name, e.shape
            )])),
            None => Err(NnError::Mismatch(vec![format!("`{}` is missing", self.display(key))])),
        }
    }

    /// The model's sizes from `wte`, `wpe`, `h.0.mlp.c_fc` and the blocks present, checked against
    /// what `options` declares.
    fn sizes(&mut self, options: &Gpt2Options) -> Result<Sizes> {
        let wte = self.shape_of("wte.weight", 2)?;
        let wpe = self.shape_of("wpe.weight", 2)?;
        let (vocab_size, dim, max_seq_len) = (wte[0], wte[1], wpe[0]);
        let mut layers: Vec<usize> = self
            .entries
            .keys()
            .filter_map(|k| k.strip_prefix("h.")?.split('.').next()?.parse::<usize>().ok())
            .collect();
        layers.sort_unstable();
        layers.dedup();
        let n_layers = layers.last().map_or(0, |last| last + 1);
        let hidden = match self.entries.get("h.0.mlp.c_fc.weight") {
            Some(e) if e.shape.len() == 2 => e.shape[1],
            _ => options.hidden.unwrap_or(4 * dim),
        };
        let mut declared = Vec::new();
        for (what, key, found, given) in [
            ("dim (n_embd)", "wte.weight", dim, options.dim),
            ("vocab_size", "wte.weight", vocab_size, options.vocab_size),
            ("max_seq_len (n_positions)", "wpe.weight", max_seq_len, options.max_seq_len),
            ("hidden (n_inner)", "h.0.mlp.c_fc.weight", hidden, options.hidden),
        ] {
            if let Some(given) = given
                && given != found
            {
                declared.push(format!("{what} is declared {given} but `{}` gives {found}", self.display(key)));
            }
        }
        if let Some(given) = options.n_layers
            && given != n_layers
        {
            declared.push(format!(
                "n_layers (n_layer) is declared {given} but the file has blocks h.0 to h.{}",
                n_layers.saturating_sub(1)
            ));
        }
        if dim == 0 || vocab_size == 0 || max_seq_len == 0 || n_layers == 0 {
            declared.push(format!(
                "an empty model: dim {dim}, vocab {vocab_size}, positions {max_seq_len}, {n_layers} blocks `h.{{i}}`"
            ));
        }
        if !declared.is_empty() {
            return Err(NnError::Mismatch(declared));
        }
        let n_heads = options.n_heads.ok_or_else(|| {
            NnError::Config(
                "the number of attention heads is not in GPT-2 weights: give `Gpt2Options::n_heads`, or put Hugging \
                 Face's config.json (with `n_head`) beside the safetensors file"
                    .into(),
            )
        })?;
        if n_heads == 0 || !dim.is_multiple_of(n_heads) {
            return Err(NnError::Config(format!(
                "GPT-2 width {dim} (from `wte`) is not a multiple of n_heads {n_heads}"
            )));
        }
        let config = TransformerConfig {
            dim,
            n_heads,
            n_layers,
            norm_eps: options.norm_eps.unwrap_or(GPT2_NORM_EPS),
            vocab_size,
            max_seq_len,
        };
        Ok(Sizes {
            config,
            hidden,
            activation: options.activation.unwrap_or(Activation::GeluTanh),
            tie_word_embeddings: options.tie_word_embeddings,
        })
    }

    /// The elements of `key` as f32, checked to have `shape`; on a problem it is recorded and the
    /// result is empty (nothing is built while problems remain).
    fn take(&mut self, key: &str, shape: &[usize]) -> Vec<f32> {
        let display = self.display(key);
        let Some(entry) = self.entries.get_mut(key) else {
            self.problems.push(format!("`{display}` is missing (GPT-2 needs shape {shape:?})"));
            return Vec::new();
        };
        entry.used = true;
        if entry.shape != shape {
            self.problems.push(format!("`{display}` has shape {:?} but GPT-2 needs {shape:?}", entry.shape));
            return Vec::new();
        }
        let data = match from_le_bytes(entry.dtype, entry.data) {
            Some(HostData::F32(v)) => v,
            Some(HostData::F16(v)) => v.iter().map(|x| x.to_f32()).collect(),
            Some(HostData::BF16(v)) => v.iter().map(|x| x.to_f32()).collect(),
            Some(HostData::F64(v)) => v.iter().map(|&x| x as f32).collect(),
            _ => {
                self.problems.push(format!(
                    "`{display}` has dtype {:?}; GPT-2 weights must be F32, F16, BF16 or F64",
                    entry.dtype
                ));
                return Vec::new();
            }
        };
        if data.len() != shape.iter().product::<usize>() {
            self.problems.push(format!("`{display}` holds {} bytes, too few for shape {shape:?}", entry.data.len()));
            return Vec::new();
        }
        data
    }

    /// A Conv1D `[in, out]` weight with its bias, as `parts` Kiln projections of `out / parts`
    /// outputs each (`[out / parts, in]`, the columns of part `p` transposed).
    fn conv1d<const PARTS: usize>(&mut self, key: &str, inputs: usize, outputs: usize) -> [Projection; PARTS] {
        let weight = self.take(&format!("{key}.weight"), &[inputs, outputs]);
        let bias = self.take(&format!("{key}.bias"), &[outputs]);
        let part = outputs / PARTS;
        std::array::from_fn(|p| Projection {
            weight: if weight.is_empty() {
                Vec::new()
            } else {
                columns_transposed(&weight, inputs, outputs, p * part, part)
            },
            bias: bias.get(p * part..(p + 1) * part).map(<[f32]>::to_vec).unwrap_or_default(),
            shape: [part, inputs],
        })
    }

    fn norm(&mut self, key: &str, dim: usize) -> [Vec<f32>; 2] {
        [self.take(&format!("{key}.weight"), &[dim]), self.take(&format!("{key}.bias"), &[dim])]
    }

    /// Every weight, in Kiln's layout (problems recorded, see [`Reader::finish`]).
    fn read_all(&mut self, sizes: &Sizes) -> Weights {
        let TransformerConfig { dim, n_layers, vocab_size, max_seq_len, .. } = sizes.config;
        let hidden = sizes.hidden;
        let wte = self.take("wte.weight", &[vocab_size, dim]);
        let wpe = self.take("wpe.weight", &[max_seq_len, dim]);
        let blocks = (0..n_layers)
            .map(|i| {
                let [q, k, v] = self.conv1d::<3>(&format!("h.{i}.attn.c_attn"), dim, 3 * dim);
                let [o] = self.conv1d::<1>(&format!("h.{i}.attn.c_proj"), dim, dim);
                let [fc] = self.conv1d::<1>(&format!("h.{i}.mlp.c_fc"), dim, hidden);
                let [proj] = self.conv1d::<1>(&format!("h.{i}.mlp.c_proj"), hidden, dim);
                BlockWeights {
                    ln1: self.norm(&format!("h.{i}.ln_1"), dim),
                    qkvo: [q, k, v, o],
                    ln2: self.norm(&format!("h.{i}.ln_2"), dim),
                    fc,
                    proj,
                }
            })
            .collect();
        let ln_f = self.norm("ln_f", dim);
        let stored = self.entries.contains_key("lm_head.weight");
        let head = match (sizes.tie_word_embeddings, stored) {
            (Some(false), false) => {
                self.problems.push(format!(
                    "`lm_head.weight` is missing (GPT-2 needs shape {:?}): tie_word_embeddings is false, so the head is \
                     not `{}`",
                    [vocab_size, dim],
                    self.display("wte.weight")
                ));
                None
            }
            (Some(true), true) => {
                let head = self.take("lm_head.weight", &[vocab_size, dim]);
                if !head.is_empty() && !wte.is_empty() && head != wte {
                    self.problems.push(format!(
                        "`lm_head.weight` differs from `{}`, but tie_word_embeddings is true (the head is the token \
                         embedding)",
                        self.display("wte.weight")
                    ));
                }
                None
            }
            (_, true) => Some(self.take("lm_head.weight", &[vocab_size, dim])),
            (_, false) => None,
        };
        Weights { wte, wpe, blocks, ln_f, head }
    }

    /// Reports every problem: those recorded, and tensors of the file that were not used (other
    /// than the causal-mask buffers older checkpoints store).
    fn finish(self) -> Result<()> {
        let mut problems = self.problems;
        let mut unused: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|(key, e)| {
                !e.used
                    && !(key.starts_with("h.") && (key.ends_with(".attn.bias") || key.ends_with(".attn.masked_bias")))
            })
            .map(|(_, e)| e)
            .collect();
        unused.sort_by(|a, b| a.name.cmp(&b.name));
        problems.extend(unused.into_iter().map(|e| {
            format!(
                "`{}` (shape {:?}) is not a tensor of GPT-2 (cross-attention and extra heads are not supported)",
                e.name, e.shape
            )
        }));
        if problems.is_empty() { Ok(()) } else { Err(NnError::Mismatch(problems)) }
    }
}

/// Columns `start..start + n` of the row-major `[rows, cols]` matrix `w`, transposed: `[n, rows]`.
fn columns_transposed(w: &[f32], rows: usize, cols: usize, start: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n * rows];
    for r in 0..rows {
        for (c, &x) in w[r * cols + start..r * cols + start + n].iter().enumerate() {
            out[c * rows + r] = x;
        }
    }
    out
}

/// The model from weights that passed every check.
fn build(sizes: Sizes, weights: Weights) -> Result<Transformer> {
    let TransformerConfig { dim, n_heads, norm_eps, vocab_size, max_seq_len, .. } = sizes.config;
    let linear = |p: Projection| Linear { bias: Some(param(p.bias, &[p.shape[0]])), weight: param(p.weight, &p.shape) };
    let norm = |[weight, bias]: [Vec<f32>; 2]| LayerNorm {
        weight: param(weight, &[dim]),
        bias: param(bias, &[dim]),
        eps: norm_eps,
    };
    let wte = param(weights.wte, &[vocab_size, dim]);
    let head = match weights.head {
        Some(head) => param(head, &[vocab_size, dim]),
        None => wte.clone(),
    };
    let blocks = weights
        .blocks
        .into_iter()
        .map(|b| {
            Ok(Block {
                ln1: norm(b.ln1),
                attn: CausalSelfAttention::from_projections(b.qkvo.map(linear), n_heads, max_seq_len)?,
                ln2: norm(b.ln2),
                mlp: Mlp { fc: linear(b.fc), proj: linear(b.proj), activation: sizes.activation },
            })
        })
        .collect::<Result<Vec<Block>>>()?;
    Ok(Transformer {
        wte: Embedding { weight: wte },
        wpe: Embedding { weight: param(weights.wpe, &[max_seq_len, dim]) },
        blocks,
        ln_f: norm(weights.ln_f),
        head: Linear { weight: head, bias: None },
        config: sizes.config,
        recorder: kiln::Recorder::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_transposed_takes_a_block_of_columns() {
        // [[0, 1, 2], [3, 4, 5]]: columns 1..3 transposed are [[1, 4], [2, 5]].
        let w: Vec<f32> = (0..6).map(|x| x as f32).collect();
        assert_eq!(columns_transposed(&w, 2, 3, 1, 2), [1.0, 4.0, 2.0, 5.0]);
        assert_eq!(columns_transposed(&w, 2, 3, 0, 1), [0.0, 3.0]);
    }

    #[test]
    fn config_json_gives_heads_eps_activation_and_sizes() {
        let text = r#"{"model_type": "gpt2", "n_head": 12, "n_embd": 768, "n_layer": 12, "vocab_size": 50257,
            "n_positions": 1024, "n_inner": null, "layer_norm_epsilon": 1e-05, "activation_function": "gelu_new",
            "add_cross_attention": false, "scale_attn_weights": true}"#;
        let options = Gpt2Options::from_config_json(text).unwrap();
        assert_eq!(
            options,
            Gpt2Options {
                n_heads: Some(12),
                norm_eps: Some(1e-5),
                activation: Some(Activation::GeluTanh),
                dim: Some(768),
                n_layers: Some(12),
                vocab_size: Some(50257),
                max_seq_len: Some(1024),
                hidden: None,
                tie_word_embeddings: None,
            }
        );
    }

    #[test]
    fn config_json_that_kiln_cannot_follow_is_an_error() {
        for (text, names) in [
            (r#"{"model_type": "gpt_neo"}"#, "model_type"),
            (r#"{"add_cross_attention": true}"#, "add_cross_attention"),
            (r#"{"scale_attn_by_inverse_layer_idx": true}"#, "scale_attn_by_inverse_layer_idx"),
            (r#"{"activation_function": "quick_gelu"}"#, "activation_function"),
            (r#"{"n_head": "twelve"}"#, "n_head"),
            (r#"{"n_head": -1}"#, "n_head"),
            (r#"{"tie_word_embeddings": 1}"#, "tie_word_embeddings"),
            (r#"[1, 2]"#, "not a JSON object"),
            (r#"{"n_head": "#, "config.json"),
        ] {
            let e = Gpt2Options::from_config_json(text).unwrap_err().to_string();
            assert!(e.contains(names), "{text}: {e}");
        }
    }

    #[test]
    fn options_and_config_must_agree() {
        let given = Gpt2Options { n_heads: Some(8), norm_eps: Some(1e-6), ..Gpt2Options::default() };
        let declared = Gpt2Options { n_heads: Some(8), dim: Some(64), ..Gpt2Options::default() };
        let merged = given.merge(&declared, "config.json").unwrap();
        assert_eq!((merged.n_heads, merged.norm_eps, merged.dim), (Some(8), Some(1e-6), Some(64)));
        let e = Gpt2Options::with_heads(4).merge(&declared, "config.json").unwrap_err().to_string();
        assert!(e.contains("n_heads: the options say 4 but config.json says 8"), "{e}");
    }
}
