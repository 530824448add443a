//! The wgpu device against the reference interpreter (and the CPU device): every primitive op,
//! fusion patterns, views, matmuls, symbolic dims, buffer reuse, errors, and random graphs.
//!
//! Without an adapter every test prints why and returns, unless `KILN_REQUIRE_VULKAN=1`, which makes
//! a missing adapter (or one that is not Vulkan) a failure.

use std::sync::OnceLock;

use air::dim::shape_of;
use air::op::{Expand, Input, Permute, Reduce, Reshape};
use air::{BinaryOp, Bindings, DType, Graph, HostTensor, NodeId, Op, ReduceOp, Symbol, TensorType, UnaryOp};
use kiln_runtime::CpuDevice;
use kiln_runtime::wgpu::WgpuDevice;
use kiln_runtime::{ErrorKind, RuntimeError};
use proptest::prelude::*;

fn require_vulkan() -> bool {
    std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v.trim() == "1")
}

/// The shared GPU device, or `None` (with a printed reason) when there is no adapter.
fn gpu() -> Option<&'static WgpuDevice> {
    static DEV: OnceLock<Result<WgpuDevice, String>> = OnceLock::new();
    // The adapter is a `log` record in the library; printed here for `scripts/gpu-check.sh`.
    let dev = DEV.get_or_init(|| {
        WgpuDevice::new().inspect(|d| eprintln!("kiln wgpu: adapter {}", d.adapter())).map_err(|e| e.to_string())
    });
    match dev {
        Ok(d) => {
            if require_vulkan() {
                assert_eq!(
                    d.adapter().backend,
                    wgpu::Backend::Vulkan,
                    "KILN_REQUIRE_VULKAN=1 but the adapter is not Vulkan: {}",
                    d.adapter()
                );
            }
            Some(d)
        }
        Err(e) => {
            assert!(!require_vulkan(), "KILN_REQUIRE_VULKAN=1 but no wgpu device: {e}");
            eprintln!("skipping: no wgpu device ({e})");
            None
        }
    }
}

fn cpu() -> &'static CpuDevice {
    static DEV: OnceLock<CpuDevice> = OnceLock::new();
    DEV.get_or_init(|| CpuDevice::new().expect("the CPU device"))
}

/// Deterministic pseudo-random values in `[lo, hi)`.
fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

fn f32_tensor(shape: &[usize], seed: u64, lo: f64, hi: f64) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::from_vec(values(n, seed, lo, hi).into_iter().map(|x| x as f32).collect::<Vec<f32>>(), shape.to_vec())
        .unwrap()
}

fn i32_tensor(shape: &[usize], seed: u64, lo: i32, hi: i32) -> HostTensor {
    let n = shape.iter().product();
    let v: Vec<i32> = values(n, seed, lo as f64, hi as f64).into_iter().map(|x| x.floor() as i32).collect();
    HostTensor::from_vec(v, shape.to_vec()).unwrap()
}

fn bool_tensor(shape: &[usize], seed: u64) -> HostTensor {
    let n = shape.iter().product();
    let v: Vec<bool> = values(n, seed, 0.0, 1.0).into_iter().map(|x| x < 0.5).collect();
    HostTensor::from_vec(v, shape.to_vec()).unwrap()
}

/// Asserts `got` matches `want`: exact for ints and bools, within `tol` (relative to magnitude)
/// for floats, NaN where NaN.
fn assert_close(got: &HostTensor, want: &HostTensor, tol: f64, what: &str) {
    air::testing::assert_host(what, got, want, air::testing::Tol::both(tol));
}

fn parse(text: &str) -> Graph {
    air::text::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// Runs `g` on the GPU and compares with the interpreter and (when there is one) the CPU device.
fn check_graph(dev: &WgpuDevice, g: &Graph, inputs: &[HostTensor], bindings: &Bindings, tol: f64) {
    let want = air::interp::eval(g, inputs, bindings).unwrap_or_else(|e| panic!("interp: {e}"));
    let got = dev.run(g, inputs, bindings).unwrap_or_else(|e| panic!("wgpu: {e}\n{}", air::print(g)));
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_close(a, b, tol, &format!("wgpu output {i} of\n{}", air::print(g)));
    }
    // The CPU device is a second opinion: it runs every graph wgpu runs.
    let c = cpu().run(g, inputs, bindings).unwrap_or_else(|e| panic!("cpu: {e}\n{}", air::print(g)));
    for (i, (a, b)) in got.iter().zip(&c).enumerate() {
        assert_close(a, b, tol, &format!("wgpu vs cpu output {i} of\n{}", air::print(g)));
    }
}

fn check(text: &str, inputs: &[HostTensor], tol: f64) {
    let Some(dev) = gpu() else { return };
    check_graph(dev, &parse(text), inputs, &Bindings::new(), tol);
}

fn unary(op: &str, dtype: &str) -> String {
    format!("graph {{\n n0 = input 0 : {dtype}[37, 29]\n n1 = {op} n0 : {dtype}[37, 29]\n return n1\n}}")
}

fn binary(op: &str, dtype: &str, out: &str) -> String {
    format!(
        "graph {{\n n0 = input 0 : {dtype}[1000]\n n1 = input 1 : {dtype}[1000]\n n2 = {op} n0, n1 : {out}[1000]\n return n2\n}}"
    )
}

#[test]
fn unary_ops_f32() {
    let x = f32_tensor(&[37, 29], 1, -4.0, 4.0);
    let pos = f32_tensor(&[37, 29], 2, 0.01, 50.0);
    for op in ["neg", "exp2", "sin", "erf", "trunc", "recip"] {
        check(&unary(op, "f32"), std::slice::from_ref(&x), 2e-5);
    }
    for op in ["log2", "sqrt"] {
        check(&unary(op, "f32"), std::slice::from_ref(&pos), 2e-5);
    }
    // erf near 0 (Taylor branch), near the switch, and at infinities.
    let special = HostTensor::from_vec(
        vec![0.0f32, -0.0, 1e-6, -3e-3, 0.49, 0.51, -0.5, 2.5, -6.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN],
        vec![12],
    )
    .unwrap();
    check("graph {\n n0 = input 0 : f32[12]\n n1 = erf n0 : f32[12]\n return n1\n}", &[special], 2e-6);
}

#[test]
fn unary_ops_int_and_bool() {
    let i = i32_tensor(&[37, 29], 3, -1000, 1000);
    check(&unary("neg", "i32"), std::slice::from_ref(&i), 0.0);
    check(&unary("not", "i32"), std::slice::from_ref(&i), 0.0);
    check(&unary("not", "bool"), &[bool_tensor(&[37, 29], 4)], 0.0);
}

#[test]
fn binary_ops_f32() {
    let a = f32_tensor(&[1000], 5, -3.0, 3.0);
    let b = f32_tensor(&[1000], 6, -3.0, 3.0);
    for op in ["add", "sub", "mul", "div", "max", "min", "mod"] {
        check(&binary(op, "f32", "f32"), &[a.clone(), b.clone()], 1e-5);
    }
    for op in ["cmplt", "cmpeq", "cmpne"] {
        check(&binary(op, "f32", "bool"), &[a.clone(), b.clone()], 0.0);
        check(&binary(op, "f32", "bool"), &[a.clone(), a.clone()], 0.0);
    }
    let base = f32_tensor(&[1000], 7, 0.1, 4.0);
    check(&binary("pow", "f32", "f32"), &[base, b.clone()], 1e-4);
    // NaN propagation and signed zeros in max/min, negative bases in pow.
    let x = HostTensor::from_vec(vec![f32::NAN, 1.0, -0.0, 0.0, -2.0, -2.0, 3.0, -8.0], vec![8]).unwrap();
    let y = HostTensor::from_vec(vec![1.0, f32::NAN, 0.0, -0.0, 3.0, 2.0, 0.0, 0.5], vec![8]).unwrap();
    for op in ["max", "min", "pow", "cmpne", "cmpeq", "cmplt"] {
        let out = if op.starts_with("cmp") { "bool" } else { "f32" };
        check(
            &format!(
                "graph {{\n n0 = input 0 : f32[8]\n n1 = input 1 : f32[8]\n n2 = {op} n0, n1 : {out}[8]\n return n2\n}}"
            ),
            &[x.clone(), y.clone()],
            1e-5,
        );
    }
}

#[test]
fn binary_ops_int_and_bool() {
    let a = i32_tensor(&[1000], 8, -50, 50);
    let b = i32_tensor(&[1000], 9, -5, 5); // includes zeros
    // Integer division by zero is an error (as in PyTorch): divide by b with its zeros made 1.
    let nonzero: Vec<i32> = b.as_slice::<i32>().unwrap().iter().map(|&x| if x == 0 { 1 } else { x }).collect();
    let b_nonzero = HostTensor::from_vec(nonzero, vec![1000]).unwrap();
    for op in ["add", "sub", "mul", "div", "max", "min", "mod", "and", "or"] {
        let divisor = if matches!(op, "div" | "mod") { &b_nonzero } else { &b };
        check(&binary(op, "i32", "i32"), &[a.clone(), divisor.clone()], 0.0);
    }
    if let Some(dev) = gpu() {
        for op in ["div", "mod"] {
            let g = parse(&binary(op, "i32", "i32"));
            let inputs = [a.clone(), b.clone()];
            let want = air::interp::eval(&g, &inputs, &Bindings::new()).expect_err("interp: division by zero");
            let got = dev.run(&g, &inputs, &Bindings::new()).expect_err("wgpu: division by zero");
            for e in [want.to_string(), got.to_string()] {
                assert!(e.contains("integer division by zero"), "{op}: {e}");
            }
        }
    }
    for op in ["cmplt", "cmpeq", "cmpne"] {
        check(&binary(op, "i32", "bool"), &[a.clone(), b.clone()], 0.0);
    }
    let edge = HostTensor::from_vec(vec![i32::MIN, i32::MIN, i32::MAX, 7, -7], vec![5]).unwrap();
    let by = HostTensor::from_vec(vec![-1, 3, -1, -2, 2], vec![5]).unwrap();
    for op in ["div", "mod", "mul", "add"] {
        check(
            &format!(
                "graph {{\n n0 = input 0 : i32[5]\n n1 = input 1 : i32[5]\n n2 = {op} n0, n1 : i32[5]\n return n2\n}}"
            ),
            &[edge.clone(), by.clone()],
            0.0,
        );
    }
    let (p, q) = (bool_tensor(&[1000], 10), bool_tensor(&[1000], 11));
    for op in ["and", "or", "max", "min", "cmpeq", "cmpne"] {
        check(&binary(op, "bool", "bool"), &[p.clone(), q.clone()], 0.0);
    }
}

#[test]
fn casts_where_iota_const() {
    let f = HostTensor::from_vec(vec![1.7f32, -1.7, 0.0, -0.0, f32::NAN, 3e9, -3e9, 0.5], vec![8]).unwrap();
    let i = HostTensor::from_vec(vec![0i32, 1, -1, 7, i32::MAX, i32::MIN, 2, -3], vec![8]).unwrap();
    let b = HostTensor::from_vec(vec![true, false, true, true, false, false, true, false], vec![8]).unwrap();
    for (from, x) in [("f32", &f), ("i32", &i), ("bool", &b)] {
        for to in ["f32", "i32", "bool"] {
            check(
                &format!("graph {{\n n0 = input 0 : {from}[8]\n n1 = cast {to} n0 : {to}[8]\n return n1\n}}"),
                std::slice::from_ref(x),
                0.0,
            );
        }
    }
    check(
        "graph {\n n0 = input 0 : bool[8]\n n1 = input 1 : f32[8]\n n2 = const -inf : f32[8]\n n3 = where n0, n1, n2 : f32[8]\n n4 = iota axis=0 : f32[8]\n n5 = add n3, n4 : f32[8]\n return n5\n}",
        &[b.clone(), f.clone()],
        0.0,
    );
    check(
        "graph {\n n0 = iota axis=1 : i32[3, 4]\n n1 = const 5 : i32[3, 4]\n n2 = mul n0, n1 : i32[3, 4]\n return n2\n}",
        &[],
        0.0,
    );
}

/// `i64` values over the whole range: the edges, values around the 32-bit word boundary (the
/// carries and borrows of the emulation), and pseudo-random wide values.
fn i64_values(n: usize, seed: u64) -> Vec<i64> {
    let edges = [
        0,
        1,
        -1,
        i64::MIN,
        i64::MAX,
        1 << 32,
        -(1 << 32),
        (1 << 32) - 1,
        1 << 31,
        -(1 << 31) - 1,
        0xffff_ffff_0000_0001u64 as i64,
        123_456_789_012_345,
        -987_654_321_098,
        7,
        -7,
        3,
    ];
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            match i % 3 {
                0 => edges[(i / 3 + seed as usize) % edges.len()],
                1 => s as i64,
                _ => (s as i64) >> (s % 60),
            }
        })
        .collect()
}

fn i64_tensor(values: Vec<i64>) -> HostTensor {
    let n = values.len();
    HostTensor::from_vec(values, vec![n]).unwrap()
}

#[test]
fn i64_arithmetic_is_exact_over_the_whole_range() {
    let (a, b) = (i64_values(1000, 1), i64_values(1000, 2));
    let nonzero: Vec<i64> = b.iter().map(|&x| if x == 0 { -1 } else { x }).collect();
    let (a, b, nonzero) = (i64_tensor(a), i64_tensor(b), i64_tensor(nonzero));
    // Wrapping overflow included: mul of two wide values, `MIN / -1`, `MIN - 1`.
    for op in ["add", "sub", "mul", "div", "mod", "max", "min", "and", "or"] {
        let divisor = if matches!(op, "div" | "mod") { &nonzero } else { &b };
        check(&binary(op, "i64", "i64"), &[a.clone(), divisor.clone()], 0.0);
    }
    for op in ["cmplt", "cmpeq", "cmpne"] {
        check(&binary(op, "i64", "bool"), &[a.clone(), b.clone()], 0.0);
        check(&binary(op, "i64", "bool"), &[a.clone(), a.clone()], 0.0);
    }
    let x = HostTensor::from_vec(i64_values(37 * 29, 3), vec![37, 29]).unwrap();
    for op in ["neg", "not"] {
        check(&unary(op, "i64"), std::slice::from_ref(&x), 0.0);
    }
    // Small divisors take the long-division path for wide dividends.
    let small = i64_tensor((0..1000).map(|i| [3, -3, 7, -1, 1 << 33, 10][i % 6]).collect());
    for op in ["div", "mod"] {
        check(&binary(op, "i64", "i64"), &[a.clone(), small.clone()], 0.0);
    }
    if let Some(dev) = gpu() {
        let g = parse(&binary("div", "i64", "i64"));
        let e = dev.run(&g, &[a.clone(), b.clone()], &Bindings::new()).expect_err("an i64 division by zero");
        assert!(e.to_string().contains("integer division by zero in div"), "{e}");
    }
}

#[test]
fn i64_casts_round_and_saturate_like_the_interpreter() {
    let mut ints = i64_values(60, 4);
    // Ties and near-ties of the rounding to f32's 24 bits, at several exponents.
    for shift in [0, 8, 20, 39] {
        let base = (1i64 << 24) << shift;
        for d in [1i64, 2, 3, 5, 6, 7] {
            ints.extend([base + (d << shift) / 2, -(base + (d << shift) / 2), base + (d << shift) / 4 + 1]);
        }
    }
    let n = ints.len();
    let ints = i64_tensor(ints);
    let p = 2f32.powi(63);
    let f = HostTensor::from_vec(
        vec![
            1.7f32,
            -1.7,
            0.0,
            -0.0,
            f32::NAN,
            3e9,
            -3e9,
            0.5,
            p,
            -p,
            1e19,
            -1e19,
            p / 2.0,
            4294967296.0,
            6.5e12,
            -f32::INFINITY,
        ],
        vec![16],
    )
    .unwrap();
    let i = HostTensor::from_vec(vec![0i32, 1, -1, 7, i32::MAX, i32::MIN, 2, -3], vec![8]).unwrap();
    let b = HostTensor::from_vec(vec![true, false, true, true, false, false, true, false], vec![8]).unwrap();
    for to in ["f32", "i32", "bool"] {
        check(
            &format!("graph {{\n n0 = input 0 : i64[{n}]\n n1 = cast {to} n0 : {to}[{n}]\n return n1\n}}"),
            std::slice::from_ref(&ints),
            0.0,
        );
    }
    for (from, x, len) in [("f32", &f, 16), ("i32", &i, 8), ("bool", &b, 8)] {
        check(
            &format!("graph {{\n n0 = input 0 : {from}[{len}]\n n1 = cast i64 n0 : i64[{len}]\n return n1\n}}"),
            std::slice::from_ref(x),
            0.0,
        );
    }
    check(
        "graph {\n n0 = iota axis=1 : i64[3, 4]\n n1 = const 5000000000 : i64[3, 4]\n n2 = mul n0, n1 : i64[3, 4]\n return n2\n}",
        &[],
        0.0,
    );
}

#[test]
fn i64_reductions_short_and_long() {
    for (rows, cols) in [(7, 9), (4, 500)] {
        let x = HostTensor::from_vec(i64_values(rows * cols, 5), vec![rows, cols]).unwrap();
        for op in ["sum", "max"] {
            check(
                &format!(
                    "graph {{\n n0 = input 0 : i64[{rows}, {cols}]\n n1 = reduce {op} axes=[1] n0 : i64[{rows}, 1]\n return n1\n}}"
                ),
                std::slice::from_ref(&x),
                0.0,
            );
        }
    }
}

#[test]
fn i64_gather_and_scatter_indices() {
    let Some(dev) = gpu() else { return };
    let text = |op: &str| {
        match op {
        "gather" => "graph {\n n0 = input 0 : f32[4, 3]\n n1 = input 1 : i64[2, 3]\n n2 = gather axis=0 n0, n1 : f32[2, 3]\n return n2\n}".to_string(),
        _ => "graph {\n n0 = input 0 : i64[2, 3]\n n1 = input 1 : i64[2, 3]\n n2 = scatter_add axis=0 [4, 3] n0, n1 : i64[4, 3]\n return n2\n}".to_string(),
    }
    };
    let index = |v: Vec<i64>| HostTensor::from_vec(v, vec![2, 3]).unwrap();
    let src = f32_tensor(&[4, 3], 6, -1.0, 1.0);
    let wide = HostTensor::from_vec(vec![i64::MAX, -5, 1 << 40, i64::MIN, 3, 9], vec![2, 3]).unwrap();
    check(&text("gather"), &[src.clone(), index(vec![3, 0, 2, 1, 1, 3])], 0.0);
    check(&text("scatter"), &[index(vec![3, 0, 3, 3, 1, 0]), wide.clone()], 0.0);
    // Out of range: negative, past the size, and past 2^32 (whose low word alone is in range).
    for bad in [-1i64, 4, (1 << 32) + 1, i64::MIN] {
        let ix = index(vec![0, 1, bad, 2, 3, 0]);
        for (op, inputs) in [("gather", [src.clone(), ix.clone()]), ("scatter_add", [ix.clone(), wide.clone()])] {
            let g = parse(&text(op));
            let e = dev.run(&g, &inputs, &Bindings::new()).expect_err("a bad i64 index");
            let want = format!("index {bad} out of range for size 4 in {op}");
            assert!(e.to_string().contains(&want), "{e} (want {want})");
        }
    }
}

#[test]
fn elementwise_chain_fuses_into_one_kernel() {
    let Some(dev) = gpu() else { return };
    // sigmoid(x) = 1 / (1 + exp2(-x * log2(e)))
    let text = "graph {\n n0 = input 0 : f32[100003]\n n1 = const -1.4426950408889634 : f32[100003]\n n2 = mul n0, n1 : f32[100003]\n n3 = exp2 n2 : f32[100003]\n n4 = const 1.0 : f32[100003]\n n5 = add n3, n4 : f32[100003]\n n6 = recip n5 : f32[100003]\n return n6\n}";
    let g = parse(text);
    let x = f32_tensor(&[100003], 12, -8.0, 8.0);
    check_graph(dev, &g, &[x], &Bindings::new(), 1e-5);
    assert_eq!(dev.compile(&g).unwrap().launches(), 1);
}

#[test]
fn reductions_short_long_full_and_multi_axis() {
    let Some(dev) = gpu() else { return };
    let cases: &[(&str, &[usize])] = &[
        ("graph {\n n0 = input 0 : f32[33, 7]\n n1 = reduce sum axes=[1] n0 : f32[33, 1]\n return n1\n}", &[33, 7]),
        ("graph {\n n0 = input 0 : f32[5, 3000]\n n1 = reduce sum axes=[1] n0 : f32[5, 1]\n return n1\n}", &[5, 3000]),
        ("graph {\n n0 = input 0 : f32[5, 3000]\n n1 = reduce max axes=[1] n0 : f32[5, 1]\n return n1\n}", &[5, 3000]),
        ("graph {\n n0 = input 0 : f32[100000]\n n1 = reduce sum axes=[0] n0 : f32[1]\n return n1\n}", &[100000]),
        (
            "graph {\n n0 = input 0 : f32[6, 7, 300]\n n1 = reduce sum axes=[0, 2] n0 : f32[1, 7, 1]\n return n1\n}",
            &[6, 7, 300],
        ),
        ("graph {\n n0 = input 0 : f32[300, 9]\n n1 = reduce max axes=[0] n0 : f32[1, 9]\n return n1\n}", &[300, 9]),
    ];
    let mut strategies = Vec::new();
    for (text, shape) in cases {
        let g = parse(text);
        check_graph(dev, &g, &[f32_tensor(shape, 13, -1.0, 1.0)], &Bindings::new(), 1e-4);
        strategies.extend(dev.compile(&g).unwrap().strategies());
    }
    assert!(strategies.contains(&"workgroup-reduce"), "{strategies:?}");
    assert!(strategies.contains(&"grid"), "{strategies:?}");
    // Integer sums wrap; max of ints.
    let x = i32_tensor(&[4, 500], 14, -1000, 1000);
    check(
        "graph {\n n0 = input 0 : i32[4, 500]\n n1 = reduce sum axes=[1] n0 : i32[4, 1]\n return n1\n}",
        std::slice::from_ref(&x),
        0.0,
    );
    check("graph {\n n0 = input 0 : i32[4, 500]\n n1 = reduce max axes=[1] n0 : i32[4, 1]\n return n1\n}", &[x], 0.0);
    // NaN propagates through a workgroup max.
    let mut v = vec![0.5f32; 1000];
    v[777] = f32::NAN;
    let nan = HostTensor::from_vec(v, vec![1, 1000]).unwrap();
    check(
        "graph {\n n0 = input 0 : f32[1, 1000]\n n1 = reduce max axes=[1] n0 : f32[1, 1]\n return n1\n}",
        &[nan],
        0.0,
    );
}

fn softmax(rows: &str, cols: &str) -> String {
    format!(
        "graph {{\n n0 = input 0 : f32[{rows}, {cols}]\n n1 = reduce max axes=[1] n0 : f32[{rows}, 1]\n n2 = expand [{rows}, {cols}] n1 : f32[{rows}, {cols}]\n n3 = sub n0, n2 : f32[{rows}, {cols}]\n n4 = exp2 n3 : f32[{rows}, {cols}]\n n5 = reduce sum axes=[1] n4 : f32[{rows}, 1]\n n6 = expand [{rows}, {cols}] n5 : f32[{rows}, {cols}]\n n7 = recip n6 : f32[{rows}, {cols}]\n n8 = mul n4, n7 : f32[{rows}, {cols}]\n return n8\n}}"
    )
}

#[test]
fn softmax_rows() {
    check(&softmax("8", "1000"), &[f32_tensor(&[8, 1000], 15, -5.0, 5.0)], 1e-5);
    check(&softmax("300", "10"), &[f32_tensor(&[300, 10], 16, -5.0, 5.0)], 1e-5);
}

#[test]
fn views_pad_shrink_permute_expand_reshape() {
    let x = f32_tensor(&[3, 4], 17, -1.0, 1.0);
    check(
        "graph {\n n0 = input 0 : f32[3, 4]\n n1 = permute [1, 0] n0 : f32[4, 3]\n n2 = pad [(1, 2), (0, 1)] value=-1.5 n1 : f32[7, 4]\n n3 = shrink [(1, 6), (1, 3)] n2 : f32[5, 2]\n n4 = reshape [10] n3 : f32[10]\n n5 = exp2 n4 : f32[10]\n return n5\n}",
        std::slice::from_ref(&x),
        1e-6,
    );
    check(
        "graph {\n n0 = input 0 : f32[3, 4]\n n1 = reshape [3, 1, 4] n0 : f32[3, 1, 4]\n n2 = expand [3, 5, 4] n1 : f32[3, 5, 4]\n n3 = permute [2, 0, 1] n2 : f32[4, 3, 5]\n n4 = neg n3 : f32[4, 3, 5]\n return n4\n}",
        std::slice::from_ref(&x),
        0.0,
    );
    // A view as an output (a copy kernel), and an output that is an input.
    check("graph {\n n0 = input 0 : f32[3, 4]\n n1 = permute [1, 0] n0 : f32[4, 3]\n return n1, n0\n}", &[x], 0.0);
}

/// `a @ b` as the front end writes it (expand-mul-sum over `[batch, m, n, k]`); with
/// `transpose_a`, input 0 is stored `[batch, k, m]`.
fn matmul(batch: &str, m: &str, k: &str, n: &str, transpose_a: bool, bias: bool) -> String {
    let a = if transpose_a {
        format!(" n0 = input 0 : f32[{batch}, {k}, {m}]\n na = permute [0, 2, 1] n0 : f32[{batch}, {m}, {k}]\n")
    } else {
        format!(" na = input 0 : f32[{batch}, {m}, {k}]\n")
    };
    let tail = if bias {
        format!(" nb = input 2 : f32[{batch}, {m}, {n}]\n nc = add n9, nb : f32[{batch}, {m}, {n}]\n return nc\n")
    } else {
        " return n9\n".to_string()
    };
    format!(
        "graph {{\n{a} n1 = input 1 : f32[{batch}, {k}, {n}]\n n2 = reshape [{batch}, {m}, 1, {k}] na : f32[{batch}, {m}, 1, {k}]\n n3 = expand [{batch}, {m}, {n}, {k}] n2 : f32[{batch}, {m}, {n}, {k}]\n n4 = permute [0, 2, 1] n1 : f32[{batch}, {n}, {k}]\n n5 = reshape [{batch}, 1, {n}, {k}] n4 : f32[{batch}, 1, {n}, {k}]\n n6 = expand [{batch}, {m}, {n}, {k}] n5 : f32[{batch}, {m}, {n}, {k}]\n n7 = mul n3, n6 : f32[{batch}, {m}, {n}, {k}]\n n8 = reduce sum axes=[3] n7 : f32[{batch}, {m}, {n}, 1]\n n9 = reshape [{batch}, {m}, {n}] n8 : f32[{batch}, {m}, {n}]\n{tail}}}"
    )
}

#[test]
fn matmul_plain_batched_transposed_and_bias() {
    let Some(dev) = gpu() else { return };
    for (batch, m, k, n, transpose, bias) in [
        (1, 64, 64, 64, false, false),
        (1, 70, 33, 65, false, false),
        (3, 17, 40, 9, true, false),
        (2, 5, 7, 130, false, true),
    ] {
        let g = parse(&matmul(&batch.to_string(), &m.to_string(), &k.to_string(), &n.to_string(), transpose, bias));
        let a_shape = if transpose { [batch, k, m] } else { [batch, m, k] };
        let mut inputs = vec![f32_tensor(&a_shape, 18, -1.0, 1.0), f32_tensor(&[batch, k, n], 19, -1.0, 1.0)];
        if bias {
            inputs.push(f32_tensor(&[batch, m, n], 20, -1.0, 1.0));
        }
        check_graph(dev, &g, &inputs, &Bindings::new(), 1e-4);
        let strategies = dev.compile(&g).unwrap().strategies();
        assert!(strategies.contains(&"matmul"), "{strategies:?}");
    }
}

#[test]
fn symbolic_dims_run_without_recompiling() {
    if gpu().is_none() {
        return;
    }
    // A device of its own: the shared one compiles for other tests meanwhile.
    let own = WgpuDevice::new().unwrap();
    let dev = &own;
    let g = parse(&softmax("4", "seq"));
    let mm = parse(&matmul("1", "seq", "8", "5", false, false));
    let exe = dev.compile(&g).unwrap();
    let exe_mm = dev.compile(&mm).unwrap();
    let before = dev.stats();
    for seq in [3usize, 7, 300, 3] {
        let bindings: Bindings = [(Symbol::new("seq"), seq as i64)].into_iter().collect();
        check_graph(dev, &g, &[f32_tensor(&[4, seq], seq as u64, -3.0, 3.0)], &bindings, 1e-5);
        let inputs = [f32_tensor(&[1, seq, 8], 21, -1.0, 1.0), f32_tensor(&[1, 8, 5], 22, -1.0, 1.0)];
        check_graph(dev, &mm, &inputs, &bindings, 1e-4);
    }
    let after = dev.stats();
    assert_eq!(after.programs_compiled, before.programs_compiled, "no recompilation for new symbol values");
    assert_eq!(after.pipelines_created, before.pipelines_created);
    assert!(std::sync::Arc::ptr_eq(&exe, &dev.compile(&g).unwrap()));
    assert!(std::sync::Arc::ptr_eq(&exe_mm, &dev.compile(&mm).unwrap()));
}

#[test]
fn second_run_of_a_cached_program_creates_no_buffers() {
    if gpu().is_none() {
        return;
    }
    // Devices of this test alone: the shared one creates buffers for tests running meanwhile.
    let dev = WgpuDevice::new().expect("a device on the adapter the shared one found");
    // Unfused, so there are temporaries in the arena.
    let opts = lower::CompileOptions { fuse: false, ..Default::default() };
    let dev2 = WgpuDevice::with_options(opts).expect("a second device on the adapter the first one found");
    for d in [&dev, &dev2] {
        let g = parse(&softmax("16", "500"));
        let x = f32_tensor(&[16, 500], 23, -2.0, 2.0);
        let first = d.run(&g, std::slice::from_ref(&x), &Bindings::new()).unwrap();
        let created = d.buffers_created();
        let second = d.run(&g, std::slice::from_ref(&x), &Bindings::new()).unwrap();
        assert_eq!(d.buffers_created(), created, "the second run created buffers");
        assert_eq!(first, second);
    }
    let exe = dev2.compile(&parse(&softmax("16", "500"))).unwrap();
    let mem = exe.memory(&Bindings::new()).unwrap();
    assert!(mem.arena_bytes > 0 && mem.arena_bytes < mem.naive_bytes, "{mem:?}");
}

#[test]
fn bad_inputs_and_unsupported_dtypes_are_errors() {
    let Some(dev) = gpu() else { return };
    let g = parse(&unary("neg", "f32"));
    let e = dev.run(&g, &[], &Bindings::new()).unwrap_err();
    assert!(matches!(e, RuntimeError::InputCount { expected: 1, got: 0 }), "{e}");
    assert_eq!(e.kind(), ErrorKind::BadInput);
    let wrong = f32_tensor(&[2, 2], 1, 0.0, 1.0);
    let e = dev.run(&g, &[wrong], &Bindings::new()).unwrap_err();
    match &e {
        RuntimeError::InputMismatch { slot: 0, expected, got, .. } => {
            assert_eq!((expected.dtype, got.dtype), (DType::F32, DType::F32));
            assert_ne!(expected.shape, got.shape);
            assert_eq!(got.shape, vec![2, 2]);
        }
        other => panic!("expected an input mismatch, got {other}"),
    }
    assert_eq!(e.kind(), ErrorKind::BadInput);
    let sym = parse(&softmax("4", "seq"));
    let e = dev.run(&sym, &[f32_tensor(&[4, 3], 1, 0.0, 1.0)], &Bindings::new()).unwrap_err();
    assert!(matches!(&e, RuntimeError::Unbound(s) if s.name() == "seq"), "{e}");
    // f64 needs the adapter's SHADER_F64: without it the error names the dtype and the adapter.
    let f64g = parse(&unary("neg", "f64"));
    match dev.compile(&f64g) {
        Ok(_) => assert!(dev.supports_f64(), "f64 compiled without SHADER_F64"),
        Err(e @ RuntimeError::Codegen(_)) => {
            assert!(!dev.supports_f64(), "{e}");
            assert!(e.to_string().contains("f64") && e.to_string().contains(&dev.adapter().name), "{e}");
            assert_eq!(e.kind(), ErrorKind::Unsupported);
        }
        Err(other) => panic!("expected a codegen error, got {other}"),
    }
    let f16g = parse(&unary("neg", "f16"));
    match dev.compile(&f16g) {
        Err(e @ RuntimeError::Codegen(_)) => {
            assert!(e.to_string().contains("f16"), "{e}");
            assert_eq!(e.kind(), ErrorKind::Unsupported);
        }
        Err(other) => panic!("expected a codegen error, got {other}"),
        Ok(_) => panic!("f16 compiled on wgpu"),
    }
}

// Random graphs, in the style of the CPU device's property test.

#[derive(Clone, Debug)]
enum Step {
    Unary(usize, UnaryOp),
    Binary(usize, usize, BinaryOp),
    /// Reduce over axis 1 and expand back.
    Reduce(usize, ReduceOp),
    /// Transpose and reshape back to `[R, C]`.
    Transpose(usize),
    /// `where(a < b, a, c)`.
    Select(usize, usize, usize),
}

fn step() -> impl Strategy<Value = Step> {
    let unary = prop::sample::select(vec![UnaryOp::Neg, UnaryOp::Exp2, UnaryOp::Sin, UnaryOp::Sqrt, UnaryOp::Trunc]);
    let binary = prop::sample::select(vec![BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max, BinaryOp::Min]);
    let reduce = prop::sample::select(vec![ReduceOp::Sum, ReduceOp::Max]);
    prop_oneof![
        (any::<usize>(), unary).prop_map(|(a, op)| Step::Unary(a, op)),
        (any::<usize>(), any::<usize>(), binary).prop_map(|(a, b, op)| Step::Binary(a, b, op)),
        (any::<usize>(), reduce).prop_map(|(a, op)| Step::Reduce(a, op)),
        any::<usize>().prop_map(Step::Transpose),
        (any::<usize>(), any::<usize>(), any::<usize>()).prop_map(|(a, b, c)| Step::Select(a, b, c)),
    ]
}

fn build(dtype: DType, rows: usize, cols: usize, steps: &[Step], extra_output: usize) -> Graph {
    let mut g = Graph::new();
    let ty = TensorType::new(dtype, shape_of(&[rows, cols]));
    let mut nodes: Vec<NodeId> =
        (0..2).map(|slot| g.add_leaf(Op::Input(Input { slot }), ty.clone()).unwrap()).collect();
    for s in steps {
        let pick = |i: usize| nodes[i % nodes.len()];
        let n = match *s {
            Step::Unary(a, op) => g.add(Op::Unary(op), &[pick(a)]).unwrap(),
            Step::Binary(a, b, op) => g.add(Op::Binary(op), &[pick(a), pick(b)]).unwrap(),
            Step::Reduce(a, op) => {
                let r = g.add(Op::Reduce(Reduce { op, axes: [1].into_iter().collect() }), &[pick(a)]).unwrap();
                g.add(Op::Expand(Expand { shape: shape_of(&[rows, cols]) }), &[r]).unwrap()
            }
            Step::Transpose(a) => {
                let t = g.add(Op::Permute(Permute { perm: [1, 0].into_iter().collect() }), &[pick(a)]).unwrap();
                g.add(Op::Reshape(Reshape { shape: shape_of(&[rows, cols]) }), &[t]).unwrap()
            }
            Step::Select(a, b, c) => {
                let lt = g.add(Op::Binary(BinaryOp::CmpLt), &[pick(a), pick(b)]).unwrap();
                g.add(Op::Where, &[lt, pick(a), pick(c)]).unwrap()
            }
        };
        nodes.push(n);
    }
    g.add_output(*nodes.last().unwrap());
    g.add_output(nodes[extra_output % nodes.len()]);
    g
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn wgpu_matches_interpreter_on_random_graphs(
        rows in 1usize..6,
        cols in prop::sample::select(vec![1usize, 3, 6, 200]),
        steps in prop::collection::vec(step(), 1..9),
        extra in any::<usize>(),
        seed in any::<u64>(),
        wide in any::<bool>(),
    ) {
        if let Some(dev) = gpu() {
            // f64 graphs too, where the adapter has SHADER_F64 (lavapipe and NVIDIA do).
            let (dtype, tol) = if wide && dev.supports_f64() { (DType::F64, 1e-9) } else { (DType::F32, 1e-4) };
            let g = build(dtype, rows, cols, &steps, extra);
            let inputs = [f32_tensor(&[rows, cols], seed, -2.0, 2.0), f32_tensor(&[rows, cols], seed ^ 0xabcdef, -2.0, 2.0)];
            let inputs = inputs.map(|t| if dtype == DType::F64 { widen(&t) } else { t });
            check_graph(dev, &g, &inputs, &Bindings::new(), tol);
        }
    }
}

#[test]
fn bool_data_round_trips() {
    let b = bool_tensor(&[3, 5], 24);
    check(
        "graph {\n n0 = input 0 : bool[3, 5]\n n1 = permute [1, 0] n0 : bool[5, 3]\n n2 = not n1 : bool[5, 3]\n return n2\n}",
        &[b],
        0.0,
    );
}

// f64 (naga's `f64`, wgpu's SHADER_F64).

/// The GPU device when it runs f64 kernels; without SHADER_F64 the tests print why and return,
/// unless `KILN_REQUIRE_VULKAN=1` (CI's lavapipe has `shaderFloat64`).
fn gpu_f64() -> Option<&'static WgpuDevice> {
    let dev = gpu()?;
    if !dev.supports_f64() {
        assert!(!require_vulkan(), "KILN_REQUIRE_VULKAN=1 but adapter {} has no SHADER_F64", dev.adapter());
        eprintln!("skipping: adapter {} has no SHADER_F64", dev.adapter());
        return None;
    }
    Some(dev)
}

fn widen(t: &HostTensor) -> HostTensor {
    HostTensor::from_vec(t.data.to_f64_vec(), t.shape.clone()).unwrap()
}

fn f64_tensor(v: Vec<f64>) -> HostTensor {
    let n = v.len();
    HostTensor::from_vec(v, vec![n]).unwrap()
}

/// Distance in units in the last place (0 for equal values, NaN against NaN, and `+0`/`-0`).
fn ulps(a: f64, b: f64) -> u64 {
    if a == b || (a.is_nan() && b.is_nan()) {
        return 0;
    }
    if a.is_nan() || b.is_nan() {
        return u64::MAX;
    }
    let ordered = |x: f64| {
        let bits = x.to_bits() as i64;
        if bits < 0 { i64::MIN - bits } else { bits }
    };
    ordered(a).abs_diff(ordered(b))
}

/// Runs the unary `op` on `xs` on the GPU and returns the largest ULP distance from the
/// interpreter (libm), with the input where it occurs.
fn worst_ulps(dev: &WgpuDevice, op: &str, xs: &[f64]) -> (u64, f64) {
    let n = xs.len();
    let g = parse(&format!("graph {{\n n0 = input 0 : f64[{n}]\n n1 = {op} n0 : f64[{n}]\n return n1\n}}"));
    let input = f64_tensor(xs.to_vec());
    let want = air::interp::eval(&g, std::slice::from_ref(&input), &Bindings::new()).unwrap();
    let got = dev.run(&g, &[input], &Bindings::new()).unwrap_or_else(|e| panic!("{op}: {e}"));
    let (got, want) = (got[0].data.to_f64_vec(), want[0].data.to_f64_vec());
    let mut worst = (0, 0.0);
    for ((&x, &a), &b) in xs.iter().zip(&got).zip(&want) {
        let u = ulps(a, b);
        if u > worst.0 {
            worst = (u, x);
        }
    }
    worst
}

/// Deterministic values `m * 2^e` with `m` in `[1, 2)` and `e` in `[lo, hi)`, both signs when
/// `signed`.
fn f64_magnitudes(n: usize, seed: u64, lo: i32, hi: i32, signed: bool) -> Vec<f64> {
    let m = values(n, seed, 1.0, 2.0);
    let e = values(n, seed ^ 0x5151, lo as f64, hi as f64);
    let s = values(n, seed ^ 0x7777, -1.0, 1.0);
    (0..n).map(|i| m[i] * 2f64.powi(e[i].floor() as i32) * if signed && s[i] < 0.0 { -1.0 } else { 1.0 }).collect()
}

#[test]
fn f64_transcendentals_are_within_a_few_ulps_of_libm() {
    let Some(dev) = gpu_f64() else { return };
    let specials = [0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1.0, -1.0, 0.5, 2.0, f64::MAX, f64::MIN];
    let tiny = [f64::MIN_POSITIVE, 4.9e-324, -4.9e-324, 1e-310, 2.5e-320];
    // exp2 over its whole range (overflow at 1024, subnormal results below -1022, 0 from -1075).
    let mut xs = values(4000, 11, -1100.0, 1100.0);
    xs.extend(values(4000, 12, -2.0, 2.0));
    xs.extend(specials.iter().chain(&tiny));
    xs.extend([1023.999, 1024.0, -1022.0, -1074.0, -1074.5, -1075.0, -1030.3, 1e-17, -1e-300]);
    let (u, x) = worst_ulps(dev, "exp2", &xs);
    eprintln!("f64 exp2 on wgpu: at most {u} ulps from libm (at {x:e})");
    assert!(u <= 2, "exp2: {u} ulps at {x:e}");
    // log2 of every binary order of magnitude, subnormals and near 1.
    let mut xs = f64_magnitudes(6000, 13, -1075, 1024, false);
    xs.extend(values(3000, 14, 0.5, 2.0));
    xs.extend(specials.iter().chain(&tiny));
    xs.extend([1.0 + f64::EPSILON, 1.0 - f64::EPSILON / 2.0, std::f64::consts::SQRT_2, -3.0]);
    let (u, x) = worst_ulps(dev, "log2", &xs);
    eprintln!("f64 log2 on wgpu: at most {u} ulps from libm (at {x:e})");
    assert!(u <= 4, "log2: {u} ulps at {x:e}");
    // sin: small, moderate, huge (Payne-Hanek) and the hardest double to reduce.
    let mut xs = values(4000, 15, -10.0, 10.0);
    xs.extend(f64_magnitudes(6000, 16, -30, 1024, true));
    xs.extend(specials.iter().chain(&tiny));
    xs.extend([std::f64::consts::PI, std::f64::consts::FRAC_PI_2, std::f64::consts::FRAC_PI_4, 1e22, -1e22]);
    xs.push(6381956970095103.0 * 2f64.powi(797));
    let (u, x) = worst_ulps(dev, "sin", &xs);
    eprintln!("f64 sin on wgpu: at most {u} ulps from libm (at {x:e})");
    assert!(u <= 3, "sin: {u} ulps at {x:e}");
    // erf on both sides of each branch switch (2^-28, 1.25, 6).
    let mut xs = values(6000, 17, -7.0, 7.0);
    xs.extend(f64_magnitudes(2000, 18, -1075, 1, true));
    xs.extend(specials.iter().chain(&tiny));
    xs.extend([3.7e-9, 3.8e-9, 1.2499999, 1.25, -1.25, 5.999, 6.0, -6.0]);
    let (u, x) = worst_ulps(dev, "erf", &xs);
    eprintln!("f64 erf on wgpu: at most {u} ulps from libm (at {x:e})");
    assert!(u <= 8, "erf: {u} ulps at {x:e}");
}

#[test]
fn f64_binary_ops_match_the_interpreter() {
    let Some(dev) = gpu_f64() else { return };
    let a = widen(&f32_tensor(&[1000], 5, -3.0, 3.0));
    let b = widen(&f32_tensor(&[1000], 6, -3.0, 3.0));
    let g = |op: &str, out: &str| parse(&binary(op, "f64", out));
    for op in ["add", "sub", "mul", "div", "max", "min", "mod"] {
        check_graph(dev, &g(op, "f64"), &[a.clone(), b.clone()], &Bindings::new(), 0.0);
    }
    for op in ["cmplt", "cmpeq", "cmpne"] {
        check_graph(dev, &g(op, "bool"), &[a.clone(), b.clone()], &Bindings::new(), 0.0);
        check_graph(dev, &g(op, "bool"), &[a.clone(), a.clone()], &Bindings::new(), 0.0);
    }
    let base = widen(&f32_tensor(&[1000], 7, 0.1, 4.0));
    check_graph(dev, &g("pow", "f64"), &[base, b.clone()], &Bindings::new(), 1e-14);
    // Exact unary ops (trunc from floor: lavapipe's own f64 trunc keeps -2147483648.5).
    let mut xs = values(500, 8, -1e10, 1e10);
    xs.extend([-2147483648.5, -4294967296.5, 0.5, -0.5, -0.0, 2.5e-320, 1e300, f64::INFINITY, f64::NAN, 9.5e15]);
    for op in ["neg", "trunc", "sqrt", "recip"] {
        let (u, x) = worst_ulps(dev, op, &xs);
        assert_eq!(u, 0, "{op} at {x:e}");
    }
    // NaN, signed zeros, infinities, exact fmod of huge quotients, pow's special cases.
    let inf = f64::INFINITY;
    let x = vec![
        f64::NAN,
        1.0,
        -0.0,
        0.0,
        -2.0,
        -2.0,
        3.0,
        -8.0,
        -0.0,
        -0.0,
        -inf,
        -inf,
        -1.0,
        0.5,
        1e300,
        -7.5,
        5.0,
        f64::MAX,
        1e-310,
        -7e-300,
    ];
    let y = vec![
        1.0,
        f64::NAN,
        0.0,
        -0.0,
        3.0,
        2.0,
        0.0,
        0.5,
        3.0,
        -3.0,
        3.0,
        0.5,
        inf,
        -inf,
        3.0,
        2.0,
        inf,
        5e-324,
        3e-320,
        -1.1e-308,
    ];
    let n = x.len();
    for op in ["max", "min", "pow", "mod", "cmpne", "cmpeq", "cmplt"] {
        let out = if op.starts_with("cmp") { "bool" } else { "f64" };
        let text = format!(
            "graph {{\n n0 = input 0 : f64[{n}]\n n1 = input 1 : f64[{n}]\n n2 = {op} n0, n1 : {out}[{n}]\n return n2\n}}"
        );
        let inputs = [f64_tensor(x.clone()), f64_tensor(y.clone())];
        let got = dev.run(&parse(&text), &inputs, &Bindings::new()).unwrap();
        let want = air::interp::eval(&parse(&text), &inputs, &Bindings::new()).unwrap();
        if op == "pow" {
            // exp2(y * log2 |x|): a few ULP off libm, the special cases exact.
            for (g, w) in got[0].data.to_f64_vec().iter().zip(want[0].data.to_f64_vec()) {
                assert!(
                    ulps(*g, w) <= 16 && (g.is_nan() || g.is_sign_negative() == w.is_sign_negative()),
                    "pow: {g} vs {w}"
                );
            }
        } else if out == "f64" {
            // Exact, zeros' signs included.
            let bits =
                |t: &HostTensor| t.data.to_f64_vec().iter().map(|v| if v.is_nan() { 0 } else { v.to_bits() }).collect();
            let (g, w): (Vec<u64>, Vec<u64>) = (bits(&got[0]), bits(&want[0]));
            assert_eq!(g, w, "{op}: {:?} vs {:?}", got[0].data.to_f64_vec(), want[0].data.to_f64_vec());
        } else {
            assert_close(&got[0], &want[0], 0.0, op);
        }
    }
}

#[test]
fn f64_casts_are_exact_and_saturate_like_rust() {
    let Some(dev) = gpu_f64() else { return };
    let p63 = 2f64.powi(63);
    let halfway = f32::MAX as f64 + 2f64.powi(103);
    let mut xs = vec![
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        1.5,
        -2.5,
        0.9999999,
        -0.9999999,
        2147483647.9,
        2147483648.0,
        -2147483648.5,
        -2147483649.0,
        4294967296.5,
        -4294967297.75,
        p63,
        -p63,
        p63 - 1024.0,
        -p63 - 2048.0,
        1e300,
        -1e300,
        halfway,
        -halfway,
        halfway - 2f64.powi(75),
        1e-40,
        -1e-45,
        1e-320,
        1.0000000596046448,
        16777217.0,
        9007199254740993.0,
    ];
    xs.extend(values(200, 21, -1e12, 1e12));
    xs.extend(f64_magnitudes(200, 22, -1075, 1024, true));
    let n = xs.len();
    let x = f64_tensor(xs);
    for to in ["f32", "i32", "i64", "bool"] {
        let text = format!("graph {{\n n0 = input 0 : f64[{n}]\n n1 = cast {to} n0 : {to}[{n}]\n return n1\n}}");
        check_graph(dev, &parse(&text), std::slice::from_ref(&x), &Bindings::new(), 0.0);
    }
    // Into f64: i64 rounds to nearest even (ties at 2^53 + odd), the rest are exact.
    let mut ints = i64_values(100, 23);
    ints.extend([i64::MAX, i64::MIN, i64::MAX - 511, (1 << 53) + 1, (1 << 53) + 3, -(1 << 53) - 1, (1 << 54) + 2]);
    let m = ints.len();
    let f = HostTensor::from_vec(vec![1.7f32, -0.0, f32::NAN, f32::INFINITY, 1e-40, f32::MAX, -3e9], vec![7]).unwrap();
    let i = HostTensor::from_vec(vec![0i32, 1, -1, i32::MAX, i32::MIN], vec![5]).unwrap();
    let b = HostTensor::from_vec(vec![true, false, true], vec![3]).unwrap();
    for (from, t, len) in [("i64", &i64_tensor(ints), m), ("f32", &f, 7), ("i32", &i, 5), ("bool", &b, 3)] {
        let text = format!("graph {{\n n0 = input 0 : {from}[{len}]\n n1 = cast f64 n0 : f64[{len}]\n return n1\n}}");
        check_graph(dev, &parse(&text), std::slice::from_ref(t), &Bindings::new(), 0.0);
    }
}

#[test]
fn f64_matmul_reductions_gather_and_scatter_match_cpu() {
    let Some(dev) = gpu_f64() else { return };
    let wide = |shape: &[usize], seed| widen(&f32_tensor(shape, seed, -1.0, 1.0));
    // Lowering makes matmul kernels of f32 only, so this is a loop kernel; kept small, because a
    // long single-invocation loop stops early on lavapipe (i32 too; see the report).
    let mm = matmul("2", "9", "20", "7", true, true).replace("f32", "f64");
    let inputs = [wide(&[2, 20, 9], 31), wide(&[2, 20, 7], 32), wide(&[2, 9, 7], 33)];
    check_graph(dev, &parse(&mm), &inputs, &Bindings::new(), 1e-12);
    for (op, cols) in [("sum", 7), ("sum", 3000), ("max", 7), ("max", 3000)] {
        let text = format!(
            "graph {{\n n0 = input 0 : f64[5, {cols}]\n n1 = reduce {op} axes=[1] n0 : f64[5, 1]\n return n1\n}}"
        );
        check_graph(dev, &parse(&text), &[wide(&[5, cols], 34)], &Bindings::new(), 1e-12);
    }
    let full = "graph {\n n0 = input 0 : f64[4096]\n n1 = reduce sum axes=[0] n0 : f64[1]\n return n1\n}";
    check_graph(dev, &parse(full), &[wide(&[4096], 35)], &Bindings::new(), 1e-12);
    let idx = HostTensor::from_vec(vec![3i64, 0, 1, 3, 2, 0], vec![2, 3]).unwrap();
    let text = "graph {\n n0 = input 0 : f64[4, 3]\n n1 = input 1 : i64[2, 3]\n n2 = gather axis=0 n0, n1 : f64[2, 3]\n n3 = scatter_add axis=0 [4, 3] n1, n2 : f64[4, 3]\n return n2, n3\n}";
    check_graph(dev, &parse(text), &[wide(&[4, 3], 36), idx], &Bindings::new(), 0.0);
}
