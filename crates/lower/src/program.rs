//! The output of lowering: kernels, the launch order, and the buffers they read and write.

use std::fmt;

use air::{Bindings, BoundsError, Check, DType, Dim, Symbol, TensorType};

use crate::kir::Kernel;

/// A buffer of the program (`buf3`): an input, an output, or a temporary placed by the planner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u32);

impl fmt::Display for BufId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "buf{}", self.0)
    }
}

/// Where a buffer's memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferKind {
    /// The program's input `slot`, read in place from the caller's memory.
    Input(u32),
    /// Output number `n`: a fresh allocation handed to the caller.
    Output(u32),
    /// An intermediate: placed in the arena by the memory planner.
    Temp,
}

/// One buffer of the program, indexed by its `BufId` in `Program::buffers`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BufferInfo {
    /// The element type.
    pub dtype: DType,
    /// Element count, possibly symbolic.
    pub numel: Dim,
    /// Where its memory comes from.
    pub kind: BufferKind,
}

/// One kernel launch: `kernels[kernel]` with its parameters bound to `args` (one per param).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Step {
    /// The index of the launched kernel in `Program::kernels`.
    pub kernel: u32,
    /// The buffer bound to each of the kernel's parameters, in parameter order.
    pub args: Vec<BufId>,
}

/// A compiled-to-kernels program, sorted once: `steps` run in order (steps that do not depend on
/// each other may also run concurrently; see `Program::deps`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Program {
    /// Symbol order of the `syms` array every kernel reads.
    pub symbols: Vec<Symbol>,
    /// Unique kernels: identical kernels appear once and are launched by several steps.
    pub kernels: Vec<Kernel>,
    /// The launches, in a valid execution order.
    pub steps: Vec<Step>,
    /// Every buffer, indexed by `BufId`.
    pub buffers: Vec<BufferInfo>,
    /// The buffer of each graph output, with its type (outputs may share a buffer).
    pub outputs: Vec<(BufId, TensorType)>,
    /// The conditions of the *original* graph's symbolic shapes that hold only for some symbol
    /// values (`air::constraints`), collected before any rewrite: a backend checks them once per
    /// binding set, with [`Program::check_bindings`], before it sizes anything.
    pub checks: Vec<Check>,
}

impl Program {
    /// Checks [`Program::checks`] for `bindings` (`air::constraints::check`): the first condition
    /// that fails is the error, naming the node's op and position in the original graph.
    pub fn check_bindings(&self, bindings: &Bindings) -> Result<(), BoundsError> {
        air::constraints::check(&self.checks, bindings)
    }

    /// Every symbol the program's sizes and checks depend on, given the graph's input types:
    /// a binding-set cache must be keyed by all of their values. Sorted, deduplicated.
    pub fn size_symbols(&self, input_types: &[Option<TensorType>]) -> Vec<Symbol> {
        let mut out = self.symbols.clone();
        let shapes = input_types.iter().flatten().chain(self.outputs.iter().map(|(_, t)| t)).flat_map(|t| &t.shape);
        let dims = shapes
            .chain(self.buffers.iter().map(|b| &b.numel))
            .chain(self.checks.iter().flat_map(|c| [&c.condition.lhs, &c.condition.rhs]));
        for d in dims {
            out.extend(d.symbols());
        }
        out.sort();
        out.dedup();
        out
    }

    /// The kernel step `s` launches, checked: the kernel exists and takes one parameter per
    /// argument of the step. Every pass that walks the steps (levels, memory plan, executor)
    /// validates a program through this one place.
    pub fn step_kernel(&self, s: usize) -> Result<&Kernel, crate::LowerError> {
        let step = self.steps.get(s).ok_or_else(|| crate::LowerError::Malformed(format!("no step {s}")))?;
        let kernel = self
            .kernels
            .get(step.kernel as usize)
            .ok_or_else(|| crate::LowerError::Malformed(format!("step {s} launches a missing kernel")))?;
        if kernel.params().len() != step.args.len() {
            return Err(crate::LowerError::Malformed(format!("step {s}: argument count differs from the kernel's")));
        }
        Ok(kernel)
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.symbols.is_empty() {
            let names: Vec<&str> = self.symbols.iter().map(|s| s.name()).collect();
            writeln!(f, "symbols {}", names.join(", "))?;
        }
        for (i, b) in self.buffers.iter().enumerate() {
            let kind = match b.kind {
                BufferKind::Input(s) => format!("input {s}"),
                BufferKind::Output(n) => format!("output {n}"),
                BufferKind::Temp => "temp".to_string(),
            };
            writeln!(f, "buf{i}: {}[{}] {kind}", b.dtype, b.numel)?;
        }
        for (i, k) in self.kernels.iter().enumerate() {
            write!(f, "k{i} = {k}")?;
        }
        for s in &self.steps {
            let args: Vec<String> = s.args.iter().map(|b| b.to_string()).collect();
            writeln!(f, "launch k{}({})", s.kernel, args.join(", "))?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|(b, t)| format!("{b}: {t}")).collect();
        writeln!(f, "return {}", outs.join(", "))
    }
}
