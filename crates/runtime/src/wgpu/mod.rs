//! The wgpu device: kir kernels as WGSL compute shaders (`codegen::wgsl`) run through wgpu
//! (Vulkan, Metal, DX12; the GL fallback works but is slow).
//!
//! ```text
//! WgpuDevice::new()                      adapter (logged: name, backend, type), device, queue
//! WgpuDevice::compile(graph)             program cache by GraphKey (structure only)
//!   lower::compile -> Program            on a miss
//!   pipeline per unique kernel           pipeline cache by (kernel structure, binding access)
//! WgpuExecutable::run(inputs, bindings)  the shared `Runner` over `GpuCode` (crate::backend)
//!   sizes, memory plan, dispatch counts  once per binding set (cached)
//!   buffers                              grown only when too small: a repeat run creates none
//!   write syms + inputs                  `queue.write_buffer` straight from the input slices
//!   one encoder                          all dispatches in one compute pass, copies to staging,
//!                                        one submit, one map, fresh `Vec`s to the caller
//! ```
//!
//! # Memory
//!
//! Temporaries live in one arena buffer, placed by `lower::memplan` (the same liveness-based
//! planner as the CPU's) with every temp's size padded to the device's
//! `min_storage_buffer_offset_alignment` (at least 256 bytes), so that every temp's binding
//! offset is aligned. Because wgpu tracks usage per buffer, a kernel parameter bound to the arena
//! is declared `read_write` in the shader even when the kernel only reads it. Inputs have one
//! buffer per slot, outputs one per output buffer, plus one uniform for the symbol values and one
//! staging buffer for downloads; all are reused by every run and replaced only when a binding set
//! needs more. [`WgpuDevice::buffers_created`] counts every buffer ever created.
//!
//! Uploads: `f32`/`i32`/`i64`/`f64` inputs go from the caller's slice to `queue.write_buffer` without a host
//! copy; `bool` inputs are widened to one `u32` per element first (WGSL has no byte type).
//!
//! # Caches
//!
//! Both caches are bounded and evict the least recently used entry (`codegen::lru`): programs
//! ([`WGPU_PROGRAM_CACHE_CAPACITY`], `KILN_WGPU_PROGRAM_CACHE=N`, or
//! [`WgpuDevice::set_cache_capacity`]) and pipelines ([`PIPELINE_CACHE_CAPACITY`],
//! `KILN_PIPELINE_CACHE=N`). A cached executable keeps its GPU buffers (sized for its largest
//! run) between runs, so the program bound also bounds the GPU memory idle programs hold. An
//! evicted executable or pipeline is an `Arc`: one still held (by a caller, or by an executable
//! for its pipelines) stays valid, and its buffers and shader are released when the last holder
//! drops it.
//!
//! # Errors
//!
//! Device failures are [`WgpuError`]s: no adapter, device creation, out of memory (checked
//! against the limits before allocating, and caught by an error scope), shader compilation (an
//! error scope around module and pipeline creation), device lost (a callback records it; a failed
//! wait or map counts as lost too). Compiling and running return the runtime's one
//! [`RuntimeError`], each `WgpuError` mapped to its kind (`From<WgpuError>`), beside everything
//! every backend reports for bad inputs. wgpu's default uncaptured-error handler panics; this device
//! installs one that records the error, which the next run returns.

mod exec;

use std::borrow::Cow;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use air::{Bindings, Graph, GraphKey, HostTensor};
use codegen::lru::{Lru, capacity_from_env};
use codegen::wgsl::{self, WgslKernel};
use lower::kir::Kernel;

use crate::error::RuntimeError;

pub use exec::{GpuBuffers, GpuCode, GpuLaunches, WgpuExecutable};

/// Why the wgpu device could not compile or run something.
#[derive(Debug, thiserror::Error)]
pub enum WgpuError {
    /// No adapter (GPU or software rasterizer) is available.
    #[error("no wgpu adapter available: {0}")]
    NoAdapter(String),
    /// The adapter would not give a device.
    #[error("could not create a wgpu device: {0}")]
    RequestDevice(String),
    /// An allocation was refused (too large for the device's limits, or out of memory).
    #[error("out of GPU memory: {0}")]
    OutOfMemory(String),
    /// A generated shader or its pipeline was rejected.
    #[error("shader compilation failed: {message}\n{source_text}")]
    ShaderCompile { message: String, source_text: String },
    /// The device was lost (driver reset, device removed, or destroyed), or waiting for it or
    /// mapping its results failed.
    #[error("GPU device lost: {0}")]
    DeviceLost(String),
    /// Any other error wgpu reported (validation, internal).
    #[error("wgpu: {0}")]
    Device(String),
    /// Generating WGSL failed (an unsupported dtype or op, or a malformed kernel).
    #[error(transparent)]
    Codegen(#[from] codegen::CodegenError),
}

/// Each wgpu failure as the runtime's error of its kind: out of memory is
/// `RuntimeError::DeviceAlloc`, a lost device (or a failed transfer) `DeviceLost`, an unsupported
/// dtype or op `Codegen(Unsupported)`, everything else `Device`.
impl From<WgpuError> for RuntimeError {
    fn from(e: WgpuError) -> RuntimeError {
        const DEVICE: &str = "wgpu";
        match e {
            WgpuError::OutOfMemory(message) => RuntimeError::DeviceAlloc { device: DEVICE, message },
            WgpuError::DeviceLost(reason) => RuntimeError::DeviceLost { device: DEVICE, reason },
            WgpuError::Codegen(e) => RuntimeError::Codegen(e),
            other @ (WgpuError::NoAdapter(_)
            | WgpuError::RequestDevice(_)
            | WgpuError::ShaderCompile { .. }
            | WgpuError::Device(_)) => RuntimeError::Device { device: DEVICE, message: other.to_string() },
        }
    }
}

/// `Result` with [`WgpuError`].
pub type Result<T, E = WgpuError> = std::result::Result<T, E>;

/// The adapter a device runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterReport {
    pub name: String,
    pub backend: ::wgpu::Backend,
    pub device_type: ::wgpu::DeviceType,
    pub driver: String,
}

impl std::fmt::Display for AdapterReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (backend {:?}, type {:?}, driver {})", self.name, self.backend, self.device_type, self.driver)
    }
}

/// What the device's caches did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WgpuStats {
    /// Graphs lowered and compiled (program cache misses).
    pub programs_compiled: u64,
    /// `compile` calls answered from the program cache.
    pub cache_hits: u64,
    /// Compute pipelines created (pipeline cache misses).
    pub pipelines_created: u64,
    /// GPU buffers created, for any purpose.
    pub buffers_created: u64,
    /// Programs evicted from the program cache to keep it at its capacity.
    pub programs_evicted: u64,
    /// Pipelines evicted from the pipeline cache to keep it at its capacity.
    pub pipelines_evicted: u64,
}

/// A compiled shader: pipeline, its bind-group layout, and the generator's launch data.
pub(crate) struct Pipeline {
    pub(crate) pipeline: ::wgpu::ComputePipeline,
    pub(crate) layout: ::wgpu::BindGroupLayout,
    pub(crate) wgsl: WgslKernel,
}

type PipelineKey = (Kernel, Vec<bool>);

/// Programs a wgpu device's cache keeps by default: fewer than on the CPU, because each holds
/// GPU buffers for its last binding set.
pub const WGPU_PROGRAM_CACHE_CAPACITY: usize = 256;

/// Environment variable that sets the wgpu program cache's capacity (a positive number).
pub const WGPU_PROGRAM_CACHE_ENV: &str = "KILN_WGPU_PROGRAM_CACHE";

/// Compute pipelines a wgpu device's cache keeps by default.
pub const PIPELINE_CACHE_CAPACITY: usize = 1024;

/// Environment variable that sets the pipeline cache's capacity (a positive number).
pub const PIPELINE_CACHE_ENV: &str = "KILN_PIPELINE_CACHE";

pub(crate) struct Inner {
    pub(crate) device: ::wgpu::Device,
    pub(crate) queue: ::wgpu::Queue,
    pub(crate) limits: ::wgpu::Limits,
    adapter: AdapterReport,
    /// Whether the device was created with `SHADER_F64` (kernels may use `f64`).
    shader_f64: bool,
    options: lower::CompileOptions,
    pipelines: Mutex<Lru<PipelineKey, Arc<Pipeline>>>,
    programs: Mutex<Lru<GraphKey, Arc<WgpuExecutable>>>,
    programs_compiled: AtomicU64,
    cache_hits: AtomicU64,
    pipelines_created: AtomicU64,
    pub(crate) buffers_created: AtomicU64,
    /// Errors wgpu reported outside an error scope, oldest first.
    uncaptured: Arc<Mutex<Vec<String>>>,
    lost: Arc<Mutex<Option<String>>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Caches `value` under `key` unless another thread cached one meanwhile, and returns the cached
/// one. Evicted entries drop after the lock is released.
fn cache_first<K: std::hash::Hash + Eq, V>(cache: &Mutex<Lru<K, Arc<V>>>, key: K, value: Arc<V>) -> Arc<V> {
    let mut guard = lock(cache);
    if let Some(first) = guard.get(&key) {
        return first.clone();
    }
    let evicted = guard.insert(key, value.clone());
    drop(guard);
    drop(evicted);
    value
}

/// A GPU through wgpu. A cheap handle: `Clone` shares the device and its caches.
#[derive(Clone)]
pub struct WgpuDevice {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for WgpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuDevice").field("adapter", &self.inner.adapter).field("stats", &self.stats()).finish()
    }
}

/// The instance [`WgpuDevice::with_options`] asks for an adapter: the environment's settings, on
/// wgpu's primary backends unless `WGPU_BACKEND` names the backends.
fn instance_descriptor() -> ::wgpu::InstanceDescriptor {
    let mut descriptor = ::wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    if ::wgpu::Backends::from_env().is_none() {
        descriptor.backends = ::wgpu::Backends::PRIMARY;
    }
    descriptor
}

impl WgpuDevice {
    /// A device on the default adapter (high performance, on Vulkan, Metal or DX12; `WGPU_BACKEND`
    /// may name other backends), with the default lowering options.
    pub fn new() -> Result<WgpuDevice> {
        WgpuDevice::with_options(lower::CompileOptions::default())
    }

    /// A device that lowers every graph with `options`. Logs the adapter it got (`log`, level `info`).
    ///
    /// Only wgpu's primary backends (Vulkan, Metal, DX12) are asked for an adapter unless
    /// `WGPU_BACKEND` names others: on OpenGL, naga's GLSL gives integer `%` of a negative operand
    /// GLSL's undefined result (Mesa's llvmpipe computes it unsigned: `-7 % 3` was 0, a silent
    /// wrong answer) and wgpu's GL device panicked under concurrent use ("Could not lock adapter
    /// context"). A machine with only OpenGL has no `wgpu` device ([`WgpuError::NoAdapter`]), and
    /// `Device::wgpu_if_available` picks the CPU there.
    pub fn with_options(mut options: lower::CompileOptions) -> Result<WgpuDevice> {
        let instance = ::wgpu::Instance::new(instance_descriptor());
        let adapter = pollster::block_on(instance.request_adapter(&::wgpu::RequestAdapterOptions {
            power_preference: ::wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            apply_limit_buckets: false,
        }))
        .map_err(|e| WgpuError::NoAdapter(e.to_string()))?;
        let info = adapter.get_info();
        let report = AdapterReport {
            name: info.name.clone(),
            backend: info.backend,
            device_type: info.device_type,
            driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
        };
        log::info!("kiln wgpu: adapter {report}");
        let limits = adapter.limits();
        // A kernel binds its buffers as storage buffers of one compute stage: fusion keeps each
        // kernel within the adapter's count.
        let most = limits.max_storage_buffers_per_shader_stage;
        options.max_kernel_buffers = Some(options.max_kernel_buffers.map_or(most, |m| m.min(most)));
        // `f64` kernels need the adapter's 64-bit floats (Vulkan's `shaderFloat64`); without
        // them an `f64` program is refused when it is compiled (see `GpuCode::new`).
        let features = adapter.features() & ::wgpu::Features::SHADER_F64;
        log::info!("kiln wgpu: shader-f64 {}", if features.is_empty() { "unavailable" } else { "enabled" });
        let (device, queue) = pollster::block_on(adapter.request_device(&::wgpu::DeviceDescriptor {
            label: Some("kiln"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: ::wgpu::ExperimentalFeatures::disabled(),
            memory_hints: ::wgpu::MemoryHints::Performance,
            trace: ::wgpu::Trace::Off,
        }))
        .map_err(|e| WgpuError::RequestDevice(e.to_string()))?;
        let uncaptured: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: ::wgpu::Error| lock(&sink).push(e.to_string())));
        let lost: Arc<Mutex<Option<String>>> = Arc::default();
        let lost_sink = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            *lock(&lost_sink) = Some(format!("{reason:?}: {message}"));
        });
        Ok(WgpuDevice {
            inner: Arc::new(Inner {
                device,
                queue,
                limits,
                adapter: report,
                shader_f64: !features.is_empty(),
                options,
                pipelines: Mutex::new(Lru::new(capacity_from_env(PIPELINE_CACHE_ENV, PIPELINE_CACHE_CAPACITY))),
                programs: Mutex::new(Lru::new(capacity_from_env(WGPU_PROGRAM_CACHE_ENV, WGPU_PROGRAM_CACHE_CAPACITY))),
                programs_compiled: AtomicU64::new(0),
                cache_hits: AtomicU64::new(0),
                pipelines_created: AtomicU64::new(0),
                buffers_created: AtomicU64::new(0),
                uncaptured,
                lost,
            }),
        })
    }

    /// The adapter this device runs on.
    pub fn adapter(&self) -> &AdapterReport {
        &self.inner.adapter
    }

    /// Whether this device runs `f64` kernels (the adapter offers `SHADER_F64` and the device was
    /// created with it). Without it, compiling a program with an `f64` value is an `Unsupported`
    /// error naming the dtype and the adapter.
    pub fn supports_f64(&self) -> bool {
        self.inner.shader_f64
    }

    /// The limits the device was created with (the adapter's).
    pub fn limits(&self) -> &::wgpu::Limits {
        &self.inner.limits
    }

    /// The executable for `graph`: from the cache when a graph of the same structure was compiled
    /// before, else lowered, turned into WGSL and compiled now.
    pub fn compile(&self, graph: &Graph) -> crate::Result<Arc<WgpuExecutable>> {
        // The key walks the topological order, which a cyclic graph does not have; the rest of
        // `air::verify` runs in `lower::compile` on a miss (a hit is structurally equal to a
        // graph that passed it).
        graph.check_acyclic().map_err(lower::LowerError::from)?;
        let key = GraphKey::of(graph);
        if let Some(exe) = lock(&self.inner.programs).get(&key) {
            self.inner.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(exe.clone());
        }
        let program = lower::compile(graph, &self.inner.options)?;
        let exe = Arc::new(WgpuExecutable::on_device(self.clone(), program, key.input_types())?);
        self.inner.programs_compiled.fetch_add(1, Ordering::Relaxed);
        Ok(cache_first(&self.inner.programs, key, exe))
    }

    /// Compiles (or finds) `graph` and runs it once.
    pub fn run(&self, graph: &Graph, inputs: &[HostTensor], bindings: &Bindings) -> crate::Result<Vec<HostTensor>> {
        self.compile(graph)?.run(inputs, bindings)
    }

    /// What the caches did so far.
    pub fn stats(&self) -> WgpuStats {
        WgpuStats {
            programs_compiled: self.inner.programs_compiled.load(Ordering::Relaxed),
            cache_hits: self.inner.cache_hits.load(Ordering::Relaxed),
            pipelines_created: self.inner.pipelines_created.load(Ordering::Relaxed),
            buffers_created: self.inner.buffers_created.load(Ordering::Relaxed),
            programs_evicted: lock(&self.inner.programs).evictions(),
            pipelines_evicted: lock(&self.inner.pipelines).evictions(),
        }
    }

    /// GPU buffers created so far by this device (all executables together).
    pub fn buffers_created(&self) -> u64 {
        self.inner.buffers_created.load(Ordering::Relaxed)
    }

    /// Number of distinct programs in the cache.
    pub fn cached_programs(&self) -> usize {
        lock(&self.inner.programs).len()
    }

    /// Number of compute pipelines in the cache.
    pub fn cached_pipelines(&self) -> usize {
        lock(&self.inner.pipelines).len()
    }

    /// Sets the most programs the cache keeps (at least 1), evicting the least recently used
    /// ones beyond it now.
    pub fn set_cache_capacity(&self, programs: usize) {
        let evicted = lock(&self.inner.programs).set_capacity(programs);
        drop(evicted);
    }

    /// Sets the most pipelines the cache keeps (at least 1), evicting the least recently used
    /// ones beyond it now.
    pub fn set_pipeline_cache_capacity(&self, pipelines: usize) {
        let evicted = lock(&self.inner.pipelines).set_capacity(pipelines);
        drop(evicted);
    }

    /// The pipeline of `kernel` with parameter `p` declared `read_write` when `force_rw[p]`.
    pub(crate) fn pipeline(&self, kernel: &Kernel, force_rw: &[bool]) -> Result<Arc<Pipeline>> {
        let key: PipelineKey = (kernel.clone(), force_rw.to_vec());
        if let Some(p) = lock(&self.inner.pipelines).get(&key) {
            return Ok(p.clone());
        }
        let w = wgsl::generate_with_access(kernel, force_rw)?;
        if w.uses_f64 && !self.inner.shader_f64 {
            return Err(WgpuError::Codegen(codegen::CodegenError::Unsupported(format!(
                "dtype f64 on wgpu: adapter {} lacks 64-bit float shaders (SHADER_F64)",
                self.inner.adapter
            ))));
        }
        let device = &self.inner.device;
        let mut entries = vec![::wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: ::wgpu::ShaderStages::COMPUTE,
            ty: ::wgpu::BindingType::Buffer {
                ty: ::wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: NonZeroU64::new(16 * w.sym_vec4s as u64),
            },
            count: None,
        }];
        for (i, &rw) in w.read_write.iter().enumerate() {
            entries.push(::wgpu::BindGroupLayoutEntry {
                binding: i as u32 + 1,
                visibility: ::wgpu::ShaderStages::COMPUTE,
                ty: ::wgpu::BindingType::Buffer {
                    ty: ::wgpu::BufferBindingType::Storage { read_only: !rw },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            });
        }
        let scope = device.push_error_scope(::wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(::wgpu::ShaderModuleDescriptor {
            label: Some("kiln kernel"),
            source: ::wgpu::ShaderSource::Wgsl(Cow::Borrowed(&w.source)),
        });
        let layout = device.create_bind_group_layout(&::wgpu::BindGroupLayoutDescriptor {
            label: Some("kiln kernel"),
            entries: &entries,
        });
        let pipeline_layout = device.create_pipeline_layout(&::wgpu::PipelineLayoutDescriptor {
            label: Some("kiln kernel"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&::wgpu::ComputePipelineDescriptor {
            label: Some("kiln kernel"),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some(w.entry),
            compilation_options: ::wgpu::PipelineCompilationOptions::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(WgpuError::ShaderCompile { message: e.to_string(), source_text: w.source });
        }
        self.inner.pipelines_created.fetch_add(1, Ordering::Relaxed);
        let p = Arc::new(Pipeline { pipeline, layout, wgsl: w });
        Ok(cache_first(&self.inner.pipelines, key, p))
    }

    /// Creates a buffer, counting it; refuses sizes over the device's limit and reports an
    /// out-of-memory or validation error from wgpu as an error.
    pub(crate) fn create_buffer(&self, label: &str, size: u64, usage: ::wgpu::BufferUsages) -> Result<::wgpu::Buffer> {
        if size > self.inner.limits.max_buffer_size {
            return Err(WgpuError::OutOfMemory(format!(
                "{label}: {size} bytes exceed the device's max_buffer_size of {}",
                self.inner.limits.max_buffer_size
            )));
        }
        let device = &self.inner.device;
        let oom = device.push_error_scope(::wgpu::ErrorFilter::OutOfMemory);
        let validation = device.push_error_scope(::wgpu::ErrorFilter::Validation);
        let buffer = device.create_buffer(&::wgpu::BufferDescriptor {
            label: Some(label),
            size: size.max(4).next_multiple_of(4),
            usage,
            mapped_at_creation: false,
        });
        let invalid = pollster::block_on(validation.pop());
        let out_of_memory = pollster::block_on(oom.pop());
        self.inner.buffers_created.fetch_add(1, Ordering::Relaxed);
        if let Some(e) = out_of_memory {
            return Err(WgpuError::OutOfMemory(format!("{label} of {size} bytes: {e}")));
        }
        if let Some(e) = invalid {
            return Err(WgpuError::OutOfMemory(format!("{label} of {size} bytes: {e}")));
        }
        Ok(buffer)
    }

    /// The first error recorded since the last check: device lost, or an uncaptured wgpu error.
    pub(crate) fn take_error(&self) -> Result<()> {
        if let Some(reason) = lock(&self.inner.lost).clone() {
            return Err(WgpuError::DeviceLost(reason));
        }
        let mut errors = lock(&self.inner.uncaptured);
        if errors.is_empty() {
            return Ok(());
        }
        let first = errors.remove(0);
        errors.clear();
        if first.to_ascii_lowercase().contains("out of memory") {
            Err(WgpuError::OutOfMemory(first))
        } else {
            Err(WgpuError::Device(first))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapters_come_from_the_primary_backends_unless_the_environment_names_others() {
        let backends = instance_descriptor().backends;
        match ::wgpu::Backends::from_env() {
            None => {
                assert_eq!(backends, ::wgpu::Backends::PRIMARY);
                assert!(!backends.contains(::wgpu::Backends::GL), "OpenGL's integer % is undefined for negatives");
            }
            Some(named) => assert_eq!(backends, named),
        }
    }
}
