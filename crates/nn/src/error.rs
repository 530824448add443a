//! The one error type of `kiln-nn`.

use std::panic::Location;

/// Everything that can go wrong in `kiln-nn`.
#[derive(Debug, thiserror::Error)]
pub enum NnError {
    /// A tensor op failed (shape mismatch, bad dtype, ...) or a backend failed.
    #[error(transparent)]
    Kiln(#[from] kiln::Error),
    /// A layer was configured with impossible sizes (`dim` not divisible by `n_heads`, ...).
    #[error("config: {0}")]
    Config(String),
    /// A weights file does not match the model; every mismatch is listed, nothing was loaded.
    #[error("weights do not match the model (nothing was loaded):\n  {}", .0.join("\n  "))]
    Mismatch(Vec<String>),
    /// A key/value cache cannot take the tokens (past its length, wrong batch or model).
    #[error("kv cache: {0}")]
    Cache(String),
    /// The safetensors data could not be read or written.
    #[error("safetensors: {0}")]
    SafeTensors(String),
    /// A collective of data-parallel training failed (a peer gone or hung, ranks that disagree).
    #[error(transparent)]
    Dist(#[from] kiln_dist::DistError),
    /// Reading or writing a file failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// Decoding (`generate`, a `Decoder`) was given a bad config or bad tokens, or the model gave
    /// logits it cannot sample from; `location` is the caller's source line.
    #[error("generate: {message} (at {location})")]
    Generate {
        /// What was wrong.
        kind: GenerateErrorKind,
        /// The details: the values, the row and the step.
        message: String,
        /// The call that was given them.
        location: &'static Location<'static>,
    },
}

/// What a [`NnError::Generate`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenerateErrorKind {
    /// The `GenerateConfig` is invalid (a temperature, `top_k` or `top_p` out of range, a stop
    /// token outside the vocabulary).
    Config,
    /// Tokens fed to a decoder are invalid: no rows, an empty row, rows of different lengths, an
    /// id outside the vocabulary, a sequence longer than the model's context.
    Tokens,
    /// The model's logits cannot be sampled from: a NaN or infinity, or not `[batch][vocab]`.
    Logits,
}

/// `Result` with [`NnError`].
pub type Result<T, E = NnError> = std::result::Result<T, E>;
