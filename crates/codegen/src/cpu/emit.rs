//! kir `LoopKernel` -> Cranelift IR.
//!
//! Values: a register of dtype `bool` is an `i8` holding 0 or 1, `i32`/`i64` are themselves,
//! `f16`/`bf16`/`f32` are `f32` (half types are exact in `f32`; every op's half result is
//! rounded to storage, as the interpreter's) and `f64` is `f64`. In a vectorized loop (see `analysis`) a register is
//! `f32x4` or `i32x4`, and a `bool` is an `i32x4` lane mask (all ones or zero); registers defined
//! outside the loop are splatted where they are used.
//!
//! Loops are rotated (one test before, one at the bottom) and count with a frontend `Variable`;
//! accumulators are `Variable`s too, so the frontend builds the loop phis. Float `sum`
//! accumulators are `f64` whatever their dtype, like the reference interpreter's sums.
//!
//! This file holds the entry ([`emit_kernel`]) and the `Emitter`'s state; its methods live by
//! topic beside it: `control` (statements, loops), `vector` (the vectorized inner loop), `scalar`
//! (index expressions, instructions, casts, arithmetic), `memory` (loads, stores, checked
//! accesses) and `reduce` (accumulators).

mod control;
mod memory;
mod reduce;
mod scalar;
mod stencil;
mod tile;
mod vector;

use rustc_hash::FxHashMap as HashMap;

use air::{DType, ReduceOp, Scalar};
use cranelift_codegen::ir::{FuncRef, Function, InstBuilder, MemFlagsData, Type, Value, ValueDef, types};
use cranelift_codegen::isa::{CallConv, TargetIsa};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use lower::kir::{Acc, IExpr, LoopKernel, Reg, Stmt, Var};

use super::analysis::KernelInfo;
use super::helpers::Helper;
use super::math::{ConstPool, Math};
use super::tile::Tiling;
use crate::error::{CodegenError, Result};

/// Lanes of a vector register (Cranelift's x86 vectors are 128 bits).
const LANES: i64 = 4;

/// A register's value and whether it is a vector.
#[derive(Clone, Copy)]
pub(super) struct Val {
    v: Value,
    vector: bool,
}

fn unsupported<T>(msg: String) -> Result<T> {
    Err(CodegenError::Unsupported(msg))
}

/// The Cranelift type of a scalar register of dtype `d`.
fn scalar_ty(d: DType) -> Type {
    match d {
        DType::Bool => types::I8,
        DType::I32 => types::I32,
        DType::I64 => types::I64,
        DType::F16 | DType::BF16 | DType::F32 => types::F32,
        DType::F64 => types::F64,
    }
}

/// The Cranelift type of a vector register of dtype `d`.
fn vector_ty(d: DType) -> Result<Type> {
    match d {
        DType::F32 => Ok(types::F32X4),
        DType::I32 | DType::Bool => Ok(types::I32X4),
        _ => unsupported(format!("{d} in a vectorized loop")),
    }
}

/// Whether a float sum of this dtype accumulates in f64.
fn acc_ty(d: DType, op: ReduceOp) -> Type {
    match (d.is_float(), op) {
        (true, ReduceOp::Sum) => types::F64,
        _ => scalar_ty(d),
    }
}

/// A constant converted to `d` with the interpreter's cast rules.
enum ConstVal {
    Int(i64),
    F32(f32),
    F64(f64),
}

/// The f32 value of a constant of dtype f32 (as the kernel's code holds it).
pub(crate) fn f32_const(s: Scalar) -> f32 {
    match s {
        Scalar::Float(x) => x as f32,
        Scalar::Int(i) => i as f32,
        Scalar::Bool(b) => b as i64 as f32,
    }
}

fn const_for(s: Scalar, d: DType) -> ConstVal {
    let as_f32 = f32_const;
    match d {
        DType::Bool => ConstVal::Int(s.as_bool() as i64),
        DType::I32 => ConstVal::Int(match s {
            Scalar::Float(x) => x as i32 as i64,
            _ => s.as_i64() as i32 as i64,
        }),
        DType::I64 => ConstVal::Int(s.as_i64()),
        DType::F16 => ConstVal::F32(half::f16::from_f32(as_f32(s)).to_f32()),
        DType::BF16 => ConstVal::F32(half::bf16::from_f32(as_f32(s)).to_f32()),
        DType::F32 => ConstVal::F32(as_f32(s)),
        DType::F64 => ConstVal::F64(s.as_f64()),
    }
}

/// Emits the whole kernel into `func` (whose signature the caller has set). Needs no JIT module:
/// helpers are named by their fixed index (see `helpers`), so this runs on any thread.
pub(crate) fn emit_kernel(
    func: &mut Function,
    fctx: &mut FunctionBuilderContext,
    isa: &dyn TargetIsa,
    k: &LoopKernel,
    tiling: Tiling,
) -> Result<()> {
    let info = KernelInfo::new(k)?;
    let target = isa.frontend_config();
    let fma = isa.isa_flags().iter().any(|f| f.name == "has_fma" && f.as_bool() == Some(true));
    let mut b = FunctionBuilder::new(func, fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let p = b.block_params(entry).to_vec();
    let (bufs, syms_ptr, start, end) = (p[0], p[1], p[2], p[3]);
    let flags = MemFlagsData::new().with_notrap();
    let bases = (0..k.params.len()).map(|i| b.ins().load(types::I64, flags, bufs, (8 * i) as i32)).collect();
    let syms = (0..k.n_syms).map(|i| b.ins().load(types::I64, flags, syms_ptr, (8 * i) as i32)).collect();
    let mut e = Emitter {
        b,
        call_conv: isa.default_call_conv(),
        helper_refs: HashMap::default(),
        k,
        info: &info,
        bases,
        syms,
        vars: HashMap::default(),
        // Every register of the kernel gets a value (sized once: growing it was ~10% of
        // emitting an LSTM step's kernels, with the plans' tables below).
        regs: HashMap::with_capacity_and_hasher(info.regs.len(), Default::default()),
        accs: HashMap::default(),
        vec_var: None,
        partials: HashMap::default(),
        copy: 0,
        lane_offset: 0,
        flags,
        fma,
        tiling,
        consts: ConstPool::new(entry),
        numbered: HashMap::default(),
    };
    match k.body.as_slice() {
        [Stmt::Loop { var, extent, parallel: true, body }] => {
            e.emit_loop(*var, extent, body, Some((start, end)), None)?
        }
        stmts => e.emit_stmts(stmts)?,
    }
    e.b.ins().return_(&[]);
    e.b.seal_all_blocks();
    e.b.finalize(target);
    Ok(())
}

/// Unrolled copies of a vector loop body of `size` statements.
///
/// Two copies hide most of the loop overhead and give reductions two independent chains; a body
/// of a load, one op and a store needs four to keep up with memory. A long body (a fused chain
/// of element-wise ops) is one long dependency chain per copy: with two copies the loop is
/// latency-bound (a fused chain of 8 sigmoids ran 3x slower per op than one sigmoid kernel),
/// since the out-of-order window does not reach the next iteration. The copies are interleaved
/// statement by statement, so four give four chains in flight; their constants then spill, but
/// a reload is one cheap load. Past `UNROLLED_STMTS` statements in all, long bodies keep two
/// copies (compile time grows with the unrolled size); `size` weighs each statement by what it
/// expands to (`analysis::weighted_size`: an `exp2` is worth eight).
fn unroll_factor(size: usize) -> i64 {
    const LONG_BODY: usize = 16;
    const UNROLLED_STMTS: usize = 256;
    let long = size >= LONG_BODY && 4 * size <= UNROLLED_STMTS;
    if size <= 3 || long { 4 } else { 2 }
}

/// A data-dependent access `buf[base + i * stride]` with `i` from the register `index`, checked
/// against `0..size` (failures recorded as `check` in the status buffer `status`).
#[derive(Clone, Copy)]
struct Indexed<'k> {
    buf: u32,
    base: &'k IExpr,
    index: Reg,
    stride: &'k IExpr,
    size: &'k IExpr,
    status: u32,
    check: u32,
}

struct Emitter<'a, 'f> {
    b: FunctionBuilder<'f>,
    call_conv: CallConv,
    helper_refs: HashMap<Helper, FuncRef>,
    k: &'a LoopKernel,
    info: &'a KernelInfo,
    bases: Vec<Value>,
    syms: Vec<Value>,
    vars: HashMap<Var, Value>,
    regs: HashMap<Reg, Val>,
    accs: HashMap<Acc, Variable>,
    /// The loop variable of the vectorized loop being emitted, if any.
    vec_var: Option<Var>,
    /// Vector partial accumulators: `partials[acc][copy]` holds one or two variables.
    partials: HashMap<Acc, Vec<Vec<Variable>>>,
    /// Which unrolled copy of a vector body is being emitted.
    copy: usize,
    /// In a vector loop, elements between the loop variable's value and the copy being emitted
    /// (applied as an immediate offset to contiguous accesses).
    lane_offset: i64,
    flags: MemFlagsData,
    fma: bool,
    /// When and how inner loops run over tiles with full-width routines.
    tiling: Tiling,
    /// Constants, emitted once in the entry block.
    consts: ConstPool,
    /// Index arithmetic already emitted, for reuse within its block (see [`Emitter::numbered`]).
    numbered: HashMap<(IndexOp, Value, u64), Value>,
}

/// The index arithmetic [`Emitter::numbered`] shares.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum IndexOp {
    Add,
    Mul,
    /// Shift left by an immediate.
    Shl,
}

impl<'f> Emitter<'_, 'f> {
    pub(super) fn vector(&self) -> bool {
        self.vec_var.is_some()
    }

    fn helper_ref(&mut self, h: Helper) -> FuncRef {
        match self.helper_refs.get(&h) {
            Some(f) => *f,
            None => {
                let f = h.import(self.b.func, self.call_conv);
                self.helper_refs.insert(h, f);
                f
            }
        }
    }

    pub(super) fn call(&mut self, h: Helper, args: &[Value]) -> Value {
        let fref = self.helper_ref(h);
        let inst = self.b.ins().call(fref, args);
        self.b.inst_results(inst)[0]
    }

    /// Calls a helper that returns nothing.
    pub(super) fn call_void(&mut self, h: Helper, args: &[Value]) {
        let fref = self.helper_ref(h);
        self.b.ins().call(fref, args);
    }

    /// `op(a, b)` (an immediate `b` for [`IndexOp::Shl`]), or the value an identical operation
    /// already computed earlier in the current block: block-local value numbering of the index
    /// arithmetic that the emitter writes per access (a load and a store of the same element
    /// computed its whole index twice). Fewer instructions compile faster at both tiers and make
    /// the quick tier's code (no GVN) better. Only a value defined in the current block is
    /// reused, so it always dominates the use, whatever blocks were opened since.
    pub(super) fn numbered(&mut self, op: IndexOp, a: Value, b: u64) -> Value {
        // Add and multiply commute: one key for both operand orders.
        let (a, b) = match op {
            IndexOp::Add | IndexOp::Mul if (b as u32) < a.as_u32() => {
                (Value::from_u32(b as u32), u64::from(a.as_u32()))
            }
            _ => (a, b),
        };
        let key = (op, a, b);
        if let Some(&v) = self.numbered.get(&key) {
            let here = self.b.current_block();
            let defined = match self.b.func.dfg.value_def(v) {
                ValueDef::Result(inst, _) => self.b.func.layout.inst_block(inst),
                _ => None,
            };
            if defined.is_some() && defined == here {
                return v;
            }
        }
        let v = match op {
            IndexOp::Add => self.b.ins().iadd(a, Value::from_u32(b as u32)),
            IndexOp::Mul => self.b.ins().imul(a, Value::from_u32(b as u32)),
            IndexOp::Shl => self.b.ins().ishl_imm_u(a, b as i64),
        };
        self.numbered.insert(key, v);
        v
    }

    pub(super) fn iconst(&mut self, ty: Type, c: i64) -> Value {
        self.consts.get(&mut self.b, ty, c as u64)
    }

    pub(super) fn fconst(&mut self, ty: Type, c: f64) -> Value {
        self.consts.float(&mut self.b, ty, c)
    }

    pub(super) fn math(&mut self, ty: Type) -> Math<'_, 'f> {
        Math { b: &mut self.b, consts: &mut self.consts, ty, fma: self.fma }
    }

    pub(super) fn sel(&mut self, cond: Value, a: Value, b: Value) -> Value {
        let ty = self.b.func.dfg.value_type(a);
        self.math(ty).sel(cond, a, b)
    }
}
