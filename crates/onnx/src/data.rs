//! `TensorProto` to Kiln host tensors: element types, raw and typed data fields, external data.

use std::path::Path;

use kiln::{DType, HostData, HostTensor};

use crate::error::{Error, Result};
use crate::proto::TensorProto;
use crate::proto::tensor_proto::{DataLocation, DataType};

/// The Kiln dtype of an ONNX element type, or `None` for the ones Kiln lacks (uint8, int8,
/// uint16, int16, uint32, uint64, string, complex, the float8/4-bit types).
pub fn to_dtype(elem_type: i32) -> Option<DType> {
    Some(match DataType::try_from(elem_type).ok()? {
        DataType::Float => DType::F32,
        DataType::Double => DType::F64,
        DataType::Int32 => DType::I32,
        DataType::Int64 => DType::I64,
        DataType::Bool => DType::Bool,
        DataType::Float16 => DType::F16,
        DataType::Bfloat16 => DType::BF16,
        _ => return None,
    })
}

/// ONNX's name of an element type (`"FLOAT"`, `"INT64"`...), or `"type N"` for unknown numbers.
pub fn elem_type_name(elem_type: i32) -> String {
    match DataType::try_from(elem_type) {
        Ok(t) => t.as_str_name().to_string(),
        Err(_) => format!("type {elem_type}"),
    }
}

/// The host tensor a `TensorProto` holds. External data is read relative to `dir` (the model
/// file's folder); without `dir` it is an error.
pub fn from_tensor_proto(t: &TensorProto, dir: Option<&Path>) -> Result<HostTensor> {
    let name = t.name.as_deref().unwrap_or("");
    let bad = |m: String| Error::Invalid(format!("tensor {name:?}: {m}"));
    let elem = t.data_type.unwrap_or(0);
    let dtype = to_dtype(elem).ok_or_else(|| bad(format!("element type {} is not supported", elem_type_name(elem))))?;
    let mut shape = Vec::with_capacity(t.dims.len());
    let mut count: usize = 1;
    for &d in &t.dims {
        let d = usize::try_from(d).map_err(|_| bad(format!("negative dim {d}")))?;
        count = count
            .checked_mul(d)
            .filter(|&c| c <= isize::MAX as usize / 8)
            .ok_or_else(|| bad("too many elements".into()))?;
        shape.push(d);
    }
    let external;
    let raw: Option<&[u8]> = if t.data_location == Some(DataLocation::External as i32) {
        external = read_external(t, dir).map_err(bad)?;
        Some(&external)
    } else {
        t.raw_data.as_deref()
    };
    let data = match raw {
        Some(bytes) => from_raw(dtype, bytes, count).map_err(bad)?,
        None => from_typed(dtype, t, count).map_err(bad)?,
    };
    HostTensor::new(data, shape).map_err(bad)
}

fn read_external(t: &TensorProto, dir: Option<&Path>) -> std::result::Result<Vec<u8>, String> {
    let mut location = None;
    let (mut offset, mut length) = (0u64, None);
    for e in &t.external_data {
        let value = e.value.as_deref().unwrap_or("");
        let number =
            || value.parse::<u64>().map_err(|_| format!("external data {:?} is not a number: {value:?}", e.key));
        match e.key.as_deref() {
            Some("location") => location = Some(value.to_string()),
            Some("offset") => offset = number()?,
            Some("length") => length = Some(number()?),
            _ => {}
        }
    }
    let location = location.ok_or("external data without a location")?;
    let rel = Path::new(&location);
    if rel.is_absolute() || rel.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(format!("external data location {location:?} leaves the model's folder"));
    }
    let dir = dir.ok_or("external data needs the model's folder (load the model from a file)")?;
    let path = dir.join(rel);
    let bytes = std::fs::read(&path).map_err(|e| format!("external data {}: {e}", path.display()))?;
    let start = usize::try_from(offset).map_err(|_| "offset too large")?;
    let end = match length {
        Some(l) => start.checked_add(usize::try_from(l).map_err(|_| "length too large")?).ok_or("length too large")?,
        None => bytes.len(),
    };
    bytes.get(start..end).map(<[u8]>::to_vec).ok_or_else(|| {
        format!("external data {}..{end} past the end of {} ({} bytes)", start, path.display(), bytes.len())
    })
}

fn check_len(have: usize, want: usize) -> std::result::Result<(), String> {
    if have == want { Ok(()) } else { Err(format!("holds {have} elements where its dims make {want}")) }
}

fn from_raw(dtype: DType, bytes: &[u8], count: usize) -> std::result::Result<HostData, String> {
    let width = dtype.size_bytes();
    if bytes.len() != count * width {
        return Err(format!("raw data has {} bytes where its dims and type make {}", bytes.len(), count * width));
    }
    macro_rules! le {
        ($t:ty, $n:literal) => {
            bytes.chunks_exact($n).map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk width"))).collect()
        };
    }
    Ok(match dtype {
        DType::F32 => HostData::F32(le!(f32, 4)),
        DType::F64 => HostData::F64(le!(f64, 8)),
        DType::I32 => HostData::I32(le!(i32, 4)),
        DType::I64 => HostData::I64(le!(i64, 8)),
        DType::Bool => HostData::Bool(bytes.iter().map(|&b| b != 0).collect()),
        DType::F16 => HostData::F16(bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]])).collect()),
        DType::BF16 => HostData::BF16(bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]])).collect()),
    })
}

fn from_typed(dtype: DType, t: &TensorProto, count: usize) -> std::result::Result<HostData, String> {
    let data = match dtype {
        DType::F32 => HostData::F32(t.float_data.clone()),
        DType::F64 => HostData::F64(t.double_data.clone()),
        DType::I32 => HostData::I32(t.int32_data.clone()),
        DType::I64 => HostData::I64(t.int64_data.clone()),
        DType::Bool => HostData::Bool(t.int32_data.iter().map(|&v| v != 0).collect()),
        DType::F16 => HostData::F16(t.int32_data.iter().map(|&v| half::f16::from_bits(v as u16)).collect()),
        DType::BF16 => HostData::BF16(t.int32_data.iter().map(|&v| half::bf16::from_bits(v as u16)).collect()),
    };
    check_len(data.len(), count)?;
    Ok(data)
}
