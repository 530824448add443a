//! The output of lowering: kernels, the launch order, and the buffers they read and write.

use std::fmt;

use air::{Bindings, BoundsError, Check, DType, Dim, Symbol, TensorType};

use crate::kir::{Access, Kernel};

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
    /// The run's status buffer (`kir::STATUS_WORDS` `i32` words, see the `kir` module docs): the
    /// device zeroes it before a run and turns a recorded failure into an error after it.
    Status,
}

/// What a data-dependent check of the program tests, for its error message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CheckKind {
    /// An index must lie in `0..size`.
    Index {
        /// The size of the indexed axis.
        size: Dim,
    },
    /// An integer divisor must not be 0.
    DivByZero,
}

/// One data-dependent check of a program (`Program::data_checks[n]` is check `n` of the
/// kernels).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DataCheck {
    /// The mnemonic of the op the check belongs to (`gather`, `div`).
    pub op: String,
    /// What is checked.
    pub kind: CheckKind,
}

impl DataCheck {
    /// The error message of a failure with the offending `value`, worded like `air::interp`'s.
    pub fn message(&self, value: i64) -> String {
        match &self.kind {
            CheckKind::Index { size } => match size.as_const() {
                Some(n) => air::interp::index_error(&self.op, value, n),
                None => format!("index {value} out of range for size {size} in {}", self.op),
            },
            CheckKind::DivByZero => air::interp::division_error(&self.op),
        }
    }

    /// The error message of a status buffer's words, or `None` if nothing failed (word 0 is 0).
    /// A code naming no check is reported as such.
    pub fn from_status(checks: &[DataCheck], words: &[i32]) -> Option<String> {
        let code = *words.first()?;
        if code == 0 {
            return None;
        }
        let lo = words.get(1).copied().unwrap_or(0) as u32 as u64;
        let hi = words.get(2).copied().unwrap_or(0) as u32 as u64;
        let value = (hi << 32 | lo) as i64;
        let check = usize::try_from(code).ok().and_then(|c| checks.get(c - 1));
        Some(match check {
            Some(c) => c.message(value),
            None => format!("a kernel reported unknown check code {code}"),
        })
    }
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
    /// `(output, input)`: the output buffer starts the run holding the input's contents, and no
    /// kernel reads the input (a concatenation written in place over it, as a KV cache update
    /// is: only the new slice is written). A backend either takes the input's storage for the
    /// output (the caller gave the input up: `Runner::run_owned`) or copies it there.
    pub inits: Vec<(BufId, BufId)>,
    /// The conditions of the *original* graph's symbolic shapes that hold only for some symbol
    /// values (`air::constraints`), collected before any rewrite: a backend checks them once per
    /// binding set, with [`Program::check_bindings`], before it sizes anything.
    pub checks: Vec<Check>,
    /// The data-dependent checks the kernels make, numbered as in their `check` fields: a backend
    /// reads the status buffer once after a run ([`DataCheck::from_status`]).
    pub data_checks: Vec<DataCheck>,
}

/// Adds the symbols of `d` that `out` does not hold yet: a program's few symbols recur in the
/// sizes of most of its hundreds of buffers, and a list per dim (`Dim::symbols`, sorted) cost
/// more than the lookups.
fn add_symbols(out: &mut Vec<Symbol>, d: &Dim) {
    d.for_each_symbol(|s| {
        if !out.contains(s) {
            out.push(s.clone());
        }
    });
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
            add_symbols(&mut out, d);
        }
        out.sort();
        out.dedup();
        out
    }

    /// The symbols that decide the program's *structure* for a binding set: every size (of a
    /// buffer, an input with elements, an output), every loop extent and every matmul size,
    /// offset and stride. The other symbols of [`Program::size_symbols`] are only index offsets
    /// read by kernels (a KV cache's write position) or dims of inputs with no elements: a
    /// binding set that differs from another only in those has the same sizes, memory plan and
    /// launches, and a backend reuses them. Sorted, deduplicated; a subset of
    /// [`Program::size_symbols`].
    pub fn structure_symbols(&self, input_types: &[Option<TensorType>]) -> Vec<Symbol> {
        let mut indices: Vec<u32> = Vec::new();
        for k in &self.kernels {
            match k {
                Kernel::Loops(l) => loop_extent_syms(&l.body, &mut indices),
                Kernel::Matmul(m) => {
                    let ops = [&m.a, &m.b, &m.c];
                    let exprs = [&m.batch, &m.m, &m.n, &m.k]
                        .into_iter()
                        .chain(ops.iter().flat_map(|o| [&o.offset, &o.batch_stride, &o.row_stride, &o.col_stride]));
                    for e in exprs {
                        e.symbols(&mut indices);
                    }
                }
            }
        }
        let mut out: Vec<Symbol> = indices.iter().filter_map(|&i| self.symbols.get(i as usize).cloned()).collect();
        // An input with no elements (a `Tensor::symbol` carrying a position) sizes nothing: its
        // symbols are offsets unless something else makes them structural.
        let empty = |t: &&TensorType| t.shape.contains(&air::Dim::Const(0));
        let shapes = input_types
            .iter()
            .flatten()
            .filter(|t| !empty(t))
            .chain(self.outputs.iter().map(|(_, t)| t))
            .flat_map(|t| &t.shape);
        for d in shapes.chain(self.buffers.iter().map(|b| &b.numel)) {
            add_symbols(&mut out, d);
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

    /// The pairs `(i, j)` of a copy step `i` that a runtime may skip, its product step `j`
    /// reading the copy's source in place (the CPU's window products, `runtime::window`): `j` is
    /// a matmul whose `b` (and neither `a` nor `c`) is a temp that exactly the two steps touch,
    /// the loop kernel `i < j` that writes it and `j`. What `i` is (an unmasked copy nest whose
    /// stores are exactly `b`) is the runtime's to check for each binding set; for every such
    /// pair the memory planner keeps the temps `i` reads alive until `j` ([`memplan::lifetimes`]),
    /// so that skipping `i` is safe wherever the runtime finds it sound. One walk over the steps'
    /// arguments.
    ///
    /// [`memplan::lifetimes`]: crate::memplan::lifetimes
    pub fn skippable_copies(&self) -> Vec<(usize, usize)> {
        // Per buffer: how many argument slots name it, and the first two steps that do.
        let mut touched: Vec<(u32, usize, usize)> = vec![(0, usize::MAX, usize::MAX); self.buffers.len()];
        for (s, step) in self.steps.iter().enumerate() {
            for b in &step.args {
                if let Some(t) = touched.get_mut(b.0 as usize) {
                    t.0 += 1;
                    if t.1 == usize::MAX {
                        t.1 = s;
                    } else if t.2 == usize::MAX && t.1 != s {
                        t.2 = s;
                    }
                }
            }
        }
        let mut pairs = Vec::new();
        for (j, step) in self.steps.iter().enumerate() {
            let Some(Kernel::Matmul(m)) = self.kernels.get(step.kernel as usize) else { continue };
            let Some(&t) = step.args.get(m.b.buf as usize) else { continue };
            let Some(&(count, i, second)) = touched.get(t.0 as usize) else { continue };
            let is_temp = self.buffers.get(t.0 as usize).is_some_and(|b| b.kind == BufferKind::Temp);
            if !is_temp || count != 2 || second != j || i >= j {
                continue;
            }
            let Some(copy) = self.steps.get(i) else { continue };
            let Some(Kernel::Loops(k)) = self.kernels.get(copy.kernel as usize) else { continue };
            let writes_only_t = k.params.iter().zip(&copy.args).all(|(p, &b)| (p.access == Access::Write) == (b == t));
            if writes_only_t {
                pairs.push((i, j));
            }
        }
        pairs
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
                BufferKind::Status => "status".to_string(),
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
        for (out, input) in &self.inits {
            writeln!(f, "init {out} = {input}")?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|(b, t)| format!("{b}: {t}")).collect();
        writeln!(f, "return {}", outs.join(", "))
    }
}

/// The symbols (by index) the extents of the loops of `stmts` read, at any depth.
fn loop_extent_syms(stmts: &[crate::kir::Stmt], out: &mut Vec<u32>) {
    for s in stmts {
        if let crate::kir::Stmt::Loop { extent, body, .. } = s {
            extent.symbols(out);
            loop_extent_syms(body, out);
        }
    }
}
