//! Tensors in files for `kiln onnx run`: NumPy `.npy` arrays (read and written through `npyz`)
//! and ONNX `TensorProto` files (`.pb`, the format of ONNX's own test data and of
//! `onnx.numpy_helper.from_array`), read into Kiln host tensors.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::Path;

use anyhow::{Context, bail};
use kiln::{HostData, HostTensor};
use kiln_onnx::proto::TensorProto;
use npyz::{TypeChar, WriterBuilder};
use prost::Message;

/// The tensor in `path`: `.npy` (C order; float16/32/64, int32/64, bool) or `.pb` (a
/// `TensorProto`).
pub fn read(path: &Path) -> anyhow::Result<HostTensor> {
    let what = || format!("reading {}", path.display());
    match path.extension().and_then(|e| e.to_str()) {
        Some("npy") => read_npy(path).with_context(what),
        Some("pb") => {
            let bytes = std::fs::read(path).with_context(what)?;
            let proto = TensorProto::decode(bytes.as_slice()).context("not a TensorProto").with_context(what)?;
            Ok(kiln_onnx::from_tensor_proto(&proto, path.parent()).with_context(what)?)
        }
        _ => bail!("{}: expected a .npy or a .pb (TensorProto) file", path.display()),
    }
}

fn read_npy(path: &Path) -> anyhow::Result<HostTensor> {
    let npy = npyz::NpyFile::new(BufReader::new(File::open(path)?))?;
    if npy.order() == npyz::Order::Fortran {
        bail!("the array is in Fortran order: save it with np.ascontiguousarray");
    }
    let shape: Vec<usize> =
        npy.shape().iter().map(|&d| usize::try_from(d)).collect::<Result<_, _>>().context("a dim too large")?;
    let npyz::DType::Plain(ty) = npy.dtype() else { bail!("a structured array (dtype {})", npy.dtype().descr()) };
    let data = match (ty.type_char(), ty.size_field()) {
        (TypeChar::Float, 2) => HostData::F16(npy.into_vec()?),
        (TypeChar::Float, 4) => HostData::F32(npy.into_vec()?),
        (TypeChar::Float, 8) => HostData::F64(npy.into_vec()?),
        (TypeChar::Int, 4) => HostData::I32(npy.into_vec()?),
        (TypeChar::Int, 8) => HostData::I64(npy.into_vec()?),
        (TypeChar::Bool, 1) => HostData::Bool(npy.into_vec()?),
        _ => bail!("element type {ty} is not one Kiln has (float16/32/64, int32/64, bool)"),
    };
    HostTensor::new(data, shape).map_err(anyhow::Error::msg)
}

/// Writes `t` to `path` as a `.npy` array (bfloat16, which NumPy lacks, as float32).
pub fn write_npy(path: &Path, t: &HostTensor) -> anyhow::Result<()> {
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    let file = BufWriter::new(File::create(path).with_context(|| format!("creating {}", path.display()))?);
    fn write<T: npyz::AutoSerialize + Copy>(file: BufWriter<File>, shape: &[u64], v: &[T]) -> std::io::Result<()> {
        let mut w = npyz::WriteOptions::new().default_dtype().shape(shape).writer(file).begin_nd()?;
        w.extend(v.iter().copied())?;
        w.finish()
    }
    match &*t.data {
        HostData::Bool(v) => write(file, &shape, v),
        HostData::I32(v) => write(file, &shape, v),
        HostData::I64(v) => write(file, &shape, v),
        HostData::F16(v) => write(file, &shape, v),
        HostData::BF16(v) => write(file, &shape, &v.iter().map(|x| x.to_f32()).collect::<Vec<_>>()),
        HostData::F32(v) => write(file, &shape, v),
        HostData::F64(v) => write(file, &shape, v),
    }
    .with_context(|| format!("writing {}", path.display()))
}
