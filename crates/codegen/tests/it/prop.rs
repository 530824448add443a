//! Property test: random element-wise expression trees over three inputs, at random lengths,
//! JIT (vector + tail paths) vs the plain evaluator, bit for bit (only correctly rounded ops).

use crate::common;

use air::{BinaryOp, DType, Scalar, UnaryOp};
use common::*;
use lower::kir::{Access, IExpr, Inst, LoopKernel, Stmt};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Expr {
    Input(u32),
    Const(f32),
    Index,
    Unary(UnaryOp, Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// `a < b ? c : d`
    Select(Box<Expr>, Box<Expr>, Box<Expr>, Box<Expr>),
}

fn float_tree() -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        (0u32..3).prop_map(Expr::Input),
        prop_oneof![Just(0.0f32), Just(1.0), Just(-2.5), Just(0.1), Just(f32::INFINITY)].prop_map(Expr::Const),
        Just(Expr::Index),
    ];
    leaf.prop_recursive(5, 32, 4, |inner| {
        let un = prop_oneof![Just(UnaryOp::Neg), Just(UnaryOp::Sqrt), Just(UnaryOp::Recip), Just(UnaryOp::Trunc)];
        let bin = prop_oneof![
            Just(BinaryOp::Add),
            Just(BinaryOp::Sub),
            Just(BinaryOp::Mul),
            Just(BinaryOp::Div),
            Just(BinaryOp::Max),
            Just(BinaryOp::Min),
            Just(BinaryOp::Mod),
        ];
        prop_oneof![
            (un, inner.clone()).prop_map(|(op, a)| Expr::Unary(op, Box::new(a))),
            (bin, inner.clone(), inner.clone()).prop_map(|(op, a, b)| Expr::Binary(op, Box::new(a), Box::new(b))),
            (inner.clone(), inner.clone(), inner.clone(), inner).prop_map(|(a, b, c, d)| Expr::Select(
                Box::new(a),
                Box::new(b),
                Box::new(c),
                Box::new(d)
            )),
        ]
    })
}

fn int_tree() -> impl Strategy<Value = Expr> {
    let leaf =
        prop_oneof![(0u32..3).prop_map(Expr::Input), (-3i32..4).prop_map(|c| Expr::Const(c as f32)), Just(Expr::Index)];
    leaf.prop_recursive(5, 32, 4, |inner| {
        let bin = prop_oneof![
            Just(BinaryOp::Add),
            Just(BinaryOp::Sub),
            Just(BinaryOp::Mul),
            Just(BinaryOp::Div),
            Just(BinaryOp::Mod),
            Just(BinaryOp::Max),
            Just(BinaryOp::Min),
            Just(BinaryOp::And),
            Just(BinaryOp::Or),
        ];
        let un = prop_oneof![Just(UnaryOp::Neg), Just(UnaryOp::Not)];
        prop_oneof![
            (un, inner.clone()).prop_map(|(op, a)| Expr::Unary(op, Box::new(a))),
            (bin, inner.clone(), inner.clone()).prop_map(|(op, a, b)| Expr::Binary(op, Box::new(a), Box::new(b))),
            (inner.clone(), inner.clone(), inner.clone(), inner).prop_map(|(a, b, c, d)| Expr::Select(
                Box::new(a),
                Box::new(b),
                Box::new(c),
                Box::new(d)
            )),
        ]
    })
}

/// Emits `e` as `Let`s of dtype `d`; returns the register holding it.
fn lower_expr(e: &Expr, d: DType, out: &mut Vec<Stmt>, next: &mut u32) -> u32 {
    fn fresh(out: &mut Vec<Stmt>, next: &mut u32, dtype: DType, inst: Inst) -> u32 {
        let r = *next;
        *next += 1;
        out.push(let_(r, dtype, inst));
        r
    }
    match e {
        Expr::Input(b) => fresh(out, next, d, Inst::Load { buf: *b, index: i(0), mask: None, other: Scalar::Int(0) }),
        Expr::Const(c) => {
            let s = if d.is_float() { Scalar::Float(*c as f64) } else { Scalar::Int(*c as i64) };
            fresh(out, next, d, Inst::Const(s))
        }
        Expr::Index => fresh(out, next, d, Inst::Index(i(0))),
        Expr::Unary(op, a) => {
            let a = lower_expr(a, d, out, next);
            fresh(out, next, d, Inst::Unary(*op, r(a)))
        }
        Expr::Binary(op, a, b) => {
            let a = lower_expr(a, d, out, next);
            let b = lower_expr(b, d, out, next);
            fresh(out, next, d, Inst::Binary(*op, r(a), r(b)))
        }
        Expr::Select(a, b, c, e) => {
            let a = lower_expr(a, d, out, next);
            let b = lower_expr(b, d, out, next);
            let c = lower_expr(c, d, out, next);
            let e = lower_expr(e, d, out, next);
            let cond = fresh(out, next, DType::Bool, Inst::Binary(BinaryOp::CmpLt, r(a), r(b)));
            fresh(out, next, d, Inst::Where(r(cond), r(c), r(e)))
        }
    }
}

fn kernel(e: &Expr, d: DType) -> LoopKernel {
    let mut body = Vec::new();
    let mut next = 0;
    let out = lower_expr(e, d, &mut body, &mut next);
    body.push(store(3, i(0), out));
    LoopKernel {
        params: vec![p(d, Access::Read), p(d, Access::Read), p(d, Access::Read), p(d, Access::Write)],
        n_syms: 1,
        body: vec![for_(0, IExpr::Sym(0), true, body)],
    }
}

fn run_case(e: &Expr, d: DType, n: usize, seed: u64, split: usize) {
    let k = kernel(e, d);
    let bufs: Vec<Buf> = (0..3).map(|j| Buf::from_vals(d, &sample(d, n, seed + j))).chain([Buf::zeros(d, n)]).collect();
    let mut got = bufs.clone();
    let mut want = bufs;
    // Two calls split at `split`: the runtime's thread split.
    let split = split.min(n) as i64;
    jit(&k, &mut got, &[n as i64], 0, split);
    jit(&k, &mut got, &[n as i64], split, n as i64);
    eval(&k, &mut want, &[n as i64], 0, n as i64);
    assert_bufs_close(&got[3], &want[3], 0.0, &format!("{e:?}"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_f32_trees_match(e in float_tree(), n in 0usize..200, seed in 0u64..1000, split in 0usize..200) {
        run_case(&e, DType::F32, n, seed, split);
    }

    #[test]
    fn random_i32_trees_match(e in int_tree(), n in 0usize..200, seed in 0u64..1000, split in 0usize..200) {
        run_case(&e, DType::I32, n, seed, split);
    }

    #[test]
    fn random_f64_and_i64_trees_match(e in float_tree(), ei in int_tree(), n in 0usize..40, seed in 0u64..1000) {
        run_case(&e, DType::F64, n, seed, n / 2);
        run_case(&ei, DType::I64, n, seed, n / 2);
    }
}
