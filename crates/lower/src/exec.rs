//! A reference executor of kir programs: interprets every statement directly, with the numerics of
//! `air::interp`, taken from its one table, `air::scalar` (f32 in f32, f64 in f64, f16/bf16 in f32
//! rounded to storage after every op, ints wrapping, `libm` transcendentals). It is slow and simple on purpose: it tests the scheduler
//! against `air::interp::eval` without a JIT, and the runtime uses it as an oracle.
//!
//! Temps live in one byte arena laid out by `memplan`, so a planning mistake (two live buffers
//! sharing bytes) shows up as a wrong result. Indices are checked: a kernel that reads or writes
//! out of bounds is an error, never a panic.
//!
//! Data-dependent checks (`Inst::Gather`, `Stmt::ScatterAdd`, `Stmt::Check`) follow the status
//! protocol of the `kir` module docs: a failure is recorded in the status buffer (the first one
//! wins), the faulting element uses its safe substitute, and after the last step a recorded
//! failure becomes `LowerError::Data` with `Program::checks`' message.

use air::scalar;
use air::{BinaryOp, Bindings, DType, HostData, HostTensor, ReduceOp, Scalar, UnaryOp};
use half::{bf16, f16};

use crate::error::LowerError;
use crate::kir::{IExpr, Inst, Kernel, LoopKernel, MatOperand, MatmulKernel, STATUS_WORDS, Stmt};
use crate::memplan::{self, MemoryPlan};
use crate::program::{BufferKind, DataCheck, Program};

/// One scalar value: floats of every width are held as `f64` (exactly), ints as `i64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Val {
    /// A `bool` value.
    B(bool),
    /// An integer value of any int dtype.
    I(i64),
    /// A floating-point value of any float dtype.
    F(f64),
}

impl Val {
    fn from_scalar(s: Scalar) -> Val {
        match s {
            Scalar::Bool(b) => Val::B(b),
            Scalar::Int(i) => Val::I(i),
            Scalar::Float(x) => Val::F(x),
        }
    }

    fn to_scalar(self) -> Scalar {
        match self {
            Val::B(b) => Scalar::Bool(b),
            Val::I(i) => Scalar::Int(i),
            Val::F(x) => Scalar::Float(x),
        }
    }

    fn as_f64(self) -> f64 {
        self.to_scalar().as_f64()
    }

    fn as_i64(self) -> i64 {
        self.to_scalar().as_i64()
    }

    /// Converts to `dtype` with the cast rules of `air::interp` (`air::scalar::cast`).
    pub fn cast(self, dtype: DType) -> Val {
        Val::from_scalar(scalar::cast(self.to_scalar(), dtype))
    }
}

fn unsupported(what: &str, dtype: DType) -> LowerError {
    LowerError::Malformed(format!("{what} on dtype {dtype}"))
}

/// `op(x)` for an operand of `dtype` (`air::scalar::unary`).
fn unary(op: UnaryOp, x: Val, dtype: DType) -> Result<Val, LowerError> {
    scalar::unary(op, x.to_scalar(), dtype).map(Val::from_scalar).ok_or_else(|| unsupported(op.name(), dtype))
}

/// `op(a, b)` for operands of `dtype` (`air::scalar::binary`).
fn binary(op: BinaryOp, a: Val, b: Val, dtype: DType) -> Result<Val, LowerError> {
    scalar::binary(op, a.to_scalar(), b.to_scalar(), dtype)
        .map(Val::from_scalar)
        .ok_or_else(|| unsupported(op.name(), dtype))
}

/// Where a buffer's bytes are.
#[derive(Clone, Copy)]
enum Region {
    Own(usize),
    Arena(usize),
}

struct Memory {
    own: Vec<Vec<u8>>,
    arena: Vec<u8>,
    regions: Vec<Region>,
    dtypes: Vec<DType>,
    lens: Vec<usize>,
}

impl Memory {
    fn bytes(&self, buf: usize) -> &[u8] {
        let n = self.lens[buf] * self.dtypes[buf].size_bytes();
        match self.regions[buf] {
            Region::Own(i) => &self.own[i][..n],
            Region::Arena(off) => &self.arena[off..off + n],
        }
    }

    fn bytes_mut(&mut self, buf: usize) -> &mut [u8] {
        let n = self.lens[buf] * self.dtypes[buf].size_bytes();
        match self.regions[buf] {
            Region::Own(i) => &mut self.own[i][..n],
            Region::Arena(off) => &mut self.arena[off..off + n],
        }
    }

    fn check(&self, buf: usize, index: i64) -> Result<usize, LowerError> {
        match usize::try_from(index) {
            Ok(i) if i < self.lens[buf] => Ok(i),
            _ => Err(LowerError::Malformed(format!("index {index} out of bounds of buf{buf} ({})", self.lens[buf]))),
        }
    }

    fn read(&self, buf: usize, index: i64) -> Result<Val, LowerError> {
        let i = self.check(buf, index)?;
        let dtype = self.dtypes[buf];
        let w = dtype.size_bytes();
        let b = &self.bytes(buf)[i * w..(i + 1) * w];
        let arr = |n: usize| -> [u8; 8] {
            let mut a = [0u8; 8];
            a[..n].copy_from_slice(&b[..n]);
            a
        };
        Ok(match dtype {
            DType::Bool => Val::B(b[0] != 0),
            DType::I32 => Val::I(i32::from_le_bytes(arr(4)[..4].try_into().expect("4 bytes")) as i64),
            DType::I64 => Val::I(i64::from_le_bytes(arr(8))),
            DType::F16 => Val::F(f16::from_le_bytes([b[0], b[1]]).to_f64()),
            DType::BF16 => Val::F(bf16::from_le_bytes([b[0], b[1]]).to_f64()),
            DType::F32 => Val::F(f32::from_le_bytes(arr(4)[..4].try_into().expect("4 bytes")) as f64),
            DType::F64 => Val::F(f64::from_le_bytes(arr(8))),
        })
    }

    fn write(&mut self, buf: usize, index: i64, v: Val) -> Result<(), LowerError> {
        let i = self.check(buf, index)?;
        let dtype = self.dtypes[buf];
        let w = dtype.size_bytes();
        let v = v.cast(dtype);
        let bytes: Vec<u8> = match (dtype, v) {
            (DType::Bool, Val::B(b)) => vec![b as u8],
            (DType::I32, Val::I(x)) => (x as i32).to_le_bytes().to_vec(),
            (DType::I64, Val::I(x)) => x.to_le_bytes().to_vec(),
            (DType::F16, Val::F(x)) => f16::from_f64(x).to_le_bytes().to_vec(),
            (DType::BF16, Val::F(x)) => bf16::from_f64(x).to_le_bytes().to_vec(),
            (DType::F32, Val::F(x)) => (x as f32).to_le_bytes().to_vec(),
            (DType::F64, Val::F(x)) => x.to_le_bytes().to_vec(),
            _ => return Err(unsupported("store", dtype)),
        };
        self.bytes_mut(buf)[i * w..(i + 1) * w].copy_from_slice(&bytes);
        Ok(())
    }
}

/// Runs `program` on `inputs` (by input slot), planning temps with `memplan::plan`.
pub fn run(program: &Program, inputs: &[HostTensor], bindings: &Bindings) -> Result<Vec<HostTensor>, LowerError> {
    let plan = memplan::plan(program, bindings)?;
    run_planned(program, inputs, bindings, &plan)
}

/// Runs `program` with its temps placed by `plan` in one arena.
pub fn run_planned(
    program: &Program,
    inputs: &[HostTensor],
    bindings: &Bindings,
    plan: &MemoryPlan,
) -> Result<Vec<HostTensor>, LowerError> {
    let order: Vec<usize> = (0..program.steps.len()).collect();
    run_ordered(program, inputs, bindings, plan, &order)
}

/// Runs the steps group by group, in the order `groups` lists them, with temps planned by
/// `memplan::plan_with_groups(groups)`: what a runtime that runs each group's steps at the same
/// time does. With groups that break a dependency (a group whose steps depend on each other, or a
/// step before one it depends on) the results are wrong; tests use that to check dependency levels
/// and the planner against the in-order run.
pub fn run_grouped(
    program: &Program,
    inputs: &[HostTensor],
    bindings: &Bindings,
    groups: &[Vec<usize>],
) -> Result<Vec<HostTensor>, LowerError> {
    let plan = memplan::plan_with_groups(program, bindings, groups)?;
    let order: Vec<usize> = groups.iter().flatten().copied().collect();
    run_ordered(program, inputs, bindings, &plan, &order)
}

fn run_ordered(
    program: &Program,
    inputs: &[HostTensor],
    bindings: &Bindings,
    plan: &MemoryPlan,
    order: &[usize],
) -> Result<Vec<HostTensor>, LowerError> {
    program.check_bindings(bindings)?;
    let syms: Vec<i64> = program
        .symbols
        .iter()
        .map(|s| bindings.get(s).copied().ok_or_else(|| air::dim::DimError::Unbound(s.clone()).into()))
        .collect::<Result<_, LowerError>>()?;
    let mut mem = Memory {
        own: Vec::new(),
        arena: vec![0u8; plan.stats.arena_bytes],
        regions: Vec::new(),
        dtypes: Vec::new(),
        lens: Vec::new(),
    };
    for (i, b) in program.buffers.iter().enumerate() {
        let len = usize::try_from(b.numel.eval(bindings)?)
            .map_err(|_| LowerError::BadInputs(format!("buf{i} has a negative size")))?;
        mem.dtypes.push(b.dtype);
        mem.lens.push(len);
        let bytes = len * b.dtype.size_bytes();
        match b.kind {
            BufferKind::Input(slot) => {
                let t = inputs
                    .get(slot as usize)
                    .ok_or_else(|| LowerError::BadInputs(format!("no input for slot {slot}")))?;
                if t.dtype() != b.dtype || t.numel() != len {
                    return Err(LowerError::BadInputs(format!(
                        "input {slot}: expected {} x {len}, got {} x {}",
                        b.dtype,
                        t.dtype(),
                        t.numel()
                    )));
                }
                mem.own.push(t.data.as_bytes().to_vec());
                mem.regions.push(Region::Own(mem.own.len() - 1));
            }
            BufferKind::Output(_) | BufferKind::Status => {
                mem.own.push(vec![0u8; bytes]);
                mem.regions.push(Region::Own(mem.own.len() - 1));
            }
            BufferKind::Temp => {
                let off =
                    plan.offsets.get(i).copied().flatten().ok_or_else(|| {
                        LowerError::Malformed(format!("buf{i} is a temp the memory plan does not place"))
                    })?;
                if off + bytes > plan.stats.arena_bytes {
                    return Err(LowerError::Malformed(format!("buf{i} does not fit in the arena")));
                }
                mem.regions.push(Region::Arena(off));
            }
        }
    }
    for &s in order {
        let step = program.steps.get(s).ok_or_else(|| LowerError::Malformed(format!("no step {s}")))?;
        let kernel = program.step_kernel(s)?;
        let args: Vec<usize> = step.args.iter().map(|b| b.0 as usize).collect();
        if let Some(&b) = args.iter().find(|&&b| b >= mem.lens.len()) {
            return Err(LowerError::Malformed(format!("step {s} uses a missing buffer buf{b}")));
        }
        match kernel {
            Kernel::Loops(k) => run_loops(k, &args, &syms, &mut mem)?,
            Kernel::Matmul(k) => run_matmul(k, &args, &syms, &mut mem)?,
        }
    }
    for (i, b) in program.buffers.iter().enumerate() {
        if b.kind == BufferKind::Status {
            let words = (0..STATUS_WORDS.min(mem.lens[i]))
                .map(|w| mem.read(i, w as i64).map(|v| v.as_i64() as i32))
                .collect::<Result<Vec<i32>, _>>()?;
            if let Some(message) = DataCheck::from_status(&program.data_checks, &words) {
                return Err(LowerError::Data(message));
            }
        }
    }
    let mut outs = Vec::new();
    for (b, ty) in &program.outputs {
        let shape = air::dim::eval_shape(&ty.shape, bindings)?;
        let i = b.0 as usize;
        let data = (0..mem.lens[i]).map(|e| mem.read(i, e as i64)).collect::<Result<Vec<Val>, _>>()?;
        outs.push(HostTensor::new(host_data(ty.dtype, &data), shape).map_err(LowerError::Malformed)?);
    }
    Ok(outs)
}

fn host_data(dtype: DType, vals: &[Val]) -> HostData {
    match dtype {
        DType::Bool => HostData::Bool(vals.iter().map(|v| matches!(v.cast(dtype), Val::B(true))).collect()),
        DType::I32 => HostData::I32(vals.iter().map(|v| v.as_i64() as i32).collect()),
        DType::I64 => HostData::I64(vals.iter().map(|v| v.as_i64()).collect()),
        DType::F16 => HostData::F16(vals.iter().map(|v| f16::from_f64(v.as_f64())).collect()),
        DType::BF16 => HostData::BF16(vals.iter().map(|v| bf16::from_f64(v.as_f64())).collect()),
        DType::F32 => HostData::F32(vals.iter().map(|v| v.as_f64() as f32).collect()),
        DType::F64 => HostData::F64(vals.iter().map(|v| v.as_f64()).collect()),
    }
}

struct Frame<'a> {
    args: &'a [usize],
    syms: &'a [i64],
    vars: Vec<i64>,
    regs: Vec<Option<(Val, DType)>>,
    accs: Vec<Option<(Val, DType, ReduceOp)>>,
}

impl Frame<'_> {
    fn reg(&self, r: crate::kir::Reg) -> Result<(Val, DType), LowerError> {
        self.regs
            .get(r.0 as usize)
            .copied()
            .flatten()
            .ok_or_else(|| LowerError::Malformed(format!("{r} read before it is defined")))
    }

    fn eval(&self, e: &IExpr) -> i64 {
        e.eval(&self.vars, self.syms)
    }

    fn buf(&self, p: u32) -> Result<usize, LowerError> {
        self.args.get(p as usize).copied().ok_or_else(|| LowerError::Malformed(format!("no parameter b{p}")))
    }

    /// The value of the index register `index` if it lies in `0..size`; otherwise records
    /// `check` in the status buffer `status` and returns `None`.
    fn checked_index(
        &self,
        index: crate::kir::Reg,
        size: &IExpr,
        status: u32,
        check: u32,
        mem: &mut Memory,
    ) -> Result<Option<i64>, LowerError> {
        let i = self.reg(index)?.0.as_i64();
        if (0..self.eval(size)).contains(&i) {
            return Ok(Some(i));
        }
        self.record(status, check, i, mem)?;
        Ok(None)
    }

    /// Records a failure of `check` with `value` unless one is recorded already.
    fn record(&self, status: u32, check: u32, value: i64, mem: &mut Memory) -> Result<(), LowerError> {
        let b = self.buf(status)?;
        if mem.read(b, 0)?.as_i64() == 0 {
            mem.write(b, 0, Val::I(check as i64 + 1))?;
            mem.write(b, 1, Val::I(value as u32 as i32 as i64))?;
            mem.write(b, 2, Val::I((value >> 32) as i32 as i64))?;
        }
        Ok(())
    }

    fn inst(&self, inst: &Inst, dtype: DType, mem: &mut Memory) -> Result<Val, LowerError> {
        Ok(match inst {
            Inst::Gather { buf, base, index, stride, size, status, check } => {
                match self.checked_index(*index, size, *status, *check, mem)? {
                    Some(i) => mem.read(self.buf(*buf)?, self.eval(base) + i * self.eval(stride))?,
                    // A bad index reads nothing (`buf` may be empty).
                    None => Val::from_scalar(Scalar::Int(0)).cast(dtype),
                }
            }
            Inst::Load { buf, index, mask, other } => {
                if mask.as_ref().is_some_and(|m| self.eval(m) == 0) {
                    Val::from_scalar(*other).cast(dtype)
                } else {
                    mem.read(self.buf(*buf)?, self.eval(index))?
                }
            }
            Inst::Const(s) => Val::from_scalar(*s).cast(dtype),
            Inst::Index(e) => Val::I(self.eval(e)).cast(dtype),
            Inst::Unary(op, r) => {
                let (x, t) = self.reg(*r)?;
                unary(*op, x, t)?
            }
            Inst::Binary(op, a, b) => {
                let ((x, t), (y, _)) = (self.reg(*a)?, self.reg(*b)?);
                binary(*op, x, y, t)?
            }
            Inst::Where(c, a, b) => {
                let (c, _) = self.reg(*c)?;
                if matches!(c, Val::B(true)) { self.reg(*a)?.0 } else { self.reg(*b)?.0 }
            }
            Inst::Cast(r) => self.reg(*r)?.0.cast(dtype),
            Inst::ReadAcc(a) => {
                self.accs
                    .get(a.0 as usize)
                    .copied()
                    .flatten()
                    .ok_or_else(|| LowerError::Malformed(format!("{a} read before it is declared")))?
                    .0
            }
        })
    }

    fn stmts(&mut self, stmts: &[Stmt], mem: &mut Memory) -> Result<(), LowerError> {
        for s in stmts {
            match s {
                Stmt::Let { reg, dtype, inst } => {
                    let v = self.inst(inst, *dtype, mem)?;
                    let i = reg.0 as usize;
                    if self.regs.len() <= i {
                        self.regs.resize(i + 1, None);
                    }
                    self.regs[i] = Some((v, *dtype));
                }
                Stmt::Loop { var, extent, body, .. } => {
                    let n = self.eval(extent);
                    let v = var.0 as usize;
                    if self.vars.len() <= v {
                        self.vars.resize(v + 1, 0);
                    }
                    for i in 0..n.max(0) {
                        self.vars[v] = i;
                        self.stmts(body, mem)?;
                    }
                }
                Stmt::AccInit { acc, dtype, op } => {
                    let init = match crate::kir::acc_start(*op, *dtype) {
                        Some(s) => Val::from_scalar(s),
                        None => return Err(unsupported("max accumulator", *dtype)),
                    };
                    let i = acc.0 as usize;
                    if self.accs.len() <= i {
                        self.accs.resize(i + 1, None);
                    }
                    self.accs[i] = Some((init, *dtype, *op));
                }
                Stmt::AccUpdate { acc, value } => {
                    let (x, _) = self.reg(*value)?;
                    let slot = self
                        .accs
                        .get_mut(acc.0 as usize)
                        .and_then(|a| a.as_mut())
                        .ok_or_else(|| LowerError::Malformed(format!("{acc} updated before it is declared")))?;
                    let (cur, dtype, op) = *slot;
                    let bop = if op == ReduceOp::Sum { BinaryOp::Add } else { BinaryOp::Max };
                    slot.0 = binary(bop, cur, x.cast(dtype), dtype)?;
                }
                Stmt::Store { buf, index, value } => {
                    let (v, _) = self.reg(*value)?;
                    let b = self.buf(*buf)?;
                    mem.write(b, self.eval(index), v)?;
                }
                Stmt::ScatterAdd { buf, base, index, stride, size, value, status, check } => {
                    if let Some(i) = self.checked_index(*index, size, *status, *check, mem)? {
                        let (v, _) = self.reg(*value)?;
                        let b = self.buf(*buf)?;
                        let at = self.eval(base) + i * self.eval(stride);
                        let dtype = mem.dtypes[b];
                        let sum = binary(BinaryOp::Add, mem.read(b, at)?, v.cast(dtype), dtype)?;
                        mem.write(b, at, sum)?;
                    }
                }
                Stmt::Check { cond, value, status, check } => {
                    if matches!(self.reg(*cond)?.0, Val::B(true)) {
                        let v = self.reg(*value)?.0.as_i64();
                        self.record(*status, *check, v, mem)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn run_loops(k: &LoopKernel, args: &[usize], syms: &[i64], mem: &mut Memory) -> Result<(), LowerError> {
    let mut frame = Frame { args, syms, vars: Vec::new(), regs: Vec::new(), accs: Vec::new() };
    frame.stmts(&k.body, mem)
}

fn run_matmul(k: &MatmulKernel, args: &[usize], syms: &[i64], mem: &mut Memory) -> Result<(), LowerError> {
    let e = |x: &IExpr| x.eval(&[], syms);
    let (batch, m, n, kk) = (e(&k.batch), e(&k.m), e(&k.n), e(&k.k));
    let at = |o: &MatOperand, b: i64, r: i64, c: i64| -> Result<(usize, i64), LowerError> {
        let buf = args
            .get(o.buf as usize)
            .copied()
            .ok_or_else(|| LowerError::Malformed(format!("no parameter b{}", o.buf)))?;
        Ok((buf, e(&o.offset) + b * e(&o.batch_stride) + r * e(&o.row_stride) + c * e(&o.col_stride)))
    };
    for b in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let mut acc = Val::I(0).cast(k.dtype);
                for p in 0..kk {
                    let (ab, ai) = at(&k.a, b, i, p)?;
                    let (bb, bi) = at(&k.b, b, p, j)?;
                    let prod = binary(BinaryOp::Mul, mem.read(ab, ai)?, mem.read(bb, bi)?, k.dtype)?;
                    acc = binary(BinaryOp::Add, acc, prod, k.dtype)?;
                }
                let (cb, ci) = at(&k.c, b, i, j)?;
                if k.accumulate {
                    acc = binary(BinaryOp::Add, mem.read(cb, ci)?, acc, k.dtype)?;
                }
                mem.write(cb, ci, acc)?;
            }
        }
    }
    Ok(())
}
