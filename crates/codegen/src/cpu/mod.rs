//! The CPU backend: kir loop kernels compiled to native code with Cranelift's JIT.
//!
//! ABI: every kernel is `unsafe extern "C" fn(bufs: *const *mut u8, syms: *const i64, start: i64,
//! end: i64)`. `bufs[i]` is the base pointer of parameter `i`, `syms[n]` the value of symbol `n`.
//! A kernel whose body is one `parallel` loop iterates it over `[start, end)` (clamped to
//! `[0, extent)`); any other kernel ignores the range.
//!
//! Set `KILN_DISASM=1` to log the machine code of every kernel compiled (`log` target
//! `kiln::disasm`, level `info`; the `kiln` command shows it with `-v`).
//!
//! [`CpuCompiler`] caches compiled kernels by structural identity (`LoopKernel: Hash + Eq`), so a
//! kernel that appears in many programs compiles once, and counts hits, misses and compile time
//! for the runtime's profiler. Kernels share JIT modules (see `jit`), which [`CompiledKernel`]
//! keeps alive.
//!
//! The cache is bounded: it keeps the [`KERNEL_CACHE_CAPACITY`] most recently used kernels
//! (`KILN_KERNEL_CACHE=N` or [`CpuCompiler::set_cache_capacity`] change the bound) and evicts the
//! least recently used one beyond that (`crate::lru`). Eviction drops the cache's handle only: a
//! kernel's JIT module (shared with up to `jit::KERNELS_PER_ARENA` kernels linked in the same
//! batches) frees its executable memory when the last `CompiledKernel` linked into it drops, so
//! code that an executable still holds, or that is running, is never freed under it.
//!
//! Compiling a kernel has two steps:
//! 1. *compile* (nearly all the cost): emit Cranelift IR (`emit`), then `Context::compile` it to
//!    machine code bytes and relocations. This needs only the ISA and a `Context` +
//!    `FunctionBuilderContext` pair (a [`Worker`]), no JIT module: helper calls name their callee
//!    by a fixed index (see `helpers`). [`CpuCompiler::compile_many`] runs this step for the
//!    batch's cache misses on several threads at once (the caller's and tasks on rayon's pool),
//!    one `Worker` each.
//! 2. *link* (cheap, serial): `Jit::link` copies the bytes into the current JIT module, patches
//!    the relocations and makes the memory executable, once per batch.
//!
//! The compiler's mutex is held across both steps, so concurrent callers never compile the same
//! kernel twice; they wait (the batch already uses every core). Step 1 may also start before
//! the batch, while the program is still being lowered ([`EarlyCompile`], `early.rs`): that
//! task runs without the mutex, so it may repeat a concurrent caller's compile of a kernel,
//! never its own.

mod analysis;
mod copy;
mod early;
mod emit;
mod helpers;
mod jit;
mod map;
mod math;
mod native;
mod split;
mod stencil;
mod tier;
mod tile;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cranelift_codegen::Context;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::{AbiParam, Function, Signature, UserFuncName, types};
use cranelift_codegen::isa::{CallConv, OwnedTargetIsa, TargetIsa};
use cranelift_frontend::FunctionBuilderContext;
use cranelift_module::ModuleReloc;
use lower::kir::{Kernel, LoopKernel, Stmt};

use crate::error::{CodegenError, Result};
use crate::lru::{Lru, capacity_from_env};
pub use copy::{CopyMove, CopyNest, CopySide};
pub use early::EarlyCompile;
use jit::{Arena, Code, Linker, Tier};
use native::{Native, NativeKinds};
use rustc_hash::FxHashMap;
use smallvec::{SmallVec, smallvec};
use tier::TierUp;
pub use tier::{JIT_ENV, JitMode, KernelEntry, tier_up_pending, tier_ups_so_far, wait_tier_up_all};
pub use tile::{TILE_ENV, TileLevel, TileMode, Tiling};

/// A batch compiles on one thread unless each thread gets at least this many kernels: a thread
/// costs tens of microseconds to start, about one small kernel's compile.
const MIN_KERNELS_PER_THREAD: usize = 2;

/// Kernels the cache keeps by default. A kernel costs a few KiB (machine code, its key and the
/// cache entry), so the default bounds the cache near 10-20 MiB while every kernel of a large
/// model (hundreds) stays cached.
pub const KERNEL_CACHE_CAPACITY: usize = 4096;

/// Environment variable that sets the kernel cache's capacity (a positive number of kernels).
pub const KERNEL_CACHE_ENV: &str = "KILN_KERNEL_CACHE";

/// The machine-code signature of every kernel.
pub type KernelFn = unsafe extern "C" fn(bufs: *const *mut u8, syms: *const i64, start: i64, end: i64);

fn kernel_signature(call_conv: CallConv) -> Signature {
    let mut sig = Signature::new(call_conv);
    sig.params.extend([types::I64; 4].map(AbiParam::new));
    sig
}

/// A kernel compiled to native code. Cloning the `Arc` is cheap; the code lives as long as any
/// handle does.
///
/// Under [`JitMode::Tiered`] its [`entry`](Self::entry) starts at quick code and moves to
/// optimised code once the background thread has compiled it (see `tier`); both stay alive
/// with the kernel.
pub struct CompiledKernel {
    entry: Arc<KernelEntry>,
    n_params: usize,
    n_syms: usize,
    parallel: bool,
    /// Compiled at [`Tier::Optimized`] from the start.
    optimized_first: bool,
    /// The arena of the code (none for a native copy).
    _arena: Option<Arc<Arena>>,
    /// The arena of the optimised code swapped in later.
    optimized: OnceLock<Arc<Arena>>,
}

// SAFETY: the code is immutable once finalized, and the arena it lives in is only touched under
// its mutex (and freed when the last handle drops).
unsafe impl Send for CompiledKernel {}
unsafe impl Sync for CompiledKernel {}

impl std::fmt::Debug for CompiledKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledKernel")
            .field("n_params", &self.n_params)
            .field("n_syms", &self.n_syms)
            .field("parallel", &self.parallel)
            .finish_non_exhaustive()
    }
}

impl CompiledKernel {
    /// The kernel `k` behind `entry`, its code (if any) in `arena`.
    fn new(
        k: &LoopKernel,
        entry: KernelEntry,
        optimized_first: bool,
        arena: Option<Arc<Arena>>,
    ) -> Arc<CompiledKernel> {
        Arc::new(CompiledKernel {
            entry: Arc::new(entry),
            n_params: k.params.len(),
            n_syms: k.n_syms as usize,
            parallel: matches!(k.body.as_slice(), [Stmt::Loop { parallel: true, .. }]),
            optimized_first,
            _arena: arena,
            optimized: OnceLock::new(),
        })
    }

    /// Number of buffer parameters.
    pub fn n_params(&self) -> usize {
        self.n_params
    }

    /// Number of symbols the kernel reads.
    pub fn n_syms(&self) -> usize {
        self.n_syms
    }

    /// Whether the kernel's body is one parallel loop, so that `[start, end)` selects iterations.
    pub fn is_parallel(&self) -> bool {
        self.parallel
    }

    /// The entry point to call now; `None` for a copy run natively ([`is_native`](Self::is_native):
    /// [`call`](Self::call) runs either).
    pub fn as_fn(&self) -> Option<KernelFn> {
        self.entry.get()
    }

    /// Whether the kernel runs natively now, with no code (a copy nest or a tiled kernel at the
    /// quick tier, see `native`).
    pub fn is_native(&self) -> bool {
        self.entry.is_native()
    }

    /// The kernel's entry, shared: it follows the swap to optimised code, so a runner that
    /// keeps it (rather than [`as_fn`](Self::as_fn)'s pointer) calls the best code there is.
    pub fn entry(&self) -> &Arc<KernelEntry> {
        &self.entry
    }

    /// Asks for this kernel's optimised code (see [`KernelEntry::request_tier_up`]).
    pub fn request_tier_up(&self) {
        self.entry.request_tier_up();
    }

    /// Whether the entry now runs optimised code.
    pub fn is_optimized(&self) -> bool {
        self.optimized_first || self.optimized.get().is_some()
    }

    /// Keeps `arena` with the kernel and points the entry at `func`, once.
    fn swap_in(&self, func: KernelFn, arena: Arc<Arena>) {
        if self.optimized.set(arena).is_ok() {
            self.entry.swap_in(func);
        }
    }

    /// Runs the kernel.
    ///
    /// # Safety
    /// `bufs` must point to `n_params()` pointers, each to a buffer large enough for every index
    /// the kernel touches (for the given symbols and range), of the parameter's dtype; buffers the
    /// kernel writes must not be read or written by anyone else meanwhile. `syms` must point to
    /// `n_syms()` values.
    pub unsafe fn call(&self, bufs: *const *mut u8, syms: *const i64, start: i64, end: i64) {
        // SAFETY: forwarded to the caller.
        unsafe { self.entry.invoke(bufs, syms, start, end) }
    }

    /// Like [`call`](Self::call), but checks the number of buffers and symbols first.
    ///
    /// # Safety
    /// As for `call`: every buffer must be large enough and correctly typed.
    pub unsafe fn run(&self, bufs: &[*mut u8], syms: &[i64], start: i64, end: i64) -> Result<()> {
        if bufs.len() != self.n_params {
            return Err(CodegenError::Arity { what: "buffers", expected: self.n_params, got: bufs.len() });
        }
        if syms.len() < self.n_syms {
            return Err(CodegenError::Arity { what: "symbols", expected: self.n_syms, got: syms.len() });
        }
        // SAFETY: arity checked; the rest is the caller's promise.
        unsafe { self.call(bufs.as_ptr(), syms.as_ptr(), start, end) };
        Ok(())
    }
}

/// Counters of the kernel cache, for the runtime's profiler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Kernels answered from the cache (by `compile`, or by `compile_many`, which also counts a
    /// kernel that appears again later in its batch as a hit).
    pub hits: u64,
    /// Kernels that had to be compiled.
    pub misses: u64,
    /// Kernels compiled successfully (to code: natively run copies are not).
    pub compiled: u64,
    /// Kernels that are copy nests, run natively with no code compiled (see `copy`).
    pub native: u64,
    /// Misses whose code (or error) an early compile made while the program was being lowered
    /// (see `early`; counted in `compiled` or `failures` too).
    pub early: u64,
    /// Compilations that returned an error.
    pub failures: u64,
    /// Time spent compiling (emission, Cranelift, linking), over all misses: wall-clock time, so
    /// a batch compiled on several threads counts once, not once per thread, plus the time of
    /// the early compiles (`early`), which overlap the lowering.
    pub compile_time: Duration,
    /// JIT modules created so far.
    pub arenas: u64,
    /// Kernels evicted from the cache (least recently used first) to keep it at its capacity.
    pub evictions: u64,
    /// Kernels sent to the background thread for optimised code ([`JitMode::Tiered`]).
    pub tier_up_queued: u64,
    /// Of those, kernels now running optimised code.
    pub tiered_up: u64,
    /// Of those, optimising compiles that failed (the kernel keeps its quick code).
    pub tier_up_failures: u64,
    /// Wall-clock time the background thread spent compiling and linking.
    pub tier_up_time: Duration,
}

struct Inner {
    mode: JitMode,
    /// The ISA of the first compile ([`JitMode::first_tier`]).
    isa: OwnedTargetIsa,
    linker: Linker,
    /// This compiler's jobs for the background thread (`tier`).
    tier_up: TierUp,
    cache: KernelCache,
    stats: CacheStats,
    /// Per-thread compilation state, reused across compilations; `workers[0]` serves
    /// single compiles and the calling thread of a batch.
    workers: Vec<Worker>,
    /// Whether [`CpuCompiler::early`] compiles ahead (unless `KILN_EARLY_COMPILE=0`).
    early: bool,
    /// The worker of [`EarlyCompile`]s, between them.
    early_worker: Option<Worker>,
    /// The most threads a batch compiles on.
    max_threads: usize,
    /// When inner loops run over tiles with full-width routines (see `tile`).
    tiling: Tiling,
    /// Whether copy nests run natively instead of compiling at the quick tier (see `copy`;
    /// `KILN_NATIVE_COPY=0` compiles them like any kernel; never under [`JitMode::Optimized`]).
    native_copies: bool,
    /// Whether tiled kernels run natively at the quick tier (see `native`; `KILN_NATIVE_TILES=0`
    /// compiles them; never under [`JitMode::Optimized`]).
    native_tiles: bool,
    /// Whether stencil kernels run natively at the quick tier (see `native`;
    /// `KILN_NATIVE_STENCILS=0` compiles them; never under [`JitMode::Optimized`]).
    native_stencils: bool,
    /// Whether masked element-wise nests run natively at the quick tier (see `map`;
    /// `KILN_NATIVE_MAPS=0` compiles them; never under [`JitMode::Optimized`]).
    native_maps: bool,
}

/// Environment variable that turns early compiles (`early`) off (`0`) for comparisons.
pub const EARLY_COMPILE_ENV: &str = "KILN_EARLY_COMPILE";

/// Environment variable that turns native copies off (`0`) for comparisons.
pub const NATIVE_COPY_ENV: &str = "KILN_NATIVE_COPY";

/// Environment variable that turns native tiled kernels off (`0`) for comparisons.
pub const NATIVE_TILES_ENV: &str = "KILN_NATIVE_TILES";

/// Environment variable that turns native stencil kernels off (`0`) for comparisons.
pub const NATIVE_STENCILS_ENV: &str = "KILN_NATIVE_STENCILS";

/// Environment variable that turns native masked element-wise nests off (`0`) for comparisons.
pub const NATIVE_MAPS_ENV: &str = "KILN_NATIVE_MAPS";

/// Whether the switch in environment variable `name` is on: unset or anything but `0`.
fn on_unless_zero(name: &str) -> bool {
    std::env::var(name).map_or(true, |v| v.trim() != "0")
}

/// The compiled kernels by structural hash ([`LoopKernel::structural_hash`], computed once per
/// lookup), least recently used first out; kernels of one hash are told apart in full.
struct KernelCache(Lru<u64, Bucket>);

/// The cached kernels of one hash (almost always one).
type Bucket = SmallVec<[(Arc<LoopKernel>, Arc<CompiledKernel>); 1]>;

impl KernelCache {
    /// The code of `k`, whose hash is `hash`, marked as just used.
    fn get(&mut self, hash: u64, k: &LoopKernel) -> Option<Arc<CompiledKernel>> {
        self.0.get(&hash)?.iter().find(|(c, _)| **c == *k).map(|(_, code)| code.clone())
    }

    /// Keeps `code` for `k` (of hash `hash`); returns the evicted entries, for the caller to drop.
    fn insert(&mut self, hash: u64, k: Arc<LoopKernel>, code: Arc<CompiledKernel>) -> Vec<Bucket> {
        if let Some(same) = self.0.get_mut(&hash) {
            match same.iter_mut().find(|(c, _)| **c == *k) {
                Some(entry) => entry.1 = code,
                None => same.push((k, code)),
            }
            return Vec::new();
        }
        self.0.insert(hash, smallvec![(k, code)])
    }
}

/// What one thread needs to compile kernels. Reused: the contexts hold the register allocator's
/// and the code buffers' allocations, which are most of the cost of compiling a small kernel
/// when made afresh.
struct Worker {
    fctx: FunctionBuilderContext,
    ctx: Context,
}

/// Compiles kir loop kernels to native code and caches them. Shareable across threads.
pub struct CpuCompiler {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for CpuCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuCompiler").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

/// Where a kernel of a batch gets its result.
enum Slot {
    Hit(Arc<CompiledKernel>),
    /// The `n`th distinct miss of the batch.
    Miss(usize),
}

impl CpuCompiler {
    /// A compiler for the host CPU, in the [`JitMode`] `KILN_JIT` names (else tiered). Batches
    /// compile on up to as many threads as the host has cores (see
    /// [`set_compile_threads`](Self::set_compile_threads)); the cache keeps
    /// [`KERNEL_CACHE_CAPACITY`] kernels, or as many as `KILN_KERNEL_CACHE` says.
    pub fn new() -> Result<CpuCompiler> {
        CpuCompiler::with_mode(JitMode::from_env())
    }

    /// A compiler for the host CPU in `mode` (otherwise as [`new`](Self::new)).
    pub fn with_mode(mode: JitMode) -> Result<CpuCompiler> {
        let isa = jit::host_isa(mode.first_tier())?;
        let max_threads = host_threads();
        Ok(CpuCompiler {
            inner: Mutex::new(Inner {
                mode,
                linker: Linker::new(isa.clone()),
                isa,
                tier_up: TierUp::default(),
                cache: KernelCache(Lru::new(capacity_from_env(KERNEL_CACHE_ENV, KERNEL_CACHE_CAPACITY))),
                stats: CacheStats::default(),
                workers: vec![Worker::new()],
                early: on_unless_zero(EARLY_COMPILE_ENV),
                early_worker: None,
                max_threads,
                tiling: Tiling::from_env(),
                native_copies: on_unless_zero(NATIVE_COPY_ENV),
                native_tiles: on_unless_zero(NATIVE_TILES_ENV),
                native_stencils: on_unless_zero(NATIVE_STENCILS_ENV),
                native_maps: on_unless_zero(NATIVE_MAPS_ENV),
            }),
        })
    }

    /// Sets the most threads [`compile_many`](Self::compile_many) uses (at least 1; 1 compiles
    /// every batch on the calling thread).
    pub fn set_compile_threads(&self, n: usize) {
        self.lock().max_threads = n.max(1);
    }

    /// Whether copy nests compiled from now on run natively until their optimised code (the
    /// default, unless `KILN_NATIVE_COPY=0` or [`JitMode::Optimized`]) or are compiled like any
    /// kernel.
    pub fn set_native_copies(&self, on: bool) {
        self.lock().native_copies = on;
    }

    /// Whether tiled kernels compiled from now on run natively until their optimised code (the
    /// default, unless `KILN_NATIVE_TILES=0` or [`JitMode::Optimized`]) or are compiled.
    pub fn set_native_tiles(&self, on: bool) {
        self.lock().native_tiles = on;
    }

    /// Whether stencil kernels compiled from now on run natively until their optimised code (the
    /// default, unless `KILN_NATIVE_STENCILS=0` or [`JitMode::Optimized`]) or are compiled.
    pub fn set_native_stencils(&self, on: bool) {
        self.lock().native_stencils = on;
    }

    /// Whether masked element-wise nests compiled from now on run natively until their
    /// optimised code (the default, unless `KILN_NATIVE_MAPS=0` or [`JitMode::Optimized`]) or
    /// are compiled.
    pub fn set_native_maps(&self, on: bool) {
        self.lock().native_maps = on;
    }

    /// Sets the most kernels the cache keeps (at least 1), evicting the least recently used
    /// ones beyond it now.
    pub fn set_cache_capacity(&self, kernels: usize) {
        let evicted = {
            let mut inner = self.lock();
            let evicted = inner.cache.0.set_capacity(kernels);
            inner.stats.evictions = inner.cache.0.evictions();
            evicted
        };
        drop(evicted);
    }

    /// Sets when inner loops run over tiles with full-width routines, and which routines they
    /// call, and forgets every cached kernel (compiled with the previous setting). A level the
    /// host cannot run ([`TileLevel::Avx512`] without AVX-512F, [`TileLevel::Avx2Fma`] without
    /// AVX2 and FMA) becomes the best it can.
    /// The default is [`Tiling::from_env`].
    pub fn set_tiling(&self, tiling: Tiling) {
        let level = if tiling.level.runs_here() { tiling.level } else { TileLevel::detect() };
        let mut inner = self.lock();
        inner.tiling = Tiling { mode: tiling.mode, level };
        inner.cache.0.clear();
    }

    /// The tiling setting in force.
    pub fn tiling(&self) -> Tiling {
        self.lock().tiling
    }

    /// The JIT mode in force.
    pub fn jit_mode(&self) -> JitMode {
        self.lock().mode
    }

    /// Blocks until every kernel compiled so far runs optimised code (under [`JitMode::Tiered`];
    /// at once otherwise), or its optimising compile failed. For measuring steady-state speed
    /// without racing the background thread; programs never need to wait.
    pub fn wait_tier_up(&self) {
        let tier_up = self.lock().tier_up.clone();
        tier_up.wait();
    }

    /// The most kernels the cache keeps.
    pub fn cache_capacity(&self) -> usize {
        self.lock().cache.0.capacity()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Compiles a kernel, or fetches it from the cache. Matmul kernels are an error: the runtime
    /// runs them with a GEMM.
    pub fn compile_kernel(&self, k: &Kernel) -> Result<Arc<CompiledKernel>> {
        match k {
            Kernel::Loops(k) => self.compile(k),
            Kernel::Matmul(_) => Err(CodegenError::Matmul),
        }
    }

    /// Compiles a loop kernel, or fetches it from the cache.
    pub fn compile(&self, k: &LoopKernel) -> Result<Arc<CompiledKernel>> {
        let mut inner = self.lock();
        let hash = k.structural_hash();
        if let Some(c) = inner.cache.get(hash, k) {
            inner.stats.hits += 1;
            return Ok(c);
        }
        let mut results = inner.compile_misses(&[(hash, k)], None);
        results.pop().unwrap_or_else(|| Err(CodegenError::Cranelift("kernel lost".into())))
    }

    /// Compiles a batch of loop kernels, or fetches them from the cache, and returns one result
    /// per kernel, in order: a kernel that fails to compile gets its error without affecting the
    /// others (collect into `Result<Vec<_>>` to stop at the first error).
    ///
    /// Same cache as [`compile`](Self::compile), same counters: each cached kernel is a hit; each
    /// distinct uncached kernel is a miss and is compiled once, and a repeat of it later in the
    /// batch is a hit that shares its result (its error too). The misses compile concurrently,
    /// on up to [`set_compile_threads`](Self::set_compile_threads) threads (the caller's and
    /// scoped threads, never rayon's pool, so this may be called from a rayon task), each thread
    /// given at least two kernels; the result is placed in executable memory serially, once for
    /// the batch. The compiler stays locked meanwhile: concurrent callers wait, then find the
    /// batch's kernels cached.
    pub fn compile_many(&self, kernels: &[&LoopKernel]) -> Vec<Result<Arc<CompiledKernel>>> {
        // Hashed once: the cache and the batch's misses compare kernels in full only on an equal
        // hash (a MobileNet's stencil kernels hashed four times, twice with SipHash, took 5% of
        // its first call).
        let hashed: Vec<(u64, &LoopKernel)> = kernels.iter().map(|&k| (k.structural_hash(), k)).collect();
        self.compile_many_early(&hashed, None)
    }

    /// Wakes a thread of rayon's pool for an early compile that may come soon (see
    /// `early::wake`); nothing when this compiler compiles nothing early, or while it is
    /// compiling (its lock held: the pool is awake).
    pub fn wake_early(&self) {
        let Ok(inner) = self.inner.try_lock() else { return };
        if inner.max_threads >= 2 && inner.early {
            early::wake();
        }
    }

    /// Frees a pool thread that [`CpuCompiler::wake_early`] woke: no compile is coming.
    pub fn settle_early(&self) {
        early::settle();
    }

    /// Starts compiling kernels ahead of the batch that needs them, on one task of rayon's pool
    /// (see `early`): hand each loop kernel to [`send_early`](Self::send_early) as it is made,
    /// then the handle to [`compile_many_early`](Self::compile_many_early) with the batch.
    /// `None` where batches compile on one thread (nothing to overlap).
    pub fn early(&self) -> Option<EarlyCompile> {
        let mut inner = self.lock();
        if inner.max_threads < 2 || !inner.early {
            return None;
        }
        let worker = inner.early_worker.take().unwrap_or_else(Worker::new);
        Some(EarlyCompile::new(worker, inner.isa.clone(), inner.tiling, disasm_wanted(), inner.native_kinds()))
    }

    /// Sends `k` (of structural hash `hash`) to be compiled early, unless a kernel of its hash
    /// was sent before or the cache has it. The task shares `k` (no copy is made).
    pub fn send_early(&self, early: &mut EarlyCompile, hash: u64, k: &Arc<LoopKernel>) {
        if early.knows(hash) || self.lock().cache.get(hash, k).is_some() {
            return;
        }
        early.send(hash, k);
    }

    /// [`compile_many`](Self::compile_many) for kernels already hashed
    /// ([`LoopKernel::structural_hash`]), taking the codes of those that `early` compiled
    /// ahead (the kernels it was sent and has not reached compile now, here and on its task,
    /// while it finishes the one in flight).
    pub fn compile_many_early(
        &self,
        kernels: &[(u64, &LoopKernel)],
        early: Option<EarlyCompile>,
    ) -> Vec<Result<Arc<CompiledKernel>>> {
        let mut inner = self.lock();
        let mut slots = Vec::with_capacity(kernels.len());
        let mut misses: Vec<(u64, &LoopKernel)> = Vec::new();
        // The misses of each hash: a repeat of one in the batch shares its compile.
        let mut first: FxHashMap<u64, SmallVec<[usize; 1]>> = FxHashMap::default();
        for &(hash, k) in kernels {
            air::work::tick();
            if let Some(c) = inner.cache.get(hash, k) {
                slots.push(Slot::Hit(c));
                inner.stats.hits += 1;
            } else if let Some(&m) = first.get(&hash).and_then(|ms| ms.iter().find(|&&m| misses[m].1 == k)) {
                slots.push(Slot::Miss(m));
                inner.stats.hits += 1;
            } else {
                first.entry(hash).or_default().push(misses.len());
                slots.push(Slot::Miss(misses.len()));
                misses.push((hash, k));
            }
        }
        let compiled = if misses.is_empty() { Vec::new() } else { inner.compile_misses(&misses, early) };
        slots
            .into_iter()
            .map(|slot| match slot {
                Slot::Hit(c) => Ok(c),
                Slot::Miss(m) => compiled[m].clone(),
            })
            .collect()
    }

    /// The cache counters so far.
    pub fn stats(&self) -> CacheStats {
        let inner = self.lock();
        let mut stats = inner.stats;
        stats.arenas = inner.linker.arenas;
        let p = inner.tier_up.progress();
        stats.tier_up_queued = p.queued;
        stats.tiered_up = p.optimized;
        stats.tier_up_failures = p.failed;
        stats.tier_up_time = p.time;
        stats
    }

    /// Number of kernels in the cache.
    pub fn cached(&self) -> usize {
        self.lock().cache.0.len()
    }

    /// Forgets every cached kernel (kernels still held elsewhere stay valid).
    pub fn clear_cache(&self) {
        self.lock().cache.0.clear();
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

impl Inner {
    /// Which kernels run natively rather than compile (see `native`): the batch and an early
    /// compile decide alike.
    fn native_kinds(&self) -> NativeKinds {
        if self.mode == JitMode::Optimized {
            return NativeKinds::NONE;
        }
        NativeKinds {
            copies: self.native_copies,
            tiles: self.native_tiles,
            stencils: self.native_stencils,
            maps: self.native_maps,
        }
    }

    /// Compiles distinct kernels that are not in the cache, caches the successes, sends them on
    /// to the background thread under [`JitMode::Tiered`] and counts everything; one result
    /// per kernel, in order.
    fn compile_misses(
        &mut self,
        misses: &[(u64, &LoopKernel)],
        early: Option<EarlyCompile>,
    ) -> Vec<Result<Arc<CompiledKernel>>> {
        self.stats.misses += misses.len() as u64;
        let t0 = Instant::now();
        let disasm = disasm_wanted();
        // Copy nests and tiled kernels need no code at first: they run natively, cached like
        // compiled kernels; the codes of the others are linked together.
        let mut plans: Vec<Option<Box<Native>>> = Vec::with_capacity(misses.len());
        let mut codes = Vec::new();
        let mut kernels: Vec<&LoopKernel> = Vec::new();
        for (made, &(_, k)) in self.made(misses, early, disasm).into_iter().zip(misses) {
            let code = match made {
                Ok(Made::Native(plan)) => {
                    plans.push(Some(plan));
                    continue;
                }
                Ok(Made::Code(c)) => Ok(c),
                Err(e) => Err(e),
            };
            plans.push(None);
            kernels.push(k);
            codes.push(code);
        }
        air::work::add(codes.iter().flatten().map(|c| c.work).sum());
        let optimized_first = self.mode.first_tier() == Tier::Optimized;
        let results: Vec<Result<Arc<CompiledKernel>>> = self
            .linker
            .link(codes)
            .into_iter()
            .zip(kernels)
            .map(|(linked, k)| {
                linked.map(|(ptr, arena)| {
                    // SAFETY: `ptr` is the entry of a function just defined (and finalized) with
                    // `kernel_signature`.
                    let func = unsafe { std::mem::transmute::<*const u8, KernelFn>(ptr) };
                    CompiledKernel::new(k, KernelEntry::new(func), optimized_first, Some(arena))
                })
            })
            .collect();
        let mut compiled = results.into_iter();
        let results: Vec<Result<Arc<CompiledKernel>>> = misses
            .iter()
            .zip(plans)
            .map(|(&(_, k), plan)| match plan {
                Some(plan) => Ok(CompiledKernel::new(k, KernelEntry::native(plan), false, None)),
                None => compiled.next().expect("one result per compiled kernel"),
            })
            .collect();
        self.stats.compile_time += t0.elapsed();
        for (&(hash, k), r) in misses.iter().zip(&results) {
            match r {
                Ok(c) => {
                    if c.is_native() {
                        self.stats.native += 1;
                    } else {
                        self.stats.compiled += 1;
                    }
                    // One copy of the kernel, shared by the cache's key and the tier-up job
                    // (a native copy's too: its optimised code replaces it in steady state,
                    // unless the native run is the faster, `KernelEntry::stays_native`).
                    let k = Arc::new(k.clone());
                    if !c.entry.stays_native() {
                        self.tier_up(&k, c, disasm);
                    }
                    // An evicted kernel's code stays valid while anything else holds it.
                    drop(self.cache.insert(hash, k, c.clone()));
                }
                Err(_) => self.stats.failures += 1,
            }
        }
        self.stats.evictions = self.cache.0.evictions();
        results
    }

    /// The quick tier of `kernels` (distinct; one result each, in order: machine code, or a
    /// native run, `Worker::make`): what `early` made ahead taken from it, those still queued for it made here while its task
    /// goes on with the rest of the queue, the others (never sent) compiled now on up to
    /// `max_threads` workers while the task finishes the kernel in flight, whose code it then
    /// brings.
    fn made(&mut self, kernels: &[(u64, &LoopKernel)], early: Option<EarlyCompile>, disasm: bool) -> Vec<Result<Made>> {
        let kinds = self.native_kinds();
        let mut codes: Vec<Option<Result<Made>>> = kernels.iter().map(|_| None).collect();
        // Early codes made with other settings (changed since) are not taken.
        let mut early = early.filter(|e| e.compiles_like(self.tiling, disasm, kinds));
        let mut index: FxHashMap<u64, SmallVec<[usize; 1]>> = FxHashMap::default();
        let mut in_flight = None;
        if let Some(e) = &mut early {
            for (i, &(hash, _)) in kernels.iter().enumerate() {
                index.entry(hash).or_default().push(i);
            }
            // The kernels still queued are compiled here, from the back of the queue, while the
            // task compiles on from the front (see `EarlyCompile::steal`).
            self.ensure_workers(1);
            while let Some((hash, k)) = e.steal() {
                if let Some(i) = find(kernels, &index, hash, &k).filter(|&i| codes[i].is_none()) {
                    codes[i] = Some(self.workers[0].make(&*self.isa, &k, disasm, self.tiling, kinds));
                }
            }
            let (done, current) = e.close();
            self.stats.early += take_codes(&mut codes, kernels, &index, done);
            in_flight = current.and_then(|(hash, k)| find(kernels, &index, hash, &k));
        }
        let now: Vec<usize> = (0..kernels.len()).filter(|&i| codes[i].is_none() && in_flight != Some(i)).collect();
        let refs: Vec<&LoopKernel> = now.iter().map(|&i| kernels[i].1).collect();
        let threads = self.max_threads.min(refs.len() / MIN_KERNELS_PER_THREAD).max(1);
        self.ensure_workers(threads);
        let compiled = make_all(&*self.isa, &mut self.workers[..threads], &refs, (disasm, self.tiling, kinds));
        for (i, code) in now.into_iter().zip(compiled) {
            codes[i] = Some(code);
        }
        if let Some(e) = early {
            let finished = e.finish();
            self.stats.early += take_codes(&mut codes, kernels, &index, finished.done);
            self.early_worker = finished.worker.or(self.early_worker.take());
            self.stats.compile_time += finished.time;
        }
        let (isa, tiling) = (&*self.isa, self.tiling);
        codes
            .into_iter()
            .zip(kernels)
            // The kernel in flight when an early task was lost (a panic outside the worker's
            // own guard): compiled here.
            .map(|(code, &(_, k))| code.unwrap_or_else(|| self.workers[0].make(isa, k, disasm, tiling, kinds)))
            .collect()
    }

    /// Makes at least `n` workers.
    fn ensure_workers(&mut self, n: usize) {
        while self.workers.len() < n {
            self.workers.push(Worker::new());
        }
    }

    /// Arms a kernel just compiled for the background thread, under [`JitMode::Tiered`]: it
    /// goes there when a runner asks ([`KernelEntry::request_tier_up`]).
    fn tier_up(&mut self, k: &Arc<LoopKernel>, c: &Arc<CompiledKernel>, disasm: bool) {
        if self.mode == JitMode::Tiered {
            self.tier_up.arm(k, c, self.tiling, disasm);
        }
    }
}

/// The threads the host runs at once, asked once per process: `available_parallelism` reads
/// the cgroup's CPU quota from `/proc` and `/sys` on every call, which was 60% of a fresh
/// device's set-up (about 35 us of an imported GRU's 1 ms first call, `perf`).
fn host_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Whether `KILN_DISASM` asks for the machine code of every kernel compiled.
fn disasm_wanted() -> bool {
    std::env::var_os("KILN_DISASM").is_some()
}

/// The position in `kernels` (indexed by hash in `index`) of the kernel equal to `k`.
fn find(
    kernels: &[(u64, &LoopKernel)],
    index: &FxHashMap<u64, SmallVec<[usize; 1]>>,
    hash: u64,
    k: &LoopKernel,
) -> Option<usize> {
    index.get(&hash)?.iter().copied().find(|&i| *kernels[i].1 == *k)
}

/// Puts each early code (or native run) in `done` at its kernel's position in `codes` (one for
/// a kernel the batch does not have is dropped); returns how many codes it placed.
fn take_codes(
    codes: &mut [Option<Result<Made>>],
    kernels: &[(u64, &LoopKernel)],
    index: &FxHashMap<u64, SmallVec<[usize; 1]>>,
    done: Vec<early::Compiled>,
) -> u64 {
    let mut placed = 0;
    for (hash, k, made) in done {
        if let Some(i) = find(kernels, index, hash, &k) {
            placed += u64::from(!matches!(made, Ok(Made::Native(_))));
            codes[i] = Some(made);
        }
    }
    placed
}

/// Makes the quick tier of `kernels` (`Worker::make`) on the workers' threads (the caller's thread is
/// `workers[0]`; the others run as tasks on rayon's pool, whose threads already exist: starting
/// a thread per batch cost 60-130 us before it compiled anything). Threads take the next kernel
/// as they finish one, the costliest first (`analysis::compile_weight`), so a big kernel neither
/// holds up the rest nor is left alone at the end. One result per kernel, in order.
fn make_all(
    isa: &dyn TargetIsa,
    workers: &mut [Worker],
    kernels: &[&LoopKernel],
    (disasm, tiling, kinds): (bool, Tiling, NativeKinds),
) -> Vec<Result<Made>> {
    let Some((own, others)) = workers.split_first_mut() else {
        return Vec::new();
    };
    if others.is_empty() {
        return kernels.iter().map(|k| own.make(isa, k, disasm, tiling, kinds)).collect();
    }
    let mut order: Vec<usize> = (0..kernels.len()).collect();
    order.sort_by_cached_key(|&i| std::cmp::Reverse(analysis::compile_weight(kernels[i])));
    let next = AtomicUsize::new(0);
    let work = |w: &mut Worker, done: &mut Vec<(usize, Result<Made>)>| {
        while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
            done.push((i, w.make(isa, kernels[i], disasm, tiling, kinds)));
        }
    };
    let mut done: Vec<Vec<(usize, Result<Made>)>> = (0..=others.len()).map(|_| Vec::new()).collect();
    let (mine, theirs) = done.split_first_mut().expect("one list per worker");
    // A task that panicked (outside the per-kernel `catch_unwind`) loses its kernels, which then
    // report an error below; the panic itself is caught here rather than re-raised by the scope.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        rayon::in_place_scope(|s| {
            let work = &work;
            for (w, list) in others.iter_mut().zip(theirs.iter_mut()) {
                s.spawn(move |_| work(w, list));
            }
            work(own, mine);
        })
    }));
    let mut results: Vec<Option<Result<Made>>> = kernels.iter().map(|_| None).collect();
    for (i, r) in done.into_iter().flatten() {
        results[i] = Some(r);
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(CodegenError::Cranelift("compile thread failed".into()))))
        .collect()
}

/// A kernel's quick tier as a worker makes it: machine code, or a native run where the kernel
/// needs none (`native`).
pub(crate) enum Made {
    Code(Code),
    Native(Box<Native>),
}

impl Worker {
    fn new() -> Worker {
        Worker { fctx: FunctionBuilderContext::new(), ctx: Context::new() }
    }

    /// `k`'s quick tier: a native run where `kinds` allows one, else its code (decided once per
    /// kernel, by whichever thread makes it: the early task's, or the batch's).
    fn make(
        &mut self,
        isa: &dyn TargetIsa,
        k: &LoopKernel,
        disasm: bool,
        tiling: Tiling,
        kinds: NativeKinds,
    ) -> Result<Made> {
        match Native::of(k, kinds, tiling) {
            Some(plan) => Ok(Made::Native(Box::new(plan))),
            None => self.compile(isa, k, disasm, tiling).map(Made::Code),
        }
    }

    /// Emits and compiles `k` to machine code; a failure leaves the worker ready for the next.
    fn compile(&mut self, isa: &dyn TargetIsa, k: &LoopKernel, disasm: bool, tiling: Tiling) -> Result<Code> {
        match catch_unwind(AssertUnwindSafe(|| self.try_compile(isa, k, disasm, tiling))) {
            Ok(Ok(code)) => Ok(code),
            Ok(Err(e)) => {
                // Emission may have stopped half-way, leaving the builder context dirty.
                self.fctx = FunctionBuilderContext::new();
                Err(e)
            }
            Err(panic) => {
                *self = Worker::new();
                Err(CodegenError::Cranelift(format!("internal error while compiling: {}", panic_message(&*panic))))
            }
        }
    }

    fn try_compile(&mut self, isa: &dyn TargetIsa, k: &LoopKernel, disasm: bool, tiling: Tiling) -> Result<Code> {
        let ctx = &mut self.ctx;
        ctx.clear();
        ctx.func.signature = kernel_signature(isa.default_call_conv());
        ctx.func.name = UserFuncName::default();
        emit::emit_kernel(&mut ctx.func, &mut self.fctx, isa, k, tiling)?;
        let work = ctx.func.dfg.num_insts() as u64;
        ctx.set_disasm(disasm);
        ctx.compile(isa, &mut ControlPlane::default()).map_err(|e| {
            CodegenError::Cranelift(cranelift_codegen::print_errors::pretty_error(e.func, e.inner).to_string())
        })?;
        let compiled = ctx.compiled_code().ok_or_else(|| CodegenError::Cranelift("no code".into()))?;
        let relocs = compiled
            .buffer
            .relocs()
            .iter()
            .map(|r| ModuleReloc::from_mach_reloc(r, &ctx.func, Code::self_id()))
            .collect();
        Ok(Code {
            bytes: compiled.code_buffer().to_vec(),
            alignment: u64::from(compiled.buffer.alignment),
            relocs,
            disasm: compiled.vcode.clone().filter(|_| disasm),
            work,
        })
    }
}

/// The Cranelift IR that [`CpuCompiler`] would compile for `k`, as text (before Cranelift's own
/// optimisations), for `--dump` and golden tests; tiled as `KILN_TILE` says ([`Tiling::from_env`]).
pub fn clif_text(k: &LoopKernel) -> Result<String> {
    clif_text_with(k, Tiling::from_env())
}

/// [`clif_text`] with the given tiling.
pub fn clif_text_with(k: &LoopKernel, tiling: Tiling) -> Result<String> {
    let isa = jit::host_isa(Tier::Optimized)?;
    let mut func = Function::with_name_signature(UserFuncName::user(0, 0), kernel_signature(isa.default_call_conv()));
    let mut fctx = FunctionBuilderContext::new();
    catch_unwind(AssertUnwindSafe(|| emit::emit_kernel(&mut func, &mut fctx, &*isa, k, tiling)))
        .map_err(|_| CodegenError::Cranelift("internal error while emitting".into()))??;
    Ok(func.display().to_string())
}

#[cfg(test)]
mod tests {
    use air::{DType, Scalar};
    use lower::kir::{Access, IExpr, Inst, Param, Reg, Var};

    use super::*;

    /// `out[i] = value` for `i < 4`.
    fn fill(value: f64) -> LoopKernel {
        LoopKernel {
            params: vec![Param { dtype: DType::F32, access: Access::Write }],
            n_syms: 0,
            body: vec![Stmt::Loop {
                var: Var(0),
                extent: IExpr::Const(4),
                parallel: false,
                body: vec![
                    Stmt::Let { reg: Reg(0), dtype: DType::F32, inst: Inst::Const(Scalar::Float(value)) },
                    Stmt::Store { buf: 0, index: IExpr::Var(Var(0)), value: Reg(0) },
                ],
            }],
        }
    }

    #[test]
    fn kernels_of_one_hash_are_told_apart() {
        let compiler = CpuCompiler::new().unwrap();
        let (a, b) = (fill(1.0), fill(2.0));
        let (code_a, code_b) = (compiler.compile(&a).unwrap(), compiler.compile(&b).unwrap());
        // Both under one (forced) hash: a lookup compares the kernels in full.
        let mut cache = KernelCache(Lru::new(4));
        assert!(cache.insert(7, Arc::new(a.clone()), code_a.clone()).is_empty());
        assert!(cache.get(7, &b).is_none());
        assert!(cache.insert(7, Arc::new(b.clone()), code_b.clone()).is_empty());
        assert!(Arc::ptr_eq(&cache.get(7, &a).unwrap(), &code_a));
        assert!(Arc::ptr_eq(&cache.get(7, &b).unwrap(), &code_b));
        assert!(cache.get(8, &a).is_none());
        // Inserting a kernel again replaces its code, and only its.
        assert!(cache.insert(7, Arc::new(a.clone()), code_b.clone()).is_empty());
        assert!(Arc::ptr_eq(&cache.get(7, &a).unwrap(), &code_b));
        assert_eq!(cache.0.len(), 1);
    }
}
