//! The one error type of `kiln-nn`.

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
    /// Reading or writing a file failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// `Result` with [`NnError`].
pub type Result<T, E = NnError> = std::result::Result<T, E>;
