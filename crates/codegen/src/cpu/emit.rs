//! kir `LoopKernel` -> Cranelift IR.
//!
//! Values: a register of dtype `bool` is an `i8` holding 0 or 1, `i32`/`i64` are themselves,
//! `f16`/`bf16`/`f32` are `f32` (half types are exact in `f32`; they are rounded to storage at
//! casts and stores) and `f64` is `f64`. In a vectorized loop (see `analysis`) a register is
//! `f32x4` or `i32x4`, and a `bool` is an `i32x4` lane mask (all ones or zero); registers defined
//! outside the loop are splatted where they are used.
//!
//! Loops are rotated (one test before, one at the bottom) and count with a frontend `Variable`;
//! accumulators are `Variable`s too, so the frontend builds the loop phis. Float `sum`
//! accumulators are `f64` whatever their dtype, like the reference interpreter's sums.

use std::collections::HashMap;

use air::{BinaryOp, DType, ReduceOp, Scalar, UnaryOp};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    ConstantData, Endianness, FuncRef, Function, InstBuilder, MemFlagsData, Type, Value, types,
};
use cranelift_codegen::isa::{CallConv, TargetIsa};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use lower::kir::{Acc, IExpr, Inst, LoopKernel, Reg, Stmt, Var};

use super::analysis::{KernelInfo, VecPlan, vector_plan};
use super::helpers::Helper;
use super::math::{ConstPool, Math, SIN_FAST_LIMIT};
use crate::error::{CodegenError, Result};

/// Lanes of a vector register (Cranelift's x86 vectors are 128 bits).
const LANES: i64 = 4;

/// A register's value and whether it is a vector.
#[derive(Clone, Copy)]
struct Val {
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

fn const_for(s: Scalar, d: DType) -> ConstVal {
    let as_f32 = |s: Scalar| match s {
        Scalar::Float(x) => x as f32,
        Scalar::Int(i) => i as f32,
        Scalar::Bool(b) => b as i64 as f32,
    };
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
        helper_refs: HashMap::new(),
        k,
        info: &info,
        bases,
        syms,
        vars: HashMap::new(),
        regs: HashMap::new(),
        accs: HashMap::new(),
        vec_var: None,
        partials: HashMap::new(),
        copy: 0,
        lane_offset: 0,
        flags,
        fma,
        consts: ConstPool::new(entry),
    };
    match k.body.as_slice() {
        [Stmt::Loop { var, extent, parallel: true, body }] => e.emit_loop(*var, extent, body, Some((start, end)))?,
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
/// copies (compile time grows with the unrolled size).
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
    /// Constants, emitted once in the entry block.
    consts: ConstPool,
}

impl<'f> Emitter<'_, 'f> {
    fn vector(&self) -> bool {
        self.vec_var.is_some()
    }

    fn call(&mut self, h: Helper, args: &[Value]) -> Value {
        let fref = match self.helper_refs.get(&h) {
            Some(f) => *f,
            None => {
                let f = h.import(self.b.func, self.call_conv);
                self.helper_refs.insert(h, f);
                f
            }
        };
        let inst = self.b.ins().call(fref, args);
        self.b.inst_results(inst)[0]
    }

    fn iconst(&mut self, ty: Type, c: i64) -> Value {
        self.consts.get(&mut self.b, ty, c as u64)
    }

    fn fconst(&mut self, ty: Type, c: f64) -> Value {
        self.consts.float(&mut self.b, ty, c)
    }

    fn math(&mut self, ty: Type) -> Math<'_, 'f> {
        Math { b: &mut self.b, consts: &mut self.consts, ty, fma: self.fma }
    }

    fn sel(&mut self, cond: Value, a: Value, b: Value) -> Value {
        let ty = self.b.func.dfg.value_type(a);
        self.math(ty).sel(cond, a, b)
    }

    // ---- statements ----

    fn emit_stmts(&mut self, stmts: &[Stmt]) -> Result<()> {
        for s in stmts {
            match s {
                Stmt::Let { reg, dtype, inst } => {
                    let v = self.emit_inst(*dtype, inst)?;
                    self.regs.insert(*reg, v);
                }
                Stmt::Loop { var, extent, body, .. } => self.emit_loop(*var, extent, body, None)?,
                Stmt::AccInit { acc, dtype, op } => {
                    let ty = acc_ty(*dtype, *op);
                    let var = self.b.declare_var(ty);
                    let init = self.identity(ty, *op);
                    self.b.def_var(var, init);
                    self.accs.insert(*acc, var);
                }
                Stmt::AccUpdate { acc, value } => self.emit_acc_update(*acc, *value)?,
                Stmt::Store { buf, index, value } => self.emit_store(*buf, index, *value)?,
                Stmt::ScatterAdd { buf, base, index, stride, size, value, status, check } => {
                    let at = Indexed { buf: *buf, base, index: *index, stride, size, status: *status, check: *check };
                    self.emit_scatter_add(&at, *value)?
                }
                Stmt::Check { cond, value, status, check } => {
                    let c = self.scalar_reg(*cond)?;
                    let v = self.index_value(*value)?;
                    let fail = self.b.create_block();
                    let join = self.b.create_block();
                    self.b.ins().brif(c, fail, &[], join, &[]);
                    self.b.switch_to_block(fail);
                    self.record_failure(*status, *check, v, join)?;
                    self.b.switch_to_block(join);
                }
            }
        }
        Ok(())
    }

    fn identity(&mut self, ty: Type, op: ReduceOp) -> Value {
        let lane = ty.lane_type();
        match (op, lane.is_float()) {
            (ReduceOp::Sum, true) => self.fconst(ty, 0.0),
            (ReduceOp::Sum, false) => self.iconst(ty, 0),
            (ReduceOp::Max, true) => self.fconst(ty, f64::NEG_INFINITY),
            (ReduceOp::Max, false) => {
                let min = if lane == types::I32 { i32::MIN as i64 } else { i64::MIN };
                self.iconst(ty, min)
            }
        }
    }

    fn reduce_op(&mut self, op: ReduceOp, a: Value, b: Value) -> Value {
        let float = self.b.func.dfg.value_type(a).lane_type().is_float();
        match (op, float) {
            (ReduceOp::Sum, true) => self.b.ins().fadd(a, b),
            (ReduceOp::Sum, false) => self.b.ins().iadd(a, b),
            (ReduceOp::Max, true) => self.b.ins().fmax(a, b),
            (ReduceOp::Max, false) => self.b.ins().smax(a, b),
        }
    }

    fn emit_acc_update(&mut self, acc: Acc, value: Reg) -> Result<()> {
        let (ad, op) = self.info.acc(acc)?;
        let vd = self.info.reg(value)?;
        let val = self.reg(value)?;
        if self.vector() {
            let parts = self
                .partials
                .get(&acc)
                .and_then(|p| p.get(self.copy))
                .cloned()
                .ok_or_else(|| CodegenError::Invalid(format!("{acc} updated in a vector loop without partials")))?;
            if parts.len() == 2 {
                // f32 sum into two f64x2 partials.
                let lo = self.b.ins().fvpromote_low(val.v);
                let hi_half = self.swap_halves(val.v);
                let hi = self.b.ins().fvpromote_low(hi_half);
                for (var, x) in parts.iter().zip([lo, hi]) {
                    let cur = self.b.use_var(*var);
                    let next = self.b.ins().fadd(cur, x);
                    self.b.def_var(*var, next);
                }
            } else {
                let cur = self.b.use_var(parts[0]);
                let next = self.reduce_op(op, cur, val.v);
                self.b.def_var(parts[0], next);
            }
            return Ok(());
        }
        let var = *self.accs.get(&acc).ok_or_else(|| CodegenError::Invalid(format!("{acc} used before its init")))?;
        let mut x = if vd != ad { self.cast(vd, ad, val.v)? } else { val.v };
        let ty = acc_ty(ad, op);
        if ty == types::F64 && self.b.func.dfg.value_type(x) == types::F32 {
            x = self.b.ins().fpromote(types::F64, x);
        }
        let cur = self.b.use_var(var);
        let next = self.reduce_op(op, cur, x);
        self.b.def_var(var, next);
        Ok(())
    }

    /// Lanes 2, 3 of an `f32x4` moved to lanes 0, 1.
    fn swap_halves(&mut self, v: Value) -> Value {
        let le = MemFlagsData::new().with_endianness(Endianness::Little);
        let bytes = self.b.ins().bitcast(types::I8X16, le, v);
        let mask: Vec<u8> = (8..16).chain(8..16).collect();
        let imm = self.b.func.dfg.immediates.push(ConstantData::from(mask));
        let sh = self.b.ins().shuffle(bytes, bytes, imm);
        self.b.ins().bitcast(types::F32X4, le, sh)
    }

    fn addr(&mut self, buf: u32, index: &IExpr, dtype: DType) -> Result<Value> {
        let idx = self.iexpr(index)?;
        let shift = dtype.size_bytes().trailing_zeros() as i64;
        let off = if shift == 0 { idx } else { self.b.ins().ishl_imm_u(idx, shift) };
        let base = *self.bases.get(buf as usize).ok_or_else(|| CodegenError::Invalid(format!("buffer b{buf}")))?;
        Ok(self.b.ins().iadd(base, off))
    }

    /// The byte offset of the current unrolled copy for a contiguous access of dtype `d` (every
    /// store, and every load that uses the vector variable, in a vector loop has coefficient 1).
    fn contiguous_offset(&self, d: DType) -> i32 {
        (self.lane_offset * d.size_bytes() as i64) as i32
    }

    fn param_dtype(&self, buf: u32) -> Result<DType> {
        self.k
            .params
            .get(buf as usize)
            .map(|p| p.dtype)
            .ok_or_else(|| CodegenError::Invalid(format!("buffer b{buf} out of range")))
    }

    fn emit_store(&mut self, buf: u32, index: &IExpr, value: Reg) -> Result<()> {
        let pd = self.param_dtype(buf)?;
        let vd = self.info.reg(value)?;
        let val = self.reg(value)?;
        let addr = self.addr(buf, index, pd)?;
        let flags = self.flags;
        if self.vector() {
            let off = self.contiguous_offset(pd);
            self.b.ins().store(flags, val.v, addr, off);
            return Ok(());
        }
        let v = if vd != pd { self.cast(vd, pd, val.v)? } else { val.v };
        match pd {
            DType::F16 => {
                let bits = self.call(Helper::F32ToF16, &[v]);
                self.b.ins().istore16(flags, bits, addr, 0);
            }
            DType::BF16 => {
                let bits = self.bf16_bits(v);
                self.b.ins().istore16(flags, bits, addr, 0);
            }
            _ => {
                self.b.ins().store(flags, v, addr, 0);
            }
        }
        Ok(())
    }

    // ---- loops ----

    fn emit_loop(&mut self, var: Var, extent: &IExpr, body: &[Stmt], range: Option<(Value, Value)>) -> Result<()> {
        let ext = self.iexpr(extent)?;
        let (lo, hi) = match range {
            Some((s, e)) => {
                let zero = self.b.ins().iconst(types::I64, 0);
                (self.b.ins().smax(s, zero), self.b.ins().smin(e, ext))
            }
            None => (self.b.ins().iconst(types::I64, 0), ext),
        };
        let saved_regs = self.regs.clone();
        let saved_vars = self.vars.clone();
        let plan = if self.vector() { None } else { vector_plan(self.k, self.info, var, body) };
        match plan {
            Some(plan) => self.vector_loop(var, lo, hi, body, &plan)?,
            None => {
                let i = self.b.declare_var(types::I64);
                self.b.def_var(i, lo);
                self.counted_loop(i, hi, 1, |s, iv| {
                    s.vars.insert(var, iv);
                    s.emit_stmts(body)
                })?;
            }
        }
        self.regs = saved_regs;
        self.vars = saved_vars;
        Ok(())
    }

    /// `while i < limit { body(i); i += step }`, rotated.
    fn counted_loop(
        &mut self,
        i: Variable,
        limit: Value,
        step: i64,
        mut body: impl FnMut(&mut Self, Value) -> Result<()>,
    ) -> Result<()> {
        let body_block = self.b.create_block();
        let exit = self.b.create_block();
        let i0 = self.b.use_var(i);
        let go = self.b.ins().icmp(IntCC::SignedLessThan, i0, limit);
        self.b.ins().brif(go, body_block, &[], exit, &[]);
        self.b.switch_to_block(body_block);
        let iv = self.b.use_var(i);
        body(self, iv)?;
        let next = self.b.ins().iadd_imm_s(iv, step);
        self.b.def_var(i, next);
        let again = self.b.ins().icmp(IntCC::SignedLessThan, next, limit);
        self.b.ins().brif(again, body_block, &[], exit, &[]);
        self.b.switch_to_block(exit);
        Ok(())
    }

    /// Main loop of `unroll` vector bodies, then a scalar tail (fewer than `4 * unroll`
    /// iterations). There is no one-vector loop between them: each body costs compile time
    /// (about a third of a kernel's, for sigmoid), and the tail is short.
    fn vector_loop(&mut self, var: Var, lo: Value, hi: Value, body: &[Stmt], plan: &VecPlan) -> Result<()> {
        let unroll = unroll_factor(plan.size);
        let step = LANES * unroll;
        let i = self.b.declare_var(types::I64);
        self.b.def_var(i, lo);
        let n = self.b.ins().isub(hi, lo);
        let zero = self.b.ins().iconst(types::I64, 0);
        let n = self.b.ins().smax(n, zero);
        let n_main = self.b.ins().band_imm_s(n, -step);
        let main_limit = self.b.ins().iadd(lo, n_main);

        // Vector partial accumulators, one set per unrolled copy.
        self.partials.clear();
        for acc in &plan.reductions {
            let (d, op) = self.info.acc(*acc)?;
            let (ty, parts) = match (d, op) {
                (DType::F32, ReduceOp::Sum) => (types::F64X2, 2),
                _ => (vector_ty(d)?, 1),
            };
            let mut copies = Vec::new();
            for _ in 0..unroll {
                let mut vars = Vec::new();
                for _ in 0..parts {
                    let v = self.b.declare_var(ty);
                    let init = self.identity(ty, op);
                    self.b.def_var(v, init);
                    vars.push(v);
                }
                copies.push(vars);
            }
            self.partials.insert(*acc, copies);
        }

        self.vec_var = Some(var);
        let outer_regs = self.regs.clone();
        let result = (|| {
            self.counted_loop(i, main_limit, step, |s, iv| {
                s.vars.insert(var, iv);
                // The copies are interleaved statement by statement, each with its own
                // registers, so that their independent dependency chains sit side by side
                // in the instruction stream (see `unroll_factor`).
                let mut copy_regs = vec![s.regs.clone(); unroll as usize];
                for stmt in body {
                    for (u, regs) in copy_regs.iter_mut().enumerate() {
                        s.copy = u;
                        s.lane_offset = u as i64 * LANES;
                        std::mem::swap(&mut s.regs, regs);
                        let r = s.emit_stmts(std::slice::from_ref(stmt));
                        std::mem::swap(&mut s.regs, regs);
                        r?;
                    }
                }
                Ok(())
            })?;
            Ok(())
        })();
        self.lane_offset = 0;
        self.vec_var = None;
        self.copy = 0;
        result?;
        self.regs = outer_regs;

        // Fold the partials into the scalar accumulators.
        let partials = std::mem::take(&mut self.partials);
        for acc in &plan.reductions {
            let (_, op) = self.info.acc(*acc)?;
            let mut total: Option<Value> = None;
            for var in partials[acc].iter().flatten() {
                let v = self.b.use_var(*var);
                let ty = self.b.func.dfg.value_type(v);
                for lane in 0..ty.lane_count() {
                    let x = self.b.ins().extractlane(v, lane as u8);
                    total = Some(match total {
                        None => x,
                        Some(t) => self.reduce_op(op, t, x),
                    });
                }
            }
            if let (Some(t), Some(var)) = (total, self.accs.get(acc).copied()) {
                let cur = self.b.use_var(var);
                let next = self.reduce_op(op, cur, t);
                self.b.def_var(var, next);
            }
        }

        self.counted_loop(i, hi, 1, |s, iv| {
            s.vars.insert(var, iv);
            s.emit_stmts(body)
        })
    }

    // ---- index expressions ----

    fn iexpr(&mut self, e: &IExpr) -> Result<Value> {
        Ok(match e {
            IExpr::Const(c) => self.b.ins().iconst(types::I64, *c),
            IExpr::Var(v) => *self
                .vars
                .get(v)
                .ok_or_else(|| CodegenError::Invalid(format!("loop variable {v} used out of scope")))?,
            IExpr::Sym(n) => *self
                .syms
                .get(*n as usize)
                .ok_or_else(|| CodegenError::Invalid(format!("symbol s{n} beyond n_syms = {}", self.k.n_syms)))?,
            IExpr::Add(a, b) => {
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                self.b.ins().iadd(a, b)
            }
            IExpr::Mul(a, b) => {
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                self.b.ins().imul(a, b)
            }
            IExpr::Div(a, d) => {
                let a = self.iexpr(a)?;
                self.floor_divmod(a, d, true)?
            }
            IExpr::Mod(a, d) => {
                let a = self.iexpr(a)?;
                self.floor_divmod(a, d, false)?
            }
            IExpr::Lt(a, b) => {
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                let c = self.b.ins().icmp(IntCC::SignedLessThan, a, b);
                self.b.ins().uextend(types::I64, c)
            }
            IExpr::And(a, b) => {
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                let a = self.b.ins().icmp_imm_s(IntCC::NotEqual, a, 0);
                let b = self.b.ins().icmp_imm_s(IntCC::NotEqual, b, 0);
                let c = self.b.ins().band(a, b);
                self.b.ins().uextend(types::I64, c)
            }
        })
    }

    /// Euclidean (floor, for positive divisors) division or remainder, 0 for a zero divisor.
    fn floor_divmod(&mut self, a: Value, d: &IExpr, div: bool) -> Result<Value> {
        if let Some(c) = d.as_const() {
            if c == 0 {
                return Ok(self.b.ins().iconst(types::I64, 0));
            }
            if c > 0 && (c as u64).is_power_of_two() {
                let k = c.trailing_zeros() as i64;
                return Ok(if div { self.b.ins().sshr_imm_u(a, k) } else { self.b.ins().band_imm_s(a, c - 1) });
            }
            if c > 0 {
                let cv = self.b.ins().iconst(types::I64, c);
                return Ok(self.euclid_fixup(a, cv, div));
            }
        }
        // A divisor that is not a positive constant: indices are non-negative by convention, so
        // only guard against division by zero (and the trap of MIN / -1).
        let dv = self.iexpr(d)?;
        let positive = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, dv, 0);
        let one = self.b.ins().iconst(types::I64, 1);
        let safe = self.b.ins().select(positive, dv, one);
        let r = self.euclid_fixup(a, safe, div);
        let zero = self.b.ins().iconst(types::I64, 0);
        let is_zero = self.b.ins().icmp_imm_s(IntCC::Equal, dv, 0);
        let r = self.b.ins().select(is_zero, zero, r);
        Ok(r)
    }

    /// Floor division/remainder by a positive `d`.
    fn euclid_fixup(&mut self, a: Value, d: Value, div: bool) -> Value {
        let q = self.b.ins().sdiv(a, d);
        let qd = self.b.ins().imul(q, d);
        let r = self.b.ins().isub(a, qd);
        let neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, r, 0);
        if div {
            let q1 = self.b.ins().iadd_imm_s(q, -1);
            self.b.ins().select(neg, q1, q)
        } else {
            let r1 = self.b.ins().iadd(r, d);
            self.b.ins().select(neg, r1, r)
        }
    }

    // ---- instructions ----

    fn reg(&mut self, r: Reg) -> Result<Val> {
        let val = *self
            .regs
            .get(&r)
            .ok_or_else(|| CodegenError::Invalid(format!("register {r} used before it is defined")))?;
        if self.vector() && !val.vector {
            let d = self.info.reg(r)?;
            let v = self.splat(d, val.v)?;
            return Ok(Val { v, vector: true });
        }
        Ok(val)
    }

    /// A scalar register value as a vector (bools become lane masks).
    fn splat(&mut self, d: DType, v: Value) -> Result<Value> {
        let ty = vector_ty(d)?;
        Ok(if d == DType::Bool {
            let w = self.b.ins().uextend(types::I32, v);
            let m = self.b.ins().ineg(w);
            self.b.ins().splat(ty, m)
        } else {
            self.b.ins().splat(ty, v)
        })
    }

    fn scalar_constant(&mut self, s: Scalar, d: DType) -> Value {
        let ty = scalar_ty(d);
        match const_for(s, d) {
            ConstVal::Int(i) => self.iconst(ty, i),
            ConstVal::F32(x) => self.consts.get(&mut self.b, ty, x.to_bits() as u64),
            ConstVal::F64(x) => self.consts.get(&mut self.b, ty, x.to_bits()),
        }
    }

    fn constant(&mut self, s: Scalar, d: DType) -> Result<Val> {
        if !self.vector() {
            return Ok(Val { v: self.scalar_constant(s, d), vector: false });
        }
        let ty = vector_ty(d)?;
        let bits = match const_for(s, d) {
            // A bool lane is a mask: all ones or zero.
            ConstVal::Int(i) if d == DType::Bool => (-i) as u64,
            ConstVal::Int(i) => i as u64,
            ConstVal::F32(x) => x.to_bits() as u64,
            ConstVal::F64(x) => x.to_bits(),
        };
        Ok(Val { v: self.consts.get(&mut self.b, ty, bits), vector: true })
    }

    fn emit_inst(&mut self, d: DType, inst: &Inst) -> Result<Val> {
        let vector = self.vector();
        let val = |v: Value| Val { v, vector };
        match inst {
            Inst::Load { buf, index, mask, other } => self.emit_load(d, *buf, index, mask.as_ref(), *other),
            Inst::Gather { buf, base, index, stride, size, status, check } => {
                let at = Indexed { buf: *buf, base, index: *index, stride, size, status: *status, check: *check };
                self.emit_gather(d, &at)
            }
            Inst::Const(s) => self.constant(*s, d),
            Inst::Index(e) => {
                let x = self.iexpr(e)?;
                let contiguous = match self.vec_var {
                    Some(v) => e.uses(v),
                    None => false,
                };
                if contiguous {
                    // Coefficient 1 (checked by the plan): lanes x, x+1, x+2, x+3.
                    let x = if self.lane_offset != 0 { self.b.ins().iadd_imm_s(x, self.lane_offset) } else { x };
                    let x32 = self.b.ins().ireduce(types::I32, x);
                    let base = self.b.ins().splat(types::I32X4, x32);
                    let bytes: Vec<u8> = (0..4i32).flat_map(|l| l.to_le_bytes()).collect();
                    let c = self.b.func.dfg.constants.insert(ConstantData::from(bytes));
                    let iota = self.b.ins().vconst(types::I32X4, c);
                    let lanes = self.b.ins().iadd(base, iota);
                    let v = self.cast(DType::I32, d, lanes)?;
                    Ok(val(v))
                } else {
                    let v = self.cast(DType::I64, d, x)?;
                    if vector {
                        let v = self.splat(d, v)?;
                        Ok(val(v))
                    } else {
                        Ok(val(v))
                    }
                }
            }
            Inst::Unary(op, r) => {
                let a = self.reg(*r)?;
                let sd = self.info.reg(*r)?;
                let v = self.unary(*op, sd, a.v)?;
                Ok(val(v))
            }
            Inst::Binary(op, a, b) => {
                let (da, db) = (self.info.reg(*a)?, self.info.reg(*b)?);
                if da != db {
                    return Err(CodegenError::Invalid(format!("{} of {a}: {da} and {b}: {db}", op.name())));
                }
                let (va, vb) = (self.reg(*a)?, self.reg(*b)?);
                let v = self.binary(*op, da, va.v, vb.v)?;
                Ok(val(v))
            }
            Inst::Where(c, a, b) => {
                if self.info.reg(*c)? != DType::Bool || self.info.reg(*a)? != self.info.reg(*b)? {
                    return Err(CodegenError::Invalid(format!("where {c}, {a}, {b}: needs (bool, T, T)")));
                }
                let (vc, va, vb) = (self.reg(*c)?, self.reg(*a)?, self.reg(*b)?);
                let v = self.sel(vc.v, va.v, vb.v);
                Ok(val(v))
            }
            Inst::Cast(r) => {
                let sd = self.info.reg(*r)?;
                let a = self.reg(*r)?;
                let v = self.cast(sd, d, a.v)?;
                Ok(val(v))
            }
            Inst::ReadAcc(acc) => {
                if vector {
                    return Err(CodegenError::Invalid(format!("read {acc} in a vector loop")));
                }
                let (ad, op) = self.info.acc(*acc)?;
                let var =
                    *self.accs.get(acc).ok_or_else(|| CodegenError::Invalid(format!("{acc} read before its init")))?;
                let mut v = self.b.use_var(var);
                if acc_ty(ad, op) == types::F64 && ad != DType::F64 {
                    v = self.b.ins().fdemote(types::F32, v);
                    v = self.round_half(ad, v);
                }
                let v = if ad != d { self.cast(ad, d, v)? } else { v };
                Ok(val(v))
            }
        }
    }

    fn emit_load(&mut self, d: DType, buf: u32, index: &IExpr, mask: Option<&IExpr>, other: Scalar) -> Result<Val> {
        let pd = self.param_dtype(buf)?;
        let contiguous = self.vec_var.is_some_and(|v| index.uses(v));
        let Some(mask) = mask else {
            return self.load_now(d, pd, buf, index, contiguous);
        };
        // Masked: branch around the access so that masked-off elements never touch memory. The
        // mask does not depend on the vectorized variable (checked by the plan), so one branch
        // serves all lanes.
        let m = self.iexpr(mask)?;
        let other = if contiguous { self.constant(other, d)?.v } else { self.scalar_constant(other, d) };
        let ty = self.b.func.dfg.value_type(other);
        let result = self.b.declare_var(ty);
        self.b.def_var(result, other);
        let load_block = self.b.create_block();
        let join = self.b.create_block();
        self.b.ins().brif(m, load_block, &[], join, &[]);
        self.b.switch_to_block(load_block);
        let loaded =
            if contiguous { self.load_now(d, pd, buf, index, true)?.v } else { self.scalar_load(d, pd, buf, index)? };
        self.b.def_var(result, loaded);
        self.b.ins().jump(join, &[]);
        self.b.switch_to_block(join);
        let v = self.b.use_var(result);
        if self.vector() && !contiguous {
            let v = self.splat(d, v)?;
            Ok(Val { v, vector: true })
        } else {
            Ok(Val { v, vector: self.vector() })
        }
    }

    /// An unmasked load: a vector load when contiguous in the vector loop, else a scalar load
    /// (splatted in a vector loop).
    fn load_now(&mut self, d: DType, pd: DType, buf: u32, index: &IExpr, contiguous: bool) -> Result<Val> {
        if contiguous {
            let addr = self.addr(buf, index, pd)?;
            let ty = vector_ty(pd)?;
            let flags = self.flags;
            let off = self.contiguous_offset(pd);
            let v = self.b.ins().load(ty, flags, addr, off);
            return Ok(Val { v, vector: true });
        }
        let v = self.scalar_load(d, pd, buf, index)?;
        if self.vector() {
            let v = self.splat(d, v)?;
            Ok(Val { v, vector: true })
        } else {
            Ok(Val { v, vector: false })
        }
    }

    fn scalar_load(&mut self, d: DType, pd: DType, buf: u32, index: &IExpr) -> Result<Value> {
        let addr = self.addr(buf, index, pd)?;
        self.scalar_load_at(d, pd, addr)
    }

    // ---- data-dependent indexing and checks ----

    /// A scalar register's value (data-dependent accesses and checks only run in scalar loops).
    fn scalar_reg(&mut self, r: Reg) -> Result<Value> {
        let v = self.reg(r)?;
        if v.vector {
            return Err(CodegenError::Invalid(format!("{r} is a vector where a scalar is needed")));
        }
        Ok(v.v)
    }

    /// The value of an integer (or bool) register widened to i64.
    fn index_value(&mut self, r: Reg) -> Result<Value> {
        let v = self.scalar_reg(r)?;
        Ok(match self.b.func.dfg.value_type(v) {
            types::I64 => v,
            types::I8 => self.b.ins().uextend(types::I64, v),
            types::I32 => self.b.ins().sextend(types::I64, v),
            ty => return Err(CodegenError::Invalid(format!("{r} of type {ty} used as an index"))),
        })
    }

    /// In the current (cold) block: sets the status buffer `status` to `check + 1` if it is 0
    /// (an atomic compare-and-swap; the first failure of a run wins), and then stores the two
    /// halves of `value` after it; then jumps to `join`.
    fn record_failure(
        &mut self,
        status: u32,
        check: u32,
        value: Value,
        join: cranelift_codegen::ir::Block,
    ) -> Result<()> {
        let ptr = *self.bases.get(status as usize).ok_or_else(|| CodegenError::Invalid(format!("buffer b{status}")))?;
        let zero = self.b.ins().iconst(types::I32, 0);
        let code = self.b.ins().iconst(types::I32, check as i64 + 1);
        let flags = self.flags;
        let old = self.b.ins().atomic_cas(flags, ptr, zero, code);
        let won = self.b.ins().icmp_imm_s(IntCC::Equal, old, 0);
        let store = self.b.create_block();
        self.b.ins().brif(won, store, &[], join, &[]);
        self.b.switch_to_block(store);
        let lo = self.b.ins().ireduce(types::I32, value);
        let hi = self.b.ins().sshr_imm_u(value, 32);
        let hi = self.b.ins().ireduce(types::I32, hi);
        self.b.ins().store(flags, lo, ptr, 4);
        self.b.ins().store(flags, hi, ptr, 8);
        self.b.ins().jump(join, &[]);
        Ok(())
    }

    /// The address of `buf[base + i * stride]` for the index register `index`, checked against
    /// `0..size`: a bad index records the failure and addresses `buf[base]` instead. Also
    /// returns the failure condition.
    fn checked_addr(&mut self, at: &Indexed<'_>) -> Result<(Value, Value)> {
        let Indexed { buf, base, index, stride, size, status, check } = *at;
        let i = self.index_value(index)?;
        let n = self.iexpr(size)?;
        // Unsigned: a negative index is a huge one.
        let bad = self.b.ins().icmp(IntCC::UnsignedGreaterThanOrEqual, i, n);
        let fail = self.b.create_block();
        let join = self.b.create_block();
        self.b.ins().brif(bad, fail, &[], join, &[]);
        self.b.switch_to_block(fail);
        self.record_failure(status, check, i, join)?;
        self.b.switch_to_block(join);
        let zero = self.b.ins().iconst(types::I64, 0);
        let safe = self.b.ins().select(bad, zero, i);
        let st = self.iexpr(stride)?;
        let off = self.b.ins().imul(safe, st);
        let b0 = self.iexpr(base)?;
        let idx = self.b.ins().iadd(b0, off);
        let pd = self.param_dtype(buf)?;
        let shift = pd.size_bytes().trailing_zeros() as i64;
        let bytes = if shift == 0 { idx } else { self.b.ins().ishl_imm_u(idx, shift) };
        let ptr = *self.bases.get(buf as usize).ok_or_else(|| CodegenError::Invalid(format!("buffer b{buf}")))?;
        Ok((self.b.ins().iadd(ptr, bytes), bad))
    }

    fn emit_gather(&mut self, d: DType, at: &Indexed<'_>) -> Result<Val> {
        if self.vector() {
            return Err(CodegenError::Invalid("gather in a vector loop".into()));
        }
        let pd = self.param_dtype(at.buf)?;
        let (addr, _) = self.checked_addr(at)?;
        let v = self.scalar_load_at(d, pd, addr)?;
        Ok(Val { v, vector: false })
    }

    /// `buf[base + i * stride] += value`, skipped (after recording the failure) for a bad index.
    fn emit_scatter_add(&mut self, at: &Indexed<'_>, value: Reg) -> Result<()> {
        let pd = self.param_dtype(at.buf)?;
        if !matches!(pd, DType::I32 | DType::I64 | DType::F32 | DType::F64) || self.info.reg(value)? != pd {
            return Err(CodegenError::Unsupported(format!("scatter_add of {pd}")));
        }
        let v = self.scalar_reg(value)?;
        let (addr, bad) = self.checked_addr(at)?;
        let update = self.b.create_block();
        let join = self.b.create_block();
        self.b.ins().brif(bad, join, &[], update, &[]);
        self.b.switch_to_block(update);
        let flags = self.flags;
        let cur = self.b.ins().load(scalar_ty(pd), flags, addr, 0);
        let sum = if pd.is_float() { self.b.ins().fadd(cur, v) } else { self.b.ins().iadd(cur, v) };
        self.b.ins().store(flags, sum, addr, 0);
        self.b.ins().jump(join, &[]);
        self.b.switch_to_block(join);
        Ok(())
    }

    fn scalar_load_at(&mut self, d: DType, pd: DType, addr: Value) -> Result<Value> {
        let flags = self.flags;
        let v = match pd {
            DType::Bool => {
                // icmp gives an i8 0/1, whatever non-zero byte is stored.
                let byte = self.b.ins().load(types::I8, flags, addr, 0);
                self.b.ins().icmp_imm_s(IntCC::NotEqual, byte, 0)
            }
            DType::F16 => {
                let bits = self.b.ins().uload16(types::I32, flags, addr, 0);
                self.f16_widen(bits)
            }
            DType::BF16 => {
                let bits = self.b.ins().uload16(types::I32, flags, addr, 0);
                let hi = self.b.ins().ishl_imm_u(bits, 16);
                self.b.ins().bitcast(types::F32, MemFlagsData::new(), hi)
            }
            _ => self.b.ins().load(scalar_ty(pd), flags, addr, 0),
        };
        if pd != d { self.cast(pd, d, v) } else { Ok(v) }
    }

    // ---- half precision ----

    /// f16 bits (low 16 of an i32) to f32, exactly.
    fn f16_widen(&mut self, bits: Value) -> Value {
        let h = self.b.ins().band_imm_s(bits, 0x7fff);
        let sign = self.b.ins().band_imm_s(bits, 0x8000);
        let sign = self.b.ins().ishl_imm_u(sign, 16);
        let e = self.b.ins().ishl_imm_u(h, 13);
        let ef = self.b.ins().bitcast(types::F32, MemFlagsData::new(), e);
        let scale = self.b.ins().f32const(f32::from_bits(0x7780_0000)); // 2^112
        let finite = self.b.ins().fmul(ef, scale);
        let finite_bits = self.b.ins().bitcast(types::I32, MemFlagsData::new(), finite);
        let special = self.b.ins().bor_imm_s(e, 0x7f80_0000);
        let is_special = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThanOrEqual, h, 0x7c00);
        let r = self.b.ins().select(is_special, special, finite_bits);
        let r = self.b.ins().bor(r, sign);
        self.b.ins().bitcast(types::F32, MemFlagsData::new(), r)
    }

    /// f32 to bf16 bits (round to nearest even; NaN stays NaN), in the low 16 bits of an i32.
    fn bf16_bits(&mut self, x: Value) -> Value {
        let bits = self.b.ins().bitcast(types::I32, MemFlagsData::new(), x);
        let lsb = self.b.ins().ushr_imm_u(bits, 16);
        let lsb = self.b.ins().band_imm_s(lsb, 1);
        let r = self.b.ins().iadd_imm_s(bits, 0x7fff);
        let r = self.b.ins().iadd(r, lsb);
        let rounded = self.b.ins().ushr_imm_u(r, 16);
        let nan = self.b.ins().ushr_imm_u(bits, 16);
        let nan = self.b.ins().bor_imm_s(nan, 0x40);
        let is_nan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
        self.b.ins().select(is_nan, nan, rounded)
    }

    /// Rounds an f32 value to what `d` (f16/bf16) can hold; other dtypes are unchanged.
    fn round_half(&mut self, d: DType, v: Value) -> Value {
        match d {
            DType::F16 => {
                let bits = self.call(Helper::F32ToF16, &[v]);
                self.f16_widen(bits)
            }
            DType::BF16 => {
                let bits = self.bf16_bits(v);
                let hi = self.b.ins().ishl_imm_u(bits, 16);
                self.b.ins().bitcast(types::F32, MemFlagsData::new(), hi)
            }
            _ => v,
        }
    }

    // ---- casts ----

    fn cast(&mut self, from: DType, to: DType, v: Value) -> Result<Value> {
        if from == to {
            return Ok(v);
        }
        let vector = self.b.func.dfg.value_type(v).is_vector();
        if vector {
            return self.vector_cast(from, to, v);
        }
        let tty = scalar_ty(to);
        Ok(match (from, to) {
            (_, DType::Bool) if from.is_float() => {
                let zero = self.fconst(scalar_ty(from), 0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, v, zero)
            }
            (_, DType::Bool) => self.b.ins().icmp_imm_s(IntCC::NotEqual, v, 0),
            (DType::Bool, _) if to.is_float() => {
                let w = self.b.ins().uextend(types::I32, v);
                self.b.ins().fcvt_from_sint(tty, w)
            }
            (DType::Bool, _) => self.b.ins().uextend(tty, v),
            (DType::I32, DType::I64) => self.b.ins().sextend(types::I64, v),
            (DType::I64, DType::I32) => self.b.ins().ireduce(types::I32, v),
            (_, _) if from.is_int() => {
                let f = self.b.ins().fcvt_from_sint(tty, v);
                self.round_half(to, f)
            }
            (_, _) if to.is_int() => self.b.ins().fcvt_to_sint_sat(tty, v),
            (DType::F64, _) => {
                let f = self.b.ins().fdemote(types::F32, v);
                self.round_half(to, f)
            }
            (_, DType::F64) => self.b.ins().fpromote(types::F64, v),
            // Between f16, bf16 and f32, all held as f32.
            _ => self.round_half(to, v),
        })
    }

    fn vector_cast(&mut self, from: DType, to: DType, v: Value) -> Result<Value> {
        Ok(match (from, to) {
            (DType::F32, DType::I32) => self.b.ins().fcvt_to_sint_sat(types::I32X4, v),
            (DType::I32, DType::F32) => self.b.ins().fcvt_from_sint(types::F32X4, v),
            (DType::F32, DType::Bool) => {
                let zero = self.fconst(types::F32X4, 0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, v, zero)
            }
            (DType::I32, DType::Bool) => {
                let zero = self.iconst(types::I32X4, 0);
                self.b.ins().icmp(IntCC::NotEqual, v, zero)
            }
            (DType::Bool, DType::I32) => self.b.ins().ineg(v),
            (DType::Bool, DType::F32) => {
                let i = self.b.ins().ineg(v);
                self.b.ins().fcvt_from_sint(types::F32X4, i)
            }
            _ => return unsupported(format!("vector cast {from} -> {to}")),
        })
    }

    // ---- element-wise ops ----

    /// Applies `f` to each lane of 32-bit vectors `args` (scalar code), rebuilding a vector.
    fn lanewise(&mut self, args: &[Value], mut f: impl FnMut(&mut Self, &[Value]) -> Result<Value>) -> Result<Value> {
        let mut out: Option<Value> = None;
        for lane in 0..LANES as u8 {
            let xs: Vec<Value> = args.iter().map(|&a| self.b.ins().extractlane(a, lane)).collect();
            let r = f(self, &xs)?;
            out = Some(match out {
                None => {
                    let ty = self.b.func.dfg.value_type(r).by(LANES as u32).unwrap_or(types::F32X4);
                    self.b.ins().splat(ty, r)
                }
                Some(o) => self.b.ins().insertlane(o, r, lane),
            });
        }
        out.ok_or_else(|| CodegenError::Invalid("no lanes".into()))
    }

    fn unary(&mut self, op: UnaryOp, d: DType, x: Value) -> Result<Value> {
        let ty = self.b.func.dfg.value_type(x);
        let vector = ty.is_vector();
        if d.is_float() {
            let f64 = ty.lane_type() == types::F64;
            return Ok(match op {
                // x86 has no vector negation: Cranelift builds the sign mask at each `fneg`
                // (three instructions); a shared constant makes it one `xorps`.
                UnaryOp::Neg if ty == types::F32X4 => {
                    let sign = self.consts.get(&mut self.b, ty, 0x8000_0000);
                    self.b.ins().bxor(x, sign)
                }
                UnaryOp::Neg => self.b.ins().fneg(x),
                UnaryOp::Sqrt => self.b.ins().sqrt(x),
                UnaryOp::Trunc => self.b.ins().trunc(x),
                UnaryOp::Recip => {
                    let one = self.fconst(ty, 1.0);
                    self.b.ins().fdiv(one, x)
                }
                UnaryOp::Exp2 if f64 => self.call(Helper::Exp2F64, &[x]),
                UnaryOp::Log2 if f64 => self.call(Helper::Log2F64, &[x]),
                UnaryOp::Sin if f64 => self.call(Helper::SinF64, &[x]),
                UnaryOp::Erf if f64 => self.call(Helper::ErfF64, &[x]),
                UnaryOp::Exp2 => self.math(ty).exp2(x),
                UnaryOp::Log2 => self.math(ty).log2(x),
                UnaryOp::Erf => self.math(ty).erf(x),
                UnaryOp::Sin => self.sin_f32(x, vector),
                UnaryOp::Not => return unsupported(format!("not of {d}")),
            });
        }
        Ok(match (op, d) {
            (UnaryOp::Not, DType::Bool) if vector => self.b.ins().bnot(x),
            (UnaryOp::Not, DType::Bool) => {
                let one = self.b.ins().iconst(types::I8, 1);
                self.b.ins().bxor(x, one)
            }
            (UnaryOp::Not, _) => self.b.ins().bnot(x),
            (UnaryOp::Neg, DType::I32 | DType::I64) => self.b.ins().ineg(x),
            _ => return unsupported(format!("{} of {d}", op.name())),
        })
    }

    /// f32 `sin`: inline for `|x| <= SIN_FAST_LIMIT` (any lane beyond takes the `libm` path).
    fn sin_f32(&mut self, x: Value, vector: bool) -> Value {
        let ty = self.b.func.dfg.value_type(x);
        let ax = self.b.ins().fabs(x);
        let limit = self.fconst(ty, SIN_FAST_LIMIT as f64);
        let big = self.b.ins().fcmp(FloatCC::GreaterThan, ax, limit);
        let any_big = if vector { self.b.ins().vany_true(big) } else { big };
        let result = self.b.declare_var(ty);
        let fast = self.b.create_block();
        let slow = self.b.create_block();
        let join = self.b.create_block();
        self.b.ins().brif(any_big, slow, &[], fast, &[]);
        self.b.switch_to_block(fast);
        let r = self.math(ty).sin(x);
        self.b.def_var(result, r);
        self.b.ins().jump(join, &[]);
        self.b.switch_to_block(slow);
        let r = if vector {
            // Cannot fail: the closure only emits calls.
            self.lanewise(&[x], |s, a| Ok(s.call(Helper::SinF32, a))).unwrap_or(x)
        } else {
            self.call(Helper::SinF32, &[x])
        };
        self.b.def_var(result, r);
        self.b.ins().jump(join, &[]);
        self.b.switch_to_block(join);
        self.b.use_var(result)
    }

    fn binary(&mut self, op: BinaryOp, d: DType, a: Value, b: Value) -> Result<Value> {
        let ty = self.b.func.dfg.value_type(a);
        let vector = ty.is_vector();
        if d.is_float() {
            let f64 = ty.lane_type() == types::F64;
            return Ok(match op {
                BinaryOp::Add => self.b.ins().fadd(a, b),
                BinaryOp::Sub => self.b.ins().fsub(a, b),
                BinaryOp::Mul => self.b.ins().fmul(a, b),
                BinaryOp::Div => self.b.ins().fdiv(a, b),
                BinaryOp::Max => self.b.ins().fmax(a, b),
                BinaryOp::Min => self.b.ins().fmin(a, b),
                BinaryOp::CmpLt => self.b.ins().fcmp(FloatCC::LessThan, a, b),
                BinaryOp::CmpEq => self.b.ins().fcmp(FloatCC::Equal, a, b),
                BinaryOp::CmpNe => self.b.ins().fcmp(FloatCC::NotEqual, a, b),
                BinaryOp::Mod | BinaryOp::Pow => {
                    let h = match (op, f64) {
                        (BinaryOp::Mod, true) => Helper::FmodF64,
                        (BinaryOp::Mod, false) => Helper::FmodF32,
                        (_, true) => Helper::PowF64,
                        (_, false) => Helper::PowF32,
                    };
                    if vector { self.lanewise(&[a, b], |s, xs| Ok(s.call(h, xs)))? } else { self.call(h, &[a, b]) }
                }
                BinaryOp::And | BinaryOp::Or => return unsupported(format!("{} of {d}", op.name())),
            });
        }
        if d == DType::Bool {
            return Ok(match op {
                BinaryOp::And | BinaryOp::Min => self.b.ins().band(a, b),
                BinaryOp::Or | BinaryOp::Max => self.b.ins().bor(a, b),
                // false < true: 0 < 1 as scalars, 0 > -1 as lane masks.
                BinaryOp::CmpLt if vector => self.b.ins().icmp(IntCC::SignedGreaterThan, a, b),
                BinaryOp::CmpLt => self.b.ins().icmp(IntCC::UnsignedLessThan, a, b),
                BinaryOp::CmpEq => self.b.ins().icmp(IntCC::Equal, a, b),
                BinaryOp::CmpNe => self.b.ins().icmp(IntCC::NotEqual, a, b),
                _ => return unsupported(format!("{} of bool", op.name())),
            });
        }
        Ok(match op {
            BinaryOp::Add => self.b.ins().iadd(a, b),
            BinaryOp::Sub => self.b.ins().isub(a, b),
            BinaryOp::Mul => self.b.ins().imul(a, b),
            BinaryOp::Max => self.b.ins().smax(a, b),
            BinaryOp::Min => self.b.ins().smin(a, b),
            BinaryOp::And => self.b.ins().band(a, b),
            BinaryOp::Or => self.b.ins().bor(a, b),
            BinaryOp::CmpLt => self.b.ins().icmp(IntCC::SignedLessThan, a, b),
            BinaryOp::CmpEq => self.b.ins().icmp(IntCC::Equal, a, b),
            BinaryOp::CmpNe => self.b.ins().icmp(IntCC::NotEqual, a, b),
            BinaryOp::Div | BinaryOp::Mod => {
                let div = op == BinaryOp::Div;
                if vector {
                    self.lanewise(&[a, b], |s, xs| Ok(s.int_divmod(xs[0], xs[1], div)))?
                } else {
                    self.int_divmod(a, b, div)
                }
            }
            BinaryOp::Pow => return unsupported(format!("pow of {d}")),
        })
    }

    /// C-style (truncating) integer division/remainder that never traps: `x / 0 = x % 0 = 0`,
    /// `MIN / -1 = MIN` (wrapping) and `MIN % -1 = 0`.
    fn int_divmod(&mut self, a: Value, b: Value, div: bool) -> Value {
        let ty = self.b.func.dfg.value_type(a);
        let zero = self.b.ins().iconst(ty, 0);
        let one = self.b.ins().iconst(ty, 1);
        let is_zero = self.b.ins().icmp_imm_s(IntCC::Equal, b, 0);
        let is_m1 = self.b.ins().icmp_imm_s(IntCC::Equal, b, -1);
        let special = self.b.ins().bor(is_zero, is_m1);
        let safe = self.b.ins().select(special, one, b);
        if div {
            let q = self.b.ins().sdiv(a, safe);
            let neg = self.b.ins().ineg(a);
            let q = self.b.ins().select(is_m1, neg, q);
            self.b.ins().select(is_zero, zero, q)
        } else {
            let r = self.b.ins().srem(a, safe);
            self.b.ins().select(special, zero, r)
        }
    }
}
