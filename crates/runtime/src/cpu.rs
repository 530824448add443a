//! The CPU device: lowers a graph, compiles its loop kernels to native code, and caches the
//! result by the graph's structure.
//!
//! A `CpuDevice` is a cheap handle (`Clone` shares the caches); it is `Send + Sync`, and any thread
//! may compile or run through it.
//!
//! The program cache is bounded: it keeps the [`PROGRAM_CACHE_CAPACITY`] most recently used
//! programs (`KILN_PROGRAM_CACHE=N` or [`CpuDevice::set_cache_capacity`] change the bound) and
//! evicts the least recently used one beyond that. An evicted [`Executable`] lives on while a
//! caller holds it (it is an `Arc`, and it holds the `Arc`s of its compiled kernels), so eviction
//! never frees code in use; the kernels themselves are bounded by the code generator's own cache
//! (`codegen::cpu::KERNEL_CACHE_CAPACITY`, `KILN_KERNEL_CACHE`).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use air::{Bindings, Graph, GraphKey, HostTensor};
pub use codegen::cpu::JitMode;
use codegen::cpu::{CompiledKernel, CpuCompiler, EarlyCompile};
use codegen::lru::{Lru, capacity_from_env};
use lower::kir::{IExpr, Kernel, LoopKernel};

use crate::error::Result;
use crate::observe::{CompileObserver, NoCompileObserver, Passes, Step};
use crate::vm::{Executable, LoopCode};

/// A loop kernel with its buffers' base offsets taken out (`lower::offsets`: kernels that differ
/// only there, an unrolled RNN's steps or a concatenation's pieces, compile once), and its
/// structural hash.
struct Split {
    hash: u64,
    /// Shared with the early compile's task.
    kernel: Arc<LoopKernel>,
    offsets: Vec<IExpr>,
}

impl Split {
    fn of(k: &LoopKernel) -> Split {
        let (kernel, offsets) = lower::offsets::split_offsets(k);
        Split { hash: kernel.structural_hash(), kernel: Arc::new(kernel), offsets }
    }
}

/// The lowering's observer on the CPU: forwards the passes to the caller's observer, and splits
/// each loop kernel as emission makes it and sends it to be compiled early, so that the code
/// generator works on a second core while the rest of the program is lowered.
struct Lowering<'a> {
    passes: Passes<'a>,
    compiler: &'a CpuCompiler,
    early: Option<EarlyCompile>,
    /// Every loop kernel made so far, in the program's order.
    loops: Vec<Split>,
    /// Per kernel of the program made so far, its position in `loops` (a loop kernel's).
    at: Vec<Option<usize>>,
}

impl lower::PassObserver for Lowering<'_> {
    fn begin(&mut self, pass: lower::Pass, graph_nodes: usize) {
        self.passes.begin(pass, graph_nodes);
    }

    fn end(&mut self, pass: lower::Pass, graph_nodes: usize) {
        self.passes.end(pass, graph_nodes);
    }

    fn output(&mut self, pass: lower::Pass, output: lower::PassOutput<'_>) {
        self.passes.output(pass, output);
    }

    fn kernel(&mut self, kernel: &Kernel) {
        let at = match kernel {
            Kernel::Loops(k) => {
                let split = Split::of(k);
                if let Some(early) = &mut self.early {
                    self.compiler.send_early(early, split.hash, &split.kernel);
                }
                self.loops.push(split);
                Some(self.loops.len() - 1)
            }
            Kernel::Matmul(_) => None,
        };
        self.at.push(at);
    }

    /// The split of kernel `from` with its offsets moved by `by`: the accesses `split_offsets`
    /// leaves in a kernel are those of `from`'s, and each offset is `from`'s plus the move (the
    /// same addresses as splitting `kernel` gives, without walking it again).
    fn shifted_kernel(&mut self, kernel: &Kernel, from: usize, by: &[IExpr]) {
        let Some(&Some(from)) = self.at.get(from) else { return self.kernel(kernel) };
        let src = &self.loops[from];
        if !matches!(kernel, Kernel::Loops(k) if k.params.len() == by.len() && by.len() == src.offsets.len()) {
            return self.kernel(kernel);
        }
        let offsets = src.offsets.iter().zip(by).map(|(o, d)| IExpr::add(o.clone(), d.clone())).collect();
        let split = Split { hash: src.hash, kernel: src.kernel.clone(), offsets };
        self.loops.push(split);
        self.at.push(Some(self.loops.len() - 1));
    }
}

/// Blocks until every loop kernel that any CPU device of the process compiled so far runs the code
/// of the JIT's optimising tier (or failed to get it): [`CpuDevice::wait_tier_up`] for all.
pub fn wait_tier_up_all() {
    codegen::wait_tier_up_all();
}

/// How much work a device has done: what its caches saved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuStats {
    /// Graphs lowered and compiled (program cache misses).
    pub programs_compiled: u64,
    /// `compile` calls answered from the program cache.
    pub cache_hits: u64,
    /// Loop kernels compiled to native code (the code generator's own cache catches repeats).
    pub kernels_compiled: u64,
    /// Distinct loop kernels that are copy nests, run natively with no code compiled (not
    /// counted in `kernels_compiled`).
    pub kernels_native: u64,
    /// Loop kernels compiled on a second core while their program was still being lowered
    /// (counted in `kernels_compiled` too; `codegen::EarlyCompile`).
    pub kernels_compiled_early: u64,
    /// Programs evicted from the program cache to keep it at its capacity.
    pub programs_evicted: u64,
    /// Kernels evicted from the code generator's kernel cache.
    pub kernels_evicted: u64,
    /// Loop kernels recompiled with Cranelift's optimisations by the tiered JIT's background
    /// thread, now running that code (not counted in `kernels_compiled`: no program waited).
    pub kernels_tiered_up: u64,
}

/// Programs a device's cache keeps by default. A cached program of a small graph costs about
/// 10-20 KiB of host memory (key, kir, launch table, memory plans), a large model's more, so
/// the default bounds a device that sees endless distinct shapes to tens of MiB while every
/// program of a training loop or of a model's generation steps stays cached.
pub const PROGRAM_CACHE_CAPACITY: usize = 1024;

/// Environment variable that sets the program cache's capacity (a positive number of programs)
/// of devices created afterwards.
pub const PROGRAM_CACHE_ENV: &str = "KILN_PROGRAM_CACHE";

/// The programs whose graphs share one structural hash (almost always one), with their keys.
type Bucket = Vec<(Arc<GraphKey>, Arc<Executable>)>;

struct Inner {
    options: lower::CompileOptions,
    level_min_work: Option<u128>,
    compiler: CpuCompiler,
    /// Compiled programs by structural hash, least recently used evicted first; a hit compares
    /// the graph with the stored key in full.
    programs: Mutex<Lru<u64, Bucket>>,
    programs_compiled: AtomicU64,
    cache_hits: AtomicU64,
    /// Bumped by every [`CpuDevice::clear_caches`].
    generation: AtomicU64,
}

/// The CPU: native loop kernels from `codegen`, GEMM for matmuls, rayon's pool for threads.
#[derive(Clone)]
pub struct CpuDevice {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuDevice").field("stats", &self.stats()).finish()
    }
}

impl CpuDevice {
    /// A device with the default lowering options.
    pub fn new() -> Result<CpuDevice> {
        CpuDevice::with_options(lower::CompileOptions::default())
    }

    /// A device that lowers every graph with `options`.
    pub fn with_options(options: lower::CompileOptions) -> Result<CpuDevice> {
        CpuDevice::with_level_threshold(options, Some(crate::levels::LEVEL_PARALLEL_MIN_WORK))
    }

    /// A device whose executables run a dependency level's steps at the same time when the level
    /// has at least `min_work` work (see [`crate::levels`]); `None` runs every step in program
    /// order.
    ///
    /// With `KILN_MALLOC_TUNING=1` the first device of the process tunes glibc's `malloc` so that
    /// freed outputs are reused warm; otherwise the process's allocator is left alone (see
    /// [`crate::memory::tune_host_allocator`], which applications call themselves).
    pub fn with_level_threshold(options: lower::CompileOptions, min_work: Option<u128>) -> Result<CpuDevice> {
        CpuDevice::build(options, min_work, JitMode::from_env())
    }

    /// A device with the default lowering options whose JIT runs in `mode` rather than the one
    /// `KILN_JIT` names (tiered by default: see [`JitMode`]).
    pub fn with_jit_mode(mode: JitMode) -> Result<CpuDevice> {
        CpuDevice::build(lower::CompileOptions::default(), Some(crate::levels::LEVEL_PARALLEL_MIN_WORK), mode)
    }

    fn build(options: lower::CompileOptions, min_work: Option<u128>, mode: JitMode) -> Result<CpuDevice> {
        crate::memory::tune_host_allocator_if_requested();
        crate::matmul::warm_up();
        let compiler = CpuCompiler::with_mode(mode)?;
        Ok(CpuDevice {
            inner: Arc::new(Inner {
                options,
                level_min_work: min_work,
                compiler,
                programs: Mutex::new(Lru::new(capacity_from_env(PROGRAM_CACHE_ENV, PROGRAM_CACHE_CAPACITY))),
                programs_compiled: AtomicU64::new(0),
                cache_hits: AtomicU64::new(0),
                generation: AtomicU64::new(0),
            }),
        })
    }

    /// Sets the most threads one compilation's batch of loop kernels is generated on (at least 1;
    /// 1 generates every kernel on the thread that calls [`compile`](CpuDevice::compile)). A new
    /// device uses every core.
    pub fn set_compile_threads(&self, n: usize) {
        self.inner.compiler.set_compile_threads(n);
    }

    /// The executable for `graph`: from the cache when a graph of the same structure was compiled
    /// before (whatever its symbol values will be), else lowered and compiled now.
    ///
    /// A hit costs one hashing pass and one comparison pass over the graph, with no allocation
    /// beyond a position table: the key itself is only built on a miss.
    pub fn compile(&self, graph: &Graph) -> Result<Arc<Executable>> {
        self.compile_observed(graph, &mut NoCompileObserver)
    }

    /// [`compile`](CpuDevice::compile), reporting each step to `observer`: `graph-key` (checking
    /// the graph is acyclic, hashing it, looking it up and, on a miss, building the key the cache
    /// keeps), then either `cache-hit` (a marker: the program was found) or every pass of `lower`
    /// (`verify`, which copies the lent graph, `optimize`, `decide-fusion`, `emit-kernels`),
    /// `codegen` (the one batch of loop kernels) and `prepare` (the executable), with the
    /// counters `kernels`, `loop kernels` and `launches`.
    pub fn compile_observed(&self, graph: &Graph, observer: &mut dyn CompileObserver) -> Result<Arc<Executable>> {
        Ok(self.compile_taking(Cow::Borrowed(graph), observer)?.0)
    }

    /// Says a compile may come soon (a trace has begun): a thread of the pool that compiles
    /// kernels early is woken now, so that its wake-up overlaps the tracing
    /// (`codegen::cpu::CpuCompiler::wake_early`). A program found in the cache frees it.
    pub fn expect_compile(&self) {
        crate::parallel::release();
        self.inner.compiler.wake_early();
    }

    /// [`compile_observed`](CpuDevice::compile_observed) of a graph lent (copied for lowering,
    /// in `verify`) or given (lowered in place, without the copy: `lower::compile_taking`),
    /// returned with the program's structural key, which answers what each node of the graph
    /// was (its op and type by topological position, `GraphKey::node`) once a given graph is
    /// gone. On a hit the key is the cached program's (of a graph of the same structure).
    pub fn compile_taking(
        &self,
        graph: Cow<'_, Graph>,
        observer: &mut dyn CompileObserver,
    ) -> Result<(Arc<Executable>, Arc<GraphKey>)> {
        let nodes = Some(graph.len());
        observer.begin(Step::GraphKey, nodes);
        // Hashing walks the topological order, which a cyclic graph does not have: check first
        // (free: the order is computed once and the check reads what that found). The rest of
        // `air::verify` runs in `lower::compile` on a miss, before any program is stored; a hit
        // compares the graph in full with the key of a graph that passed it.
        if let Err(e) = graph.check_acyclic() {
            observer.end(Step::GraphKey, nodes);
            return Err(lower::LowerError::from(e).into());
        }
        let hash = GraphKey::structural_hash(&graph);
        let hit = {
            let mut programs = self.inner.programs.lock().unwrap_or_else(PoisonError::into_inner);
            programs.get(&hash).and_then(|b| b.iter().find(|(k, _)| k.matches(&graph))).cloned()
        };
        if let Some((key, exe)) = hit {
            observer.end(Step::GraphKey, nodes);
            observer.begin(Step::CacheHit, nodes);
            self.inner.compiler.settle_early();
            self.inner.cache_hits.fetch_add(1, Ordering::Relaxed);
            observer.end(Step::CacheHit, nodes);
            return Ok((exe, key));
        }
        // On a miss the key is built now, from the graph as given: lowering rewrites a graph it
        // was handed in place.
        let key = Arc::new(GraphKey::with_hash(&graph, hash));
        observer.end(Step::GraphKey, nodes);
        let compiler = &self.inner.compiler;
        let mut lowering = Lowering {
            passes: Passes(&mut *observer),
            compiler,
            early: compiler.early(),
            loops: Vec::new(),
            at: Vec::new(),
        };
        let program = lower::compile_taking(graph, &self.inner.options, &mut lowering)?;
        let Lowering { early, loops, .. } = lowering;
        // Emission hands over every kernel it makes, in the program's order (the codes below
        // are matched to the program's loop kernels by position).
        let made = program.kernels.iter().filter(|k| matches!(k, Kernel::Loops(_))).count();
        assert_eq!(loops.len(), made, "loop kernels handed over during emission against those in the program");
        // Every loop kernel in one batch: the codes compiled during the lowering taken, the
        // misses left compiled concurrently on all cores.
        observer.begin(Step::Codegen, None);
        let refs: Vec<(u64, &LoopKernel)> = loops.iter().map(|s| (s.hash, &*s.kernel)).collect();
        let code =
            compiler.compile_many_early(&refs, early).into_iter().collect::<Result<Vec<Arc<CompiledKernel>>, _>>();
        observer.end(Step::Codegen, None);
        let offsets = loops.into_iter().map(|s| s.offsets);
        let code = code?;
        observer.counter("kernels", program.kernels.len() as u64);
        observer.counter("loop kernels", code.len() as u64);
        let mut fns = code.iter().zip(offsets).map(|(c, offsets)| LoopCode { entry: c.entry().clone(), offsets });
        let loop_fns: Vec<Option<LoopCode>> = program
            .kernels
            .iter()
            .map(|k| match k {
                Kernel::Loops(_) => fns.next(),
                Kernel::Matmul(_) => None,
            })
            .collect();
        observer.begin(Step::Prepare, None);
        let exe = Executable::new(program, key.input_types(), loop_fns, Arc::new(code)).and_then(|exe| {
            match self.inner.level_min_work {
                Some(min_work) => exe.with_concurrency(min_work),
                None => Ok(exe),
            }
        });
        observer.end(Step::Prepare, None);
        let exe = Arc::new(exe?);
        observer.counter("launches", exe.launches() as u64);
        self.inner.programs_compiled.fetch_add(1, Ordering::Relaxed);
        let evicted = {
            let mut programs = self.inner.programs.lock().unwrap_or_else(PoisonError::into_inner);
            match programs.get_mut(&key.hash_value()) {
                Some(bucket) => {
                    // Another thread may have compiled the same graph meanwhile: keep the first.
                    if let Some(first) = bucket.iter().find(|(k, _)| **k == *key) {
                        return Ok((first.1.clone(), first.0.clone()));
                    }
                    bucket.push((key.clone(), exe.clone()));
                    Vec::new()
                }
                None => programs.insert(key.hash_value(), vec![(key.clone(), exe.clone())]),
            }
        };
        // Evicted executables (and, through them, kernels) drop here, outside the lock; one still
        // held by a caller lives on.
        drop(evicted);
        Ok((exe, key))
    }

    /// Compiles (or finds) `graph` and runs it once.
    pub fn run(&self, graph: &Graph, inputs: &[HostTensor], bindings: &Bindings) -> Result<Vec<HostTensor>> {
        self.compile(graph)?.run(inputs, bindings)
    }

    /// What the caches saved so far.
    pub fn stats(&self) -> CpuStats {
        let kernels = self.inner.compiler.stats();
        CpuStats {
            programs_compiled: self.inner.programs_compiled.load(Ordering::Relaxed),
            cache_hits: self.inner.cache_hits.load(Ordering::Relaxed),
            kernels_compiled: kernels.compiled,
            kernels_native: kernels.native,
            kernels_compiled_early: kernels.early,
            programs_evicted: self.inner.programs.lock().unwrap_or_else(PoisonError::into_inner).evictions(),
            kernels_evicted: kernels.evictions,
            kernels_tiered_up: kernels.tiered_up,
        }
    }

    /// Blocks until every loop kernel compiled so far runs the code of the JIT's optimising tier
    /// (`codegen::JitMode`; `KILN_JIT`). Programs never need this: they run the quick tier's
    /// code until then. Benchmarks call it after their warm-up so that what they time is the
    /// steady state.
    pub fn wait_tier_up(&self) {
        self.inner.compiler.wait_tier_up();
    }

    /// The code generator's own counters (kernel cache, tiers).
    pub fn codegen_stats(&self) -> codegen::CacheStats {
        self.inner.compiler.stats()
    }

    /// Number of distinct programs in the cache.
    pub fn cached_programs(&self) -> usize {
        self.inner.programs.lock().unwrap_or_else(PoisonError::into_inner).values().map(Vec::len).sum()
    }

    /// Number of compiled kernels in the code generator's cache.
    pub fn cached_kernels(&self) -> usize {
        self.inner.compiler.cached()
    }

    /// Sets the most programs the cache keeps (at least 1; programs whose graphs share a
    /// structural hash count as one), evicting the least recently used ones beyond it now.
    pub fn set_cache_capacity(&self, programs: usize) {
        let evicted = self.inner.programs.lock().unwrap_or_else(PoisonError::into_inner).set_capacity(programs);
        drop(evicted);
    }

    /// Sets the most kernels the code generator's cache keeps (at least 1).
    pub fn set_kernel_cache_capacity(&self, kernels: usize) {
        self.inner.compiler.set_cache_capacity(kernels);
    }

    /// Empties the program and kernel caches, so the next graph of any structure compiles from
    /// scratch (executables and kernels still held elsewhere stay valid). For measuring
    /// compilation in a warm process.
    pub fn clear_caches(&self) {
        let programs = self.inner.programs.lock().unwrap_or_else(PoisonError::into_inner).drain();
        drop(programs);
        self.inner.compiler.clear_cache();
        self.inner.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// How many times [`CpuDevice::clear_caches`] has emptied the caches: a cache of this
    /// device's executables kept elsewhere (the facade's realize cache) forgets what it holds
    /// when this changes, so that clearing means the next graph compiles.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Relaxed)
    }
}
