//! Memory: addresses, loads and stores (masked, half-precision, contiguous vector), and the checked
//! data-dependent accesses of gather and scatter-add.

use air::{DType, Scalar};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value, types};
use lower::kir::{IExpr, Reg};

use super::{Emitter, IndexOp, Indexed, Val, scalar_ty, vector_ty};
use crate::cpu::helpers::Helper;
use crate::error::{CodegenError, Result};

impl<'f> Emitter<'_, 'f> {
    pub(super) fn addr(&mut self, buf: u32, index: &IExpr, dtype: DType) -> Result<Value> {
        let idx = self.iexpr(index)?;
        let shift = dtype.size_bytes().trailing_zeros();
        let off = if shift == 0 { idx } else { self.numbered(IndexOp::Shl, idx, u64::from(shift)) };
        let base = *self.bases.get(buf as usize).ok_or_else(|| CodegenError::Invalid(format!("buffer b{buf}")))?;
        Ok(self.numbered(IndexOp::Add, base, u64::from(off.as_u32())))
    }

    /// The byte offset of the current unrolled copy for a contiguous access of dtype `d` (every
    /// store, and every load that uses the vector variable, in a vector loop has coefficient 1).
    pub(super) fn contiguous_offset(&self, d: DType) -> i32 {
        (self.lane_offset * d.size_bytes() as i64) as i32
    }

    pub(super) fn param_dtype(&self, buf: u32) -> Result<DType> {
        self.k
            .params
            .get(buf as usize)
            .map(|p| p.dtype)
            .ok_or_else(|| CodegenError::Invalid(format!("buffer b{buf} out of range")))
    }

    pub(super) fn emit_store(&mut self, buf: u32, index: &IExpr, value: Reg) -> Result<()> {
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

    pub(super) fn emit_load(
        &mut self,
        d: DType,
        buf: u32,
        index: &IExpr,
        mask: Option<&IExpr>,
        other: Scalar,
    ) -> Result<Val> {
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
    pub(super) fn load_now(&mut self, d: DType, pd: DType, buf: u32, index: &IExpr, contiguous: bool) -> Result<Val> {
        if contiguous {
            let addr = self.addr(buf, index, pd)?;
            let ty = vector_ty(pd)?;
            let flags = self.flags;
            let off = self.contiguous_offset(pd);
            let stride2 = self.vec_var.and_then(|v| index.linear_coeff(v)) == Some(IExpr::Const(2));
            if !stride2 {
                let v = self.b.ins().load(ty, flags, addr, off);
                return Ok(Val { v, vector: true });
            }
            // Elements e, e+2, e+4, e+6 (4-byte lanes): lanes 0 and 2 of [e, e+4) and lanes 1
            // and 3 of [e+3, e+7), so nothing past the last element the lanes need is read.
            let size = pd.size_bytes() as i32;
            let lo = self.b.ins().load(ty, flags, addr, 2 * off);
            let hi = self.b.ins().load(ty, flags, addr, 2 * off + 3 * size);
            let v = self.pick_lanes(lo, hi, [0, 2, 5, 7]);
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

    pub(super) fn scalar_load(&mut self, d: DType, pd: DType, buf: u32, index: &IExpr) -> Result<Value> {
        let addr = self.addr(buf, index, pd)?;
        self.scalar_load_at(d, pd, addr)
    }

    /// In the current (cold) block: sets the status buffer `status` to `check + 1` if it is 0
    /// (an atomic compare-and-swap; the first failure of a run wins), and then stores the two
    /// halves of `value` after it; then jumps to `join`.
    pub(super) fn record_failure(
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
    /// `0..size`: a bad index records the failure and addresses `buf[base]` instead, which the
    /// caller must not touch (it need not exist). Also returns the failure condition.
    pub(super) fn checked_addr(&mut self, at: &Indexed<'_>) -> Result<(Value, Value)> {
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

    pub(super) fn emit_gather(&mut self, d: DType, at: &Indexed<'_>) -> Result<Val> {
        if self.vector() {
            return Err(CodegenError::Invalid("gather in a vector loop".into()));
        }
        let pd = self.param_dtype(at.buf)?;
        let (addr, bad) = self.checked_addr(at)?;
        // A bad index reads nothing and yields zero (the run fails with the recorded check):
        // the fallback element `buf[base]` need not exist (an index into an empty axis).
        let zero = self.constant(Scalar::Int(0).cast(d), d)?.v;
        let load = self.b.create_block();
        let join = self.b.create_block();
        let ty = self.b.func.dfg.value_type(zero);
        let v = self.b.append_block_param(join, ty);
        self.b.ins().brif(bad, join, &[zero.into()], load, &[]);
        self.b.switch_to_block(load);
        let loaded = self.scalar_load_at(d, pd, addr)?;
        self.b.ins().jump(join, &[loaded.into()]);
        self.b.switch_to_block(join);
        Ok(Val { v, vector: false })
    }

    /// `buf[base + i * stride] += value`, skipped (after recording the failure) for a bad index.
    pub(super) fn emit_scatter_add(&mut self, at: &Indexed<'_>, value: Reg) -> Result<()> {
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

    pub(super) fn scalar_load_at(&mut self, d: DType, pd: DType, addr: Value) -> Result<Value> {
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

    /// f16 bits (low 16 of an i32) to f32, exactly.
    pub(super) fn f16_widen(&mut self, bits: Value) -> Value {
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
    pub(super) fn bf16_bits(&mut self, x: Value) -> Value {
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
    pub(super) fn round_half(&mut self, d: DType, v: Value) -> Value {
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
}
