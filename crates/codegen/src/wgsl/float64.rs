//! 64-bit floats in WGSL (naga's `f64`, behind wgpu's `SHADER_F64`): the helper functions the
//! shaders call where a native operation would not match `air::scalar`. Vulkan's GLSL.std.450
//! `Exp2`, `Log2`, `Sin` and `Pow` take no 64-bit floats, so `exp2`, `log2`, `sin`, `erf` and
//! `pow` are written here from `+ - * /`, `floor` and `ldexp` (which do take them): range
//! reduction plus a polynomial, each within a few ULP of libm (the sweeps of
//! `f64_transcendentals_are_within_a_few_ulps_of_libm` in `crates/runtime/tests/gpu/wgpu_ops.rs`
//! pin the bounds). Nothing relies on error-free transformations (two-sum and the like): Mesa's
//! NIR (lavapipe) treats float ops as reassociable and folds them away.
//!
//! No helper reads a float's bits (WGSL cannot bitcast an `f64`): NaN is `!(x == x)` (naga
//! emits an ordered compare), the sign of a zero is the sign of `1 / x`, and infinities are
//! `f32` infinities widened. Where a product must be exact (the pieces of `pi / 2`, a square
//! split in halves) both factors have at most 26 significant bits, so a driver that contracts a
//! multiply and an add into an `fma` computes the same value.

/// `+inf` and NaN as `f64` expressions (an `f64` literal must be finite).
pub(super) const INF: &str = "f64(bitcast<f32>(0x7f800000u))";
pub(super) const NAN: &str = "f64(bitcast<f32>(0x7fc00000u))";

/// NaN test without the bits.
pub(super) const IS_NAN: &str = "fn k_isnand(x: f64) -> bool {
    return !(x == x);
}
";

/// `floor(log2(x))` for a finite `x > 0`, subnormals included: a binary search over the
/// exponents with exact powers of two (naga's `frexp` of an `f64` returns an `i64` exponent,
/// which would need `SHADER_INT64` as well).
pub(super) const ILOGB: &str = "fn k_ilogbd(x: f64) -> i32 {
    var a = x;
    var bias = 0;
    if (a < 2.2250738585072014e-308lf) {
        a = a * 18014398509481984.0lf;
        bias = 54;
    }
    var lo = -1022;
    var hi = 1023;
    while (lo < hi) {
        let mid = (lo + hi + 1) >> 1u;
        if (a >= ldexp(1.0lf, mid)) { lo = mid; } else { hi = mid - 1; }
    }
    return lo - bias;
}
";

/// `trunc` from `floor` (lavapipe's `f64` `trunc` returns non-integers such as -2147483648.5
/// unchanged); keeps the sign of zero and NaN.
pub(super) const TRUNC: &str = "fn k_truncd(x: f64) -> f64 {
    return select(-floor(-x), floor(x), x >= 0.0lf);
}
";

/// `max`: NaN if either is NaN; `max(-0, +0) = +0`.
pub(super) const MAX: &str = "fn k_maxd(a: f64, b: f64) -> f64 {
    if (k_isnand(a) || k_isnand(b)) { return f64(bitcast<f32>(0x7fc00000u)); }
    if (a == b) { return select(a, b, 1.0lf / a < 0.0lf); }
    return select(b, a, a > b);
}
";

/// `min`: NaN if either is NaN; `min(-0, +0) = -0`.
pub(super) const MIN: &str = "fn k_mind(a: f64, b: f64) -> f64 {
    if (k_isnand(a) || k_isnand(b)) { return f64(bitcast<f32>(0x7fc00000u)); }
    if (a == b) { return select(a, b, 1.0lf / a > 0.0lf); }
    return select(b, a, a < b);
}
";

/// C `fmod`, exact: subtract the largest `|b| * 2^k <= r` until `r < |b|` (each subtraction is
/// exact; at most one round per binary order of magnitude, about 2100).
pub(super) const MOD: &str = "fn k_modd(a: f64, b: f64) -> f64 {
    let x = abs(a);
    let y = abs(b);
    if (k_isnand(a) || k_isnand(b) || y == 0.0lf || x > 1.7976931348623157e308lf) { return f64(bitcast<f32>(0x7fc00000u)); }
    if (x < y) { return a; }
    let ey = k_ilogbd(y);
    var r = x;
    for (var i = 0; i < 2200 && r >= y; i++) {
        // `y * 2^d` in three exact steps: `d` reaches 2097 (a subnormal `y`), past `ldexp`'s range.
        let d = k_ilogbd(r) - ey;
        var s = ldexp(ldexp(ldexp(y, d / 3), d / 3), d - 2 * (d / 3));
        if (s > r) { s = s * 0.5lf; }
        r = r - s;
    }
    return select(r, -r, a < 0.0lf);
}
";

/// `f64 -> i32` as Rust's `as`: truncates, saturates, NaN gives 0.
pub(super) const TO_I32: &str = "fn k_d2i(x: f64) -> i32 {
    if (k_isnand(x)) { return 0; }
    if (x >= 2147483648.0lf) { return 2147483647; }
    if (x <= -2147483648.0lf) { return bitcast<i32>(0x80000000u); }
    return i32(x);
}
";

/// `f64 -> f32` as Rust's `as`: rounds to nearest even; from halfway between `f32::MAX` and
/// `2^128` up the result is infinite (the driver's conversion is not trusted out of range).
pub(super) const TO_F32: &str = "fn k_d2f(x: f64) -> f32 {
    if (k_isnand(x)) { return bitcast<f32>(0x7fc00000u); }
    if (x >= 3.4028235677973366e38lf) { return bitcast<f32>(0x7f800000u); }
    if (x <= -3.4028235677973366e38lf) { return bitcast<f32>(0xff800000u); }
    return f32(x);
}
";

/// `i64 -> f64` (rounded to nearest even): the high word times `2^32` is exact, so the one
/// addition is the only rounding. Words convert through `i32` (lavapipe's `u32 -> f64` and
/// `f64 -> u32` conversions saturate at `2^31`).
pub(super) const FROM_I64: &str = "fn k_l2d(a: vec2<u32>) -> f64 {
    let lo = f64(bitcast<i32>(a.x)) + select(0.0lf, 4294967296.0lf, bitcast<i32>(a.x) < 0);
    return f64(bitcast<i32>(a.y)) * 4294967296.0lf + lo;
}
";

/// `f64 -> i64`: truncates, saturates at `±2^63`, NaN gives 0. The truncated value splits
/// exactly into `hi * 2^32 + lo` with `floor`.
pub(super) const TO_I64: &str = "fn k_d2l(x: f64) -> vec2<u32> {
    if (k_isnand(x)) { return vec2<u32>(0u, 0u); }
    if (x >= 9223372036854775808.0lf) { return vec2<u32>(0xffffffffu, 0x7fffffffu); }
    if (x <= -9223372036854775808.0lf) { return vec2<u32>(0u, 0x80000000u); }
    let t = k_truncd(x);
    let hi = floor(t * 2.3283064365386963e-10lf);
    let lo = t - hi * 4294967296.0lf;
    let lo32 = bitcast<u32>(i32(select(lo, lo - 4294967296.0lf, lo >= 2147483648.0lf)));
    return vec2<u32>(lo32, bitcast<u32>(i32(hi)));
}
";

/// `e^r` for `|r| <= ln(2) / 2` (Taylor to degree 13: truncation below 2^-57), and `p * 2^n`
/// for `n` down to -1075 as two multiplications by exact normal powers of two (one `ldexp`
/// could leave its range), so a subnormal result is rounded once.
pub(super) const EXP_CORE: &str = "fn k_exp_poly(r: f64) -> f64 {
    var p = 1.6059043836821613e-10lf;
    p = 2.08767569878681e-9lf + r * p;
    p = 2.505210838544172e-8lf + r * p;
    p = 2.755731922398589e-7lf + r * p;
    p = 2.7557319223985893e-6lf + r * p;
    p = 2.48015873015873e-5lf + r * p;
    p = 0.0001984126984126984lf + r * p;
    p = 0.001388888888888889lf + r * p;
    p = 0.008333333333333333lf + r * p;
    p = 0.041666666666666664lf + r * p;
    p = 0.16666666666666666lf + r * p;
    p = 0.5lf + r * p;
    p = 1.0lf + r * p;
    return 1.0lf + r * p;
}

fn k_scaled(p: f64, n: i32) -> f64 {
    let n1 = n / 2;
    return p * ldexp(1.0lf, n1) * ldexp(1.0lf, n - n1);
}
";

/// `2^x`: `x = n + f` with `|f| <= 1/2`, `2^f = e^(f ln 2)`.
pub(super) const EXP2: &str = "fn k_exp2d(x: f64) -> f64 {
    if (k_isnand(x)) { return x; }
    if (x >= 1024.0lf) { return f64(bitcast<f32>(0x7f800000u)); }
    if (x <= -1075.0lf) { return 0.0lf; }
    let n = floor(x + 0.5lf);
    return k_scaled(k_exp_poly((x - n) * 0.6931471805599453lf), i32(n));
}
";

/// `e^y` for finite `y` in `(-745, 709)` (what `erf` needs): `y = n ln 2 + r`, with `ln 2` in two
/// parts whose first has 32 bits, so `n * ln2_hi` is exact.
pub(super) const EXP: &str = "fn k_expd(y: f64) -> f64 {
    let n = floor(y * 1.4426950408889634lf + 0.5lf);
    let r = (y - n * 0.6931471803691238lf) - n * 1.9082149292705877e-10lf;
    return k_scaled(k_exp_poly(r), i32(n));
}
";

/// `log2(x)`: `x = f * 2^k` with `f` in `[sqrt(1/2), sqrt(2))`, `ln f = 2 atanh(s)`, `s = (f - 1) / (f + 1)`, the odd series to `s^23`.
pub(super) const LOG2: &str = "fn k_log2d(x: f64) -> f64 {
    if (k_isnand(x) || x < 0.0lf) { return f64(bitcast<f32>(0x7fc00000u)); }
    if (x == 0.0lf) { return -f64(bitcast<f32>(0x7f800000u)); }
    if (x > 1.7976931348623157e308lf) { return x; }
    var k = k_ilogbd(x);
    var f: f64;
    if (k < -1022) {
        f = ldexp(ldexp(x, 54), -k - 54);
    } else {
        f = ldexp(x, -k);
    }
    if (f > 1.4142135623730951lf) {
        f = f * 0.5lf;
        k = k + 1;
    }
    let s = (f - 1.0lf) / (f + 1.0lf);
    let z = s * s;
    var p = 1.0lf / 23.0lf;
    for (var d = 21; d > 1; d -= 2) {
        p = 1.0lf / f64(d) + z * p;
    }
    let s2 = 2.0lf * s;
    return f64(k) + (s2 + s2 * z * p) * 1.4426950408889634lf;
}
";

/// `sin(x)`. Arguments from `pi/4` up are reduced modulo `pi/2` exactly enough for every finite
/// double (Payne-Hanek) in integer arithmetic on doubles, so nothing depends on rounding errors
/// a driver may reassociate away (Mesa's NIR treats float ops as inexact and folds error-free
/// transformations such as two-sum): `|x| = X * 2^(24 e24)` with `X < 2^76` in four 24-bit limbs;
/// `2/pi` is 56 limbs of 24 bits (computed for this file from Machin's formula), so every
/// product of limbs is exact and lands on a 24-bit boundary of the binary point. Products worth
/// a multiple of 4 are skipped; the integer limb (mod 4) and six fraction limbs are carried
/// exactly; a fraction of one half or more is complemented (the quadrant rounds up). The
/// fraction times `pi/2` (four limbs) is summed from the smallest term, and the quadrant picks
/// the Taylor sine or cosine (to degree 19 and 20) of `r`, `|r| <= pi/4`.
pub(super) const SIN: &str = "const K_2OPI = array<u32, 56>(0xa2f983u, 0x6e4e44u, 0x1529fcu, 0x2757d1u, 0xf534ddu, 0xc0db62u, 0x95993cu, 0x439041u, 0xfe5163u, 0xabdebbu, 0xc561b7u, 0x246e3au, 0x424dd2u, 0xe00649u, 0x2eea09u, 0xd1921cu, 0xfe1debu, 0x1cb129u, 0xa73ee8u, 0x8235f5u, 0x2ebb44u, 0x84e99cu, 0x7026b4u, 0x5f7e41u, 0x3991d6u, 0x398353u, 0x39f49cu, 0x845f8bu, 0xbdf928u, 0x3b1ff8u, 0x97ffdeu, 0x05980fu, 0xef2f11u, 0x8b5a0au, 0x6d1f6du, 0x367ecfu, 0x27cb09u, 0xb74f46u, 0x3f669eu, 0x5fea2du, 0x7527bau, 0xc7ebe5u, 0xf17b3du, 0x0739f7u, 0x8a5292u, 0xea6bfbu, 0x5fb11fu, 0x8d5d08u, 0x560330u, 0x46fc7bu, 0x6babf0u, 0xcfbc20u, 0x9af436u, 0x1da9e3u, 0x91615eu, 0xe61b08u);

fn k_rem_pio2_q(x: array<f64, 4>, j: i32) -> f64 {
    var q = 0.0lf;
    for (var k = 0; k < 4; k++) {
        let i = j - k;
        if (i >= 0 && i < 56) { q = q + x[k] * f64(K_2OPI[i]); }
    }
    return q;
}

fn k_rem_pio2d(a: f64) -> vec2<f64> {
    let e0 = k_ilogbd(a) - 52;
    let e24 = select(e0 / 24, (e0 - 23) / 24, e0 < 0);
    let big = ldexp(a, -24 * e24);
    var x: array<f64, 4>;
    x[0] = floor(ldexp(big, -72));
    var rest = big - ldexp(x[0], 72);
    x[1] = floor(ldexp(rest, -48));
    rest = rest - ldexp(x[1], 48);
    x[2] = floor(ldexp(rest, -24));
    x[3] = rest - ldexp(x[2], 24);
    var m: array<f64, 7>;
    for (var f = 0; f < 7; f++) {
        m[f] = k_rem_pio2_q(x, e24 + 2 + f);
    }
    for (var f = 6; f > 0; f--) {
        let c = floor(ldexp(m[f], -24));
        m[f] = m[f] - ldexp(c, 24);
        m[f - 1] = m[f - 1] + c;
    }
    var n = m[0] - 4.0lf * floor(m[0] * 0.25lf);
    let negative = m[1] >= 8388608.0lf;
    if (negative) {
        n = n + 1.0lf;
        for (var f = 1; f < 6; f++) {
            m[f] = 16777215.0lf - m[f];
        }
        m[6] = 16777216.0lf - m[6];
        for (var f = 6; f > 1; f--) {
            let c = floor(ldexp(m[f], -24));
            m[f] = m[f] - ldexp(c, 24);
            m[f - 1] = m[f - 1] + c;
        }
    }
    let p = array<f64, 4>(1.0lf, 9576373.0lf, 4473553.0lf, 8677769.0lf);
    var r = 0.0lf;
    for (var u = 9; u > 0; u--) {
        var s = 0.0lf;
        for (var t = 0; t < 4; t++) {
            let f = u - t;
            if (f >= 1 && f <= 6) { s = s + m[f] * p[t]; }
        }
        r = r + ldexp(s, -24 * u);
    }
    return vec2<f64>(n - 4.0lf * floor(n * 0.25lf), select(r, -r, negative));
}

fn k_sin_kernel(r: f64) -> f64 {
    let z = r * r;
    var p = -8.22063524662433e-18lf;
    p = 2.8114572543455206e-15lf + z * p;
    p = -7.647163731819816e-13lf + z * p;
    p = 1.6059043836821613e-10lf + z * p;
    p = -2.505210838544172e-8lf + z * p;
    p = 2.7557319223985893e-6lf + z * p;
    p = -0.0001984126984126984lf + z * p;
    p = 0.008333333333333333lf + z * p;
    p = -0.16666666666666666lf + z * p;
    return r + r * z * p;
}

fn k_cos_kernel(r: f64) -> f64 {
    let z = r * r;
    var p = 4.110317623312165e-19lf;
    p = -1.5619206968586225e-16lf + z * p;
    p = 4.779477332387385e-14lf + z * p;
    p = -1.1470745597729725e-11lf + z * p;
    p = 2.08767569878681e-9lf + z * p;
    p = -2.755731922398589e-7lf + z * p;
    p = 2.48015873015873e-5lf + z * p;
    p = -0.001388888888888889lf + z * p;
    p = 0.041666666666666664lf + z * p;
    return (1.0lf - 0.5lf * z) + z * z * p;
}

fn k_sind(x: f64) -> f64 {
    let a = abs(x);
    if (k_isnand(x) || a > 1.7976931348623157e308lf) { return f64(bitcast<f32>(0x7fc00000u)); }
    if (a < 0.7853981633974483lf) { return k_sin_kernel(x); }
    let r = k_rem_pio2d(a);
    var v: f64;
    if (r.x == 0.0lf) {
        v = k_sin_kernel(r.y);
    } else if (r.x == 1.0lf) {
        v = k_cos_kernel(r.y);
    } else if (r.x == 2.0lf) {
        v = -k_sin_kernel(r.y);
    } else {
        v = -k_cos_kernel(r.y);
    }
    return select(v, -v, x < 0.0lf);
}
";

/// `erf(x)`: below 2^-28 `2x/sqrt(pi)`; below 1.25 the Taylor series; from 6 on `±1`; between,
/// `1 - erfc` with `erfc = e^(-x^2) / sqrt(pi) * CF`, the continued fraction
/// `1 / (x + (1/2) / (x + 1 / (x + (3/2) / ...)))` evaluated backwards from depth 250, and
/// `x^2` as an exact sum of two doubles (`x` split into 26-bit halves) so `e^(-x^2)` keeps its
/// precision.
pub(super) const ERF: &str = "fn k_erfd(x: f64) -> f64 {
    let a = abs(x);
    if (k_isnand(x)) { return x; }
    if (a < 3.725290298461914e-9lf) { return x * 1.1283791670955126lf; }
    if (a < 1.25lf) {
        let z = x * x;
        var term = x;
        var s = x;
        for (var n = 1; n < 45; n++) {
            term = -term * z / f64(n);
            s = s + term / f64(2 * n + 1);
        }
        return s * 1.1283791670955126lf;
    }
    if (a >= 6.0lf) { return select(1.0lf, -1.0lf, x < 0.0lf); }
    let z = a * a;
    let ex = k_ilogbd(a) + 1;
    let ah = ldexp(k_truncd(ldexp(a, 26 - ex)), ex - 26);
    let al = a - ah;
    let zl = ((ah * ah - z) + 2.0lf * ah * al) + al * al;
    var t = a;
    for (var k = 250; k > 0; k--) {
        t = a + (f64(k) * 0.5lf) / t;
    }
    let r = 1.0lf - k_expd(-z) * (1.0lf - zl) * 0.5641895835477563lf / t;
    return select(r, -r, x < 0.0lf);
}
";

/// `pow(a, b)` as libm's special cases have it (`pow(x, 0) = pow(1, y) = 1`, `pow(-1, ±inf) = 1`,
/// a negative finite base with a non-integer exponent is NaN, odd integer exponents keep the
/// sign of a negative base, `-0` included), otherwise `2^(b * log2 |a|)`.
pub(super) const POW: &str = "fn k_powd(a: f64, b: f64) -> f64 {
    if (b == 0.0lf || a == 1.0lf) { return 1.0lf; }
    if (k_isnand(a) || k_isnand(b)) { return f64(bitcast<f32>(0x7fc00000u)); }
    let b_inf = abs(b) > 1.7976931348623157e308lf;
    if (a == -1.0lf && b_inf) { return 1.0lf; }
    let m = k_exp2d(b * k_log2d(abs(a)));
    if (a < 0.0lf || (a == 0.0lf && 1.0lf / a < 0.0lf)) {
        if (k_truncd(b) != b) {
            let finite = a > -1.7976931348623157e308lf;
            return select(m, f64(bitcast<f32>(0x7fc00000u)), a < 0.0lf && finite);
        }
        let odd = !b_inf && (b - 2.0lf * floor(b * 0.5lf)) == 1.0lf;
        return select(m, -m, odd);
    }
    return m;
}
";
