//! Host tensors: typed, reference-counted arrays on the host, shared by the interpreter, the
//! runtime (which reads them in place, zero-copy) and the facade.

use std::sync::Arc;

use half::{bf16, f16};

use crate::dtype::{DType, Scalar};

/// A typed host array. `Vec`s so that a uniquely held buffer can be handed back without a copy.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// Elements of dtype `bool`.
    Bool(Vec<bool>),
    /// Elements of dtype `i32`.
    I32(Vec<i32>),
    /// Elements of dtype `i64`.
    I64(Vec<i64>),
    /// Elements of dtype `f16`.
    F16(Vec<f16>),
    /// Elements of dtype `bf16`.
    BF16(Vec<bf16>),
    /// Elements of dtype `f32`.
    F32(Vec<f32>),
    /// Elements of dtype `f64`.
    F64(Vec<f64>),
}

/// Rust element types that map to a `DType`.
pub trait Element: Copy + Send + Sync + 'static {
    /// The dtype whose elements this type stores.
    const DTYPE: DType;
    /// Wraps `v` as the matching [`HostData`] variant, without a copy.
    fn wrap(v: Vec<Self>) -> HostData;
    /// The elements of `d` if it holds this type, else `None`.
    fn unwrap_ref(d: &HostData) -> Option<&[Self]>;
    /// The vector inside `d` if it holds this type (no copy), else `d` back unchanged as the error.
    fn unwrap_vec(d: HostData) -> Result<Vec<Self>, HostData>;
    /// The value as a [`Scalar`] (ints widen to `i64`, floats to `f64`).
    fn to_scalar(self) -> Scalar;
    /// `s` converted to this type through [`Scalar::as_bool`], [`Scalar::as_i64`] or
    /// [`Scalar::as_f64`], then Rust's `as` (or the nearest `f16`/`bf16`).
    fn from_scalar(s: Scalar) -> Self;
}

macro_rules! element {
    ($t:ty, $v:ident, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$v;
            fn wrap(v: Vec<Self>) -> HostData {
                HostData::$v(v)
            }
            fn unwrap_ref(d: &HostData) -> Option<&[Self]> {
                match d {
                    HostData::$v(v) => Some(v),
                    _ => None,
                }
            }
            fn unwrap_vec(d: HostData) -> Result<Vec<Self>, HostData> {
                match d {
                    HostData::$v(v) => Ok(v),
                    other => Err(other),
                }
            }
            fn to_scalar(self) -> Scalar {
                let f: fn($t) -> Scalar = $to;
                f(self)
            }
            fn from_scalar(s: Scalar) -> Self {
                let f: fn(Scalar) -> $t = $from;
                f(s)
            }
        }
    };
}
element!(bool, Bool, Scalar::Bool, |s| s.as_bool());
element!(i32, I32, |x| Scalar::Int(x as i64), |s| s.as_i64() as i32);
element!(i64, I64, Scalar::Int, |s| s.as_i64());
element!(f16, F16, |x| Scalar::Float(x.to_f64()), |s| f16::from_f64(s.as_f64()));
element!(bf16, BF16, |x| Scalar::Float(x.to_f64()), |s| bf16::from_f64(s.as_f64()));
element!(f32, F32, |x| Scalar::Float(x as f64), |s| s.as_f64() as f32);
element!(f64, F64, Scalar::Float, |s| s.as_f64());

/// Applies `$body` with `$v` bound to the inner `Vec` of whichever variant `$data` is.
#[macro_export]
macro_rules! with_host_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::host::HostData::Bool($v) => $body,
            $crate::host::HostData::I32($v) => $body,
            $crate::host::HostData::I64($v) => $body,
            $crate::host::HostData::F16($v) => $body,
            $crate::host::HostData::BF16($v) => $body,
            $crate::host::HostData::F32($v) => $body,
            $crate::host::HostData::F64($v) => $body,
        }
    };
}

/// [`HostData::empty_shared`]'s arrays, one per dtype.
static EMPTY_SHARED: std::sync::LazyLock<[Arc<HostData>; DType::ALL.len()]> =
    std::sync::LazyLock::new(|| DType::ALL.map(|d| Arc::new(HostData::filled(d, 0, Scalar::Int(0)))));

impl HostData {
    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::Bool(_) => DType::Bool,
            HostData::I32(_) => DType::I32,
            HostData::I64(_) => DType::I64,
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_host_data!(self, v => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` copies of `value` converted to `dtype`.
    pub fn filled(dtype: DType, n: usize, value: Scalar) -> HostData {
        match dtype {
            DType::Bool => HostData::Bool(vec![bool::from_scalar(value); n]),
            DType::I32 => HostData::I32(vec![i32::from_scalar(value); n]),
            DType::I64 => HostData::I64(vec![i64::from_scalar(value); n]),
            DType::F16 => HostData::F16(vec![f16::from_scalar(value); n]),
            DType::BF16 => HostData::BF16(vec![bf16::from_scalar(value); n]),
            DType::F32 => HostData::F32(vec![f32::from_scalar(value); n]),
            DType::F64 => HostData::F64(vec![f64::from_scalar(value); n]),
        }
    }

    /// A shared array of no elements of `dtype`: a placeholder for an array taken elsewhere, at
    /// the cost of a reference count rather than an allocation.
    pub fn empty_shared(dtype: DType) -> Arc<HostData> {
        let i = DType::ALL.iter().position(|&d| d == dtype).expect("DType::ALL lists every dtype");
        EMPTY_SHARED[i].clone()
    }

    /// Whether `data` is one of [`HostData::empty_shared`]'s arrays (compared by address: no
    /// array is read).
    pub fn is_empty_shared(data: &Arc<HostData>) -> bool {
        EMPTY_SHARED.iter().any(|e| Arc::ptr_eq(e, data))
    }

    /// Element `i` as a scalar.
    pub fn get(&self, i: usize) -> Scalar {
        with_host_data!(self, v => v[i].to_scalar())
    }

    /// Every element converted to `f64` (bools as 0/1).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        with_host_data!(self, v => v.iter().map(|x| x.to_scalar().as_f64()).collect())
    }

    /// Raw bytes of the elements, little-endian, as stored.
    pub fn as_bytes(&self) -> &[u8] {
        fn bytes<T>(v: &[T]) -> &[u8] {
            // SAFETY: every element type here is plain old data without padding; reading its
            // bytes is always defined. `bool` is one byte holding 0 or 1.
            unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
        }
        with_host_data!(self, v => bytes(v))
    }
}

/// A host array with a shape, shared by reference count.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// The elements in row-major order, shared by reference count.
    pub data: Arc<HostData>,
    /// The size of each axis; their product is the element count.
    pub shape: Vec<usize>,
}

impl HostTensor {
    /// Wraps `data` (no copy). Errors if the element count does not match `shape`.
    pub fn new(data: HostData, shape: Vec<usize>) -> Result<HostTensor, String> {
        HostTensor::from_arc(Arc::new(data), shape)
    }

    /// Like [`HostTensor::new`], for data that is already shared. Errors if the element count does
    /// not match `shape`.
    pub fn from_arc(data: Arc<HostData>, shape: Vec<usize>) -> Result<HostTensor, String> {
        let Some(n) = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)) else {
            return Err(format!("host tensor: the element count of shape {shape:?} overflows"));
        };
        if n != data.len() {
            return Err(format!("host tensor: {} elements do not fill shape {:?} ({} elements)", data.len(), shape, n));
        }
        Ok(HostTensor { data, shape })
    }

    /// Wraps a vector of `T` (no copy). Errors if the element count does not match `shape`.
    pub fn from_vec<T: Element>(v: Vec<T>, shape: Vec<usize>) -> Result<HostTensor, String> {
        HostTensor::new(T::wrap(v), shape)
    }

    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// Number of elements (the product of `shape`).
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The elements as a slice of `T`, if the dtype matches.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        T::unwrap_ref(&self.data)
    }

    /// The elements as a `Vec<T>`: without a copy when this is the only reference, else cloned.
    pub fn into_vec<T: Element>(self) -> Option<Vec<T>> {
        match Arc::try_unwrap(self.data) {
            Ok(d) => T::unwrap_vec(d).ok(),
            Err(shared) => T::unwrap_ref(&shared).map(|s| s.to_vec()),
        }
    }
}
