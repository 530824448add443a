//! wgpu as a [`Backend`]: a compute pipeline per step, dispatch counts per binding set, buffers
//! and bind groups reused across runs, one command encoder and one submit per run. A compiled
//! program is a [`WgpuExecutable`], the shared [`Runner`] over [`GpuCode`].

use std::num::NonZeroU64;
use std::sync::Arc;

use air::{Bindings, DType, HostData, HostTensor, TensorType};
use codegen::wgsl;
use lower::{BufferKind, Program};

use super::{Pipeline, WgpuDevice, WgpuError};
use crate::backend::{Backend, BindingSet, Runner};
use crate::error::{Result, RuntimeError};
use crate::prepared::{Prepared, Preset, SizeKey, Sizes};

/// A program's pipelines on a wgpu device: the wgpu [`Backend`].
pub struct GpuCode {
    device: WgpuDevice,
    /// Per step: the pipeline it launches.
    pipelines: Vec<Arc<Pipeline>>,
    sym_bytes: u64,
    /// Temps are padded to this many bytes, so every binding offset into the arena is aligned.
    align: u64,
}

/// What wgpu derives from one binding set.
pub struct GpuLaunches {
    /// Device bytes of each buffer (`bool` is 4 bytes per element).
    bytes: Vec<u64>,
    /// Bytes of the input and output buffers.
    io_bytes: u64,
    /// Workgroup counts of each step (`None`: nothing to do).
    dispatches: Vec<Option<[u32; 3]>>,
}

/// A reusable buffer with the bytes it holds.
struct Slot {
    buffer: ::wgpu::Buffer,
    capacity: u64,
}

/// The device buffers of a program, reused by every run, and the run in flight.
#[derive(Default)]
pub struct GpuBuffers {
    syms: Option<::wgpu::Buffer>,
    inputs: Vec<Option<Slot>>,
    /// Per `BufId` of kind `Output` or `Status`.
    outputs: Vec<Option<Slot>>,
    arena: Option<Slot>,
    staging: Option<Slot>,
    /// Bumped whenever a buffer is replaced (bind groups must be rebuilt).
    generation: u64,
    /// Bind groups per step, for (binding-set key, generation).
    bind_groups: Option<(SizeKey, u64, Vec<::wgpu::BindGroup>)>,
    /// The run's command encoder and its compute pass, between `bind` and `finish`.
    encoder: Option<::wgpu::CommandEncoder>,
    pass: Option<::wgpu::ComputePass<'static>>,
    /// The initial contents of outputs written in place ([`Backend::preset`]), uploaded by
    /// `bind`.
    presets: Vec<Preset>,
}

/// A compiled program, ready to run on the GPU for any symbol values.
pub type WgpuExecutable = Runner<GpuCode>;

/// The smallest binding of a storage buffer: one element of the widest element type (an `i64`
/// is two words), so an empty tensor still binds an array a shader may declare.
const MIN_BINDING: u64 = 8;

fn invalid(msg: String) -> RuntimeError {
    RuntimeError::InvalidProgram(msg)
}

impl GpuCode {
    /// The pipelines of `prepared` on `device` (each from the device's pipeline cache).
    pub(crate) fn new(device: WgpuDevice, prepared: &Prepared) -> Result<GpuCode> {
        let program = prepared.program();
        for b in &program.buffers {
            wgsl::device_elem_bytes(b.dtype)?;
        }
        let mut pipelines = Vec::with_capacity(program.steps.len());
        for step in &program.steps {
            // `Prepared::new` checked the kernel, the arguments and their dtypes.
            let kernel = &program.kernels[step.kernel as usize];
            let force_rw: Vec<bool> =
                step.args.iter().map(|arg| program.buffers[arg.0 as usize].kind == BufferKind::Temp).collect();
            pipelines.push(device.pipeline(kernel, &force_rw)?);
        }
        let vec4s =
            pipelines.iter().map(|p| p.wgsl.sym_vec4s).max().unwrap_or(1).max(program.symbols.len().div_ceil(4) as u32);
        let align = (device.inner.limits.min_storage_buffer_offset_alignment as u64).max(256);
        Ok(GpuCode { device, pipelines, sym_bytes: 16 * vec4s.max(1) as u64, align })
    }

    /// Makes `slot` hold a buffer of at least `bytes`; returns whether it replaced one.
    fn ensure(&self, slot: &mut Option<Slot>, bytes: u64, label: &str, usage: ::wgpu::BufferUsages) -> Result<bool> {
        let bytes = bytes.max(MIN_BINDING).next_multiple_of(4);
        if slot.as_ref().is_some_and(|s| s.capacity >= bytes) {
            return Ok(false);
        }
        *slot = None;
        let buffer = self.device.create_buffer(label, bytes, usage)?;
        *slot = Some(Slot { buffer, capacity: bytes });
        Ok(true)
    }
}

impl Runner<GpuCode> {
    /// `program` (lowered from a graph whose input slots have `input_types`) on `device`.
    pub(crate) fn on_device(
        device: WgpuDevice,
        program: Program,
        input_types: Vec<Option<TensorType>>,
    ) -> Result<WgpuExecutable> {
        let prepared = Prepared::new(program, input_types)?;
        let code = GpuCode::new(device, &prepared)?;
        Ok(Runner::with_backend(prepared, code))
    }

    /// The WGSL source of every step's shader, in step order.
    pub fn shaders(&self) -> Vec<&str> {
        self.backend.pipelines.iter().map(|p| p.wgsl.source.as_str()).collect()
    }

    /// How each step's kernel was mapped (`grid`, `workgroup-reduce`, `single`, `matmul`).
    pub fn strategies(&self) -> Vec<&'static str> {
        self.backend.pipelines.iter().map(|p| p.wgsl.strategy).collect()
    }

    /// Bytes of the input and output buffers for one binding set (the arena is in
    /// [`memory`](Runner::memory)).
    pub fn io_bytes(&self, bindings: &Bindings) -> Result<u64> {
        Ok(self.sized(bindings)?.launches.io_bytes)
    }
}

impl Backend for GpuCode {
    const NAME: &'static str = "wgpu";
    const CONCURRENT_RUNS: bool = false;
    type Launches = GpuLaunches;
    type Buffers = GpuBuffers;

    fn buffer_bytes(&self, program: &Program, buf: usize, numel: usize) -> Result<usize> {
        let b = &program.buffers[buf];
        let size = numel
            .checked_mul(wgsl::device_elem_bytes(b.dtype)?)
            .ok_or_else(|| RuntimeError::BadSize(format!("buf{buf} of {numel} elements is too large")))?;
        Ok(match b.kind {
            // Every temp's binding offset into the arena must be aligned: its slot is padded.
            BufferKind::Temp => size.max(4).next_multiple_of(self.align as usize),
            _ => size,
        })
    }

    fn size(&self, prepared: &Prepared, sizes: &Sizes) -> Result<GpuLaunches> {
        let p = prepared.program();
        sym_words(p, &sizes.syms)?;
        let binding_limit = self.device.inner.limits.max_storage_buffer_binding_size;
        let mut bytes = Vec::with_capacity(p.buffers.len());
        let mut io_bytes = 0u64;
        for (i, b) in p.buffers.iter().enumerate() {
            let n = sizes.buf_numel[i] as u64;
            let size = n
                .checked_mul(wgsl::device_elem_bytes(b.dtype)? as u64)
                .ok_or_else(|| RuntimeError::BadSize(format!("buf{i} of {n} elements is too large")))?;
            if size > binding_limit {
                return Err(RuntimeError::DeviceAlloc {
                    device: Self::NAME,
                    message: format!(
                        "buf{i} needs {size} bytes, over the device's max_storage_buffer_binding_size of {binding_limit}"
                    ),
                });
            }
            if b.kind != BufferKind::Temp {
                io_bytes += size;
            }
            bytes.push(size);
        }
        let dispatches = self.pipelines.iter().map(|pl| pl.wgsl.dispatch.workgroups(&sizes.syms)).collect();
        Ok(GpuLaunches { bytes, io_bytes, dispatches })
    }

    fn preset(&self, st: &mut GpuBuffers, inits: Vec<Preset>) -> Result<()> {
        st.presets = inits;
        Ok(())
    }

    /// Grows the buffers that are too small, uploads the symbol values and the inputs, zeroes the
    /// status words, rebuilds the bind groups if needed and opens the run's compute pass.
    fn bind(
        &self,
        st: &mut GpuBuffers,
        prepared: &Prepared,
        sized: &BindingSet<Self>,
        inputs: &[HostTensor],
    ) -> Result<()> {
        self.device.take_error()?;
        let p = prepared.program();
        let l = &sized.launches;
        let dev = &self.device.inner;
        use ::wgpu::BufferUsages as U;
        st.pass = None;
        st.encoder = None;

        // Buffers: created on first use, replaced only when too small.
        let mut replaced = false;
        if st.syms.is_none() {
            st.syms = Some(self.device.create_buffer("kiln syms", self.sym_bytes, U::UNIFORM | U::COPY_DST)?);
            replaced = true;
        }
        st.inputs.resize_with(prepared.input_types().len(), || None);
        st.outputs.resize_with(p.buffers.len(), || None);
        for (i, b) in p.buffers.iter().enumerate() {
            match b.kind {
                BufferKind::Input(slot) => {
                    replaced |=
                        self.ensure(&mut st.inputs[slot as usize], l.bytes[i], "kiln input", U::STORAGE | U::COPY_DST)?;
                }
                BufferKind::Output(_) => {
                    let usage = U::STORAGE | U::COPY_SRC | U::COPY_DST;
                    replaced |= self.ensure(&mut st.outputs[i], l.bytes[i], "kiln output", usage)?;
                }
                BufferKind::Status => {
                    let usage = U::STORAGE | U::COPY_SRC | U::COPY_DST;
                    replaced |= self.ensure(&mut st.outputs[i], l.bytes[i], "kiln status", usage)?;
                }
                BufferKind::Temp => {}
            }
        }
        if p.buffers.iter().any(|b| b.kind == BufferKind::Temp) {
            let arena = sized.plan.stats.arena_bytes as u64;
            replaced |= self.ensure(&mut st.arena, arena, "kiln arena", U::STORAGE | U::COPY_SRC)?;
        }
        let mut staging_bytes = 0u64;
        for (buf, _) in &p.outputs {
            if !matches!(p.buffers[buf.0 as usize].kind, BufferKind::Input(_)) {
                staging_bytes += l.bytes[buf.0 as usize];
            }
        }
        // The status buffer (if any) is read back after the outputs, in the same copy.
        if let Some(i) = p.buffers.iter().position(|b| b.kind == BufferKind::Status) {
            staging_bytes += l.bytes[i];
        }
        if staging_bytes > 0 {
            replaced |= self.ensure(&mut st.staging, staging_bytes, "kiln staging", U::MAP_READ | U::COPY_DST)?;
        }
        if replaced {
            st.generation += 1;
        }

        // Uploads: symbol values, then every input straight from the caller's slice.
        let syms_buf = st.syms.as_ref().ok_or_else(|| invalid("no symbol buffer".into()))?;
        if !sized.sizes.syms.is_empty() {
            // This binding set's values: binding sets that differ only in offset symbols share
            // their launches.
            let syms = sym_words(p, &sized.sizes.syms)?;
            dev.queue.write_buffer(syms_buf, 0, bytemuck::cast_slice(&syms));
        }
        for (i, b) in p.buffers.iter().enumerate() {
            let BufferKind::Input(slot) = b.kind else { continue };
            let Some(target) = st.inputs[slot as usize].as_ref() else { continue };
            if l.bytes[i] == 0 {
                continue;
            }
            upload(dev, &target.buffer, &inputs[slot as usize].data)?;
        }
        // Outputs written in place start from their inputs' contents.
        for Preset { out: b, data, .. } in std::mem::take(&mut st.presets) {
            let target = st
                .outputs
                .get(b)
                .and_then(Option::as_ref)
                .ok_or_else(|| invalid(format!("buf{b} has no device buffer")))?;
            if l.bytes[b] > 0 {
                upload(dev, &target.buffer, &data)?;
            }
        }

        // The status words start at 0 every run (queue writes precede the submitted commands).
        if let Some(i) = p.buffers.iter().position(|b| b.kind == BufferKind::Status) {
            let slot = st.outputs[i].as_ref().ok_or_else(|| invalid("no status buffer".into()))?;
            dev.queue.write_buffer(&slot.buffer, 0, &vec![0u8; l.bytes[i] as usize]);
        }

        // Bind groups: rebuilt only for a new binding set or new buffers.
        let fresh = !matches!(&st.bind_groups, Some((k, g, _)) if *k == sized.sizes.key && *g == st.generation);
        if fresh {
            let mut groups = Vec::with_capacity(p.steps.len());
            for (step, pipeline) in p.steps.iter().zip(&self.pipelines) {
                let mut entries = vec![::wgpu::BindGroupEntry { binding: 0, resource: syms_buf.as_entire_binding() }];
                for (a, arg) in step.args.iter().enumerate() {
                    let i = arg.0 as usize;
                    let (slot, offset) = match p.buffers[i].kind {
                        BufferKind::Input(s) => (st.inputs[s as usize].as_ref(), 0),
                        BufferKind::Output(_) | BufferKind::Status => (st.outputs[i].as_ref(), 0),
                        BufferKind::Temp => (st.arena.as_ref(), sized.plan.offsets[i].unwrap_or(0) as u64),
                    };
                    let slot = slot.ok_or_else(|| invalid(format!("{arg} has no device buffer")))?;
                    entries.push(::wgpu::BindGroupEntry {
                        binding: a as u32 + 1,
                        resource: ::wgpu::BindingResource::Buffer(::wgpu::BufferBinding {
                            buffer: &slot.buffer,
                            offset,
                            size: NonZeroU64::new(l.bytes[i].max(MIN_BINDING)),
                        }),
                    });
                }
                groups.push(dev.device.create_bind_group(&::wgpu::BindGroupDescriptor {
                    label: Some("kiln step"),
                    layout: &pipeline.layout,
                    entries: &entries,
                }));
            }
            st.bind_groups = Some((sized.sizes.key.clone(), st.generation, groups));
        }

        // One encoder: every dispatch in one pass, then the copies to the staging buffer.
        let mut encoder =
            dev.device.create_command_encoder(&::wgpu::CommandEncoderDescriptor { label: Some("kiln run") });
        let pass = encoder
            .begin_compute_pass(&::wgpu::ComputePassDescriptor { label: Some("kiln steps"), timestamp_writes: None })
            .forget_lifetime();
        st.encoder = Some(encoder);
        st.pass = Some(pass);
        Ok(())
    }

    unsafe fn launch(&self, st: &mut GpuBuffers, _: &Prepared, sized: &BindingSet<Self>, step: usize) -> Result<()> {
        let Some([x, y, z]) = sized.launches.dispatches[step] else { return Ok(()) };
        let (Some(pass), Some((_, _, groups))) = (st.pass.as_mut(), &st.bind_groups) else {
            return Err(invalid("a launch outside a run".into()));
        };
        pass.set_pipeline(&self.pipelines[step].pipeline);
        pass.set_bind_group(0, &groups[step], &[]);
        pass.dispatch_workgroups(x, y, z);
        Ok(())
    }

    /// Ends the pass, copies the outputs and the status words to the staging buffer, submits,
    /// maps the staging buffer once and copies each output into a fresh `Vec`.
    unsafe fn finish(
        &self,
        st: &mut GpuBuffers,
        prepared: &Prepared,
        sized: &BindingSet<Self>,
        inputs: &[HostTensor],
    ) -> Result<Vec<HostTensor>> {
        let p = prepared.program();
        let l = &sized.launches;
        let dev = &self.device.inner;
        // The pass ends when dropped, which unlocks the encoder.
        st.pass = None;
        let mut encoder = st.encoder.take().ok_or_else(|| invalid("no command encoder".into()))?;
        let mut regions = Vec::with_capacity(p.outputs.len());
        let mut at = 0u64;
        for (buf, _) in &p.outputs {
            let i = buf.0 as usize;
            let (src, offset) = match p.buffers[i].kind {
                BufferKind::Input(_) => {
                    regions.push(None);
                    continue;
                }
                BufferKind::Output(_) | BufferKind::Status => (st.outputs[i].as_ref(), 0),
                BufferKind::Temp => (st.arena.as_ref(), sized.plan.offsets[i].unwrap_or(0) as u64),
            };
            let n = l.bytes[i];
            if n > 0 {
                let src = src.ok_or_else(|| invalid(format!("output {buf} has no device buffer")))?;
                let staging = st.staging.as_ref().ok_or_else(|| invalid("no staging buffer".into()))?;
                encoder.copy_buffer_to_buffer(&src.buffer, offset, &staging.buffer, at, n);
            }
            regions.push(Some(at..at + n));
            at += n;
        }
        let mut status_region = None;
        if let Some(i) = p.buffers.iter().position(|b| b.kind == BufferKind::Status) {
            let (src, staging) = (st.outputs[i].as_ref(), st.staging.as_ref());
            let (Some(src), Some(staging)) = (src, staging) else {
                return Err(invalid("no status or staging buffer".into()));
            };
            let n = l.bytes[i];
            encoder.copy_buffer_to_buffer(&src.buffer, 0, &staging.buffer, at, n);
            status_region = Some(at..at + n);
            at += n;
        }
        dev.queue.submit([encoder.finish()]);

        // Download: map the staging buffer once, copy each output into a fresh Vec.
        let mut results = Vec::with_capacity(p.outputs.len());
        let mapped = if at > 0 {
            let staging = st.staging.as_ref().ok_or_else(|| invalid("no staging buffer".into()))?;
            let slice = staging.buffer.slice(0..at);
            let (tx, rx) = std::sync::mpsc::channel();
            slice.map_async(::wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
            dev.device
                .poll(::wgpu::PollType::wait_indefinitely())
                .map_err(|e| WgpuError::DeviceLost(format!("waiting for the run: {e}")))?;
            self.device.take_error()?;
            rx.recv()
                .map_err(|_| WgpuError::DeviceLost("the staging buffer was never mapped".into()))?
                .map_err(|e| WgpuError::DeviceLost(format!("mapping the staging buffer: {e}")))?;
            Some(slice)
        } else {
            None
        };
        {
            let view = match &mapped {
                Some(slice) => Some(
                    slice
                        .get_mapped_range()
                        .map_err(|e| WgpuError::DeviceLost(format!("reading the staging buffer: {e}")))?,
                ),
                None => None,
            };
            // One check per run: a failure recorded by any kernel is the run's error.
            if let (Some(r), Some(v)) = (&status_region, &view) {
                let bytes = &v[r.start as usize..r.end as usize];
                let words: Vec<i32> =
                    bytes.chunks_exact(4).map(|w| i32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
                if let Err(e) = prepared.check_status(&words) {
                    drop(view);
                    if let Some(staging) = &st.staging {
                        staging.buffer.unmap();
                    }
                    return Err(e);
                }
            }
            for (o, ((buf, ty), region)) in p.outputs.iter().zip(&regions).enumerate() {
                let shape = sized.sizes.output_shapes[o].clone();
                let data = match region {
                    None => {
                        let BufferKind::Input(slot) = p.buffers[buf.0 as usize].kind else {
                            return Err(invalid(format!("output {buf} has no region and is not an input")));
                        };
                        inputs[slot as usize].data.clone()
                    }
                    Some(r) => {
                        let bytes: &[u8] = match &view {
                            Some(v) => &v[r.start as usize..r.end as usize],
                            None => &[],
                        };
                        Arc::new(download(ty.dtype, bytes)?)
                    }
                };
                results.push(HostTensor { data, shape });
            }
        }
        if mapped.is_some()
            && let Some(staging) = &st.staging
        {
            staging.buffer.unmap();
        }
        self.device.take_error()?;
        Ok(results)
    }
}

/// Copies device bytes of `dtype` into a fresh host array, reserved fallibly.
fn download(dtype: DType, bytes: &[u8]) -> Result<HostData> {
    let words = bytes.len() / 4;
    let read_u32 = |i: usize| u32::from_le_bytes([bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]]);
    Ok(match dtype {
        DType::F32 => {
            let mut v: Vec<f32> = crate::memory::reserved_vec(words, "a readback")?;
            match bytemuck::try_cast_slice::<u8, f32>(bytes) {
                Ok(s) => v.extend_from_slice(s),
                Err(_) => v.extend((0..words).map(|i| f32::from_bits(read_u32(i)))),
            }
            HostData::F32(v)
        }
        DType::I32 => {
            let mut v: Vec<i32> = crate::memory::reserved_vec(words, "a readback")?;
            match bytemuck::try_cast_slice::<u8, i32>(bytes) {
                Ok(s) => v.extend_from_slice(s),
                Err(_) => v.extend((0..words).map(|i| read_u32(i) as i32)),
            }
            HostData::I32(v)
        }
        // Two words per element, low first: the little-endian bytes of an `i64`.
        DType::I64 => {
            let mut v: Vec<i64> = crate::memory::reserved_vec(words / 2, "a readback")?;
            match bytemuck::try_cast_slice::<u8, i64>(bytes) {
                Ok(s) => v.extend_from_slice(s),
                Err(_) => v.extend(
                    (0..words / 2).map(|i| (read_u32(2 * i) as u64 | (read_u32(2 * i + 1) as u64) << 32) as i64),
                ),
            }
            HostData::I64(v)
        }
        DType::F64 => {
            let mut v: Vec<f64> = crate::memory::reserved_vec(words / 2, "a readback")?;
            match bytemuck::try_cast_slice::<u8, f64>(bytes) {
                Ok(s) => v.extend_from_slice(s),
                Err(_) => v.extend(
                    (0..words / 2).map(|i| f64::from_bits(read_u32(2 * i) as u64 | (read_u32(2 * i + 1) as u64) << 32)),
                ),
            }
            HostData::F64(v)
        }
        DType::Bool => {
            let mut v: Vec<bool> = crate::memory::reserved_vec(words, "a readback")?;
            v.extend((0..words).map(|i| read_u32(i) != 0));
            HostData::Bool(v)
        }
        other => return Err(RuntimeError::Unsupported { device: "wgpu", what: format!("dtype {other}") }),
    })
}

/// Writes `data` at the start of `buffer` (bools as one `u32` word each, as kernels read them;
/// an `i64` is its little-endian bytes, the low and high words kernels read).
fn upload(dev: &super::Inner, buffer: &::wgpu::Buffer, data: &HostData) -> Result<()> {
    match data {
        HostData::Bool(v) => {
            let mut words: Vec<u32> = crate::memory::reserved_vec(v.len(), "a bool upload")?;
            words.extend(v.iter().map(|&x| x as u32));
            dev.queue.write_buffer(buffer, 0, bytemuck::cast_slice(&words));
        }
        data => dev.queue.write_buffer(buffer, 0, data.as_bytes()),
    }
    Ok(())
}

/// The symbol values as the kernels' `i32` words; a value out of `i32` range is an error.
fn sym_words(p: &Program, syms: &[i64]) -> Result<Vec<i32>> {
    p.symbols
        .iter()
        .zip(syms)
        .map(|(s, &v)| {
            i32::try_from(v)
                .map_err(|_| RuntimeError::BadSize(format!("symbol `{s}` = {v} does not fit in i32 (wgpu indices)")))
        })
        .collect()
}
