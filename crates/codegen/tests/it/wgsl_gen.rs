//! WGSL generation: golden shader text for a few kernels, and naga validation of the shader of
//! every op, dtype and kernel shape the lowering produces (shader bugs show without a GPU).

use air::DType;
use expect_test::{Expect, expect};
use kiln_codegen::CodegenError;
use kiln_codegen::wgsl::{self, WgslKernel};
use lower::kir::Kernel;

/// Parses and validates `source` with naga, panicking with the shader text on an error. Only a
/// shader that says it uses `f64` gets naga's `FLOAT64` capability (what wgpu grants with
/// `SHADER_F64`), so a wrong `uses_f64` fails here.
fn validate(source: &str, uses_f64: bool) {
    let module =
        naga::front::wgsl::parse_str(source).unwrap_or_else(|e| panic!("{}\n{source}", e.emit_to_string(source)));
    let caps = if uses_f64 { naga::valid::Capabilities::FLOAT64 } else { naga::valid::Capabilities::empty() };
    let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
    if let Err(e) = validator.validate(&module) {
        panic!("{}\n{source}", e.emit_to_string(source));
    }
}

/// The kernels `lower::compile` makes of the text-form graph `text`.
fn kernels(text: &str) -> Vec<Kernel> {
    let g = air::text::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    lower::compile(&g, &lower::CompileOptions::default()).unwrap_or_else(|e| panic!("{e}\n{text}")).kernels
}

/// Generates and validates the shader of every kernel of `text`.
fn shaders(text: &str) -> Vec<WgslKernel> {
    kernels(text)
        .iter()
        .map(|k| {
            let w = wgsl::generate(k).unwrap_or_else(|e| panic!("{e}\n{k}"));
            validate(&w.source, w.uses_f64);
            w
        })
        .collect()
}

fn check(text: &str, expected: Expect) {
    let mut out = String::new();
    for w in shaders(text) {
        out.push_str(&format!("// strategy {}, workgroup {:?}, {:?}\n", w.strategy, w.workgroup_size, w.dispatch));
        out.push_str(&w.source);
    }
    expected.assert_eq(&out);
}

#[test]
fn golden_elementwise_neg() {
    check(
        "graph {\n n0 = input 0 : f32[n]\n n1 = neg n0 : f32[n]\n return n1\n}",
        expect![[r#"
            // strategy grid, workgroup [256, 1, 1], Grid { extent: Sym(0), per_workgroup: 256 }
            @group(0) @binding(0) var<uniform> syms: array<vec4<i32>, 1>;
            @group(0) @binding(1) var<storage, read_write> b0: array<f32>;
            @group(0) @binding(2) var<storage, read> b1: array<f32>;

            @compute @workgroup_size(256)
            fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
                let stride = i32(nwg.x) * 256;
                for (var i0: i32 = i32(gid.x); i0 < syms[0][0]; i0 += stride) {
                    let r0: f32 = b1[i0];
                    let r1: f32 = (-r0);
                    b0[i0] = r1;
                }
            }
        "#]],
    );
}

#[test]
fn golden_row_max_uses_workgroup_memory() {
    check(
        "graph {\n n0 = input 0 : f32[4, 512]\n n1 = reduce max axes=[1] n0 : f32[4, 1]\n return n1\n}",
        expect![[r#"
            // strategy workgroup-reduce, workgroup [256, 1, 1], Rows { rows: Const(4) }
            @group(0) @binding(0) var<uniform> syms: array<vec4<i32>, 1>;
            @group(0) @binding(1) var<storage, read_write> b0: array<f32>;
            @group(0) @binding(2) var<storage, read> b1: array<f32>;
            var<workgroup> red_acc0: array<f32, 256>;

            fn k_isnan(x: f32) -> bool {
                return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
            }

            fn k_maxf(a: f32, b: f32) -> f32 {
                if (k_isnan(a) || k_isnan(b)) { return bitcast<f32>(0x7fc00000u); }
                if (a == b) { return bitcast<f32>(bitcast<u32>(a) & bitcast<u32>(b)); }
                return select(b, a, a > b);
            }

            @compute @workgroup_size(256)
            fn main(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
                let lid = i32(lid3.x);
                for (var i0: i32 = i32(wid.x); i0 < 4; i0 += i32(nwg.x)) {
                    var acc0: f32 = bitcast<f32>(0xff800000u);
                    for (var i1: i32 = lid; i1 < 512; i1 += 256) {
                        let r0: f32 = b1[(i0 * 512 + i1)];
                        acc0 = k_maxf(acc0, r0);
                    }
                    red_acc0[lid] = acc0;
                    workgroupBarrier();
                    for (var s: i32 = 128; s > 0; s = s >> 1u) {
                        if (lid < s) { red_acc0[lid] = k_maxf(red_acc0[lid], red_acc0[lid + s]); }
                        workgroupBarrier();
                    }
                    if (lid == 0) {
                        acc0 = red_acc0[0];
                        let r1: f32 = acc0;
                        b0[i0] = r1;
                    }
                }
            }
        "#]],
    );
}

#[test]
fn golden_short_rows_use_a_thread_per_row() {
    check(
        "graph {\n n0 = input 0 : i32[1000, 8]\n n1 = reduce sum axes=[1] n0 : i32[1000, 1]\n return n1\n}",
        expect![[r#"
            // strategy grid, workgroup [256, 1, 1], Grid { extent: Const(1000), per_workgroup: 256 }
            @group(0) @binding(0) var<uniform> syms: array<vec4<i32>, 1>;
            @group(0) @binding(1) var<storage, read_write> b0: array<i32>;
            @group(0) @binding(2) var<storage, read> b1: array<i32>;

            @compute @workgroup_size(256)
            fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
                let stride = i32(nwg.x) * 256;
                for (var i0: i32 = i32(gid.x); i0 < 1000; i0 += stride) {
                    var acc0: i32 = 0i;
                    for (var i1: i32 = 0; i1 < 8; i1 += 1) {
                        let r0: i32 = b1[(i0 * 8 + i1)];
                        acc0 = acc0 + r0;
                    }
                    let r1: i32 = acc0;
                    b0[i0] = r1;
                }
            }
        "#]],
    );
}

/// The front end's canonical matmul `a @ b` (expand-mul-sum over `[batch, m, n, k]`); with
/// `transpose_a`, input 0 is stored as `[batch, k, m]` and permuted first.
fn matmul_graph(batch: &str, m: &str, k: &str, n: &str, transpose_a: bool) -> String {
    let a = if transpose_a {
        format!(" n0 = input 0 : f32[{batch}, {k}, {m}]\n na = permute [0, 2, 1] n0 : f32[{batch}, {m}, {k}]\n")
    } else {
        format!(" na = input 0 : f32[{batch}, {m}, {k}]\n")
    };
    format!(
        "graph {{\n{a} n1 = input 1 : f32[{batch}, {k}, {n}]\n n2 = reshape [{batch}, {m}, 1, {k}] na : f32[{batch}, {m}, 1, {k}]\n n3 = expand [{batch}, {m}, {n}, {k}] n2 : f32[{batch}, {m}, {n}, {k}]\n n4 = permute [0, 2, 1] n1 : f32[{batch}, {n}, {k}]\n n5 = reshape [{batch}, 1, {n}, {k}] n4 : f32[{batch}, 1, {n}, {k}]\n n6 = expand [{batch}, {m}, {n}, {k}] n5 : f32[{batch}, {m}, {n}, {k}]\n n7 = mul n3, n6 : f32[{batch}, {m}, {n}, {k}]\n n8 = reduce sum axes=[3] n7 : f32[{batch}, {m}, {n}, 1]\n n9 = reshape [{batch}, {m}, {n}] n8 : f32[{batch}, {m}, {n}]\n return n9\n}}"
    )
}

#[test]
fn golden_matmul() {
    check(
        &matmul_graph("1", "m", "32", "24", false),
        expect![[r#"
        // strategy matmul, workgroup [16, 16, 1], Matmul { m: Sym(0), n: Const(24), batch: Const(1) }
        @group(0) @binding(0) var<uniform> syms: array<vec4<i32>, 1>;
        @group(0) @binding(1) var<storage, read_write> b0: array<f32>;
        @group(0) @binding(2) var<storage, read> b1: array<f32>;
        @group(0) @binding(3) var<storage, read> b2: array<f32>;
        var<workgroup> tile_a: array<f32, 1024>;
        var<workgroup> tile_b: array<f32, 1024>;

        @compute @workgroup_size(16, 16, 1)
        fn main(@builtin(local_invocation_index) lidx: u32, @builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
            let tx = i32(lid3.x);
            let ty = i32(lid3.y);
            let lid = i32(lidx);
            let m: i32 = syms[0][0];
            let n: i32 = 24;
            let kk: i32 = 32;
            let batch: i32 = 1;
            for (var bz: i32 = i32(wid.z); bz < batch; bz += i32(nwg.z)) {
                let a_base = 0 + bz * 0;
                let b_base = 0 + bz * 0;
                let c_base = 0 + bz * syms[0][0] * 24;
                for (var row0: i32 = i32(wid.y) * 64; row0 < m; row0 += i32(nwg.y) * 64) {
                    for (var col0: i32 = i32(wid.x) * 64; col0 < n; col0 += i32(nwg.x) * 64) {
                        var acc0 = vec4<f32>();
                        var acc1 = vec4<f32>();
                        var acc2 = vec4<f32>();
                        var acc3 = vec4<f32>();
                        for (var k0: i32 = 0; k0 < kk; k0 += 16) {
                            for (var q: i32 = 0; q < 4; q += 1) {
                                let e = lid + 256 * q;
                                let ar = row0 + e / 16;
                                let ak = k0 + e % 16;
                                var av = 0.0f;
                                if (ar < m && ak < kk) { av = b1[a_base + ar * 32 + ak * 1]; }
                                tile_a[(e % 16) * 64 + e / 16] = av;
                                let bk = k0 + e / 64;
                                let bc = col0 + e % 64;
                                var bv = 0.0f;
                                if (bk < kk && bc < n) { bv = b2[b_base + bk * 24 + bc * 1]; }
                                tile_b[e] = bv;
                            }
                            workgroupBarrier();
                            for (var p: i32 = 0; p < 16; p += 1) {
                                let ra = p * 64 + ty;
                                let rb = p * 64 + tx;
                                let bq = vec4<f32>(tile_b[rb], tile_b[rb + 16], tile_b[rb + 32], tile_b[rb + 48]);
                                acc0 += tile_a[ra + 0] * bq;
                                acc1 += tile_a[ra + 16] * bq;
                                acc2 += tile_a[ra + 32] * bq;
                                acc3 += tile_a[ra + 48] * bq;
                            }
                            workgroupBarrier();
                        }
                        let r0 = row0 + ty + 0;
                        if (r0 < m) {
                            let c0 = col0 + tx + 0;
                            if (c0 < n) {
                                let ci = c_base + r0 * 24 + c0 * 1;
                                b0[ci] = acc0.x;
                            }
                            let c1 = col0 + tx + 16;
                            if (c1 < n) {
                                let ci = c_base + r0 * 24 + c1 * 1;
                                b0[ci] = acc0.y;
                            }
                            let c2 = col0 + tx + 32;
                            if (c2 < n) {
                                let ci = c_base + r0 * 24 + c2 * 1;
                                b0[ci] = acc0.z;
                            }
                            let c3 = col0 + tx + 48;
                            if (c3 < n) {
                                let ci = c_base + r0 * 24 + c3 * 1;
                                b0[ci] = acc0.w;
                            }
                        }
                        let r1 = row0 + ty + 16;
                        if (r1 < m) {
                            let c0 = col0 + tx + 0;
                            if (c0 < n) {
                                let ci = c_base + r1 * 24 + c0 * 1;
                                b0[ci] = acc1.x;
                            }
                            let c1 = col0 + tx + 16;
                            if (c1 < n) {
                                let ci = c_base + r1 * 24 + c1 * 1;
                                b0[ci] = acc1.y;
                            }
                            let c2 = col0 + tx + 32;
                            if (c2 < n) {
                                let ci = c_base + r1 * 24 + c2 * 1;
                                b0[ci] = acc1.z;
                            }
                            let c3 = col0 + tx + 48;
                            if (c3 < n) {
                                let ci = c_base + r1 * 24 + c3 * 1;
                                b0[ci] = acc1.w;
                            }
                        }
                        let r2 = row0 + ty + 32;
                        if (r2 < m) {
                            let c0 = col0 + tx + 0;
                            if (c0 < n) {
                                let ci = c_base + r2 * 24 + c0 * 1;
                                b0[ci] = acc2.x;
                            }
                            let c1 = col0 + tx + 16;
                            if (c1 < n) {
                                let ci = c_base + r2 * 24 + c1 * 1;
                                b0[ci] = acc2.y;
                            }
                            let c2 = col0 + tx + 32;
                            if (c2 < n) {
                                let ci = c_base + r2 * 24 + c2 * 1;
                                b0[ci] = acc2.z;
                            }
                            let c3 = col0 + tx + 48;
                            if (c3 < n) {
                                let ci = c_base + r2 * 24 + c3 * 1;
                                b0[ci] = acc2.w;
                            }
                        }
                        let r3 = row0 + ty + 48;
                        if (r3 < m) {
                            let c0 = col0 + tx + 0;
                            if (c0 < n) {
                                let ci = c_base + r3 * 24 + c0 * 1;
                                b0[ci] = acc3.x;
                            }
                            let c1 = col0 + tx + 16;
                            if (c1 < n) {
                                let ci = c_base + r3 * 24 + c1 * 1;
                                b0[ci] = acc3.y;
                            }
                            let c2 = col0 + tx + 32;
                            if (c2 < n) {
                                let ci = c_base + r3 * 24 + c2 * 1;
                                b0[ci] = acc3.z;
                            }
                            let c3 = col0 + tx + 48;
                            if (c3 < n) {
                                let ci = c_base + r3 * 24 + c3 * 1;
                                b0[ci] = acc3.w;
                            }
                        }
                    }
                }
            }
        }
    "#]],
    );
}

fn unary_graph(op: &str, dtype: &str) -> String {
    format!("graph {{\n n0 = input 0 : {dtype}[3, 5]\n n1 = {op} n0 : {dtype}[3, 5]\n return n1\n}}")
}

fn binary_graph(op: &str, dtype: &str, out: &str) -> String {
    format!(
        "graph {{\n n0 = input 0 : {dtype}[3, 5]\n n1 = input 1 : {dtype}[3, 5]\n n2 = {op} n0, n1 : {out}[3, 5]\n return n2\n}}"
    )
}

#[test]
fn every_unary_op_validates() {
    for dtype in ["f32", "f64"] {
        for op in ["neg", "exp2", "log2", "sin", "sqrt", "recip", "erf", "trunc"] {
            let ws = shaders(&unary_graph(op, dtype));
            assert_eq!(ws.iter().any(|w| w.uses_f64), dtype == "f64", "{op} {dtype}");
        }
    }
    for (op, dtype) in [("neg", "i32"), ("not", "i32"), ("not", "bool"), ("neg", "i64"), ("not", "i64")] {
        shaders(&unary_graph(op, dtype));
    }
}

#[test]
fn every_binary_op_validates() {
    for dtype in ["f32", "f64", "i32", "i64"] {
        for op in ["add", "sub", "mul", "div", "max", "min", "mod"] {
            shaders(&binary_graph(op, dtype, dtype));
        }
        for op in ["cmplt", "cmpeq", "cmpne"] {
            shaders(&binary_graph(op, dtype, "bool"));
        }
    }
    shaders(&binary_graph("pow", "f32", "f32"));
    shaders(&binary_graph("pow", "f64", "f64"));
    for op in ["and", "or"] {
        shaders(&binary_graph(op, "i32", "i32"));
        shaders(&binary_graph(op, "i64", "i64"));
        shaders(&binary_graph(op, "bool", "bool"));
    }
    for op in ["max", "min"] {
        shaders(&binary_graph(op, "bool", "bool"));
    }
    for op in ["cmpeq", "cmpne"] {
        shaders(&binary_graph(op, "bool", "bool"));
    }
}

#[test]
fn casts_where_iota_and_consts_validate() {
    for from in ["f32", "f64", "i32", "i64", "bool"] {
        for to in ["f32", "f64", "i32", "i64", "bool"] {
            shaders(&format!("graph {{\n n0 = input 0 : {from}[7]\n n1 = cast {to} n0 : {to}[7]\n return n1\n}}"));
        }
    }
    shaders(
        "graph {\n n0 = input 0 : bool[4]\n n1 = input 1 : f32[4]\n n2 = const inf : f32[4]\n n3 = where n0, n1, n2 : f32[4]\n n4 = iota axis=0 : f32[4]\n n5 = add n3, n4 : f32[4]\n n6 = const nan : f32[4]\n n7 = max n5, n6 : f32[4]\n return n7\n}",
    );
    shaders(
        "graph {\n n0 = iota axis=1 : i32[3, 4]\n n1 = const -2147483648 : i32[3, 4]\n n2 = add n0, n1 : i32[3, 4]\n return n2\n}",
    );
    // f64 constants: non-finite ones are widened f32 infinities and NaN, subnormals are literals.
    shaders(
        "graph {\n n0 = input 0 : bool[4]\n n1 = input 1 : f64[4]\n n2 = const -inf : f64[4]\n n3 = where n0, n1, n2 : f64[4]\n n4 = iota axis=0 : f64[4]\n n5 = add n3, n4 : f64[4]\n n6 = const nan : f64[4]\n n7 = max n5, n6 : f64[4]\n n8 = const 5e-324 : f64[4]\n n9 = mul n7, n8 : f64[4]\n return n9\n}",
    );
}

#[test]
fn reductions_and_views_validate() {
    let ws = shaders("graph {\n n0 = input 0 : f32[4096]\n n1 = reduce sum axes=[0] n0 : f32[1]\n return n1\n}");
    assert_eq!(ws[0].strategy, "workgroup-reduce");
    assert_eq!(ws[0].dispatch, wgsl::Dispatch::Single);
    let ws = shaders(
        "graph {\n n0 = input 0 : f32[6, 7, 300]\n n1 = reduce sum axes=[0, 2] n0 : f32[1, 7, 1]\n return n1\n}",
    );
    assert_eq!(ws[0].strategy, "workgroup-reduce");
    for dtype in ["i32", "i64", "f64"] {
        for op in ["sum", "max"] {
            shaders(&format!(
                "graph {{\n n0 = input 0 : {dtype}[5, seq]\n n1 = reduce {op} axes=[1] n0 : {dtype}[5, 1]\n return n1\n}}"
            ));
        }
    }
    // Gather and scatter_add with i64 indices (and i64 values scattered).
    shaders(
        "graph {\n n0 = input 0 : f32[4, 3]\n n1 = input 1 : i64[2, 3]\n n2 = gather axis=0 n0, n1 : f32[2, 3]\n return n2\n}",
    );
    shaders(
        "graph {\n n0 = input 0 : i64[2, 3]\n n1 = input 1 : i64[2, 3]\n n2 = scatter_add axis=0 [4, 3] n0, n1 : i64[4, 3]\n return n2\n}",
    );
    shaders(
        "graph {\n n0 = input 0 : f64[4, 3]\n n1 = input 1 : i64[2, 3]\n n2 = gather axis=0 n0, n1 : f64[2, 3]\n n3 = scatter_add axis=0 [4, 3] n1, n2 : f64[4, 3]\n return n3\n}",
    );
    // Softmax over the last axis of a symbolic-length sequence.
    shaders(
        "graph {\n n0 = input 0 : f32[4, seq]\n n1 = reduce max axes=[1] n0 : f32[4, 1]\n n2 = expand [4, seq] n1 : f32[4, seq]\n n3 = sub n0, n2 : f32[4, seq]\n n4 = exp2 n3 : f32[4, seq]\n n5 = reduce sum axes=[1] n4 : f32[4, 1]\n n6 = expand [4, seq] n5 : f32[4, seq]\n n7 = recip n6 : f32[4, seq]\n n8 = mul n4, n7 : f32[4, seq]\n return n8\n}",
    );
    shaders(
        "graph {\n n0 = input 0 : f32[3, 4]\n n1 = permute [1, 0] n0 : f32[4, 3]\n n2 = pad [(1, 2), (0, 1)] value=-1.5 n1 : f32[7, 4]\n n3 = shrink [(1, 6), (1, 3)] n2 : f32[5, 2]\n n4 = reshape [10] n3 : f32[10]\n return n4\n}",
    );
}

/// A shrink that keeps only padding reads its input at a constant negative index under a mask
/// that is always false; WGSL rejects a constant negative index at shader creation, so the
/// masked load must read a valid index instead (found by the random-graph property test).
#[test]
fn a_view_of_padding_only_validates() {
    let ws = shaders(
        "graph {\n n0 = input 0 : f32[1]\n n1 = pad [(1, 2)] value=0.0 n0 : f32[4]\n n2 = shrink [(0, 1)] n1 : f32[1]\n n3 = neg n2 : f32[1]\n return n3\n}",
    );
    assert!(!ws.iter().any(|w| w.source.contains("[-")), "{}", ws[0].source);
}

#[test]
fn transposed_batched_matmul_validates() {
    let ws = shaders(&matmul_graph("3", "16", "8", "5", true));
    assert!(ws.iter().any(|w| w.strategy == "matmul"), "no matmul kernel");
    // Lowering makes matmul kernels of f32 contractions only; the shader is generic, so the same
    // kernel retyped to f64 must give a valid f64 shader.
    let mut retyped = 0;
    for k in kernels(&matmul_graph("3", "16", "8", "5", true)) {
        let Kernel::Matmul(mut m) = k else { continue };
        m.dtype = DType::F64;
        m.params.iter_mut().for_each(|p| p.dtype = DType::F64);
        let w = wgsl::generate(&Kernel::Matmul(m)).unwrap();
        assert!(w.uses_f64 && w.source.contains("vec4<f64>"), "{}", w.source);
        validate(&w.source, true);
        retyped += 1;
    }
    assert_eq!(retyped, 1);
}

#[test]
fn unsupported_dtypes_are_clear_errors() {
    for dtype in [DType::F16, DType::BF16] {
        let text = unary_graph("neg", dtype.name());
        for k in kernels(&text) {
            match wgsl::generate(&k) {
                Err(CodegenError::Unsupported(msg)) => assert!(msg.contains(dtype.name()), "{msg}"),
                other => panic!("{dtype}: expected Unsupported, got {other:?}"),
            }
        }
        assert!(wgsl::device_elem_bytes(dtype).is_err());
    }
    assert_eq!(wgsl::device_elem_bytes(DType::Bool).unwrap(), 4);
    assert_eq!(wgsl::device_elem_bytes(DType::I64).unwrap(), 8);
    assert_eq!(wgsl::device_elem_bytes(DType::F64).unwrap(), 8);
}

#[test]
fn dispatch_counts_clamp_and_skip_empty_launches() {
    use lower::kir::IExpr;
    let grid = wgsl::Dispatch::Grid { extent: IExpr::Sym(0), per_workgroup: 256 };
    assert_eq!(grid.workgroups(&[1]), Some([1, 1, 1]));
    assert_eq!(grid.workgroups(&[257]), Some([2, 1, 1]));
    assert_eq!(grid.workgroups(&[1 << 30]), Some([wgsl::MAX_WORKGROUPS, 1, 1]));
    assert_eq!(grid.workgroups(&[0]), None);
    let mm = wgsl::Dispatch::Matmul { m: IExpr::Const(100), n: IExpr::Const(65), batch: IExpr::Sym(0) };
    assert_eq!(mm.workgroups(&[3]), Some([2, 2, 3]));
}
