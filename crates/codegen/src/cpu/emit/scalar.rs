//! Scalar instruction lowering: index expressions, registers and constants, kir instructions,
//! casts, unary and binary ops.

use air::{BinaryOp, DType, Scalar, UnaryOp};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{ConstantData, InstBuilder, Value, types};
use lower::kir::{IExpr, Inst, Reg};

use super::{ConstVal, Emitter, IndexOp, Indexed, Val, acc_ty, const_for, scalar_ty, unsupported, vector_ty};
use crate::cpu::helpers::Helper;
use crate::cpu::math::SIN_FAST_LIMIT;
use crate::error::{CodegenError, Result};

impl<'f> Emitter<'_, 'f> {
    pub(super) fn iexpr(&mut self, e: &IExpr) -> Result<Value> {
        Ok(match e {
            IExpr::Const(c) => self.iconst(types::I64, *c),
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
                self.numbered(IndexOp::Add, a, u64::from(b.as_u32()))
            }
            IExpr::Mul(a, b) => {
                let (a, b) = (self.iexpr(a)?, self.iexpr(b)?);
                self.numbered(IndexOp::Mul, a, u64::from(b.as_u32()))
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
    pub(super) fn floor_divmod(&mut self, a: Value, d: &IExpr, div: bool) -> Result<Value> {
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
    pub(super) fn euclid_fixup(&mut self, a: Value, d: Value, div: bool) -> Value {
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

    pub(super) fn reg(&mut self, r: Reg) -> Result<Val> {
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

    pub(super) fn scalar_constant(&mut self, s: Scalar, d: DType) -> Value {
        let ty = scalar_ty(d);
        match const_for(s, d) {
            ConstVal::Int(i) => self.iconst(ty, i),
            ConstVal::F32(x) => self.consts.get(&mut self.b, ty, x.to_bits() as u64),
            ConstVal::F64(x) => self.consts.get(&mut self.b, ty, x.to_bits()),
        }
    }

    pub(super) fn constant(&mut self, s: Scalar, d: DType) -> Result<Val> {
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

    pub(super) fn emit_inst(&mut self, d: DType, inst: &Inst) -> Result<Val> {
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
                // A half result rounds to storage after every op, as the interpreter's does
                // (halves never run in vector loops).
                Ok(val(self.round_half(d, v)))
            }
            Inst::Binary(op, a, b) => {
                let (da, db) = (self.info.reg(*a)?, self.info.reg(*b)?);
                if da != db {
                    return Err(CodegenError::Invalid(format!("{} of {a}: {da} and {b}: {db}", op.name())));
                }
                let (va, vb) = (self.reg(*a)?, self.reg(*b)?);
                let v = self.binary(*op, da, va.v, vb.v)?;
                Ok(val(self.round_half(d, v)))
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
                let (ad, op) = self.info.acc(*acc)?;
                let var =
                    *self.accs.get(acc).ok_or_else(|| CodegenError::Invalid(format!("{acc} read before its init")))?;
                if vector {
                    // A lane-wise accumulator of the vector body (`analysis::vector_plan`), in
                    // the register's own type.
                    if self.partials.contains_key(acc) || ad != d {
                        return Err(CodegenError::Invalid(format!("read {acc} in a vector loop")));
                    }
                    return Ok(val(self.b.use_var(var)));
                }
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

    /// A scalar register's value (data-dependent accesses and checks only run in scalar loops).
    pub(super) fn scalar_reg(&mut self, r: Reg) -> Result<Value> {
        let v = self.reg(r)?;
        if v.vector {
            return Err(CodegenError::Invalid(format!("{r} is a vector where a scalar is needed")));
        }
        Ok(v.v)
    }

    /// The value of an integer (or bool) register widened to i64.
    pub(super) fn index_value(&mut self, r: Reg) -> Result<Value> {
        let v = self.scalar_reg(r)?;
        Ok(match self.b.func.dfg.value_type(v) {
            types::I64 => v,
            types::I8 => self.b.ins().uextend(types::I64, v),
            types::I32 => self.b.ins().sextend(types::I64, v),
            ty => return Err(CodegenError::Invalid(format!("{r} of type {ty} used as an index"))),
        })
    }

    pub(super) fn cast(&mut self, from: DType, to: DType, v: Value) -> Result<Value> {
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

    pub(super) fn unary(&mut self, op: UnaryOp, d: DType, x: Value) -> Result<Value> {
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
    pub(super) fn sin_f32(&mut self, x: Value, vector: bool) -> Value {
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

    pub(super) fn binary(&mut self, op: BinaryOp, d: DType, a: Value, b: Value) -> Result<Value> {
        let ty = self.b.func.dfg.value_type(a);
        let vector = ty.is_vector();
        if d.is_float() {
            let f64 = ty.lane_type() == types::F64;
            return Ok(match op {
                BinaryOp::Add => self.b.ins().fadd(a, b),
                BinaryOp::Sub => self.b.ins().fsub(a, b),
                BinaryOp::Mul => self.b.ins().fmul(a, b),
                BinaryOp::Div => self.b.ins().fdiv(a, b),
                BinaryOp::Max => self.math(ty).min_max(a, b, true),
                BinaryOp::Min => self.math(ty).min_max(a, b, false),
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
    pub(super) fn int_divmod(&mut self, a: Value, b: Value, div: bool) -> Value {
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
