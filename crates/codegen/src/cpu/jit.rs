//! The JIT arena: one `JITModule` that many kernels are compiled into, kept alive (and its code
//! memory freed) by reference counting from the compiled kernels.
//!
//! Why share a module: creating one costs an ISA lookup and a `JITModule::new` (about 0.1 ms),
//! which is several times the cost of compiling a small kernel. Why rotate: code memory is freed
//! only when a whole module goes, so the compiler starts a new arena every
//! [`KERNELS_PER_ARENA`] kernels and old ones disappear once their last kernel is dropped.

use std::collections::HashMap;
use std::sync::Mutex;

use cranelift_codegen::ir::{FuncRef, Function};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};

use super::helpers::Helper;
use crate::error::{CodegenError, Result};

/// How many kernels go into one arena before the compiler starts the next.
pub(crate) const KERNELS_PER_ARENA: usize = 256;

/// Builds the host ISA with Kiln's flags (no IR optimisation passes, backtracking register
/// allocation, non-PIC as `cranelift-jit` needs).
pub(crate) fn host_isa() -> Result<OwnedTargetIsa> {
    let mut flags = settings::builder();
    let set = |f: &mut settings::Builder, k: &str, v: &str| {
        f.set(k, v).map_err(|e| CodegenError::Isa(format!("setting {k}={v}: {e}")))
    };
    // "none": the emitter already shares constants, folds addressing into immediate offsets
    // and keeps loop bodies small, so Cranelift's e-graph pass (GVN, LICM) found nothing that
    // changed the hot loops' speed but cost about a quarter of each compile. The backtracking
    // register allocator stays: "single_pass" compiles 30-40% faster but spills in the loops
    // (neg ran 1.6x slower).
    set(&mut flags, "opt_level", "none")?;
    set(&mut flags, "regalloc_algorithm", "backtracking")?;
    set(&mut flags, "use_colocated_libcalls", "false")?;
    set(&mut flags, "is_pic", "false")?;
    // The IR verifier costs compile time; debug builds keep it, release builds rely on
    // `catch_unwind` around compilation instead.
    set(&mut flags, "enable_verifier", if cfg!(debug_assertions) { "true" } else { "false" })?;
    let isa_builder = cranelift_native::builder().map_err(|m| CodegenError::Isa(m.to_string()))?;
    isa_builder.finish(settings::Flags::new(flags)).map_err(|e| CodegenError::Isa(e.to_string()))
}

/// A JIT module with the helpers declared in it.
pub(crate) struct Jit {
    pub(crate) module: JITModule,
    helpers: HashMap<Helper, FuncId>,
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
        let mut helpers = HashMap::new();
        for h in Helper::ALL {
            let id = module
                .declare_function(h.name(), Linkage::Import, &h.signature(call_conv))
                .map_err(|e| CodegenError::Cranelift(e.to_string()))?;
            helpers.insert(h, id);
        }
        Ok(Jit { module, helpers, count: 0 })
    }

    /// Imports helper `h` into `func` (once per function; the caller caches the `FuncRef`).
    pub(crate) fn import(&mut self, h: Helper, func: &mut Function) -> FuncRef {
        let id = self.helpers[&h];
        self.module.declare_func_in_func(id, func)
    }
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
