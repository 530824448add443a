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
    let f64g = parse(&unary("neg", "f64"));
    match dev.compile(&f64g) {
        Err(e @ RuntimeError::Codegen(_)) => {
            assert!(e.to_string().contains("f64"), "{e}");
            assert_eq!(e.kind(), ErrorKind::Unsupported);
        }
        Err(other) => panic!("expected a codegen error, got {other}"),
        Ok(_) => panic!("f64 compiled on wgpu"),
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

fn build(rows: usize, cols: usize, steps: &[Step], extra_output: usize) -> Graph {
    let mut g = Graph::new();
    let ty = TensorType::new(DType::F32, shape_of(&[rows, cols]));
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
    ) {
        if let Some(dev) = gpu() {
            let g = build(rows, cols, &steps, extra);
            let inputs = [f32_tensor(&[rows, cols], seed, -2.0, 2.0), f32_tensor(&[rows, cols], seed ^ 0xabcdef, -2.0, 2.0)];
            check_graph(dev, &g, &inputs, &Bindings::new(), 1e-4);
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
