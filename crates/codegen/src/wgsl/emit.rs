//! Loop kernels as WGSL: expressions, statements, helper functions, and the three launch shapes
//! (grid-stride, workgroup reduction, single invocation).

use std::collections::BTreeSet;

use rustc_hash::FxHashMap as HashMap;
use std::fmt::Write as _;

use air::{BinaryOp, DType, ReduceOp, Scalar, UnaryOp};
use lower::kir::{Acc, Access, IExpr, Inst, LoopKernel, Param, Reg, Stmt, Var};

use super::float64;
use super::int64::{F32_TO_I64, I64_ADD, I64_DIV, I64_DIVMOD, I64_LT, I64_MOD, I64_MUL, I64_SUB, I64_TO_F32};
use super::{Dispatch, ELEMENTWISE_WG, REDUCE_WG, WG_REDUCE_MIN, WgslKernel, unsupported_dtype};
use crate::error::{CodegenError, Result};

/// Helper functions a shader may need; each is emitted once, only when used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Helper {
    IsNan,
    MaxF,
    MinF,
    DivI,
    ModF,
    ModI,
    IndexDiv,
    IndexMod,
    Pow,
    Erf,
    F2I,
    /// 64-bit integers as `vec2<u32>` (low word, high word); see the module docs of `wgsl`.
    AddL,
    SubL,
    MulL,
    LtL,
    DivModL,
    DivL,
    ModL,
    L2F,
    F2L,
    /// 64-bit floats (naga's `f64`); see `float64.rs`.
    IsNanD,
    IlogbD,
    TruncD,
    MaxD,
    MinD,
    ModD,
    D2I,
    D2F,
    L2D,
    D2L,
    ExpCoreD,
    Exp2D,
    ExpD,
    Log2D,
    SinD,
    ErfD,
    PowD,
}

impl Helper {
    fn source(self) -> &'static str {
        match self {
            Helper::IsNan => {
                "fn k_isnan(x: f32) -> bool {\n    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;\n}\n"
            }
            Helper::MaxF => {
                "fn k_maxf(a: f32, b: f32) -> f32 {\n    if (k_isnan(a) || k_isnan(b)) { return bitcast<f32>(0x7fc00000u); }\n    if (a == b) { return bitcast<f32>(bitcast<u32>(a) & bitcast<u32>(b)); }\n    return select(b, a, a > b);\n}\n"
            }
            Helper::MinF => {
                "fn k_minf(a: f32, b: f32) -> f32 {\n    if (k_isnan(a) || k_isnan(b)) { return bitcast<f32>(0x7fc00000u); }\n    if (a == b) { return bitcast<f32>(bitcast<u32>(a) | bitcast<u32>(b)); }\n    return select(b, a, a < b);\n}\n"
            }
            Helper::DivI => {
                "fn k_divi(a: i32, b: i32) -> i32 {\n    if (b == 0) { return 0; }\n    if (b == -1) { return -a; }\n    return a / b;\n}\n"
            }
            // WGSL's float `%` is `a - b * trunc(a / b)`: inexact for large quotients and NaN for
            // `b = inf`. C `fmod` is exact: subtract the largest `|b| * 2^k <= r` until `r < |b|`
            // (each subtraction is exact by Sterbenz's lemma; at most ~280 rounds for f32).
            Helper::ModF => {
                "fn k_modf(a: f32, b: f32) -> f32 {\n    let x = abs(a);\n    let y = abs(b);\n    if (k_isnan(a) || k_isnan(b) || y == 0.0 || x > bitcast<f32>(0x7f7fffffu)) { return bitcast<f32>(0x7fc00000u); }\n    if (x < y) { return a; }\n    let ey = frexp(y).exp;\n    var r = x;\n    for (var i = 0; i < 300 && r >= y; i++) {\n        var s = ldexp(y, frexp(r).exp - ey);\n        if (s > r) { s = s * 0.5f; }\n        r = r - s;\n    }\n    return select(r, -r, a < 0.0f);\n}\n"
            }
            Helper::ModI => {
                "fn k_modi(a: i32, b: i32) -> i32 {\n    if (b == 0 || b == -1) { return 0; }\n    return a % b;\n}\n"
            }
            Helper::IndexDiv => "fn k_idx_div(a: i32, b: i32) -> i32 {\n    return select(a / b, 0, b == 0);\n}\n",
            Helper::IndexMod => "fn k_idx_mod(a: i32, b: i32) -> i32 {\n    return select(a % b, 0, b == 0);\n}\n",
            Helper::Pow => {
                "fn k_pow(a: f32, b: f32) -> f32 {\n    if (b == 0.0 || a == 1.0) { return 1.0; }\n    if (k_isnan(a) || k_isnan(b)) { return bitcast<f32>(0x7fc00000u); }\n    let m = exp2(b * log2(abs(a)));\n    if (a < 0.0) {\n        if (trunc(b) != b) { return bitcast<f32>(0x7fc00000u); }\n        let odd = (b - 2.0 * floor(b * 0.5)) == 1.0;\n        return select(m, -m, odd);\n    }\n    return m;\n}\n"
            }
            Helper::Erf => {
                "fn k_erf(x: f32) -> f32 {\n    let a = abs(x);\n    if (a < 0.5) {\n        let z = x * x;\n        return x * (1.1283791671 + z * (-0.3761263890 + z * (0.1128379167 + z * (-0.0268661707 + z * (0.0052239776 + z * -0.0008548327)))));\n    }\n    let t = 1.0 / (1.0 + 0.3275911 * a);\n    let p = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t;\n    let y = 1.0 - p * exp(-a * a);\n    return select(y, -y, x < 0.0);\n}\n"
            }
            Helper::F2I => {
                "fn k_f2i(x: f32) -> i32 {\n    if (k_isnan(x)) { return 0; }\n    if (x >= 2147483648.0) { return 2147483647; }\n    if (x <= -2147483648.0) { return bitcast<i32>(0x80000000u); }\n    return i32(x);\n}\n"
            }
            Helper::AddL => I64_ADD,
            Helper::SubL => I64_SUB,
            Helper::MulL => I64_MUL,
            Helper::LtL => I64_LT,
            Helper::DivModL => I64_DIVMOD,
            Helper::DivL => I64_DIV,
            Helper::ModL => I64_MOD,
            Helper::L2F => I64_TO_F32,
            Helper::F2L => F32_TO_I64,
            Helper::IsNanD => float64::IS_NAN,
            Helper::IlogbD => float64::ILOGB,
            Helper::TruncD => float64::TRUNC,
            Helper::MaxD => float64::MAX,
            Helper::MinD => float64::MIN,
            Helper::ModD => float64::MOD,
            Helper::D2I => float64::TO_I32,
            Helper::D2F => float64::TO_F32,
            Helper::L2D => float64::FROM_I64,
            Helper::D2L => float64::TO_I64,
            Helper::ExpCoreD => float64::EXP_CORE,
            Helper::Exp2D => float64::EXP2,
            Helper::ExpD => float64::EXP,
            Helper::Log2D => float64::LOG2,
            Helper::SinD => float64::SIN,
            Helper::ErfD => float64::ERF,
            Helper::PowD => float64::POW,
        }
    }

    fn deps(self) -> &'static [Helper] {
        match self {
            Helper::MaxF | Helper::MinF | Helper::F2I | Helper::Pow | Helper::ModF => &[Helper::IsNan],
            Helper::DivModL => &[Helper::SubL, Helper::LtL],
            Helper::DivL | Helper::ModL => &[Helper::DivModL, Helper::SubL, Helper::LtL],
            Helper::F2L => &[Helper::IsNan, Helper::SubL],
            Helper::L2F => &[Helper::SubL],
            Helper::MaxD | Helper::MinD | Helper::D2I | Helper::D2F => &[Helper::IsNanD],
            Helper::D2L => &[Helper::IsNanD, Helper::TruncD],
            Helper::Exp2D => &[Helper::IsNanD, Helper::ExpCoreD],
            Helper::ExpD => &[Helper::ExpCoreD],
            Helper::ModD | Helper::Log2D | Helper::SinD => &[Helper::IsNanD, Helper::IlogbD],
            Helper::ErfD => &[Helper::IsNanD, Helper::IlogbD, Helper::TruncD, Helper::ExpD, Helper::ExpCoreD],
            Helper::PowD => {
                &[Helper::IsNanD, Helper::IlogbD, Helper::TruncD, Helper::Exp2D, Helper::ExpCoreD, Helper::Log2D]
            }
            _ => &[],
        }
    }
}

/// The WGSL type of a register of `dtype`.
pub(super) fn reg_type(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::I32 => Ok("i32"),
        DType::Bool => Ok("bool"),
        DType::I64 => Ok("vec2<u32>"),
        DType::F64 => Ok("f64"),
        other => Err(unsupported_dtype(other)),
    }
}

/// The WGSL element type of a buffer of `dtype`.
pub(super) fn storage_type(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::I32 => Ok("i32"),
        DType::Bool => Ok("u32"),
        DType::I64 => Ok("vec2<u32>"),
        DType::F64 => Ok("f64"),
        other => Err(unsupported_dtype(other)),
    }
}

/// A constant of `dtype` as a WGSL expression (non-finite and subnormal floats as bit casts).
pub(super) fn constant(value: Scalar, dtype: DType) -> Result<String> {
    Ok(match dtype {
        DType::F32 => {
            let x = value.as_f64() as f32;
            if x.is_finite() && (x == 0.0 || x.abs() >= f32::MIN_POSITIVE) {
                let text = format!("{x:?}");
                if text.contains(['.', 'e']) { format!("{text}f") } else { format!("{text}.0f") }
            } else {
                format!("bitcast<f32>(0x{:08x}u)", x.to_bits())
            }
        }
        DType::F64 => {
            let x = value.as_f64();
            if x.is_nan() {
                float64::NAN.to_string()
            } else if x.is_infinite() {
                if x > 0.0 { float64::INF.to_string() } else { format!("(-{})", float64::INF) }
            } else {
                // `{:?}` is the shortest text that parses back to the same value (subnormals too).
                let text = format!("{x:?}");
                if text.contains(['.', 'e']) { format!("{text}lf") } else { format!("{text}.0lf") }
            }
        }
        DType::I32 => {
            let v = value.as_i64() as i32;
            if v == i32::MIN { "bitcast<i32>(0x80000000u)".to_string() } else { format!("{v}i") }
        }
        DType::Bool => value.as_bool().to_string(),
        DType::I64 => {
            let v = value.as_i64() as u64;
            format!("vec2<u32>({}u, {}u)", v as u32, (v >> 32) as u32)
        }
        other => return Err(unsupported_dtype(other)),
    })
}

fn identity(op: ReduceOp, dtype: DType) -> Result<String> {
    match (op, dtype) {
        (ReduceOp::Sum, DType::F32 | DType::I32 | DType::I64 | DType::F64) => constant(Scalar::Int(0), dtype),
        (ReduceOp::Max, DType::F32) => Ok("bitcast<f32>(0xff800000u)".to_string()),
        (ReduceOp::Max, DType::F64) => Ok(format!("(-{})", float64::INF)),
        (ReduceOp::Max, DType::I32) => constant(Scalar::Int(i32::MIN as i64), dtype),
        (ReduceOp::Max, DType::I64) => constant(Scalar::Int(i64::MIN), dtype),
        (_, other) => Err(CodegenError::Unsupported(format!("{} reduction of {other} on wgpu", op.name()))),
    }
}

/// The name of symbol `n` in the `syms` uniform array.
fn sym(n: u32) -> String {
    format!("syms[{}][{}]", n / 4, n % 4)
}

/// Renders index expressions and code for one shader.
pub(super) struct Writer<'a> {
    params: &'a [Param],
    /// Per parameter: declared `read_write` (written, or forced by the caller).
    pub(super) read_write: Vec<bool>,
    regs: HashMap<Reg, DType>,
    accs: HashMap<Acc, (DType, ReduceOp)>,
    helpers: BTreeSet<Helper>,
    /// Parameters used as the status buffer: declared `array<atomic<i32>>`.
    status: BTreeSet<u32>,
    pub(super) body: String,
}

impl<'a> Writer<'a> {
    pub(super) fn new(params: &'a [Param], force_read_write: &[bool]) -> Writer<'a> {
        let read_write = params
            .iter()
            .enumerate()
            .map(|(i, p)| p.access == Access::Write || force_read_write.get(i).copied().unwrap_or(false))
            .collect();
        Writer {
            params,
            read_write,
            regs: HashMap::default(),
            accs: HashMap::default(),
            helpers: BTreeSet::new(),
            status: BTreeSet::new(),
            body: String::new(),
        }
    }

    fn helper(&mut self, h: Helper) {
        self.helpers.insert(h);
        for &d in h.deps() {
            self.helpers.insert(d);
        }
    }

    pub(super) fn line(&mut self, depth: usize, text: &str) {
        for _ in 0..depth {
            self.body.push_str("    ");
        }
        self.body.push_str(text);
        self.body.push('\n');
    }

    /// An index expression as an `i32` WGSL expression.
    pub(super) fn iexpr(&mut self, e: &IExpr) -> Result<String> {
        Ok(match e {
            IExpr::Const(c) => {
                let v = i32::try_from(*c).map_err(|_| {
                    CodegenError::Unsupported(format!("index constant {c} does not fit in i32 on wgpu"))
                })?;
                if v == i32::MIN { "bitcast<i32>(0x80000000u)".to_string() } else { v.to_string() }
            }
            IExpr::Var(v) => v.to_string(),
            IExpr::Sym(n) => sym(*n),
            IExpr::Add(a, b) => format!("({} + {})", self.iexpr(a)?, self.iexpr(b)?),
            IExpr::Mul(a, b) => format!("{} * {}", self.iexpr_factor(a)?, self.iexpr_factor(b)?),
            IExpr::Div(a, b) | IExpr::Mod(a, b) => {
                let is_div = matches!(e, IExpr::Div(..));
                let (x, y) = (self.iexpr(a)?, self.iexpr(b)?);
                match b.as_const() {
                    Some(c) if c > 0 => format!("({x} {} {y})", if is_div { "/" } else { "%" }),
                    _ => {
                        let h = if is_div { Helper::IndexDiv } else { Helper::IndexMod };
                        self.helper(h);
                        format!("{}({x}, {y})", if is_div { "k_idx_div" } else { "k_idx_mod" })
                    }
                }
            }
            IExpr::Lt(..) | IExpr::And(..) => format!("select(0, 1, {})", self.cond(e)?),
        })
    }

    /// A factor of a product: parenthesized unless it is atomic.
    fn iexpr_factor(&mut self, e: &IExpr) -> Result<String> {
        let s = self.iexpr(e)?;
        Ok(match e {
            IExpr::Add(..) | IExpr::Const(_) | IExpr::Var(_) | IExpr::Sym(_) | IExpr::Mul(..) => s,
            _ => format!("({s})"),
        })
    }

    /// An index expression used as a condition (`!= 0`), as a WGSL `bool`.
    fn cond(&mut self, e: &IExpr) -> Result<String> {
        Ok(match e {
            IExpr::Const(c) => (*c != 0).to_string(),
            IExpr::Lt(a, b) => format!("({} < {})", self.iexpr(a)?, self.iexpr(b)?),
            IExpr::And(a, b) => format!("({} && {})", self.cond(a)?, self.cond(b)?),
            other => format!("({} != 0)", self.iexpr(other)?),
        })
    }

    fn reg(&self, r: Reg) -> Result<DType> {
        self.regs.get(&r).copied().ok_or_else(|| CodegenError::Invalid(format!("{r} is used before it is defined")))
    }

    fn param(&self, buf: u32) -> Result<&'a Param> {
        self.params.get(buf as usize).ok_or_else(|| CodegenError::Invalid(format!("buffer b{buf} is not a parameter")))
    }

    fn load(&mut self, buf: u32, index: &IExpr, dtype: DType) -> Result<String> {
        let p = self.param(buf)?;
        if p.dtype != dtype {
            return Err(CodegenError::Invalid(format!("load of {dtype} from b{buf}, a {} buffer", p.dtype)));
        }
        let idx = self.iexpr(index)?;
        Ok(match dtype {
            DType::Bool => format!("(b{buf}[{idx}] != 0u)"),
            _ => format!("b{buf}[{idx}]"),
        })
    }

    /// An `i32` or `i64` index register checked against `0..size`: emits the check (recording
    /// `check` in the status buffer on failure) and returns the WGSL expressions of the failure
    /// condition and of the safe `i32` index (0 when out of range).
    fn checked_index(
        &mut self,
        index: Reg,
        size: &IExpr,
        status: u32,
        check: u32,
        depth: usize,
    ) -> Result<(String, String)> {
        let n = self.iexpr(size)?;
        let (bad, narrow) = match self.reg(index)? {
            DType::I32 => (format!("({index} < 0 || {index} >= {n})"), index.to_string()),
            // Negative values have a non-zero high word; `size` is never negative.
            DType::I64 => (format!("({index}.y != 0u || {index}.x >= u32({n}))"), format!("bitcast<i32>({index}.x)")),
            other => return Err(CodegenError::Invalid(format!("index {index} of dtype {other}"))),
        };
        self.line(depth, &format!("if {bad} {{"));
        self.record_failure(status, check, index, depth + 1)?;
        self.line(depth, "}");
        Ok((bad.clone(), format!("select({narrow}, 0, {bad})")))
    }

    /// The low and high `i32` words of an integer register, as the status buffer holds them.
    fn value_words(&self, value: Reg) -> Result<(String, String)> {
        Ok(match self.reg(value)? {
            DType::I32 => (value.to_string(), format!("select(0, -1, {value} < 0)")),
            DType::I64 => (format!("bitcast<i32>({value}.x)"), format!("bitcast<i32>({value}.y)")),
            other => return Err(CodegenError::Invalid(format!("check value {value} of dtype {other}"))),
        })
    }

    /// Sets the status buffer's word 0 to `check + 1` if it is 0 (the first failure wins), then
    /// the value words.
    fn record_failure(&mut self, status: u32, check: u32, value: Reg, depth: usize) -> Result<()> {
        let p = self.param(status)?;
        if p.dtype != DType::I32 || p.access != Access::Write {
            return Err(CodegenError::Invalid(format!("status buffer b{status} is not a written i32 parameter")));
        }
        self.status.insert(status);
        let code = check as i64 + 1;
        let (lo, hi) = self.value_words(value)?;
        // A weak compare-exchange may fail spuriously: retry while the word is still 0.
        self.line(depth, "loop {");
        self.line(depth + 1, &format!("let r = atomicCompareExchangeWeak(&b{status}[0], 0, {code});"));
        self.line(depth + 1, "if r.exchanged {");
        self.line(depth + 2, &format!("atomicStore(&b{status}[1], {lo});"));
        self.line(depth + 2, &format!("atomicStore(&b{status}[2], {hi});"));
        self.line(depth + 2, "break;");
        self.line(depth + 1, "}");
        self.line(depth + 1, "if r.old_value != 0 { break; }");
        self.line(depth, "}");
        Ok(())
    }

    fn load_at(&mut self, buf: u32, idx: &str, dtype: DType) -> Result<String> {
        let p = self.param(buf)?;
        if p.dtype != dtype {
            return Err(CodegenError::Invalid(format!("load of {dtype} from b{buf}, a {} buffer", p.dtype)));
        }
        Ok(match dtype {
            DType::Bool => format!("(b{buf}[{idx}] != 0u)"),
            _ => format!("b{buf}[{idx}]"),
        })
    }

    fn inst(&mut self, dtype: DType, inst: &Inst) -> Result<String> {
        Ok(match inst {
            Inst::Gather { .. } => return Err(CodegenError::Invalid("gather outside a let".into())),
            Inst::Load { buf, index, mask, other } => match mask {
                None => self.load(*buf, index, dtype)?,
                Some(m) => {
                    // `select` evaluates both operands, and WGSL rejects a constant negative
                    // index when the shader is created. A constant index below 0 can only be
                    // read under a mask that is false there (a view of padding alone): read
                    // element 0 instead; the mask picks `other` either way.
                    let safe;
                    let index = match index.as_const() {
                        Some(i) if i < 0 => {
                            safe = IExpr::Const(0);
                            &safe
                        }
                        _ => index,
                    };
                    let value = self.load(*buf, index, dtype)?;
                    format!("select({}, {value}, {})", constant(*other, dtype)?, self.cond(m)?)
                }
            },
            Inst::Const(s) => constant(*s, dtype)?,
            Inst::Index(e) => {
                let i = self.iexpr(e)?;
                match dtype {
                    DType::F32 => format!("f32({i})"),
                    DType::F64 => format!("f64({i})"),
                    DType::I32 => i,
                    DType::I64 => widen_i32(&i),
                    DType::Bool => self.cond(e)?,
                    other => return Err(unsupported_dtype(other)),
                }
            }
            Inst::Unary(op, r) => self.unary(*op, *r)?,
            Inst::Binary(op, a, b) => self.binary(*op, *a, *b)?,
            Inst::Where(c, a, b) => {
                if self.reg(*c)? != DType::Bool {
                    return Err(CodegenError::Invalid(format!("where condition {c} is not bool")));
                }
                format!("select({b}, {a}, {c})")
            }
            Inst::Cast(r) => self.cast(*r, dtype)?,
            Inst::ReadAcc(acc) => {
                self.accs.get(acc).ok_or_else(|| CodegenError::Invalid(format!("{acc} is read before it is set")))?;
                acc.to_string()
            }
        })
    }

    fn unary(&mut self, op: UnaryOp, r: Reg) -> Result<String> {
        let t = self.reg(r)?;
        let bad = || CodegenError::Unsupported(format!("{} of {t} on wgpu", op.name()));
        Ok(match (op, t) {
            (UnaryOp::Neg, DType::F32 | DType::I32 | DType::F64) => format!("(-{r})"),
            (UnaryOp::Not, DType::I32 | DType::I64) => format!("(~{r})"),
            (UnaryOp::Neg, DType::I64) => {
                self.helper(Helper::SubL);
                format!("k_subl(vec2<u32>(0u, 0u), {r})")
            }
            (UnaryOp::Not, DType::Bool) => format!("(!{r})"),
            (_, DType::F32) => match op {
                UnaryOp::Exp2 => format!("exp2({r})"),
                UnaryOp::Log2 => format!("log2({r})"),
                UnaryOp::Sin => format!("sin({r})"),
                UnaryOp::Sqrt => format!("sqrt({r})"),
                UnaryOp::Recip => format!("(1.0f / {r})"),
                UnaryOp::Trunc => format!("trunc({r})"),
                UnaryOp::Erf => {
                    self.helper(Helper::Erf);
                    format!("k_erf({r})")
                }
                _ => return Err(bad()),
            },
            (_, DType::F64) => {
                let h = match op {
                    UnaryOp::Sqrt => return Ok(format!("sqrt({r})")),
                    UnaryOp::Recip => return Ok(format!("(1.0lf / {r})")),
                    UnaryOp::Trunc => (Helper::TruncD, "k_truncd"),
                    UnaryOp::Exp2 => (Helper::Exp2D, "k_exp2d"),
                    UnaryOp::Log2 => (Helper::Log2D, "k_log2d"),
                    UnaryOp::Sin => (Helper::SinD, "k_sind"),
                    UnaryOp::Erf => (Helper::ErfD, "k_erfd"),
                    _ => return Err(bad()),
                };
                self.helper(h.0);
                format!("{}({r})", h.1)
            }
            _ => return Err(bad()),
        })
    }

    fn binary(&mut self, op: BinaryOp, a: Reg, b: Reg) -> Result<String> {
        let t = self.reg(a)?;
        if self.reg(b)? != t {
            return Err(CodegenError::Invalid(format!("{} of {a} and {b} with different dtypes", op.name())));
        }
        let bad = || CodegenError::Unsupported(format!("{} of {t} on wgpu", op.name()));
        let mut call = |h: Helper, name: &str| {
            self.helper(h);
            format!("{name}({a}, {b})")
        };
        use BinaryOp::*;
        use DType::{Bool, F32, F64, I32, I64};
        Ok(match (op, t) {
            (Add, F64) => format!("({a} + {b})"),
            (Sub, F64) => format!("({a} - {b})"),
            (Mul, F64) => format!("({a} * {b})"),
            (Div, F64) => format!("({a} / {b})"),
            (Mod, F64) => call(Helper::ModD, "k_modd"),
            (Max, F64) => call(Helper::MaxD, "k_maxd"),
            (Min, F64) => call(Helper::MinD, "k_mind"),
            (Pow, F64) => call(Helper::PowD, "k_powd"),
            (CmpLt, F64) => format!("({a} < {b})"),
            (CmpNe, F64) => format!("(!({a} == {b}))"),
            (Add, I64) => call(Helper::AddL, "k_addl"),
            (Sub, I64) => call(Helper::SubL, "k_subl"),
            (Mul, I64) => call(Helper::MulL, "k_mull"),
            (Div, I64) => call(Helper::DivL, "k_divl"),
            (Mod, I64) => call(Helper::ModL, "k_modl"),
            (Max, I64) => {
                self.helper(Helper::LtL);
                format!("select({a}, {b}, k_ltl({a}, {b}))")
            }
            (Min, I64) => {
                self.helper(Helper::LtL);
                format!("select({a}, {b}, k_ltl({b}, {a}))")
            }
            (CmpLt, I64) => call(Helper::LtL, "k_ltl"),
            (CmpEq, I64) => format!("all({a} == {b})"),
            (CmpNe, I64) => format!("any({a} != {b})"),
            (And, I64) => format!("({a} & {b})"),
            (Or, I64) => format!("({a} | {b})"),
            (Add, F32 | I32) => format!("({a} + {b})"),
            (Sub, F32 | I32) => format!("({a} - {b})"),
            (Mul, F32 | I32) => format!("({a} * {b})"),
            (Div, F32) => format!("({a} / {b})"),
            (Div, I32) => call(Helper::DivI, "k_divi"),
            (Mod, F32) => call(Helper::ModF, "k_modf"),
            (Mod, I32) => call(Helper::ModI, "k_modi"),
            (Max, F32) => call(Helper::MaxF, "k_maxf"),
            (Min, F32) => call(Helper::MinF, "k_minf"),
            (Max, I32) => format!("max({a}, {b})"),
            (Min, I32) => format!("min({a}, {b})"),
            (Max, Bool) | (Or, Bool) => format!("({a} || {b})"),
            (Min, Bool) | (And, Bool) => format!("({a} && {b})"),
            (And, I32) => format!("({a} & {b})"),
            (Or, I32) => format!("({a} | {b})"),
            (Pow, F32) => call(Helper::Pow, "k_pow"),
            (CmpLt, F32 | I32) => format!("({a} < {b})"),
            (CmpLt, Bool) => format!("(!{a} && {b})"),
            (CmpEq, _) => format!("({a} == {b})"),
            (CmpNe, F32) => format!("(!({a} == {b}))"),
            (CmpNe, _) => format!("({a} != {b})"),
            _ => return Err(bad()),
        })
    }

    fn cast(&mut self, r: Reg, to: DType) -> Result<String> {
        let from = self.reg(r)?;
        use DType::{Bool, F32, F64, I32, I64};
        let mut call = |h: Helper, name: &str| {
            self.helper(h);
            format!("{name}({r})")
        };
        Ok(match (from, to) {
            (a, b) if a == b => r.to_string(),
            (F32 | I32, F64) => format!("f64({r})"),
            (Bool, F64) => format!("select(0.0lf, 1.0lf, {r})"),
            (I64, F64) => call(Helper::L2D, "k_l2d"),
            (F64, F32) => call(Helper::D2F, "k_d2f"),
            (F64, I32) => call(Helper::D2I, "k_d2i"),
            (F64, I64) => call(Helper::D2L, "k_d2l"),
            (F64, Bool) => format!("(!({r} == 0.0lf))"),
            (I32, I64) => widen_i32(&r.to_string()),
            (Bool, I64) => format!("vec2<u32>(select(0u, 1u, {r}), 0u)"),
            (I64, I32) => format!("bitcast<i32>({r}.x)"),
            (I64, Bool) => format!("any({r} != vec2<u32>(0u, 0u))"),
            (I64, F32) => call(Helper::L2F, "k_l2f"),
            (F32, I64) => call(Helper::F2L, "k_f2l"),
            (I32, F32) => format!("f32({r})"),
            (Bool, F32) => format!("select(0.0f, 1.0f, {r})"),
            (Bool, I32) => format!("select(0i, 1i, {r})"),
            (F32, I32) => call(Helper::F2I, "k_f2i"),
            (F32, Bool) => format!("((bitcast<u32>({r}) & 0x7fffffffu) != 0u)"),
            (I32, Bool) => format!("({r} != 0i)"),
            (a, b) => return Err(unsupported_dtype(if reg_type(a).is_err() { a } else { b })),
        })
    }

    /// `acc op value` for an accumulator of `dtype`.
    fn combine(&mut self, op: ReduceOp, dtype: DType, acc: &str, value: &str) -> Result<String> {
        Ok(match (op, dtype) {
            (ReduceOp::Sum, DType::F32 | DType::I32 | DType::F64) => format!("{acc} + {value}"),
            (ReduceOp::Max, DType::F64) => {
                self.helper(Helper::MaxD);
                format!("k_maxd({acc}, {value})")
            }
            (ReduceOp::Max, DType::F32) => {
                self.helper(Helper::MaxF);
                format!("k_maxf({acc}, {value})")
            }
            (ReduceOp::Max, DType::I32) => format!("max({acc}, {value})"),
            (ReduceOp::Sum, DType::I64) => {
                self.helper(Helper::AddL);
                format!("k_addl({acc}, {value})")
            }
            (ReduceOp::Max, DType::I64) => {
                self.helper(Helper::LtL);
                format!("select({acc}, {value}, k_ltl({acc}, {value}))")
            }
            (_, other) => return Err(CodegenError::Unsupported(format!("{} reduction of {other} on wgpu", op.name()))),
        })
    }

    fn stmt(&mut self, s: &Stmt, depth: usize) -> Result<()> {
        match s {
            Stmt::Let { reg, dtype, inst } => {
                let ty = reg_type(*dtype)?;
                let value = match inst {
                    Inst::Gather { buf, base, index, stride, size, status, check } => {
                        let (_, i) = self.checked_index(*index, size, *status, *check, depth)?;
                        let (b, st) = (self.iexpr(base)?, self.iexpr_factor(stride)?);
                        self.load_at(*buf, &format!("{b} + {i} * {st}"), *dtype)?
                    }
                    _ => self.inst(*dtype, inst)?,
                };
                if self.regs.insert(*reg, *dtype).is_some() {
                    return Err(CodegenError::Invalid(format!("{reg} is defined twice")));
                }
                self.line(depth, &format!("let {reg}: {ty} = {value};"));
            }
            Stmt::Loop { var, extent, body, .. } => {
                let e = self.iexpr(extent)?;
                self.line(depth, &format!("for (var {var}: i32 = 0; {var} < {e}; {var} += 1) {{"));
                self.stmts(body, depth + 1)?;
                self.line(depth, "}");
            }
            Stmt::AccInit { acc, dtype, op } => {
                let init = identity(*op, *dtype)?;
                self.accs.insert(*acc, (*dtype, *op));
                self.line(depth, &format!("var {acc}: {} = {init};", reg_type(*dtype)?));
            }
            Stmt::AccUpdate { acc, value } => {
                let &(dtype, op) =
                    self.accs.get(acc).ok_or_else(|| CodegenError::Invalid(format!("{acc} is updated before init")))?;
                if self.reg(*value)? != dtype {
                    return Err(CodegenError::Invalid(format!("{acc} ({dtype}) updated with {value}")));
                }
                let v = self.combine(op, dtype, &acc.to_string(), &value.to_string())?;
                self.line(depth, &format!("{acc} = {v};"));
            }
            Stmt::Store { buf, index, value } => {
                let p = self.param(*buf)?;
                if p.access != Access::Write {
                    return Err(CodegenError::Invalid(format!("store to b{buf}, a read-only parameter")));
                }
                let t = self.reg(*value)?;
                if t != p.dtype {
                    return Err(CodegenError::Invalid(format!("store of {t} into b{buf}, a {} buffer", p.dtype)));
                }
                let idx = self.iexpr(index)?;
                let v = if t == DType::Bool { format!("select(0u, 1u, {value})") } else { value.to_string() };
                self.line(depth, &format!("b{buf}[{idx}] = {v};"));
            }
            Stmt::ScatterAdd { buf, base, index, stride, size, value, status, check } => {
                let p = self.param(*buf)?;
                let t = self.reg(*value)?;
                if p.access != Access::Write
                    || t != p.dtype
                    || !matches!(t, DType::F32 | DType::I32 | DType::I64 | DType::F64)
                {
                    return Err(CodegenError::Invalid(format!("scatter_add of {value}: {t} into b{buf}")));
                }
                let (bad, i) = self.checked_index(*index, size, *status, *check, depth)?;
                let (b, st) = (self.iexpr(base)?, self.iexpr_factor(stride)?);
                let sum = self.combine(ReduceOp::Sum, t, &format!("b{buf}[at]"), &value.to_string())?;
                self.line(depth, &format!("if !{bad} {{"));
                self.line(depth + 1, &format!("let at = {b} + {i} * {st};"));
                self.line(depth + 1, &format!("b{buf}[at] = {sum};"));
                self.line(depth, "}");
            }
            Stmt::Check { cond, value, status, check } => {
                if self.reg(*cond)? != DType::Bool || !matches!(self.reg(*value)?, DType::I32 | DType::I64) {
                    return Err(CodegenError::Invalid(format!("check of {cond} with value {value}")));
                }
                self.line(depth, &format!("if {cond} {{"));
                self.record_failure(*status, *check, *value, depth + 1)?;
                self.line(depth, "}");
            }
        }
        Ok(())
    }

    fn stmts(&mut self, stmts: &[Stmt], depth: usize) -> Result<()> {
        stmts.iter().try_for_each(|s| self.stmt(s, depth))
    }

    /// The module text: bindings, workgroup arrays, helpers, then `entry` (already in `body`).
    pub(super) fn finish(&self, n_syms: u32, shared: &str) -> Result<(String, u32)> {
        let vec4s = n_syms.div_ceil(4).max(1);
        let mut out = String::new();
        let _ = writeln!(out, "@group(0) @binding(0) var<uniform> syms: array<vec4<i32>, {vec4s}>;");
        for (i, p) in self.params.iter().enumerate() {
            let access = if self.read_write[i] { "read_write" } else { "read" };
            let elem = if self.status.contains(&(i as u32)) {
                "atomic<i32>".to_string()
            } else {
                storage_type(p.dtype)?.to_string()
            };
            let _ = writeln!(out, "@group(0) @binding({}) var<storage, {access}> b{i}: array<{elem}>;", i + 1);
        }
        out.push_str(shared);
        for h in &self.helpers {
            out.push('\n');
            out.push_str(h.source());
        }
        out.push('\n');
        out.push_str(&self.body);
        Ok((out, vec4s))
    }
}

/// A block of the form "accumulator inits and loop-invariant lets, one reduce loop nest, epilogue".
struct ReduceShape<'s> {
    pre: &'s [Stmt],
    /// The reduce loops, outermost first: variable, extent, and the non-loop statements of its body.
    levels: Vec<(Var, &'s IExpr, Vec<&'s Stmt>)>,
    post: &'s [Stmt],
    /// The accumulators the nest updates (all initialized in `pre`).
    accs: Vec<(Acc, DType, ReduceOp)>,
}

impl ReduceShape<'_> {
    /// Elements reduced per output, when constant.
    fn const_len(&self) -> Option<i64> {
        self.levels.iter().try_fold(1i64, |n, (_, e, _)| e.as_const().map(|c| n.saturating_mul(c)))
    }
}

fn reduce_shape(stmts: &[Stmt]) -> Option<ReduceShape<'_>> {
    let loops: Vec<usize> =
        stmts.iter().enumerate().filter(|(_, s)| matches!(s, Stmt::Loop { .. })).map(|(i, _)| i).collect();
    let [at] = loops[..] else { return None };
    let (pre, post) = (&stmts[..at], &stmts[at + 1..]);
    if pre.iter().any(|s| matches!(s, Stmt::Store { .. } | Stmt::AccUpdate { .. })) {
        return None;
    }
    let inits: HashMap<Acc, (DType, ReduceOp)> = pre
        .iter()
        .filter_map(|s| match s {
            Stmt::AccInit { acc, dtype, op } => Some((*acc, (*dtype, *op))),
            _ => None,
        })
        .collect();
    let mut levels = Vec::new();
    let mut accs = Vec::new();
    let mut current = &stmts[at];
    loop {
        let Stmt::Loop { var, extent, body, .. } = current else { return None };
        if levels.iter().any(|(v, _, _)| extent.uses(*v)) {
            return None;
        }
        let mut plain = Vec::new();
        let mut inner = None;
        for (i, s) in body.iter().enumerate() {
            match s {
                Stmt::Let { .. } => plain.push(s),
                Stmt::AccUpdate { acc, .. } => {
                    let &(dtype, op) = inits.get(acc)?;
                    accs.push((*acc, dtype, op));
                    plain.push(s);
                }
                // A nested loop must close its level (nothing after it may run per outer step).
                Stmt::Loop { .. } if i + 1 == body.len() => inner = Some(s),
                _ => return None,
            }
        }
        let has_update = plain.iter().any(|s| matches!(s, Stmt::AccUpdate { .. }));
        levels.push((*var, extent, plain));
        match inner {
            Some(s) if !has_update => current = s,
            Some(_) => return None,
            None => break,
        }
    }
    if accs.is_empty() {
        return None;
    }
    accs.sort_by_key(|a| a.0);
    accs.dedup_by_key(|a| a.0);
    Some(ReduceShape { pre, levels, post, accs })
}

fn long_enough(shape: &ReduceShape<'_>) -> bool {
    shape.const_len().is_none_or(|n| n >= WG_REDUCE_MIN)
}

/// Emits a workgroup reduction of `shape` at `depth` (inside the row loop, if any).
fn emit_wg_reduce(w: &mut Writer<'_>, shape: &ReduceShape<'_>, depth: usize) -> Result<()> {
    w.stmts(shape.pre, depth)?;
    let wg = REDUCE_WG;
    if let [(var, extent, body)] = &shape.levels[..] {
        let e = w.iexpr(extent)?;
        w.line(depth, &format!("for (var {var}: i32 = lid; {var} < {e}; {var} += {wg}) {{"));
        for s in body {
            w.stmt(s, depth + 1)?;
        }
        w.line(depth, "}");
    } else {
        let mut names = Vec::new();
        for (var, extent, _) in &shape.levels {
            let e = w.iexpr(extent)?;
            let name = format!("n_{var}");
            w.line(depth, &format!("let {name}: i32 = {e};"));
            names.push(name);
        }
        w.line(depth, &format!("let n_reduce: i32 = {};", names.join(" * ")));
        w.line(depth, &format!("for (var f: i32 = lid; f < n_reduce; f += {wg}) {{"));
        for (l, (var, _, _)) in shape.levels.iter().enumerate() {
            let inner: Vec<&str> = names[l + 1..].iter().map(|s| s.as_str()).collect();
            let quotient = if inner.is_empty() { "f".to_string() } else { format!("(f / ({}))", inner.join(" * ")) };
            let value = if l == 0 { quotient } else { format!("({quotient} % {})", names[l]) };
            w.line(depth + 1, &format!("let {var}: i32 = {value};"));
        }
        for (_, _, body) in &shape.levels {
            for s in body {
                w.stmt(s, depth + 1)?;
            }
        }
        w.line(depth, "}");
    }
    for &(acc, dtype, op) in &shape.accs {
        w.line(depth, &format!("red_{acc}[lid] = {acc};"));
        w.line(depth, "workgroupBarrier();");
        w.line(depth, &format!("for (var s: i32 = {}; s > 0; s = s >> 1u) {{", wg / 2));
        let v = w.combine(op, dtype, &format!("red_{acc}[lid]"), &format!("red_{acc}[lid + s]"))?;
        w.line(depth + 1, &format!("if (lid < s) {{ red_{acc}[lid] = {v}; }}"));
        w.line(depth + 1, "workgroupBarrier();");
        w.line(depth, "}");
    }
    w.line(depth, "if (lid == 0) {");
    for &(acc, _, _) in &shape.accs {
        w.line(depth + 1, &format!("{acc} = red_{acc}[0];"));
    }
    w.stmts(shape.post, depth + 1)?;
    w.line(depth, "}");
    Ok(())
}

fn shared_arrays(shape: &ReduceShape<'_>) -> Result<String> {
    let mut s = String::new();
    for &(acc, dtype, _) in &shape.accs {
        let _ = writeln!(s, "var<workgroup> red_{acc}: array<{}, {REDUCE_WG}>;", reg_type(dtype)?);
    }
    Ok(s)
}

pub(super) fn loop_kernel(k: &LoopKernel, force_read_write: &[bool]) -> Result<WgslKernel> {
    let mut w = Writer::new(&k.params, force_read_write);
    let (shared, dispatch, workgroup_size, strategy) = match k.body.as_slice() {
        [Stmt::Loop { var, extent, parallel: true, body }] => {
            if extent.uses(*var) {
                return Err(CodegenError::Invalid(format!("the extent of {var} uses {var}")));
            }
            match reduce_shape(body).filter(long_enough) {
                Some(shape) => {
                    let e = w.iexpr(extent)?;
                    w.line(0, &format!("@compute @workgroup_size({REDUCE_WG})"));
                    w.line(0, "fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {");
                    w.line(1, "let lid = i32(lid3.x);");
                    w.line(1, &format!("for (var {var}: i32 = i32(wid.x); {var} < {e}; {var} += i32(nwg.x)) {{"));
                    emit_wg_reduce(&mut w, &shape, 2)?;
                    w.line(1, "}");
                    w.line(0, "}");
                    (shared_arrays(&shape)?, Dispatch::Rows { rows: extent.clone() }, REDUCE_WG, "workgroup-reduce")
                }
                None => {
                    // The parallel loop and the loops nested alone inside it (each the only
                    // statement of its parent, extents free of the loop variables): one flat
                    // grid-stride index over their product, split back into the variables, so
                    // that a small parallel extent (a batch of 1) does not leave one invocation
                    // the whole nest (slow everywhere, and silently cut short on lavapipe, which
                    // ends an invocation's loops after 65,535 iterations).
                    // (A constant extent of 0 or less stays out: its `% 0` would not validate,
                    // and the loop runs nothing anyway.)
                    let empty = |e: &lower::kir::IExpr| matches!(e, lower::kir::IExpr::Const(c) if *c <= 0);
                    let mut nest: Vec<(lower::kir::Var, &lower::kir::IExpr)> = vec![(*var, extent)];
                    let mut inner: &[Stmt] = body;
                    while let [Stmt::Loop { var: v, extent: e, body: b, .. }] = inner {
                        if nest.iter().any(|&(u, _)| e.uses(u)) || e.uses(*v) || empty(e) || empty(extent) {
                            break;
                        }
                        nest.push((*v, e));
                        inner = b;
                    }
                    let total =
                        nest.iter().skip(1).fold(extent.clone(), |t, (_, e)| lower::kir::IExpr::mul(t, (*e).clone()));
                    let wg = ELEMENTWISE_WG;
                    w.line(0, &format!("@compute @workgroup_size({wg})"));
                    w.line(0, "fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {");
                    w.line(1, &format!("let stride = i32(nwg.x) * {wg};"));
                    if nest.len() == 1 {
                        let e = w.iexpr(extent)?;
                        w.line(1, &format!("for (var {var}: i32 = i32(gid.x); {var} < {e}; {var} += stride) {{"));
                    } else {
                        let t = w.iexpr(&total)?;
                        w.line(1, &format!("for (var flat: i32 = i32(gid.x); flat < {t}; flat += stride) {{"));
                        w.line(2, "var rest = flat;");
                        for (i, &(v, e)) in nest.iter().enumerate().rev() {
                            if i == 0 {
                                w.line(2, &format!("let {v} = rest;"));
                            } else {
                                let e = w.iexpr(e)?;
                                w.line(2, &format!("let {v} = rest % ({e});"));
                                w.line(2, &format!("rest = rest / ({e});"));
                            }
                        }
                    }
                    w.stmts(inner, 2)?;
                    w.line(1, "}");
                    w.line(0, "}");
                    (String::new(), Dispatch::Grid { extent: total, per_workgroup: wg }, wg, "grid")
                }
            }
        }
        body => match reduce_shape(body).filter(long_enough) {
            Some(shape) => {
                w.line(0, &format!("@compute @workgroup_size({REDUCE_WG})"));
                w.line(0, "fn main(@builtin(local_invocation_id) lid3: vec3<u32>) {");
                w.line(1, "let lid = i32(lid3.x);");
                emit_wg_reduce(&mut w, &shape, 1)?;
                w.line(0, "}");
                (shared_arrays(&shape)?, Dispatch::Single, REDUCE_WG, "workgroup-reduce")
            }
            None => {
                w.line(0, "@compute @workgroup_size(1)");
                w.line(0, "fn main() {");
                w.stmts(body, 1)?;
                w.line(0, "}");
                (String::new(), Dispatch::Single, 1, "single")
            }
        },
    };
    let (source, sym_vec4s) = w.finish(k.n_syms, &shared)?;
    Ok(WgslKernel {
        source,
        entry: "main",
        sym_vec4s,
        read_write: w.read_write.clone(),
        dispatch,
        workgroup_size: [workgroup_size, 1, 1],
        strategy,
        uses_f64: false,
    })
}

/// An `i32` WGSL expression sign-extended to an `i64` (`vec2<u32>`).
fn widen_i32(x: &str) -> String {
    format!("vec2<u32>(bitcast<u32>(i32({x})), select(0u, 0xffffffffu, i32({x}) < 0))")
}
