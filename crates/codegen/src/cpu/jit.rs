//! The JIT arena: one `JITModule` that many kernels are compiled into, kept alive (and its code
//! memory freed) by reference counting from the compiled kernels.
//!
//! Why share a module: creating one costs an ISA lookup and a `JITModule::new`, several times the
//! cost of compiling a small kernel (BENCHMARKS.md, the 2026-12-01 note on library hygiene). Why rotate: code memory is freed
//! only when a whole module goes, so the compiler starts a new arena every
//! [`KERNELS_PER_ARENA`] kernels and old ones disappear once their last kernel is dropped.
//!
//! The module only links: kernels arrive as machine code with relocations ([`Code`], compiled
//! without a module, possibly on another thread), and [`Jit::link`] copies a batch of them into
//! the module's memory, patches the relocations (helper addresses) and makes the memory
//! executable once for the whole batch.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, ModuleError, ModuleReloc, ModuleRelocTarget, default_libcall_names};

use super::helpers::Helper;
use crate::error::{CodegenError, Result};

/// The `log` target of the machine code `KILN_DISASM=1` asks for: each kernel's listing is one
/// `info` record, shown by whatever logger the application installed (the `kiln` command: `-v`).
pub(crate) const DISASM_LOG_TARGET: &str = "kiln::disasm";

/// How many kernels go into one arena before the compiler starts the next.
pub(crate) const KERNELS_PER_ARENA: usize = 256;

/// How hard Cranelift works on a kernel: the two tiers of the JIT (see `tier`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tier {
    /// No optimisation passes and the single-pass register allocator: about 40% less compile
    /// time than [`Tier::Optimized`] (`kiln profile transformer`'s codegen 3.7 against 6.5 ms,
    /// medians of 12), for code that runs up to 2x slower (MobileNet's steady predict).
    Quick,
    /// Cranelift's optimisation passes and backtracking register allocator.
    Optimized,
}

/// The host ISA with Kiln's flags for `tier` (non-PIC, as `cranelift-jit` needs), built once per
/// process and shared (an ISA is immutable; building one looks its flags up by name and
/// detects the CPU's features, a tenth of a fresh device's set-up).
pub(crate) fn host_isa(tier: Tier) -> Result<OwnedTargetIsa> {
    static QUICK: OnceLock<Result<OwnedTargetIsa>> = OnceLock::new();
    static OPTIMIZED: OnceLock<Result<OwnedTargetIsa>> = OnceLock::new();
    let cell = match tier {
        Tier::Quick => &QUICK,
        Tier::Optimized => &OPTIMIZED,
    };
    cell.get_or_init(|| build_host_isa(tier)).clone()
}

/// Builds [`host_isa`].
fn build_host_isa(tier: Tier) -> Result<OwnedTargetIsa> {
    let mut flags = settings::builder();
    let set = |f: &mut settings::Builder, k: &str, v: &str| {
        f.set(k, v).map_err(|e| CodegenError::Isa(format!("setting {k}={v}: {e}")))
    };
    // Optimized, "speed": Cranelift's e-graph pass (GVN, LICM, constant folding into addressing
    // modes) shares and hoists the index arithmetic of loop nests that the emitter writes per
    // access (a 2x2 max pool recomputed the whole index for each of its four loads): conv-32's
    // predict ran 1.5x and MobileNet's 1.8x faster than at "none" (measured with `kiln bench
    // models`; element-wise kernels unchanged). The backtracking register allocator: "single_pass"
    // spills in the loops (neg ran 1.6x slower). Quick gives both up for compile time.
    let (opt_level, regalloc) = match tier {
        Tier::Quick => ("none", "single_pass"),
        Tier::Optimized => ("speed", "backtracking"),
    };
    set(&mut flags, "opt_level", opt_level)?;
    set(&mut flags, "regalloc_algorithm", regalloc)?;
    set(&mut flags, "use_colocated_libcalls", "false")?;
    set(&mut flags, "is_pic", "false")?;
    // The IR verifier costs compile time; debug builds keep it, release builds rely on
    // `catch_unwind` around compilation instead.
    set(&mut flags, "enable_verifier", if cfg!(debug_assertions) { "true" } else { "false" })?;
    let isa_builder = cranelift_native::builder().map_err(|m| CodegenError::Isa(m.to_string()))?;
    isa_builder.finish(settings::Flags::new(flags)).map_err(|e| CodegenError::Isa(e.to_string()))
}

/// Machine code of one kernel, ready to be linked into any [`Jit`].
pub(crate) struct Code {
    pub(crate) bytes: Vec<u8>,
    pub(crate) alignment: u64,
    /// Relocations; a `FunctionOffset` target names [`Code::self_id`], replaced by the kernel's
    /// id once it has one.
    pub(crate) relocs: Vec<ModuleReloc>,
    /// The register-allocated machine code as text, when `KILN_DISASM` asked for it (logged at
    /// `info` level to [`DISASM_LOG_TARGET`] when the kernel is linked).
    pub(crate) disasm: Option<String>,
    /// Units of work compiling it took (Cranelift instructions emitted), added to the compiling
    /// thread's `air::work` counter by the batch (whatever thread compiled the kernel).
    pub(crate) work: u64,
}

impl Code {
    /// The placeholder id of the function being compiled, in relocations made before linking
    /// (no module declares that many functions).
    pub(crate) fn self_id() -> FuncId {
        FuncId::from_u32(u32::MAX - 1)
    }
}

/// The entry point of a kernel linked into a module.
pub(crate) type Linked = Result<*const u8>;

/// A JIT module with the helpers declared in it.
pub(crate) struct Jit {
    pub(crate) module: JITModule,
    /// Kernels defined in this module so far (also used to name them uniquely).
    pub(crate) count: usize,
}

impl Jit {
    pub(crate) fn new(isa: OwnedTargetIsa) -> Result<Jit> {
        let mut builder = JITBuilder::with_isa(isa, default_libcall_names());
        for h in Helper::ALL {
            builder.symbol(h.name(), h.address());
        }
        let mut module = JITModule::new(builder);
        let call_conv = module.isa().default_call_conv();
        for h in Helper::ALL {
            let id = module.declare_function(h.name(), Linkage::Import, &h.signature(call_conv)).map_err(cl)?;
            // Compiled kernels name helpers by index (see `helpers`): the ids must match.
            if id.as_u32() != h.index() {
                return Err(CodegenError::Cranelift(format!("helper {} declared as {id}", h.name())));
            }
        }
        Ok(Jit { module, count: 0 })
    }

    /// Room left in this module, in kernels.
    pub(crate) fn room(&self) -> usize {
        KERNELS_PER_ARENA.saturating_sub(self.count)
    }

    /// Defines every kernel of `codes` in the module and finalizes them together (one
    /// relocation pass, one change of page protection). Returns the entry points in order; an
    /// error in defining one kernel fails only that one, an error in finalizing fails them all.
    /// The caller keeps `codes.len() <= self.room()` and catches panics (an unresolvable symbol
    /// panics in `cranelift-jit`).
    pub(crate) fn link(&mut self, codes: &[Code]) -> Vec<Linked> {
        let sig = super::kernel_signature(self.module.isa().default_call_conv());
        let mut ids = Vec::with_capacity(codes.len());
        for code in codes {
            let name = format!("kiln_kernel_{}", self.count);
            self.count += 1;
            if let Some(text) = &code.disasm {
                log::info!(target: DISASM_LOG_TARGET, "; {name}\n{text}");
            }
            ids.push(self.define(&name, &sig, code));
        }
        if let Err(e) = self.module.finalize_definitions() {
            let msg = e.to_string();
            return codes.iter().map(|_| Err(CodegenError::Cranelift(msg.clone()))).collect();
        }
        ids.into_iter().map(|id| id.map(|id| self.module.get_finalized_function(id))).collect()
    }

    fn define(&mut self, name: &str, sig: &cranelift_codegen::ir::Signature, code: &Code) -> Result<FuncId> {
        let id = self.module.declare_function(name, Linkage::Local, sig).map_err(cl)?;
        let mut relocs = code.relocs.clone();
        for r in &mut relocs {
            if let ModuleRelocTarget::FunctionOffset(f, _) = &mut r.name
                && *f == Code::self_id()
            {
                *f = id;
            }
        }
        self.module.define_function_bytes(id, code.alignment, &code.bytes, &relocs).map_err(cl)?;
        Ok(id)
    }
}

fn cl(e: ModuleError) -> CodegenError {
    CodegenError::Cranelift(e.to_string())
}

/// A `Jit` shared by the kernels compiled into it. Its code memory is freed when the last of them
/// (and the compiler) let go.
pub(crate) struct Arena {
    pub(crate) jit: Mutex<Option<Jit>>,
}

impl Drop for Arena {
    fn drop(&mut self) {
        let jit = self.jit.get_mut().map(Option::take).unwrap_or_else(|poisoned| poisoned.into_inner().take());
        if let Some(jit) = jit {
            // SAFETY: every `CompiledKernel` holds an `Arc<Arena>`, so no function pointer into
            // this module's memory can be called once the arena is dropped.
            unsafe { jit.module.free_memory() };
        }
    }
}

/// Links machine code into arenas, starting a new one whenever the current one is full (or was
/// left inconsistent by a failed link). Each tier of the compiler has its own.
pub(crate) struct Linker {
    isa: OwnedTargetIsa,
    arena: Option<Arc<Arena>>,
    /// Arenas started so far.
    pub(crate) arenas: u64,
}

/// A kernel linked into an arena: its entry point, and the arena that keeps it alive.
pub(crate) type LinkedIn = Result<(*const u8, Arc<Arena>)>;

impl Linker {
    pub(crate) fn new(isa: OwnedTargetIsa) -> Linker {
        Linker { isa, arena: None, arenas: 0 }
    }

    /// The arena to link into: the current one unless it is full (or broken).
    fn arena(&mut self) -> Result<Arc<Arena>> {
        if let Some(a) = &self.arena {
            let full = a.jit.lock().map(|j| j.as_ref().is_none_or(|j| j.room() == 0)).unwrap_or(true);
            if !full {
                return Ok(a.clone());
            }
        }
        let arena = Arc::new(Arena { jit: Mutex::new(Some(Jit::new(self.isa.clone())?)) });
        self.arenas += 1;
        self.arena = Some(arena.clone());
        Ok(arena)
    }

    /// Links every successfully compiled kernel of `codes` (a batch per arena); one result per
    /// code, in order, a compile error passed through.
    pub(crate) fn link(&mut self, codes: Vec<Result<Code>>) -> Vec<LinkedIn> {
        let mut results: Vec<Option<LinkedIn>> = Vec::with_capacity(codes.len());
        let mut ready: Vec<(usize, Code)> = Vec::new();
        for (i, c) in codes.into_iter().enumerate() {
            match c {
                Ok(c) => {
                    results.push(None);
                    ready.push((i, c));
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let mut ready = ready.into_iter().peekable();
        while ready.peek().is_some() {
            let arena = match self.arena() {
                Ok(a) => a,
                Err(e) => {
                    for (i, _) in ready.by_ref() {
                        results[i] = Some(Err(e.clone()));
                    }
                    break;
                }
            };
            let (linked, group) = {
                let mut guard = arena.jit.lock().unwrap_or_else(|p| p.into_inner());
                let Some(jit) = guard.as_mut() else {
                    // Only a dropped arena has no module; start another.
                    self.arena = None;
                    continue;
                };
                let (indices, group): (Vec<usize>, Vec<Code>) = ready.by_ref().take(jit.room()).unzip();
                (catch_unwind(AssertUnwindSafe(|| jit.link(&group))), indices)
            };
            let linked: Vec<Linked> = linked.unwrap_or_else(|panic| {
                // The module may be inconsistent now: later kernels go to a fresh one.
                self.arena = None;
                let msg = format!("internal error while linking: {}", super::panic_message(&*panic));
                group.iter().map(|_| Err(CodegenError::Cranelift(msg.clone()))).collect()
            });
            for (i, l) in group.into_iter().zip(linked) {
                results[i] = Some(l.map(|ptr| (ptr, arena.clone())));
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(CodegenError::Cranelift("kernel not linked".into()))))
            .collect()
    }
}
