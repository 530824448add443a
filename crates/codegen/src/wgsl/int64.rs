//! 64-bit integers in WGSL, which has none: an `i64` is a `vec2<u32>` (`x` the low word, `y` the
//! high word, two's complement), the same eight bytes as a little-endian `i64` on the host, so
//! buffers upload and download unchanged. These are the helper functions the shaders call for
//! the arithmetic that does not work word by word (`and`, `or`, `not`, `==` and `select` do).
//! Every result is exact and wraps as Rust's `wrapping_*` do; `air::scalar` is the reference.

/// `a + b` (the carry out of the low word goes into the high word).
pub(super) const I64_ADD: &str = "fn k_addl(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}
";

/// `a - b`.
pub(super) const I64_SUB: &str = "fn k_subl(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}
";

/// `a * b`: the full 64-bit product of the low words from 16-bit halves, plus the cross terms
/// (only their low words reach the result).
pub(super) const I64_MUL: &str = "fn k_mul32(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((p00 & 0xffffu) | (mid << 16u), a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}

fn k_mull(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let p = k_mul32(a.x, b.x);
    return vec2<u32>(p.x, p.y + a.x * b.y + a.y * b.x);
}
";

/// Signed `a < b`.
pub(super) const I64_LT: &str = "fn k_ltl(a: vec2<u32>, b: vec2<u32>) -> bool {
    let ah = bitcast<i32>(a.y);
    let bh = bitcast<i32>(b.y);
    return ah < bh || (ah == bh && a.x < b.x);
}
";

/// Unsigned quotient and remainder (`d != 0`; one word each when both fit in 32 bits, else
/// 64 rounds of shift-and-subtract), and the magnitude of a signed value (`|MIN|` is `2^63`,
/// right as an unsigned value).
pub(super) const I64_DIVMOD: &str = "struct KDivModL {
    q: vec2<u32>,
    r: vec2<u32>,
}

fn k_udivmodl(n: vec2<u32>, d: vec2<u32>) -> KDivModL {
    if (n.y == 0u && d.y == 0u) {
        return KDivModL(vec2<u32>(n.x / d.x, 0u), vec2<u32>(n.x % d.x, 0u));
    }
    var q = vec2<u32>(0u, 0u);
    var r = vec2<u32>(0u, 0u);
    for (var i: i32 = 63; i >= 0; i -= 1) {
        let hi = i >= 32;
        let s = u32(i) & 31u;
        let bit = (select(n.x, n.y, hi) >> s) & 1u;
        r = vec2<u32>((r.x << 1u) | bit, (r.y << 1u) | (r.x >> 31u));
        if (r.y > d.y || (r.y == d.y && r.x >= d.x)) {
            r = k_subl(r, d);
            if (hi) { q.y = q.y | (1u << s); } else { q.x = q.x | (1u << s); }
        }
    }
    return KDivModL(q, r);
}

fn k_absl(a: vec2<u32>) -> vec2<u32> {
    return select(a, k_subl(vec2<u32>(0u, 0u), a), bitcast<i32>(a.y) < 0);
}
";

/// `a / b` truncated toward zero; 0 for `b = 0` (reported by a check the kernel carries);
/// `MIN / -1` wraps to `MIN`.
pub(super) const I64_DIV: &str = "fn k_divl(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    if (b.x == 0u && b.y == 0u) { return vec2<u32>(0u, 0u); }
    let q = k_udivmodl(k_absl(a), k_absl(b)).q;
    let negative = (bitcast<i32>(a.y) < 0) != (bitcast<i32>(b.y) < 0);
    return select(q, k_subl(vec2<u32>(0u, 0u), q), negative);
}
";

/// `a % b` with the sign of `a`; 0 for `b = 0`.
pub(super) const I64_MOD: &str = "fn k_modl(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    if (b.x == 0u && b.y == 0u) { return vec2<u32>(0u, 0u); }
    let r = k_udivmodl(k_absl(a), k_absl(b)).r;
    return select(r, k_subl(vec2<u32>(0u, 0u), r), bitcast<i32>(a.y) < 0);
}
";

/// `i64 -> f32`, rounded to nearest even without trusting the driver's integer conversion: the
/// magnitude is shifted so its top bit is bit 63, the upper 24 bits are the significand, rounded
/// up when the bits below are over half, or exactly half with an odd significand; `ldexp` then
/// scales exactly.
pub(super) const I64_TO_F32: &str = "fn k_l2f(a: vec2<u32>) -> f32 {
    let negative = bitcast<i32>(a.y) < 0;
    let m = select(a, k_subl(vec2<u32>(0u, 0u), a), negative);
    if (m.x == 0u && m.y == 0u) { return 0.0f; }
    var lz: u32;
    var top: u32;
    var rest: u32;
    if (m.y == 0u) {
        lz = 32u + countLeadingZeros(m.x);
        top = m.x << (lz - 32u);
        rest = 0u;
    } else {
        lz = countLeadingZeros(m.y);
        if (lz == 0u) {
            top = m.y;
            rest = m.x;
        } else {
            top = (m.y << lz) | (m.x >> (32u - lz));
            rest = m.x << lz;
        }
    }
    let low = top & 0xffu;
    var mant = top >> 8u;
    if (low > 0x80u || (low == 0x80u && (rest != 0u || (mant & 1u) == 1u))) {
        mant = mant + 1u;
    }
    let f = ldexp(f32(mant), 40 - i32(lz));
    return select(f, -f, negative);
}
";

/// `f32 -> i64`: truncates toward zero, saturates, NaN gives 0 (Rust's `as`). Beyond `2^32` a
/// float is a multiple of `2^9`, so splitting it at `2^32` with `ldexp` and `floor` is exact.
pub(super) const F32_TO_I64: &str = "fn k_f2l(x: f32) -> vec2<u32> {
    if (k_isnan(x)) { return vec2<u32>(0u, 0u); }
    if (x >= bitcast<f32>(0x5f000000u)) { return vec2<u32>(0xffffffffu, 0x7fffffffu); }
    if (x <= bitcast<f32>(0xdf000000u)) { return vec2<u32>(0u, 0x80000000u); }
    let a = trunc(abs(x));
    var m = vec2<u32>(0u, 0u);
    if (a < 4294967296.0f) {
        m = vec2<u32>(u32(a), 0u);
    } else {
        let hi = floor(ldexp(a, -32));
        m = vec2<u32>(u32(a - ldexp(hi, 32)), u32(hi));
    }
    return select(m, k_subl(vec2<u32>(0u, 0u), m), x < 0.0f);
}
";
