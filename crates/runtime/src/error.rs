//! The error type of the runtime: every failure a caller can cause or meet, never a panic, each
//! with an [`ErrorKind`] callers can match on whatever device reported it.

use air::{DType, Symbol};

/// What an input should be, or what was given: a dtype, a shape and the elements it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputSpec {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Elements the tensor holds (given inputs only: a `HostTensor` whose data does not match its
    /// shape is refused too).
    pub numel: usize,
}

impl std::fmt::Display for InputSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{:?}", self.dtype, self.shape)?;
        let product = self.shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b));
        if product != Some(self.numel) {
            write!(f, " with {} elements", self.numel)?;
        }
        Ok(())
    }
}

/// Errors from compiling or running a program on a device.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Lowering the graph to kernels failed, or a data-dependent check of a run failed (an index
    /// out of range: `LowerError::Data`).
    #[error(transparent)]
    Lower(#[from] lower::LowerError),
    /// Compiling a kernel to native code or a shader failed.
    #[error(transparent)]
    Codegen(#[from] codegen::CodegenError),
    /// The caller passed the wrong number of inputs.
    #[error("expected {expected} inputs, got {got}")]
    InputCount { expected: usize, got: usize },
    /// An input's dtype or shape does not match the graph's input node for these bindings:
    /// `declared` is the node's type (symbolic dims and all), `expected` that type for these
    /// bindings.
    #[error("input slot {slot}: expected {declared} (= {expected}), got {got}")]
    InputMismatch { slot: u32, declared: Box<air::TensorType>, expected: InputSpec, got: InputSpec },
    /// A condition of the graph's symbolic shapes fails for the bindings (a shrink past the end
    /// of its input, a negative padding or dim): the error the interpreter gives too, naming the
    /// op and its node's position in the graph (`air::constraints`).
    #[error(transparent)]
    Bounds(#[from] air::BoundsError),
    /// A symbol the program needs has no value in the bindings.
    #[error("symbol `{0}` has no value bound")]
    Unbound(Symbol),
    /// A dim evaluated to a negative or overflowing size.
    #[error("bad size: {0}")]
    BadSize(String),
    /// Out of host memory: an allocation (arena, output, readback) was refused. Every host
    /// allocation whose size a user chooses is reserved fallibly and reported here, never an
    /// abort.
    #[error("out of memory: could not allocate {bytes} bytes for {what}")]
    Alloc { bytes: usize, what: &'static str },
    /// Out of device memory: a device buffer was refused (over the device's limits, or its
    /// allocator failed).
    #[error("out of {device} memory: {message}")]
    DeviceAlloc { device: &'static str, message: String },
    /// The program asks for something this device does not do.
    #[error("unsupported on {device}: {what}")]
    Unsupported { device: &'static str, what: String },
    /// The device is gone (driver reset, device removed) or a transfer from it failed.
    #[error("{device} device lost: {reason}")]
    DeviceLost { device: &'static str, reason: String },
    /// The device failed otherwise: no adapter, a rejected shader, a validation error.
    #[error("{device}: {message}")]
    Device { device: &'static str, message: String },
    /// The program is inconsistent (an internal bug upstream, reported instead of run).
    #[error("invalid program: {0}")]
    InvalidProgram(String),
}

/// What kind of failure a [`RuntimeError`] is: the part callers match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Host or device memory ran out.
    OutOfMemory,
    /// The device does not do what the program asks (a dtype, an op).
    Unsupported,
    /// The inputs or bindings do not fit the program (count, dtype, shape, an unbound symbol, a
    /// size that is negative or overflows).
    BadInput,
    /// A shape condition failed for the bindings, or a data-dependent check failed in a run (an
    /// index out of range, an integer division by zero).
    Bounds,
    /// The device was lost, or reading results back from it failed.
    DeviceLost,
    /// Any other failure of the device (no adapter, a rejected shader, a validation error).
    Device,
    /// The graph or program is invalid (lowering refused it, or an internal inconsistency).
    InvalidProgram,
}

impl RuntimeError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RuntimeError::Lower(lower::LowerError::Data(_)) => ErrorKind::Bounds,
            RuntimeError::Lower(_) => ErrorKind::InvalidProgram,
            RuntimeError::Codegen(codegen::CodegenError::Unsupported(_)) => ErrorKind::Unsupported,
            RuntimeError::Codegen(_) => ErrorKind::InvalidProgram,
            RuntimeError::InputCount { .. }
            | RuntimeError::InputMismatch { .. }
            | RuntimeError::Unbound(_)
            | RuntimeError::BadSize(_) => ErrorKind::BadInput,
            RuntimeError::Bounds(_) => ErrorKind::Bounds,
            RuntimeError::Alloc { .. } | RuntimeError::DeviceAlloc { .. } => ErrorKind::OutOfMemory,
            RuntimeError::Unsupported { .. } => ErrorKind::Unsupported,
            RuntimeError::DeviceLost { .. } => ErrorKind::DeviceLost,
            RuntimeError::Device { .. } => ErrorKind::Device,
            RuntimeError::InvalidProgram(_) => ErrorKind::InvalidProgram,
        }
    }

    pub(crate) fn unsupported_dtype(what: &str, dtype: DType) -> RuntimeError {
        RuntimeError::Unsupported { device: "cpu", what: format!("{what} of dtype {dtype}") }
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
