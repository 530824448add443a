//! The tiled matmul shader: 64x64 output tiles per 16x16 workgroup, a 4x4 register block per
//! thread, 16-deep K slices staged through workgroup memory. Strides and offsets come from the
//! kernel's `MatOperand`s, so transposed and batched operands need no copy. One shader text for
//! `f32` and `f64` (the element type is a parameter of the text; `f64` products accumulate in
//! `f64`).

use air::DType;
use lower::kir::{Access, MatmulKernel};

use super::emit::Writer;
use super::{Dispatch, MATMUL_TILE, WgslKernel};
use crate::error::{CodegenError, Result};

/// Depth of one K slice.
const TK: i64 = 16;

pub(super) fn matmul_kernel(k: &MatmulKernel, force_read_write: &[bool]) -> Result<WgslKernel> {
    let (ty, zero) = match k.dtype {
        DType::F32 => ("f32", "0.0f"),
        DType::F64 => ("f64", "0.0lf"),
        other => return Err(CodegenError::Unsupported(format!("matmul of {other} on wgpu (f32 and f64 only)"))),
    };
    for (name, o) in [("a", &k.a), ("b", &k.b), ("c", &k.c)] {
        let p = k.params.get(o.buf as usize).ok_or_else(|| {
            CodegenError::Invalid(format!("matmul operand {name} reads missing parameter b{}", o.buf))
        })?;
        if p.dtype != k.dtype {
            return Err(CodegenError::Invalid(format!("matmul operand {name} is {}", p.dtype)));
        }
    }
    if k.params[k.c.buf as usize].access != Access::Write {
        return Err(CodegenError::Invalid("matmul result parameter is read-only".into()));
    }
    let mut w = Writer::new(&k.params, force_read_write);
    let t = MATMUL_TILE;
    let mut ex = |e: &lower::kir::IExpr| w.iexpr(e);
    let (m, n, kk, batch) = (ex(&k.m)?, ex(&k.n)?, ex(&k.k)?, ex(&k.batch)?);
    let mut operand = |o: &lower::kir::MatOperand| -> Result<[String; 4]> {
        Ok([ex(&o.offset)?, ex(&o.batch_stride)?, ex(&o.row_stride)?, ex(&o.col_stride)?])
    };
    let [a_off, a_bs, a_rs, a_cs] = operand(&k.a)?;
    let [b_off, b_bs, b_rs, b_cs] = operand(&k.b)?;
    let [c_off, c_bs, c_rs, c_cs] = operand(&k.c)?;
    let (ab, bb, cb) = (k.a.buf, k.b.buf, k.c.buf);
    let loads = (t * TK) / 256;
    let shared =
        format!("var<workgroup> tile_a: array<{ty}, {}>;\nvar<workgroup> tile_b: array<{ty}, {}>;\n", t * TK, t * TK);
    let mut body = String::new();
    let mut l = |depth: usize, s: &str| {
        for _ in 0..depth {
            body.push_str("    ");
        }
        body.push_str(s);
        body.push('\n');
    };
    l(0, "@compute @workgroup_size(16, 16, 1)");
    l(
        0,
        "fn main(@builtin(local_invocation_index) lidx: u32, @builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {",
    );
    l(1, "let tx = i32(lid3.x);");
    l(1, "let ty = i32(lid3.y);");
    l(1, "let lid = i32(lidx);");
    l(1, &format!("let m: i32 = {m};"));
    l(1, &format!("let n: i32 = {n};"));
    l(1, &format!("let kk: i32 = {kk};"));
    l(1, &format!("let batch: i32 = {batch};"));
    l(1, "for (var bz: i32 = i32(wid.z); bz < batch; bz += i32(nwg.z)) {");
    l(2, &format!("let a_base = {a_off} + bz * {a_bs};"));
    l(2, &format!("let b_base = {b_off} + bz * {b_bs};"));
    l(2, &format!("let c_base = {c_off} + bz * {c_bs};"));
    l(2, &format!("for (var row0: i32 = i32(wid.y) * {t}; row0 < m; row0 += i32(nwg.y) * {t}) {{"));
    l(3, &format!("for (var col0: i32 = i32(wid.x) * {t}; col0 < n; col0 += i32(nwg.x) * {t}) {{"));
    for i in 0..4 {
        l(4, &format!("var acc{i} = vec4<{ty}>();"));
    }
    l(4, &format!("for (var k0: i32 = 0; k0 < kk; k0 += {TK}) {{"));
    l(5, &format!("for (var q: i32 = 0; q < {loads}; q += 1) {{"));
    l(6, "let e = lid + 256 * q;");
    l(6, &format!("let ar = row0 + e / {TK};"));
    l(6, &format!("let ak = k0 + e % {TK};"));
    l(6, &format!("var av = {zero};"));
    l(6, &format!("if (ar < m && ak < kk) {{ av = b{ab}[a_base + ar * {a_rs} + ak * {a_cs}]; }}"));
    l(6, &format!("tile_a[(e % {TK}) * {t} + e / {TK}] = av;"));
    l(6, &format!("let bk = k0 + e / {t};"));
    l(6, &format!("let bc = col0 + e % {t};"));
    l(6, &format!("var bv = {zero};"));
    l(6, &format!("if (bk < kk && bc < n) {{ bv = b{bb}[b_base + bk * {b_rs} + bc * {b_cs}]; }}"));
    l(6, "tile_b[e] = bv;");
    l(5, "}");
    l(5, "workgroupBarrier();");
    l(5, &format!("for (var p: i32 = 0; p < {TK}; p += 1) {{"));
    l(6, &format!("let ra = p * {t} + ty;"));
    l(6, &format!("let rb = p * {t} + tx;"));
    l(6, &format!("let bq = vec4<{ty}>(tile_b[rb], tile_b[rb + 16], tile_b[rb + 32], tile_b[rb + 48]);"));
    for i in 0..4 {
        l(6, &format!("acc{i} += tile_a[ra + {}] * bq;", 16 * i));
    }
    l(5, "}");
    l(5, "workgroupBarrier();");
    l(4, "}");
    for i in 0..4 {
        l(4, &format!("let r{i} = row0 + ty + {};", 16 * i));
        l(4, &format!("if (r{i} < m) {{"));
        for j in 0..4 {
            let comp = ["x", "y", "z", "w"][j];
            l(5, &format!("let c{j} = col0 + tx + {};", 16 * j));
            l(5, &format!("if (c{j} < n) {{"));
            l(6, &format!("let ci = c_base + r{i} * {c_rs} + c{j} * {c_cs};"));
            if k.accumulate {
                l(6, &format!("b{cb}[ci] = b{cb}[ci] + acc{i}.{comp};"));
            } else {
                l(6, &format!("b{cb}[ci] = acc{i}.{comp};"));
            }
            l(5, "}");
        }
        l(4, "}");
    }
    l(3, "}");
    l(2, "}");
    l(1, "}");
    l(0, "}");
    w.body = body;
    let read_write = w.read_write.clone();
    let (source, sym_vec4s) = w.finish(k.n_syms, &shared)?;
    Ok(WgslKernel {
        source,
        entry: "main",
        sym_vec4s,
        read_write,
        dispatch: Dispatch::Matmul { m: k.m.clone(), n: k.n.clone(), batch: k.batch.clone() },
        workgroup_size: [16, 16, 1],
        strategy: "matmul",
        uses_f64: false,
    })
}
