//! A reference executor of kir programs: interprets every statement directly, with the numerics of
//! `air::interp` (f32 in f32, f64 in f64, f16/bf16 in f32 rounded to storage after every op, ints
//! wrapping, `libm` transcendentals). It is slow and simple on purpose: it tests the scheduler
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

    fn as_f64(self) -> f64 {
        match self {
            Val::B(b) => b as i64 as f64,
            Val::I(i) => i as f64,
            Val::F(x) => x,
        }
    }

    fn as_i64(self) -> i64 {
        match self {
            Val::B(b) => b as i64,
            Val::I(i) => i,
            Val::F(x) => x as i64,
        }
    }

    /// Converts to `dtype` with the cast rules of `air::interp`.
    pub fn cast(self, dtype: DType) -> Val {
        match dtype {
            DType::Bool => Val::B(match self {
                Val::B(b) => b,
                Val::I(i) => i != 0,
                Val::F(x) => x != 0.0,
            }),
            DType::I32 => Val::I(match self {
                Val::F(x) => x as i32 as i64,
                v => v.as_i64() as i32 as i64,
            }),
            DType::I64 => Val::I(self.as_i64()),
            DType::F32 => Val::F(match self {
                Val::F(x) => x as f32 as f64,
                v => v.as_i64() as f32 as f64,
            }),
            DType::F64 => Val::F(match self {
                Val::F(x) => x,
                v => v.as_i64() as f64,
            }),
            DType::F16 | DType::BF16 => {
                let wide = self.cast(DType::F32).as_f64() as f32;
                Val::F(round_half(dtype, wide))
            }
        }
    }
}

fn round_half(dtype: DType, x: f32) -> f64 {
    if dtype == DType::F16 { f16::from_f32(x).to_f64() } else { bf16::from_f32(x).to_f64() }
}

fn fmax<T: PartialOrd + Copy>(a: T, b: T, nan: impl Fn(T) -> bool, pos: impl Fn(T) -> bool) -> T {
    if nan(a) {
        a
    } else if nan(b) || b > a {
        b
    } else if a > b || pos(a) {
        a
    } else {
        b
    }
}

fn fmin<T: PartialOrd + Copy>(a: T, b: T, nan: impl Fn(T) -> bool, pos: impl Fn(T) -> bool) -> T {
    if nan(a) {
        a
    } else if nan(b) || b < a {
        b
    } else if a < b || !pos(a) {
        a
    } else {
        b
    }
}

fn unary_f32(op: UnaryOp, x: f32) -> Option<f32> {
    Some(match op {
        UnaryOp::Neg => -x,
        UnaryOp::Exp2 => libm::exp2f(x),
        UnaryOp::Log2 => libm::log2f(x),
        UnaryOp::Sin => libm::sinf(x),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Erf => libm::erff(x),
        UnaryOp::Trunc => x.trunc(),
        UnaryOp::Not => return None,
    })
}

fn unary_f64(op: UnaryOp, x: f64) -> Option<f64> {
    Some(match op {
        UnaryOp::Neg => -x,
        UnaryOp::Exp2 => libm::exp2(x),
        UnaryOp::Log2 => libm::log2(x),
        UnaryOp::Sin => libm::sin(x),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Erf => libm::erf(x),
        UnaryOp::Trunc => x.trunc(),
        UnaryOp::Not => return None,
    })
}

fn binary_f32(op: BinaryOp, a: f32, b: f32) -> Option<f32> {
    Some(match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Max => fmax(a, b, f32::is_nan, f32::is_sign_positive),
        BinaryOp::Min => fmin(a, b, f32::is_nan, f32::is_sign_positive),
        BinaryOp::Mod => a % b,
        BinaryOp::Pow => libm::powf(a, b),
        _ => return None,
    })
}

fn binary_f64(op: BinaryOp, a: f64, b: f64) -> Option<f64> {
    Some(match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Max => fmax(a, b, f64::is_nan, f64::is_sign_positive),
        BinaryOp::Min => fmin(a, b, f64::is_nan, f64::is_sign_positive),
        BinaryOp::Mod => a % b,
        BinaryOp::Pow => libm::pow(a, b),
        _ => return None,
    })
}

/// Integer ops in `i64`, wrapped to the width of `dtype` afterwards.
fn binary_int(op: BinaryOp, a: i64, b: i64, dtype: DType) -> Option<i64> {
    let wide = dtype == DType::I64;
    let r = match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div if b == 0 => 0,
        BinaryOp::Mod if b == 0 => 0,
        BinaryOp::Div if wide => a.wrapping_div(b),
        BinaryOp::Mod if wide => a.wrapping_rem(b),
        BinaryOp::Div => (a as i32).wrapping_div(b as i32) as i64,
        BinaryOp::Mod => (a as i32).wrapping_rem(b as i32) as i64,
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::And => a & b,
        BinaryOp::Or => a | b,
        _ => return None,
    };
    Some(if wide { r } else { r as i32 as i64 })
}

fn unsupported(what: &str, dtype: DType) -> LowerError {
    LowerError::Malformed(format!("{what} on dtype {dtype}"))
}

fn unary(op: UnaryOp, x: Val, dtype: DType) -> Result<Val, LowerError> {
    let bad = || unsupported(op.name(), dtype);
    Ok(match (dtype, x) {
        (DType::Bool, Val::B(b)) if op == UnaryOp::Not => Val::B(!b),
        (DType::I32 | DType::I64, Val::I(i)) => match op {
            UnaryOp::Neg => Val::I(i.wrapping_neg()),
            UnaryOp::Not => Val::I(!i),
            _ => return Err(bad()),
        }
        .cast(dtype),
        (DType::F64, Val::F(v)) => Val::F(unary_f64(op, v).ok_or_else(bad)?),
        (DType::F32 | DType::F16 | DType::BF16, Val::F(v)) => {
            let r = unary_f32(op, v as f32).ok_or_else(bad)?;
            if dtype == DType::F32 { Val::F(r as f64) } else { Val::F(round_half(dtype, r)) }
        }
        _ => return Err(bad()),
    })
}

/// `op(a, b)` for operands of `dtype`.
fn binary(op: BinaryOp, a: Val, b: Val, dtype: DType) -> Result<Val, LowerError> {
    let bad = || unsupported(op.name(), dtype);
    if op.is_comparison() {
        let ord = match (a, b) {
            (Val::F(x), Val::F(y)) => x.partial_cmp(&y),
            (Val::I(x), Val::I(y)) => Some(x.cmp(&y)),
            (Val::B(x), Val::B(y)) => Some(x.cmp(&y)),
            _ => return Err(bad()),
        };
        use std::cmp::Ordering::*;
        return Ok(Val::B(match op {
            BinaryOp::CmpLt => ord == Some(Less),
            BinaryOp::CmpEq => ord == Some(Equal),
            _ => ord != Some(Equal),
        }));
    }
    Ok(match (a, b) {
        (Val::B(x), Val::B(y)) => Val::B(match op {
            BinaryOp::And | BinaryOp::Min => x && y,
            BinaryOp::Or | BinaryOp::Max => x || y,
            _ => return Err(bad()),
        }),
        (Val::I(x), Val::I(y)) => Val::I(binary_int(op, x, y, dtype).ok_or_else(bad)?),
        (Val::F(x), Val::F(y)) if dtype == DType::F64 => Val::F(binary_f64(op, x, y).ok_or_else(bad)?),
        (Val::F(x), Val::F(y)) => {
            let r = binary_f32(op, x as f32, y as f32).ok_or_else(bad)?;
            if dtype == DType::F32 { Val::F(r as f64) } else { Val::F(round_half(dtype, r)) }
        }
        _ => return Err(bad()),
    })
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
                let i = self.checked_index(*index, size, *status, *check, mem)?.unwrap_or(0);
                mem.read(self.buf(*buf)?, self.eval(base) + i * self.eval(stride))?
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
                    let init = match (op, dtype) {
                        (ReduceOp::Sum, _) => Val::I(0).cast(*dtype),
                        (ReduceOp::Max, d) if d.is_float() => Val::F(f64::NEG_INFINITY),
                        (ReduceOp::Max, DType::I32) => Val::I(i32::MIN as i64),
                        (ReduceOp::Max, DType::I64) => Val::I(i64::MIN),
                        (ReduceOp::Max, d) => return Err(unsupported("max accumulator", *d)),
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
