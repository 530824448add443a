//! The CPU backend: kir loop kernels compiled to native code with Cranelift's JIT.
//!
//! ABI: every kernel is `unsafe extern "C" fn(bufs: *const *mut u8, syms: *const i64, start: i64,
//! end: i64)`. `bufs[i]` is the base pointer of parameter `i`, `syms[n]` the value of symbol `n`.
//! A kernel whose body is one `parallel` loop iterates it over `[start, end)` (clamped to
//! `[0, extent)`); any other kernel ignores the range.
//!
//! Set `KILN_DISASM=1` to print the machine code of every kernel compiled (to stderr).
//!
//! [`CpuCompiler`] caches compiled kernels by structural identity (`LoopKernel: Hash + Eq`), so a
//! kernel that appears in many programs compiles once, and counts hits, misses and compile time
//! for the runtime's profiler. Kernels share JIT modules (see `jit`), which [`CompiledKernel`]
//! keeps alive.

mod analysis;
mod emit;
mod helpers;
mod jit;
mod math;

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cranelift_codegen::Context;
use cranelift_codegen::ir::{AbiParam, Function, Signature, UserFuncName, types};
use cranelift_codegen::isa::{CallConv, OwnedTargetIsa};
use cranelift_frontend::FunctionBuilderContext;
use cranelift_module::{Linkage, Module};
use lower::kir::{Kernel, LoopKernel, Stmt};

use crate::error::{CodegenError, Result};
use jit::{Arena, Jit, KERNELS_PER_ARENA};

/// The machine-code signature of every kernel.
pub type KernelFn = unsafe extern "C" fn(bufs: *const *mut u8, syms: *const i64, start: i64, end: i64);

fn kernel_signature(call_conv: CallConv) -> Signature {
    let mut sig = Signature::new(call_conv);
    sig.params.extend([types::I64; 4].map(AbiParam::new));
    sig
}

/// A kernel compiled to native code. Cloning the `Arc` is cheap; the code lives as long as any
/// handle does.
pub struct CompiledKernel {
    func: KernelFn,
    n_params: usize,
    n_syms: usize,
    parallel: bool,
    _arena: Arc<Arena>,
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

    /// The raw entry point.
    pub fn as_fn(&self) -> KernelFn {
        self.func
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
        unsafe { (self.func)(bufs, syms, start, end) }
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
    /// `compile` calls answered from the cache.
    pub hits: u64,
    /// `compile` calls that had to compile.
    pub misses: u64,
    /// Kernels compiled successfully.
    pub compiled: u64,
    /// Compilations that returned an error.
    pub failures: u64,
    /// Time spent compiling (emission, Cranelift, linking), over all misses.
    pub compile_time: Duration,
    /// JIT modules created so far.
    pub arenas: u64,
}

struct Inner {
    isa: OwnedTargetIsa,
    arena: Option<Arc<Arena>>,
    cache: HashMap<LoopKernel, Arc<CompiledKernel>>,
    stats: CacheStats,
    fctx: FunctionBuilderContext,
    /// Reused across compilations: it holds the register allocator's and the code buffers'
    /// allocations, which are most of the cost of compiling a small kernel when made afresh.
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

impl CpuCompiler {
    /// A compiler for the host CPU.
    pub fn new() -> Result<CpuCompiler> {
        let isa = jit::host_isa()?;
        Ok(CpuCompiler {
            inner: Mutex::new(Inner {
                isa,
                arena: None,
                cache: HashMap::new(),
                stats: CacheStats::default(),
                fctx: FunctionBuilderContext::new(),
                ctx: Context::new(),
            }),
        })
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
        if let Some(c) = inner.cache.get(k) {
            let c = c.clone();
            inner.stats.hits += 1;
            return Ok(c);
        }
        inner.stats.misses += 1;
        let t0 = Instant::now();
        let result = inner.compile_uncached(k);
        inner.stats.compile_time += t0.elapsed();
        match result {
            Ok(c) => {
                inner.stats.compiled += 1;
                inner.cache.insert(k.clone(), c.clone());
                Ok(c)
            }
            Err(e) => {
                inner.stats.failures += 1;
                Err(e)
            }
        }
    }

    /// The cache counters so far.
    pub fn stats(&self) -> CacheStats {
        self.lock().stats
    }

    /// Number of kernels in the cache.
    pub fn cached(&self) -> usize {
        self.lock().cache.len()
    }

    /// Forgets every cached kernel (kernels still held elsewhere stay valid).
    pub fn clear_cache(&self) {
        self.lock().cache.clear();
    }
}

impl Inner {
    fn arena(&mut self) -> Result<Arc<Arena>> {
        if let Some(a) = &self.arena {
            let full = a.jit.lock().map(|j| j.as_ref().is_none_or(|j| j.count >= KERNELS_PER_ARENA)).unwrap_or(true);
            if !full {
                return Ok(a.clone());
            }
        }
        let arena = Arc::new(Arena { jit: Mutex::new(Some(Jit::new(self.isa.clone())?)) });
        self.stats.arenas += 1;
        self.arena = Some(arena.clone());
        Ok(arena)
    }

    fn compile_uncached(&mut self, k: &LoopKernel) -> Result<Arc<CompiledKernel>> {
        let arena = self.arena()?;
        let (fctx, ctx) = (&mut self.fctx, &mut self.ctx);
        let outcome = {
            let mut guard = arena.jit.lock().map_err(|_| CodegenError::Cranelift("JIT module poisoned".into()))?;
            let jit = guard.as_mut().ok_or_else(|| CodegenError::Cranelift("JIT module gone".into()))?;
            catch_unwind(AssertUnwindSafe(|| define(jit, fctx, ctx, k)))
        };
        let func = match outcome {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => {
                // Emission may have stopped half-way, leaving the builder context dirty.
                self.fctx = FunctionBuilderContext::new();
                return Err(e);
            }
            Err(panic) => {
                // The module may be inconsistent now: later kernels go to a fresh one.
                self.arena = None;
                self.fctx = FunctionBuilderContext::new();
                self.ctx = Context::new();
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                return Err(CodegenError::Cranelift(format!("internal error while compiling: {msg}")));
            }
        };
        let parallel = matches!(k.body.as_slice(), [Stmt::Loop { parallel: true, .. }]);
        Ok(Arc::new(CompiledKernel {
            func,
            n_params: k.params.len(),
            n_syms: k.n_syms as usize,
            parallel,
            _arena: arena,
        }))
    }
}

/// Declares, emits, defines and finalizes one kernel in `jit`.
fn define(jit: &mut Jit, fctx: &mut FunctionBuilderContext, ctx: &mut Context, k: &LoopKernel) -> Result<KernelFn> {
    let sig = kernel_signature(jit.module.isa().default_call_conv());
    let name = format!("kiln_kernel_{}", jit.count);
    jit.count += 1;
    let cl = |e: cranelift_module::ModuleError| CodegenError::Cranelift(e.to_string());
    let id = jit.module.declare_function(&name, Linkage::Local, &sig).map_err(cl)?;
    jit.module.clear_context(ctx);
    ctx.func.signature = sig;
    ctx.func.name = UserFuncName::user(0, id.as_u32());
    emit::emit_kernel(&mut ctx.func, fctx, jit, k)?;
    let disasm = std::env::var_os("KILN_DISASM").is_some();
    ctx.set_disasm(disasm);
    let defined = jit.module.define_function(id, ctx).map_err(|e| match e {
        cranelift_module::ModuleError::Compilation(c) => {
            CodegenError::Cranelift(cranelift_codegen::print_errors::pretty_error(&ctx.func, c).to_string())
        }
        e => cl(e),
    });
    if defined.is_err() {
        jit.module.clear_context(ctx);
    }
    defined?;
    if let Some(vcode) = ctx.compiled_code().and_then(|c| c.vcode.as_ref()).filter(|_| disasm) {
        eprintln!("; {name}\n{vcode}");
    }
    jit.module.clear_context(ctx);
    jit.module.finalize_definitions().map_err(cl)?;
    let ptr = jit.module.get_finalized_function(id);
    // SAFETY: `ptr` is the entry of a function just defined with `kernel_signature`.
    Ok(unsafe { std::mem::transmute::<*const u8, KernelFn>(ptr) })
}

/// The Cranelift IR that [`CpuCompiler`] would compile for `k`, as text (before Cranelift's own
/// optimisations), for `--dump` and golden tests.
pub fn clif_text(k: &LoopKernel) -> Result<String> {
    let mut jit = Jit::new(jit::host_isa()?)?;
    let mut func =
        Function::with_name_signature(UserFuncName::user(0, 0), kernel_signature(jit.module.isa().default_call_conv()));
    let mut fctx = FunctionBuilderContext::new();
    catch_unwind(AssertUnwindSafe(|| emit::emit_kernel(&mut func, &mut fctx, &mut jit, k)))
        .map_err(|_| CodegenError::Cranelift("internal error while emitting".into()))??;
    Ok(func.display().to_string())
}
