//! A compiled program on the wgpu device: pipelines per step, sizes and memory plan per binding
//! set, buffers and bind groups reused across runs, one command encoder and one submit per run.

use std::num::NonZeroU64;
use std::sync::Arc;

use air::{Bindings, DType, HostData, HostTensor, TensorType};
use codegen::wgsl;
use lower::{BufferKind, Program};

use super::{Pipeline, Result, WgpuDevice, WgpuError, lock};
use crate::error::RuntimeError;

/// GPU memory of one binding set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuMemoryStats {
    /// Bytes of the arena holding every temporary, after the planner's reuse.
    pub arena_bytes: u64,
    /// Bytes the temporaries would take with a buffer each (padded like the arena's slots).
    pub naive_bytes: u64,
    /// The most temporary bytes live at one step: no placement can beat it.
    pub peak_live_bytes: u64,
    /// Bytes of input and output buffers.
    pub io_bytes: u64,
}

/// Everything that depends on the symbol values.
struct Sized {
    key: Vec<i64>,
    /// Symbol values as the shaders read them (`vec4<i32>` packed).
    syms: Vec<i32>,
    /// Device bytes of each buffer (`bool` is 4 bytes per element).
    bytes: Vec<u64>,
    /// Arena offset of each temp.
    offsets: Vec<Option<u64>>,
    stats: GpuMemoryStats,
    input_shapes: Vec<Option<Vec<usize>>>,
    output_shapes: Vec<Vec<usize>>,
    /// Workgroup counts of each step (`None`: nothing to do).
    dispatches: Vec<Option<[u32; 3]>>,
}

/// A reusable buffer with the bytes it holds.
struct Slot {
    buffer: ::wgpu::Buffer,
    capacity: u64,
}

#[derive(Default)]
struct RunState {
    syms: Option<::wgpu::Buffer>,
    inputs: Vec<Option<Slot>>,
    /// Per `BufId` of kind `Output`.
    outputs: Vec<Option<Slot>>,
    arena: Option<Slot>,
    staging: Option<Slot>,
    /// Bumped whenever a buffer is replaced (bind groups must be rebuilt).
    generation: u64,
    /// Bind groups per step, for (binding-set key, generation).
    bind_groups: Option<(Vec<i64>, u64, Vec<::wgpu::BindGroup>)>,
    sized: Vec<Arc<Sized>>,
}

/// How many binding sets an executable remembers.
const SIZED_CACHE: usize = 16;

/// A compiled program, ready to run on the GPU for any symbol values.
pub struct WgpuExecutable {
    device: WgpuDevice,
    program: Program,
    input_types: Vec<Option<TensorType>>,
    /// Per step: the pipeline it launches.
    pipelines: Vec<Arc<Pipeline>>,
    /// Lifetimes of the temps (one time slot per step).
    intervals: Vec<Option<(usize, usize)>>,
    /// Every symbol a size depends on, sorted: the binding-set key.
    size_symbols: Vec<air::Symbol>,
    sym_bytes: u64,
    align: u64,
    state: std::sync::Mutex<RunState>,
}

fn invalid(msg: String) -> WgpuError {
    WgpuError::Runtime(RuntimeError::InvalidProgram(msg))
}

impl WgpuExecutable {
    pub(crate) fn new(
        device: WgpuDevice,
        program: Program,
        input_types: Vec<Option<TensorType>>,
    ) -> Result<WgpuExecutable> {
        for b in &program.buffers {
            wgsl::device_elem_bytes(b.dtype)?;
        }
        let mut pipelines = Vec::with_capacity(program.steps.len());
        for (i, step) in program.steps.iter().enumerate() {
            let kernel = program
                .kernels
                .get(step.kernel as usize)
                .ok_or_else(|| invalid(format!("step {i} launches missing kernel k{}", step.kernel)))?;
            if kernel.params().len() != step.args.len() {
                return Err(invalid(format!("step {i}: argument count differs from k{}'s", step.kernel)));
            }
            let mut force_rw = Vec::with_capacity(step.args.len());
            for (p, arg) in step.args.iter().enumerate() {
                let info = program
                    .buffers
                    .get(arg.0 as usize)
                    .ok_or_else(|| invalid(format!("step {i} uses missing {arg}")))?;
                if info.dtype != kernel.params()[p].dtype {
                    return Err(invalid(format!("step {i}: {arg} is {} but parameter b{p} is not", info.dtype)));
                }
                force_rw.push(info.kind == BufferKind::Temp);
            }
            pipelines.push(device.pipeline(kernel, &force_rw)?);
        }
        for (i, b) in program.buffers.iter().enumerate() {
            if let BufferKind::Input(slot) = b.kind {
                match input_types.get(slot as usize) {
                    Some(Some(t)) if t.dtype == b.dtype => {}
                    _ => return Err(invalid(format!("buf{i} reads input slot {slot}, which the graph lacks"))),
                }
            }
        }
        let groups: Vec<Vec<usize>> = (0..program.steps.len()).map(|s| vec![s]).collect();
        let intervals = lower::memplan::lifetimes(&program, &groups)?;
        let size_symbols = program.size_symbols(&input_types);
        let vec4s =
            pipelines.iter().map(|p| p.wgsl.sym_vec4s).max().unwrap_or(1).max(program.symbols.len().div_ceil(4) as u32);
        let align = (device.inner.limits.min_storage_buffer_offset_alignment as u64).max(256);
        Ok(WgpuExecutable {
            device,
            program,
            input_types,
            pipelines,
            intervals,
            size_symbols,
            sym_bytes: 16 * vec4s.max(1) as u64,
            align,
            state: std::sync::Mutex::new(RunState::default()),
        })
    }

    /// The lowered program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The WGSL source of every step's shader, in step order.
    pub fn shaders(&self) -> Vec<&str> {
        self.pipelines.iter().map(|p| p.wgsl.source.as_str()).collect()
    }

    /// How each step's kernel was mapped (`grid`, `workgroup-reduce`, `single`, `matmul`).
    pub fn strategies(&self) -> Vec<&'static str> {
        self.pipelines.iter().map(|p| p.wgsl.strategy).collect()
    }

    /// Number of dispatches per run (at most; empty ones are skipped).
    pub fn launches(&self) -> usize {
        self.pipelines.len()
    }

    /// GPU memory for one binding set.
    pub fn memory(&self, bindings: &Bindings) -> Result<GpuMemoryStats> {
        Ok(self.sized(&mut lock(&self.state), bindings)?.stats)
    }

    fn sized(&self, st: &mut RunState, bindings: &Bindings) -> Result<Arc<Sized>> {
        let mut key = Vec::with_capacity(self.size_symbols.len());
        for s in &self.size_symbols {
            key.push(*bindings.get(s).ok_or_else(|| RuntimeError::Unbound(s.clone()))?);
        }
        if let Some(i) = st.sized.iter().position(|s| s.key == key) {
            let hit = st.sized.remove(i);
            st.sized.insert(0, hit.clone());
            return Ok(hit);
        }
        let sized = Arc::new(self.size_for(key, bindings)?);
        st.sized.insert(0, sized.clone());
        st.sized.truncate(SIZED_CACHE);
        Ok(sized)
    }

    /// Everything for one binding set, computed on a cache miss only. The graph's shape
    /// conditions are checked first (`Program::check_bindings`, as on the CPU).
    fn size_for(&self, key: Vec<i64>, bindings: &Bindings) -> Result<Sized> {
        let p = &self.program;
        p.check_bindings(bindings).map_err(RuntimeError::Bounds)?;
        let eval = |d: &air::Dim, what: &dyn Fn() -> String| -> Result<usize> {
            let v = d.eval(bindings).map_err(|e| match e {
                air::dim::DimError::Unbound(s) => RuntimeError::Unbound(s),
                other => RuntimeError::BadSize(format!("{}: {other}", what())),
            })?;
            Ok(usize::try_from(v).map_err(|_| RuntimeError::BadSize(format!("{} is {v}", what())))?)
        };
        let shape = |t: &TensorType, what: &dyn Fn() -> String| -> Result<Vec<usize>> {
            t.shape.iter().map(|d| eval(d, what)).collect()
        };
        let mut syms64 = Vec::with_capacity(p.symbols.len());
        let mut syms = Vec::with_capacity(p.symbols.len());
        for s in &p.symbols {
            let v = *bindings.get(s).ok_or_else(|| RuntimeError::Unbound(s.clone()))?;
            let v32 = i32::try_from(v)
                .map_err(|_| RuntimeError::BadSize(format!("symbol `{s}` = {v} does not fit in i32 (wgpu indices)")))?;
            syms64.push(v);
            syms.push(v32);
        }
        let mut bytes = Vec::with_capacity(p.buffers.len());
        let mut padded = Vec::with_capacity(p.buffers.len());
        let mut io_bytes = 0u64;
        for (i, b) in p.buffers.iter().enumerate() {
            let n = eval(&b.numel, &|| format!("the size of buf{i}"))? as u64;
            let size = n
                .checked_mul(wgsl::device_elem_bytes(b.dtype)? as u64)
                .ok_or_else(|| RuntimeError::BadSize(format!("buf{i} of {n} elements is too large")))?;
            let binding_limit = self.device.inner.limits.max_storage_buffer_binding_size;
            if size > binding_limit {
                return Err(WgpuError::OutOfMemory(format!(
                    "buf{i} needs {size} bytes, over the device's max_storage_buffer_binding_size of {binding_limit}"
                )));
            }
            bytes.push(size);
            if b.kind == BufferKind::Temp {
                padded.push(size.max(4).next_multiple_of(self.align) as usize);
            } else {
                padded.push(0);
                io_bytes += size;
            }
        }
        let (offsets, arena) = lower::memplan::place(&padded, &self.intervals);
        let naive: usize = padded.iter().sum();
        let peak = lower::memplan::peak_live(&padded, &self.intervals);
        let offsets = offsets.into_iter().map(|o| o.map(|o| o as u64)).collect();
        let mut input_shapes = Vec::with_capacity(self.input_types.len());
        for (slot, t) in self.input_types.iter().enumerate() {
            input_shapes.push(match t {
                Some(t) => Some(shape(t, &|| format!("input slot {slot} ({t})"))?),
                None => None,
            });
        }
        let mut output_shapes = Vec::with_capacity(p.outputs.len());
        for (i, (_, t)) in p.outputs.iter().enumerate() {
            output_shapes.push(shape(t, &|| format!("output {i} ({t})"))?);
        }
        let dispatches = self.pipelines.iter().map(|pl| pl.wgsl.dispatch.workgroups(&syms64)).collect();
        Ok(Sized {
            key,
            syms,
            bytes,
            offsets,
            stats: GpuMemoryStats {
                arena_bytes: arena as u64,
                naive_bytes: naive as u64,
                peak_live_bytes: peak as u64,
                io_bytes,
            },
            input_shapes,
            output_shapes,
            dispatches,
        })
    }

    fn check_inputs(&self, inputs: &[HostTensor], sized: &Sized) -> Result<()> {
        if inputs.len() != self.input_types.len() {
            return Err(RuntimeError::InputCount { expected: self.input_types.len(), got: inputs.len() }.into());
        }
        for (slot, (t, shape)) in self.input_types.iter().zip(&sized.input_shapes).enumerate() {
            let (Some(t), Some(shape)) = (t, shape) else { continue };
            let x = &inputs[slot];
            let numel_ok = x.shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b)) == Some(x.numel());
            if x.dtype() != t.dtype || &x.shape != shape || !numel_ok {
                return Err(RuntimeError::InputMismatch {
                    slot: slot as u32,
                    expected: format!("{t} (= {}{shape:?})", t.dtype),
                    got: format!("{}{:?}", x.dtype(), x.shape),
                }
                .into());
            }
        }
        Ok(())
    }

    /// Makes `slot` hold a buffer of at least `bytes`; returns whether it replaced one.
    fn ensure(&self, slot: &mut Option<Slot>, bytes: u64, label: &str, usage: ::wgpu::BufferUsages) -> Result<bool> {
        let bytes = bytes.max(4).next_multiple_of(4);
        if slot.as_ref().is_some_and(|s| s.capacity >= bytes) {
            return Ok(false);
        }
        *slot = None;
        let buffer = self.device.create_buffer(label, bytes, usage)?;
        *slot = Some(Slot { buffer, capacity: bytes });
        Ok(true)
    }

    /// Runs the program on `inputs` (`inputs[slot]` feeds input slot `slot`) with `bindings`;
    /// returns one fresh host tensor per graph output.
    pub fn run(&self, inputs: &[HostTensor], bindings: &Bindings) -> Result<Vec<HostTensor>> {
        self.device.take_error()?;
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let sized = self.sized(st, bindings)?;
        self.check_inputs(inputs, &sized)?;
        let p = &self.program;
        let dev = &self.device.inner;
        use ::wgpu::BufferUsages as U;

        // Buffers: created on first use, replaced only when too small.
        let mut replaced = false;
        if st.syms.is_none() {
            st.syms = Some(self.device.create_buffer("kiln syms", self.sym_bytes, U::UNIFORM | U::COPY_DST)?);
            replaced = true;
        }
        st.inputs.resize_with(self.input_types.len(), || None);
        st.outputs.resize_with(p.buffers.len(), || None);
        for (i, b) in p.buffers.iter().enumerate() {
            match b.kind {
                BufferKind::Input(slot) => {
                    replaced |= self.ensure(
                        &mut st.inputs[slot as usize],
                        sized.bytes[i],
                        "kiln input",
                        U::STORAGE | U::COPY_DST,
                    )?;
                }
                BufferKind::Output(_) => {
                    replaced |=
                        self.ensure(&mut st.outputs[i], sized.bytes[i], "kiln output", U::STORAGE | U::COPY_SRC)?;
                }
                BufferKind::Status => {
                    let usage = U::STORAGE | U::COPY_SRC | U::COPY_DST;
                    replaced |= self.ensure(&mut st.outputs[i], sized.bytes[i], "kiln status", usage)?;
                }
                BufferKind::Temp => {}
            }
        }
        if p.buffers.iter().any(|b| b.kind == BufferKind::Temp) {
            replaced |= self.ensure(&mut st.arena, sized.stats.arena_bytes, "kiln arena", U::STORAGE | U::COPY_SRC)?;
        }
        let mut staging_bytes = 0u64;
        for (buf, _) in &p.outputs {
            if !matches!(p.buffers[buf.0 as usize].kind, BufferKind::Input(_)) {
                staging_bytes += sized.bytes[buf.0 as usize];
            }
        }
        // The status buffer (if any) is read back after the outputs, in the same copy.
        let status = p.buffers.iter().position(|b| b.kind == BufferKind::Status);
        if let Some(i) = status {
            staging_bytes += sized.bytes[i];
        }
        if staging_bytes > 0 {
            replaced |= self.ensure(&mut st.staging, staging_bytes, "kiln staging", U::MAP_READ | U::COPY_DST)?;
        }
        if replaced {
            st.generation += 1;
        }

        // Uploads: symbol values, then every input straight from the caller's slice.
        let syms_buf = st.syms.as_ref().ok_or_else(|| invalid("no symbol buffer".into()))?;
        if !sized.syms.is_empty() {
            dev.queue.write_buffer(syms_buf, 0, bytemuck::cast_slice(&sized.syms));
        }
        for (i, b) in p.buffers.iter().enumerate() {
            let BufferKind::Input(slot) = b.kind else { continue };
            let Some(target) = st.inputs[slot as usize].as_ref() else { continue };
            if sized.bytes[i] == 0 {
                continue;
            }
            match &*inputs[slot as usize].data {
                HostData::Bool(v) => {
                    let mut words: Vec<u32> = crate::memory::reserved_vec(v.len(), "a bool upload")?;
                    words.extend(v.iter().map(|&x| x as u32));
                    dev.queue.write_buffer(&target.buffer, 0, bytemuck::cast_slice(&words));
                }
                data => dev.queue.write_buffer(&target.buffer, 0, data.as_bytes()),
            }
        }

        // The status words start at 0 every run (queue writes precede the submitted commands).
        if let Some(i) = status {
            let slot = st.outputs[i].as_ref().ok_or_else(|| invalid("no status buffer".into()))?;
            dev.queue.write_buffer(&slot.buffer, 0, &vec![0u8; sized.bytes[i] as usize]);
        }

        // Bind groups: rebuilt only for a new binding set or new buffers.
        let fresh = !matches!(&st.bind_groups, Some((k, g, _)) if *k == sized.key && *g == st.generation);
        if fresh {
            let mut groups = Vec::with_capacity(p.steps.len());
            for (step, pipeline) in p.steps.iter().zip(&self.pipelines) {
                let mut entries = vec![::wgpu::BindGroupEntry { binding: 0, resource: syms_buf.as_entire_binding() }];
                for (a, arg) in step.args.iter().enumerate() {
                    let i = arg.0 as usize;
                    let (slot, offset) = match p.buffers[i].kind {
                        BufferKind::Input(s) => (st.inputs[s as usize].as_ref(), 0),
                        BufferKind::Output(_) | BufferKind::Status => (st.outputs[i].as_ref(), 0),
                        BufferKind::Temp => (st.arena.as_ref(), sized.offsets[i].unwrap_or(0)),
                    };
                    let slot = slot.ok_or_else(|| invalid(format!("{arg} has no device buffer")))?;
                    entries.push(::wgpu::BindGroupEntry {
                        binding: a as u32 + 1,
                        resource: ::wgpu::BindingResource::Buffer(::wgpu::BufferBinding {
                            buffer: &slot.buffer,
                            offset,
                            size: NonZeroU64::new(sized.bytes[i].max(4)),
                        }),
                    });
                }
                groups.push(dev.device.create_bind_group(&::wgpu::BindGroupDescriptor {
                    label: Some("kiln step"),
                    layout: &pipeline.layout,
                    entries: &entries,
                }));
            }
            st.bind_groups = Some((sized.key.clone(), st.generation, groups));
        }
        let Some((_, _, groups)) = &st.bind_groups else { return Err(invalid("no bind groups".into())) };

        // One encoder: every dispatch in one pass, then the copies to the staging buffer.
        let mut encoder =
            dev.device.create_command_encoder(&::wgpu::CommandEncoderDescriptor { label: Some("kiln run") });
        {
            let mut pass = encoder.begin_compute_pass(&::wgpu::ComputePassDescriptor {
                label: Some("kiln steps"),
                timestamp_writes: None,
            });
            for ((pipeline, group), wg) in self.pipelines.iter().zip(groups).zip(&sized.dispatches) {
                let Some([x, y, z]) = *wg else { continue };
                pass.set_pipeline(&pipeline.pipeline);
                pass.set_bind_group(0, group, &[]);
                pass.dispatch_workgroups(x, y, z);
            }
        }
        let mut regions = Vec::with_capacity(p.outputs.len());
        let mut at = 0u64;
        for (buf, _) in &p.outputs {
            let i = buf.0 as usize;
            let (src, offset) = match p.buffers[i].kind {
                BufferKind::Input(_) => {
                    regions.push(None);
                    continue;
                }
                BufferKind::Output(_) => (st.outputs[i].as_ref(), 0),
                BufferKind::Temp => (st.arena.as_ref(), sized.offsets[i].unwrap_or(0)),
                BufferKind::Status => return Err(invalid(format!("output {buf} is the status buffer"))),
            };
            let n = sized.bytes[i];
            if n > 0 {
                let src = src.ok_or_else(|| invalid(format!("output {buf} has no device buffer")))?;
                let staging = st.staging.as_ref().ok_or_else(|| invalid("no staging buffer".into()))?;
                encoder.copy_buffer_to_buffer(&src.buffer, offset, &staging.buffer, at, n);
            }
            regions.push(Some(at..at + n));
            at += n;
        }
        let mut status_region = None;
        if let Some(i) = status {
            let (src, staging) = (st.outputs[i].as_ref(), st.staging.as_ref());
            let (Some(src), Some(staging)) = (src, staging) else {
                return Err(invalid("no status or staging buffer".into()));
            };
            let n = sized.bytes[i];
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
            dev.device.poll(::wgpu::PollType::wait_indefinitely()).map_err(|e| WgpuError::Device(e.to_string()))?;
            self.device.take_error()?;
            rx.recv()
                .map_err(|_| WgpuError::Device("the staging buffer was never mapped".into()))?
                .map_err(|e| WgpuError::Device(format!("mapping the staging buffer: {e}")))?;
            Some(slice)
        } else {
            None
        };
        {
            let view = match &mapped {
                Some(slice) => Some(slice.get_mapped_range().map_err(|e| WgpuError::Device(e.to_string()))?),
                None => None,
            };
            // One check per run: a failure recorded by any kernel is the run's error.
            if let (Some(r), Some(v)) = (&status_region, &view) {
                let bytes = &v[r.start as usize..r.end as usize];
                let words: Vec<i32> =
                    bytes.chunks_exact(4).map(|w| i32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
                if let Some(message) = lower::DataCheck::from_status(&p.data_checks, &words) {
                    drop(view);
                    if let Some(staging) = &st.staging {
                        staging.buffer.unmap();
                    }
                    return Err(lower::LowerError::Data(message).into());
                }
            }
            for (o, ((buf, ty), region)) in p.outputs.iter().zip(&regions).enumerate() {
                let shape = sized.output_shapes[o].clone();
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
        DType::Bool => {
            let mut v: Vec<bool> = crate::memory::reserved_vec(words, "a readback")?;
            v.extend((0..words).map(|i| read_u32(i) != 0));
            HostData::Bool(v)
        }
        other => return Err(WgpuError::Codegen(codegen::CodegenError::Unsupported(format!("dtype {other} on wgpu")))),
    })
}
