//! Saving and loading a module's parameter tree as safetensors (names as [`Module::visit`] gives
//! them: `blocks.0.attn.q.weight`).
//!
//! Loading is all-or-nothing: every name, dtype and shape is checked first, and every mismatch is
//! reported in one [`NnError::Mismatch`]; the module is changed only when there is none.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use kiln::{DType, HostData, HostTensor, Tensor};
use safetensors::{Dtype, SafeTensors, View};

use crate::error::{NnError, Result};
use crate::module::{Module, ParamKind};

fn to_safetensors_dtype(dtype: DType) -> Result<Dtype> {
    Ok(match dtype {
        DType::Bool => Dtype::BOOL,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
    })
}

/// A realized tensor's bytes, little-endian, as safetensors wants them.
struct Bytes {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Bytes {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn le_bytes(data: &HostData) -> Vec<u8> {
    match data {
        HostData::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
        HostData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

fn chunks<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    bytes.chunks_exact(N).map(|c| f(c.try_into().unwrap_or([0; N]))).collect()
}

/// The elements of little-endian `bytes` of a safetensors `dtype` (`None` for a dtype Kiln has not).
pub(crate) fn from_le_bytes(dtype: Dtype, bytes: &[u8]) -> Option<HostData> {
    Some(match dtype {
        Dtype::BOOL => HostData::Bool(bytes.iter().map(|&b| b != 0).collect()),
        Dtype::I32 => HostData::I32(chunks(bytes, i32::from_le_bytes)),
        Dtype::I64 => HostData::I64(chunks(bytes, i64::from_le_bytes)),
        Dtype::F16 => HostData::F16(chunks(bytes, half::f16::from_le_bytes)),
        Dtype::BF16 => HostData::BF16(chunks(bytes, half::bf16::from_le_bytes)),
        Dtype::F32 => HostData::F32(chunks(bytes, f32::from_le_bytes)),
        Dtype::F64 => HostData::F64(chunks(bytes, f64::from_le_bytes)),
        _ => return None,
    })
}

/// The module's parameters and buffers as safetensors bytes (realizing any lazy tensor first).
pub fn to_safetensors_bytes(module: &dyn Module) -> Result<Vec<u8>> {
    let named: Vec<(String, Tensor)> = module.state_dict().into_iter().map(|(name, t, _)| (name, t)).collect();
    tensors_to_safetensors_bytes(&named)
}

/// Named tensors as safetensors bytes (realizing any lazy tensor first).
pub(crate) fn tensors_to_safetensors_bytes(named: &[(String, Tensor)]) -> Result<Vec<u8>> {
    let mut entries: Vec<(String, Bytes)> = Vec::new();
    for (name, t) in named {
        let name = name.clone();
        let host = t.to_host()?;
        entries.push((
            name,
            Bytes { dtype: to_safetensors_dtype(host.dtype())?, shape: host.shape.clone(), data: le_bytes(&host.data) },
        ));
    }
    let views = entries.iter().map(|(n, b)| (n.as_str(), b));
    safetensors::serialize(views, None).map_err(|e| NnError::SafeTensors(e.to_string()))
}

/// Writes the module's parameters and buffers to a safetensors file.
pub fn save_safetensors(module: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    let bytes = to_safetensors_bytes(module)?;
    std::fs::write(path, bytes)?;
    Ok(())
}

/// Every tensor of a safetensors buffer, by name, as `kiln` source tensors.
pub fn read_safetensors(bytes: &[u8]) -> Result<HashMap<String, Tensor>> {
    let file = SafeTensors::deserialize(bytes).map_err(|e| NnError::SafeTensors(e.to_string()))?;
    let mut out = HashMap::new();
    for (name, view) in file.tensors() {
        let data = from_le_bytes(view.dtype(), view.data())
            .ok_or_else(|| NnError::SafeTensors(format!("tensor `{name}` has unsupported dtype {:?}", view.dtype())))?;
        let host = HostTensor::new(data, view.shape().to_vec()).map_err(NnError::SafeTensors)?;
        out.insert(name, Tensor::from_host(host));
    }
    Ok(out)
}

/// Loads a safetensors file into `module` (see [`load_state_dict`]).
pub fn load_safetensors(module: &mut dyn Module, path: impl AsRef<Path>, strict: bool) -> Result<()> {
    let bytes = std::fs::read(path)?;
    load_state_dict(module, &read_safetensors(&bytes)?, strict)
}

/// Replaces `module`'s parameters and buffers with the tensors of `tensors` of the same names.
/// Every one must be present with the module's dtype and shape; with `strict`, `tensors` may hold
/// no other names. All names are checked before anything changes: on any mismatch the module is
/// untouched and the error lists every problem. Loaded parameters are marked `requires_grad`.
pub fn load_state_dict(module: &mut dyn Module, tensors: &HashMap<String, Tensor>, strict: bool) -> Result<()> {
    let mut problems = Vec::new();
    let mut wanted = std::collections::HashSet::new();
    for (name, current, _) in module.state_dict() {
        wanted.insert(name.clone());
        let Some(given) = tensors.get(&name) else {
            problems.push(format!("`{name}` is missing"));
            continue;
        };
        if given.dtype() != current.dtype() {
            problems.push(format!("`{name}` has dtype {} but the model expects {}", given.dtype(), current.dtype()));
        }
        match (given.dims(), current.dims()) {
            (Ok(g), Ok(c)) if g != c => problems.push(format!("`{name}` has shape {g:?} but the model expects {c:?}")),
            (Err(e), _) | (_, Err(e)) => problems.push(format!("`{name}`: {e}")),
            _ => {}
        }
    }
    if strict {
        let mut extra: Vec<&String> = tensors.keys().filter(|n| !wanted.contains(*n)).collect();
        extra.sort();
        problems.extend(extra.into_iter().map(|n| format!("`{n}` is not a tensor of the model")));
    }
    if !problems.is_empty() {
        return Err(NnError::Mismatch(problems));
    }
    module.visit_mut(&mut |name, t, kind| {
        if let Some(given) = tensors.get(name) {
            *t = if kind == ParamKind::Weight { given.clone().requires_grad_() } else { given.clone() };
        }
    });
    Ok(())
}
