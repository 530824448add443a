//! Scheduling tests: golden kir dumps of fused programs, and a property test that
//! `exec::run(compile(g))` agrees with `air::interp::eval(g)` on random graphs, fused and not.

use crate::common;
use crate::common::Rng;

use air::op::{Cast, Const, Expand, Input, Iota, Pad, Permute, Reduce, Reshape, Shrink};
use air::{BinaryOp, Bindings, DType, Dim, Graph, NodeId, Op, ReduceOp, Scalar, Symbol, TensorType, UnaryOp};
use expect_test::{Expect, expect};
use kiln_lower::exec;
use kiln_lower::{CompileOptions, Program, compile};
use proptest::prelude::*;

/// Builds graphs tersely.
#[derive(Default)]
struct B {
    g: Graph,
    slots: u32,
}

fn dims(v: &[i64]) -> Vec<Dim> {
    v.iter().map(|&d| Dim::Const(d)).collect()
}

impl B {
    fn input(&mut self, dtype: DType, shape: &[Dim]) -> NodeId {
        let n = self.g.add_leaf(Op::Input(Input { slot: self.slots }), TensorType::new(dtype, shape.to_vec())).unwrap();
        self.slots += 1;
        n
    }
    fn f32(&mut self, shape: &[i64]) -> NodeId {
        self.input(DType::F32, &dims(shape))
    }
    fn konst(&mut self, v: f32, shape: &[Dim]) -> NodeId {
        let ty = TensorType::new(DType::F32, shape.to_vec());
        self.g.add_leaf(Op::Const(Const { value: Scalar::Float(v as f64) }), ty).unwrap()
    }
    fn op(&mut self, op: Op, inputs: &[NodeId]) -> NodeId {
        self.g.add(op, inputs).unwrap()
    }
    fn un(&mut self, op: UnaryOp, x: NodeId) -> NodeId {
        self.op(Op::Unary(op), &[x])
    }
    fn bin(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        self.op(Op::Binary(op), &[a, b])
    }
    fn reduce(&mut self, op: ReduceOp, x: NodeId, axes: &[usize]) -> NodeId {
        self.op(Op::Reduce(Reduce { op, axes: axes.into() }), &[x])
    }
    fn shape(&self, x: NodeId) -> Vec<Dim> {
        self.g.ty(x).shape.to_vec()
    }
    fn reshape(&mut self, x: NodeId, shape: &[Dim]) -> NodeId {
        self.op(Op::Reshape(Reshape { shape: shape.into() }), &[x])
    }
    fn permute(&mut self, x: NodeId, perm: &[usize]) -> NodeId {
        self.op(Op::Permute(Permute { perm: perm.into() }), &[x])
    }
    fn expand(&mut self, x: NodeId, shape: &[Dim]) -> NodeId {
        self.op(Op::Expand(Expand { shape: shape.into() }), &[x])
    }
    /// Broadcasts `x` (with size-1 dims where needed) to the shape of `like`.
    fn expand_like(&mut self, x: NodeId, like: NodeId) -> NodeId {
        let s = self.shape(like);
        self.expand(x, &s)
    }
    /// The front end's canonical matmul: expand-mul-sum over `[..., M, N, K]`.
    fn matmul(&mut self, a: NodeId, b: NodeId) -> NodeId {
        let (sa, sb) = (self.shape(a), self.shape(b));
        let r = sa.len();
        let (m, k, n) = (sa[r - 2], sa[r - 1], sb[r - 1]);
        let batch = &sa[..r - 2];
        let with = |tail: &[Dim]| -> Vec<Dim> { batch.iter().chain(tail).cloned().collect() };
        let a1 = self.reshape(a, &with(&[m, Dim::Const(1), k]));
        let a2 = self.expand(a1, &with(&[m, n, k]));
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        let bt = self.permute(b, &perm);
        let b1 = self.reshape(bt, &with(&[Dim::Const(1), n, k]));
        let b2 = self.expand(b1, &with(&[m, n, k]));
        let p = self.bin(BinaryOp::Mul, a2, b2);
        let s = self.reduce(ReduceOp::Sum, p, &[r]);
        self.reshape(s, &with(&[m, n]))
    }
    fn out(mut self, outs: &[NodeId]) -> Graph {
        for &o in outs {
            self.g.add_output(o);
        }
        self.g
    }
}

fn fused() -> CompileOptions {
    CompileOptions { optimize: false, ..CompileOptions::default() }
}

fn unfused() -> CompileOptions {
    CompileOptions { fuse: false, optimize: false, ..CompileOptions::default() }
}

/// Compares `exec::run(program)` with `air::interp::eval(g)`.
fn agree(g: &Graph, program: &Program, bindings: &Bindings, seed: u64) -> Result<(), String> {
    let inputs = common::inputs_for(g, bindings, seed, 10.0);
    let want = match air::eval(g, &inputs, bindings) {
        // A random int divisor of 0 is an error of the run: the program must report it too.
        Err(e) if e.to_string().contains("integer division by zero") => {
            return match exec::run(program, &inputs, bindings) {
                Err(x) if x.to_string().contains("integer division by zero") => Ok(()),
                other => Err(format!("interp: {e}, but exec gave {other:?}\n{program}")),
            };
        }
        r => r.map_err(|e| format!("interp: {e}"))?,
    };
    let got = exec::run(program, &inputs, bindings).map_err(|e| format!("exec: {e}\n{program}"))?;
    if want.len() != got.len() {
        return Err(format!("{} outputs, expected {}", got.len(), want.len()));
    }
    for (i, (w, o)) in want.iter().zip(&got).enumerate() {
        if w.numel() == 0 && o.shape == w.shape && o.dtype() == w.dtype() {
            continue; // An empty output: its dtype and shape are all there is to compare.
        }
        air::testing::check_host(o, w, air::testing::Tol::both(1e-3))
            .map_err(|e| format!("output {i}: {e}\n{}\n{program}", air::print(g)))?;
    }
    Ok(())
}

/// Compiles fused, checks the dump and checks the result against the interpreter (fused and not).
fn check(g: Graph, want: Expect) {
    let p = compile(&g, &fused()).unwrap();
    want.assert_eq(&p.to_string());
    agree(&g, &p, &Bindings::new(), 1).unwrap();
    agree(&g, &compile(&g, &unfused()).unwrap(), &Bindings::new(), 1).unwrap();
}

fn count_kernels(p: &Program, matmul: bool) -> usize {
    p.steps
        .iter()
        .filter(|s| matches!(p.kernels[s.kernel as usize], kiln_lower::kir::Kernel::Matmul(_)) == matmul)
        .count()
}

#[test]
fn elementwise_chain_fuses_into_one_flat_kernel() {
    let mut b = B::default();
    let x = b.f32(&[4, 8]);
    let y = b.un(UnaryOp::Neg, x);
    let z = b.un(UnaryOp::Exp2, y);
    let w = b.un(UnaryOp::Neg, z);
    check(
        b.out(&[w]),
        expect![[r#"
            buf0: f32[32] input 0
            buf1: f32[32] output 0
            k0 = kernel(b0: out f32, b1: in f32) {
              for i0 in 0..32 parallel {
                r0: f32 = load b1[i0]
                r1: f32 = neg r0
                r2: f32 = exp2 r1
                r3: f32 = neg r2
                store b0[i0] = r3
              }
            }
            launch k0(buf1, buf0)
            return buf1: f32[4, 8]
        "#]],
    );
}

#[test]
fn elementwise_producers_fuse_into_a_full_reduction() {
    let mut b = B::default();
    let x = b.f32(&[3, 5]);
    let y = b.un(UnaryOp::Neg, x);
    let z = b.un(UnaryOp::Exp2, y);
    let w = b.un(UnaryOp::Recip, z);
    let s = b.reduce(ReduceOp::Sum, w, &[0, 1]);
    check(
        b.out(&[s]),
        expect![[r#"
        buf0: f32[15] input 0
        buf1: f32[1] output 0
        k0 = kernel(b0: out f32, b1: in f32) {
          acc0: f32 = sum.init
          for i0 in 0..15 {
            r0: f32 = load b1[i0]
            r1: f32 = neg r0
            r2: f32 = exp2 r1
            r3: f32 = recip r2
            acc0 <- r3
          }
          r4: f32 = read acc0
          store b0[0] = r4
        }
        launch k0(buf1, buf0)
        return buf1: f32[1, 1]
    "#]],
    );
}

/// softmax over the last axis, as the front end builds it.
fn softmax(b: &mut B, x: NodeId, axis: usize) -> NodeId {
    let m = b.reduce(ReduceOp::Max, x, &[axis]);
    let me = b.expand_like(m, x);
    let d = b.bin(BinaryOp::Sub, x, me);
    let shape = b.shape(x);
    let c = b.konst(std::f32::consts::LOG2_E, &shape);
    let t = b.bin(BinaryOp::Mul, d, c);
    let e = b.un(UnaryOp::Exp2, t);
    let s = b.reduce(ReduceOp::Sum, e, &[axis]);
    let r = b.un(UnaryOp::Recip, s);
    let re = b.expand_like(r, x);
    b.bin(BinaryOp::Mul, e, re)
}

/// Softmax over rows of 16: the row maximum, the exponentials (one element-wise kernel: its sum
/// and the normalization both read it, and recomputing `exp2` in each cost more than the round
/// trip), their sum's reciprocal, and the product. Rows shorter than `TILE_ROWS_MIN` keep three
/// kernels (`short_softmax_rows_recompute_their_exponentials`).
#[test]
fn softmax_computes_its_exponentials_once() {
    let mut b = B::default();
    let x = b.f32(&[4, 16]);
    let y = softmax(&mut b, x, 1);
    check(
        b.out(&[y]),
        expect![[r#"
            buf0: f32[64] input 0
            buf1: f32[64] output 0
            buf2: f32[4] temp
            buf3: f32[64] temp
            buf4: f32[4] temp
            k0 = kernel(b0: out f32, b1: in f32) {
              for i0 in 0..4 parallel {
                acc0: f32 = max.init
                for i1 in 0..16 {
                  r0: f32 = load b1[(i0*16 + i1)]
                  acc0 <- r0
                }
                r1: f32 = read acc0
                store b0[i0] = r1
              }
            }
            k1 = kernel(b0: out f32, b1: in f32, b2: in f32) {
              for i0 in 0..4 parallel {
                r0: f32 = load b2[i0]
                r1: f32 = const 1.4426950216293335
                for i1 in 0..16 {
                  r2: f32 = load b1[(i0*16 + i1)]
                  r3: f32 = sub r2, r0
                  r4: f32 = mul r3, r1
                  r5: f32 = exp2 r4
                  store b0[(i0*16 + i1)] = r5
                }
              }
            }
            k2 = kernel(b0: out f32, b1: in f32) {
              for i0 in 0..4 parallel {
                acc0: f32 = sum.init
                for i1 in 0..16 {
                  r0: f32 = load b1[(i0*16 + i1)]
                  acc0 <- r0
                }
                r1: f32 = read acc0
                r2: f32 = recip r1
                store b0[i0] = r2
              }
            }
            k3 = kernel(b0: out f32, b1: in f32, b2: in f32) {
              for i0 in 0..4 parallel {
                r0: f32 = load b2[i0]
                for i1 in 0..16 {
                  r1: f32 = load b1[(i0*16 + i1)]
                  r2: f32 = mul r1, r0
                  store b0[(i0*16 + i1)] = r2
                }
              }
            }
            launch k0(buf2, buf0)
            launch k1(buf3, buf0, buf2)
            launch k2(buf4, buf3)
            launch k3(buf1, buf3, buf4)
            return buf1: f32[4, 16]
        "#]],
    );
}

#[test]
fn matmul_2d() {
    let mut b = B::default();
    let x = b.f32(&[3, 4]);
    let w = b.f32(&[4, 5]);
    let y = b.matmul(x, w);
    check(
        b.out(&[y]),
        expect![[r#"
        buf0: f32[12] input 0
        buf1: f32[20] input 1
        buf2: f32[15] output 0
        k0 = matmul(b0: out f32, b1: in f32, b2: in f32) {
          batch 1, m 3, n 5, k 4, f32
          a = b1[0 + batch*0 + row*4 + col*1]
          b = b2[0 + batch*0 + row*5 + col*1]
          c = b0[0 + batch*15 + row*5 + col*1]
        }
        launch k0(buf2, buf0, buf1)
        return buf2: f32[3, 5]
    "#]],
    );
}

#[test]
fn matmul_batched_with_transposed_operand() {
    let mut b = B::default();
    let q = b.f32(&[2, 3, 4]);
    let k = b.f32(&[2, 5, 4]);
    let kt = b.permute(k, &[0, 2, 1]);
    let y = b.matmul(q, kt);
    let g = b.out(&[y]);
    let p = compile(&g, &fused()).unwrap();
    assert_eq!(count_kernels(&p, true), 1);
    check(
        g,
        expect![[r#"
        buf0: f32[24] input 0
        buf1: f32[40] input 1
        buf2: f32[30] output 0
        k0 = matmul(b0: out f32, b1: in f32, b2: in f32) {
          batch 2, m 3, n 5, k 4, f32
          a = b1[0 + batch*12 + row*4 + col*1]
          b = b2[0 + batch*20 + row*1 + col*4]
          c = b0[0 + batch*15 + row*5 + col*1]
        }
        launch k0(buf2, buf0, buf1)
        return buf2: f32[2, 3, 5]
    "#]],
    );
}

/// `x @ w + bias` for `x: [3, 4]`, `w: [4, 5]` and a `[1, 5]` bias broadcast over the rows.
fn matmul_plus_bias(b: &mut B) -> NodeId {
    let x = b.f32(&[3, 4]);
    let w = b.f32(&[4, 5]);
    let bias = b.f32(&[1, 5]);
    let y = b.matmul(x, w);
    let be = b.expand_like(bias, y);
    b.bin(BinaryOp::Add, y, be)
}

/// A bias whose sum is an output (nothing else reads it): the matmul accumulates onto the bias.
#[test]
fn matmul_bias_output_accumulates() {
    let mut b = B::default();
    let z = matmul_plus_bias(&mut b);
    check(
        b.out(&[z]),
        expect![[r#"
        buf0: f32[12] input 0
        buf1: f32[20] input 1
        buf2: f32[5] input 2
        buf3: f32[15] output 0
        k0 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..3 parallel {
            for i1 in 0..5 {
              r0: f32 = load b1[i1]
              store b0[(i0*5 + i1)] = r0
            }
          }
        }
        k1 = matmul(b0: out f32, b1: in f32, b2: in f32) {
          batch 1, m 3, n 5, k 4, f32
          a = b1[0 + batch*0 + row*4 + col*1]
          b = b2[0 + batch*0 + row*5 + col*1]
          c = b0[0 + batch*15 + row*5 + col*1]
          accumulate
        }
        launch k0(buf3, buf2)
        launch k1(buf3, buf0, buf1)
        return buf3: f32[3, 5]
    "#]],
    );
}

/// A bias whose sum only the ReLU reads: the ReLU's kernel adds it as it loads the product (no
/// pass writing the bias into the product's buffer first).
#[test]
fn matmul_bias_relu() {
    let mut b = B::default();
    let z = matmul_plus_bias(&mut b);
    let zero = b.konst(0.0, &dims(&[3, 5]));
    let r = b.bin(BinaryOp::Max, z, zero);
    check(
        b.out(&[r]),
        expect![[r#"
            buf0: f32[12] input 0
            buf1: f32[20] input 1
            buf2: f32[5] input 2
            buf3: f32[15] output 0
            buf4: f32[15] temp
            k0 = matmul(b0: out f32, b1: in f32, b2: in f32) {
              batch 1, m 3, n 5, k 4, f32
              a = b1[0 + batch*0 + row*4 + col*1]
              b = b2[0 + batch*0 + row*5 + col*1]
              c = b0[0 + batch*15 + row*5 + col*1]
            }
            k1 = kernel(b0: out f32, b1: in f32, b2: in f32) {
              for i0 in 0..3 parallel {
                r0: f32 = const 0.0
                for i1 in 0..5 {
                  r1: f32 = load b1[(i0*5 + i1)]
                  r2: f32 = load b2[i1]
                  r3: f32 = add r1, r2
                  r4: f32 = max r3, r0
                  store b0[(i0*5 + i1)] = r4
                }
              }
            }
            launch k0(buf4, buf0, buf1)
            launch k1(buf3, buf4, buf2)
            return buf3: f32[3, 5]
        "#]],
    );
}

#[test]
fn permute_then_reshape_loops_over_the_permuted_shape_without_div_mod() {
    let mut b = B::default();
    let x = b.f32(&[2, 3, 4]);
    let t = b.permute(x, &[2, 0, 1]);
    let r = b.reshape(t, &dims(&[8, 3]));
    let y = b.un(UnaryOp::Neg, r);
    check(
        b.out(&[y]),
        expect![[r#"
            buf0: f32[24] input 0
            buf1: f32[24] output 0
            k0 = kernel(b0: out f32, b1: in f32) {
              for i0 in 0..4 parallel {
                for i1 in 0..2 {
                  for i2 in 0..3 {
                    r0: f32 = load b1[((i0 + i1*12) + i2*4)]
                    r1: f32 = neg r0
                    store b0[((i0*6 + i1*3) + i2)] = r1
                  }
                }
              }
            }
            launch k0(buf1, buf0)
            return buf1: f32[8, 3]
        "#]],
    );
}

#[test]
fn pad_becomes_a_masked_load() {
    let mut b = B::default();
    let x = b.f32(&[3, 4]);
    let p = b.op(
        Op::Pad(Pad {
            padding: vec![(Dim::Const(1), Dim::Const(0)), (Dim::Const(0), Dim::Const(2))],
            value: Scalar::Float(-1.0),
        }),
        &[x],
    );
    let y = b.un(UnaryOp::Sqrt, p);
    check(
        b.out(&[y]),
        expect![[r#"
        buf0: f32[12] input 0
        buf1: f32[24] output 0
        k0 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..4 parallel {
            for i1 in 0..6 {
              r0: f32 = load b1[((i0*4 + i1) + -4)] if ((0 < i0) && (i1 < 4)) else -1.0
              r1: f32 = sqrt r0
              store b0[(i0*6 + i1)] = r1
            }
          }
        }
        launch k0(buf1, buf0)
        return buf1: f32[4, 6]
    "#]],
    );
}

/// The facade's `cat`: each piece zero-padded along `axis` to the total, the pads added.
fn cat(b: &mut B, pieces: &[NodeId], axis: usize) -> NodeId {
    let sizes: Vec<Dim> = pieces.iter().map(|&p| b.shape(p)[axis]).collect();
    let total = sizes.iter().fold(Dim::Const(0), |a, s| &a + s);
    let combine = if b.g.ty(pieces[0]).dtype == DType::Bool { BinaryOp::Or } else { BinaryOp::Add };
    let (mut at, mut acc) = (Dim::Const(0), None);
    for (&p, size) in pieces.iter().zip(&sizes) {
        let rank = b.shape(p).len();
        let after = &(total - at) - size;
        let padding = (0..rank).map(|d| if d == axis { (at, after) } else { (Dim::Const(0), Dim::Const(0)) }).collect();
        let value = Scalar::Int(0).cast(b.g.ty(p).dtype);
        let padded = b.op(Op::Pad(Pad { padding, value }), &[p]);
        acc = Some(match acc {
            None => padded,
            Some(a) => b.bin(combine, a, padded),
        });
        at = &at + size;
    }
    acc.unwrap()
}

/// How many steps write `buf` (the first parameter of a loop kernel is the buffer it writes).
fn writers_of(p: &Program, buf: u32) -> usize {
    p.steps.iter().filter(|s| s.args[0].0 == buf).count()
}

#[test]
fn cat_writes_each_piece_into_its_slice() {
    let mut b = B::default();
    let x = b.f32(&[2, 3]);
    let y = b.f32(&[2, 5]);
    let ny = b.un(UnaryOp::Neg, y);
    let c = cat(&mut b, &[x, ny], 1);
    let g = b.out(&[c]);
    let p = compile(&g, &fused()).unwrap();
    expect![[r#"
        buf0: f32[6] input 0
        buf1: f32[10] input 1
        buf2: f32[16] output 0
        k0 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..2 parallel {
            for i1 in 0..3 {
              r0: f32 = load b1[(i0*3 + i1)]
              store b0[(i0*8 + i1)] = r0
            }
          }
        }
        k1 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..2 parallel {
            for i1 in 0..5 {
              r0: f32 = load b1[(i0*5 + i1)]
              r1: f32 = neg r0
              store b0[((i0*8 + i1) + 3)] = r1
            }
          }
        }
        launch k0(buf2, buf0)
        launch k1(buf2, buf1)
        return buf2: f32[2, 8]
    "#]]
    .assert_eq(&p.to_string());
    agree(&g, &p, &Bindings::new(), 1).unwrap();
    agree(&g, &compile(&g, &unfused()).unwrap(), &Bindings::new(), 1).unwrap();
}

#[test]
fn cat_pieces_copying_buffers_reuse_the_first_pieces_kernel_moved_along() {
    // An unrolled RNN's output: each step's state (its own buffer) copied into its window, of
    // rows (`n` each, a symbolic offset) and of columns (strided writes). The later pieces take
    // the first one's kernel with its writes moved to their windows (`schedule/memo.rs`), and
    // each piece lands in its own window.
    let n = Dim::sym("n");
    let mut b = B::default();
    let xs: Vec<NodeId> = (0..3).map(|_| b.input(DType::F32, &[n, Dim::Const(2)])).collect();
    let rows = cat(&mut b, &xs, 0);
    let cols = cat(&mut b, &xs, 1);
    let g = b.out(&[rows, cols]);
    let p = compile(&g, &fused()).unwrap();
    let mut bindings = Bindings::new();
    bindings.insert(Symbol::new("n"), 3);
    agree(&g, &p, &bindings, 5).unwrap();
    expect![[r#"
        symbols n
        buf0: f32[2*n] input 0
        buf1: f32[2*n] input 1
        buf2: f32[2*n] input 2
        buf3: f32[6*n] output 0
        buf4: f32[6*n] output 1
        k0 = kernel(b0: out f32, b1: in f32; syms 1) {
          for i0 in 0..s0*2 parallel {
            r0: f32 = load b1[i0]
            store b0[i0] = r0
          }
        }
        k1 = kernel(b0: out f32, b1: in f32; syms 1) {
          for i0 in 0..s0*2 parallel {
            r0: f32 = load b1[i0]
            store b0[(i0 + s0*2)] = r0
          }
        }
        k2 = kernel(b0: out f32, b1: in f32; syms 1) {
          for i0 in 0..s0*2 parallel {
            r0: f32 = load b1[i0]
            store b0[(i0 + s0*4)] = r0
          }
        }
        k3 = kernel(b0: out f32, b1: in f32; syms 1) {
          for i0 in 0..s0 parallel {
            for i1 in 0..2 {
              r0: f32 = load b1[(i0*2 + i1)]
              store b0[(i0*6 + i1)] = r0
            }
          }
        }
        k4 = kernel(b0: out f32, b1: in f32; syms 1) {
          for i0 in 0..s0 parallel {
            for i1 in 0..2 {
              r0: f32 = load b1[(i0*2 + i1)]
              store b0[((i0*6 + i1) + 2)] = r0
            }
          }
        }
        k5 = kernel(b0: out f32, b1: in f32; syms 1) {
          for i0 in 0..s0 parallel {
            for i1 in 0..2 {
              r0: f32 = load b1[(i0*2 + i1)]
              store b0[((i0*6 + i1) + 4)] = r0
            }
          }
        }
        launch k0(buf3, buf0)
        launch k1(buf3, buf1)
        launch k2(buf3, buf2)
        launch k3(buf4, buf0)
        launch k4(buf4, buf1)
        launch k5(buf4, buf2)
        return buf3: f32[3*n, 2], buf4: f32[n, 6]
    "#]]
    .assert_eq(&p.to_string());
}

#[test]
fn cat_pieces_over_one_loop_nest_share_a_kernel() {
    // im2col's shape: shifted windows of one input stacked on a new axis, one of them negated
    // (its registers renamed past the first piece's) and merged; one scaled by a constant,
    // which is hoisted out of the inner loop, so that piece's nest is not a plain chain of
    // loops and it keeps its own kernel; then a piece with a reduction, its own kernel too.
    let mut b = B::default();
    let x = b.f32(&[2, 6]);
    let mut pieces = Vec::new();
    for shift in 0..3 {
        let ranges = vec![(Dim::Const(0), Dim::Const(2)), (Dim::Const(shift), Dim::Const(shift + 4))];
        let w = b.op(Op::Shrink(Shrink { ranges }), &[x]);
        let w = match shift {
            1 => b.un(UnaryOp::Neg, w),
            2 => {
                let k = b.konst(0.5, &dims(&[2, 4]));
                b.bin(BinaryOp::Mul, w, k)
            }
            _ => w,
        };
        pieces.push(b.reshape(w, &dims(&[2, 1, 4])));
    }
    let c = cat(&mut b, &pieces, 1);
    let g = b.out(&[c]);
    let p = compile(&g, &fused()).unwrap();
    expect![[r#"
        buf0: f32[12] input 0
        buf1: f32[24] output 0
        k0 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..2 parallel {
            for i1 in 0..4 {
              r0: f32 = load b1[(i0*6 + i1)]
              store b0[(i0*12 + i1)] = r0
              r1: f32 = load b1[((i0*6 + i1) + 1)]
              r2: f32 = neg r1
              store b0[((i0*12 + i1) + 4)] = r2
            }
          }
        }
        k1 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..2 parallel {
            r0: f32 = const 0.5
            for i1 in 0..4 {
              r1: f32 = load b1[((i0*6 + i1) + 2)]
              r2: f32 = mul r1, r0
              store b0[((i0*12 + i1) + 8)] = r2
            }
          }
        }
        launch k0(buf1, buf0)
        launch k1(buf1, buf0)
        return buf1: f32[2, 3, 4]
    "#]]
    .assert_eq(&p.to_string());
    agree(&g, &p, &Bindings::new(), 1).unwrap();
    agree(&g, &compile(&g, &unfused()).unwrap(), &Bindings::new(), 1).unwrap();

    let mut b = B::default();
    let x = b.f32(&[2, 4]);
    let y = b.f32(&[2, 4, 3]);
    let s = b.reduce(ReduceOp::Sum, y, &[2]);
    let s = b.reshape(s, &dims(&[2, 4]));
    let c = cat(&mut b, &[x, s, x], 1);
    let g = b.out(&[c]);
    let p = compile(&g, &fused()).unwrap();
    assert_eq!(writers_of(&p, p.outputs[0].0.0), 3, "{p}");
    agree(&g, &p, &Bindings::new(), 2).unwrap();
}

#[test]
fn cat_pieces_in_any_order_dtype_and_symbolic_sizes() {
    // Three pieces along a symbolic axis 0, one of them a padded window (its own pad on axis 1
    // composes with the cat's), added in an order other than the axis order.
    let (n, m) = (Dim::sym("n"), Dim::sym("m"));
    let mut b = B::default();
    let x = b.input(DType::F32, &[n, Dim::Const(4)]);
    let y = b.input(DType::F32, &[m, Dim::Const(2)]);
    let z = b.f32(&[3, 4]);
    let yp = b.op(
        Op::Pad(Pad {
            padding: vec![(Dim::Const(0), Dim::Const(0)), (Dim::Const(1), Dim::Const(1))],
            value: Scalar::Float(0.0),
        }),
        &[y],
    );
    let c = cat(&mut b, &[x, yp, z], 0);
    let g = b.out(&[c]);
    let p = compile(&g, &fused()).unwrap();
    let out = p.outputs[0].0.0;
    assert_eq!(writers_of(&p, out), 3, "{p}");
    for (sn, sm) in [(1, 2), (4, 3), (0, 5)] {
        let bind = Bindings::from([(Symbol::new("n"), sn), (Symbol::new("m"), sm)]);
        agree(&g, &p, &bind, (sn * 10 + sm) as u64).unwrap();
    }
    // Bool pieces are combined with `or`; integers with `add`; a 3-D cat on the middle axis.
    for dtype in [DType::Bool, DType::I32] {
        let mut b = B::default();
        let x = b.input(dtype, &dims(&[2, 1, 3]));
        let y = b.input(dtype, &dims(&[2, 4, 3]));
        let c = cat(&mut b, &[y, x, y], 1);
        let g = b.out(&[c]);
        let p = compile(&g, &fused()).unwrap();
        assert_eq!(writers_of(&p, p.outputs[0].0.0), 3, "{p}");
        agree(&g, &p, &Bindings::new(), 3).unwrap();
    }
}

#[test]
fn flattened_window_loops_over_the_window_without_div_mod() {
    // A 4x4 window of 6x6 images, flattened (what conv-1's taps become before its Linear): the
    // loops follow the window, so no load divides.
    let mut b = B::default();
    let x = b.f32(&[2, 1, 6, 6]);
    let mut taps = Vec::new();
    for (i, j) in [(0, 0), (1, 2), (2, 1)] {
        let ranges = vec![(0, 2), (0, 1), (i, i + 4), (j, j + 4)]
            .into_iter()
            .map(|(a, e)| (Dim::Const(a), Dim::Const(e)))
            .collect();
        taps.push(b.op(Op::Shrink(Shrink { ranges }), &[x]));
    }
    let s = b.bin(BinaryOp::Add, taps[0], taps[1]);
    let s = b.bin(BinaryOp::Mul, s, taps[2]);
    let flat = b.reshape(s, &dims(&[2, 16]));
    let y = b.un(UnaryOp::Neg, flat);
    // The same windows unflattened: the size-1 channel dim between the batch and the rows must
    // not let the loops merge batch and rows, which do not stride alike.
    let z = b.un(UnaryOp::Neg, s);
    let g = b.out(&[y, z]);
    let p = compile(&g, &fused()).unwrap();
    let text = p.to_string();
    assert!(!text.contains(" / ") && !text.contains(" % "), "{text}");
    agree(&g, &p, &Bindings::new(), 1).unwrap();
    agree(&g, &compile(&g, &unfused()).unwrap(), &Bindings::new(), 1).unwrap();
}

#[test]
fn symbolic_dims_read_syms() {
    let mut b = B::default();
    let seq = Dim::sym("seq");
    let x = b.input(DType::F32, &[seq, Dim::Const(4)]);
    let m = b.reduce(ReduceOp::Max, x, &[1]);
    let me = b.expand_like(m, x);
    let y = b.bin(BinaryOp::Sub, x, me);
    let g = b.out(&[y]);
    let p = compile(&g, &fused()).unwrap();
    expect![[r#"
        symbols seq
        buf0: f32[4*seq] input 0
        buf1: f32[4*seq] output 0
        buf2: f32[seq] temp
        k0 = kernel(b0: out f32, b1: in f32; syms 1) {
          for i0 in 0..s0 parallel {
            acc0: f32 = max.init
            for i1 in 0..4 {
              r0: f32 = load b1[(i0*4 + i1)]
              acc0 <- r0
            }
            r1: f32 = read acc0
            store b0[i0] = r1
          }
        }
        k1 = kernel(b0: out f32, b1: in f32, b2: in f32; syms 1) {
          for i0 in 0..s0 parallel {
            r0: f32 = load b2[i0]
            for i1 in 0..4 {
              r1: f32 = load b1[(i0*4 + i1)]
              r2: f32 = sub r1, r0
              store b0[(i0*4 + i1)] = r2
            }
          }
        }
        launch k0(buf2, buf0)
        launch k1(buf1, buf0, buf2)
        return buf1: f32[seq, 4]
    "#]]
    .assert_eq(&p.to_string());
    for s in [3, 7] {
        let bind = Bindings::from([(Symbol::new("seq"), s)]);
        agree(&g, &p, &bind, s as u64).unwrap();
    }
}

#[test]
fn reduce_epilogue_fuses_into_the_reduce_kernel() {
    // mean over the last axis, then x - mean: the scale runs after the reduce loop.
    let mut b = B::default();
    let x = b.f32(&[4, 6]);
    let s = b.reduce(ReduceOp::Sum, x, &[1]);
    let c = b.konst(1.0 / 6.0, &dims(&[4, 1]));
    let mean = b.bin(BinaryOp::Mul, s, c);
    let me = b.expand_like(mean, x);
    let y = b.bin(BinaryOp::Sub, x, me);
    check(
        b.out(&[y]),
        expect![[r#"
        buf0: f32[24] input 0
        buf1: f32[24] output 0
        buf2: f32[4] temp
        k0 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..4 parallel {
            acc0: f32 = sum.init
            r0: f32 = const 0.1666666716337204
            for i1 in 0..6 {
              r1: f32 = load b1[(i0*6 + i1)]
              acc0 <- r1
            }
            r2: f32 = read acc0
            r3: f32 = mul r2, r0
            store b0[i0] = r3
          }
        }
        k1 = kernel(b0: out f32, b1: in f32, b2: in f32) {
          for i0 in 0..4 parallel {
            r0: f32 = load b2[i0]
            for i1 in 0..6 {
              r1: f32 = load b1[(i0*6 + i1)]
              r2: f32 = sub r1, r0
              store b0[(i0*6 + i1)] = r2
            }
          }
        }
        launch k0(buf2, buf0)
        launch k1(buf1, buf0, buf2)
        return buf1: f32[4, 6]
    "#]],
    );
}

#[test]
fn short_softmax_rows_recompute_their_exponentials() {
    let mut b = B::default();
    let x = b.f32(&[4, 6]);
    let y = softmax(&mut b, x, 1);
    let prog = compile(&b.out(&[y]), &fused()).unwrap();
    assert_eq!(prog.steps.len(), 3, "{prog}");
    assert_eq!(prog.to_string().matches(" exp2 ").count(), 2, "{prog}");
}

/// Softmax over rows of a symbolic length (a decoder's attention over its past): the row maximum
/// and the sum of the exponentials are row reduces computed inside the one kernel that reads
/// them, in loops of their own before the loop over the row, with plain indices (no division by
/// the symbolic length). Checked against the interpreter at lengths 1, 3 and 7.
#[test]
fn symbolic_softmax_rows_are_computed_by_their_reader() {
    let mut b = B::default();
    let seq = Dim::sym("seq");
    let x = b.input(DType::F32, &[Dim::Const(4), seq]);
    let y = softmax(&mut b, x, 1);
    let g = b.out(&[y]);
    let p = compile(&g, &fused()).unwrap();
    expect![[r#"
        symbols seq
        buf0: f32[4*seq] input 0
        buf1: f32[4*seq] output 0
        k0 = kernel(b0: out f32, b1: in f32; syms 1) {
          for i0 in 0..4 parallel {
            acc0: f32 = max.init
            for i2 in 0..s0 {
              r0: f32 = load b1[(i0*s0 + i2)]
              acc0 <- r0
            }
            r1: f32 = read acc0
            r2: f32 = const 1.4426950216293335
            acc1: f32 = sum.init
            for i3 in 0..s0 {
              r3: f32 = load b1[(i0*s0 + i3)]
              r4: f32 = sub r3, r1
              r5: f32 = mul r4, r2
              r6: f32 = exp2 r5
              acc1 <- r6
            }
            r7: f32 = read acc1
            r8: f32 = recip r7
            for i1 in 0..s0 {
              r9: f32 = load b1[(i0*s0 + i1)]
              r10: f32 = sub r9, r1
              r11: f32 = mul r10, r2
              r12: f32 = exp2 r11
              r13: f32 = mul r12, r8
              store b0[(i0*s0 + i1)] = r13
            }
          }
        }
        launch k0(buf1, buf0)
        return buf1: f32[4, seq]
    "#]]
    .assert_eq(&p.to_string());
    for s in [1, 3, 7] {
        let bind = Bindings::from([(Symbol::new("seq"), s)]);
        agree(&g, &p, &bind, s as u64).unwrap();
    }
}

/// A layer norm over a symbolic axis: the mean is a row reduce of the variance's row reduce,
/// which is one of the normalization's kernel, and the row reduces index the rows without
/// dividing by the symbolic length. The element count (a sum of ones, read at its own shape by
/// both divisions) keeps a kernel of its own. Checked at empty rows and no rows too.
#[test]
fn symbolic_layer_norm_computes_its_statistics_per_row() {
    let mut b = B::default();
    let (n, seq) = (Dim::sym("n"), Dim::sym("seq"));
    let x = b.input(DType::F32, &[Dim::Const(3), n, seq]);
    let s = b.reduce(ReduceOp::Sum, x, &[2]);
    let x_shape = b.shape(x);
    let one = b.konst(1.0, &x_shape);
    let count = b.reduce(ReduceOp::Sum, one, &[2]);
    let mean = b.bin(BinaryOp::Div, s, count);
    let me = b.expand_like(mean, x);
    let d = b.bin(BinaryOp::Sub, x, me);
    let sq = b.bin(BinaryOp::Mul, d, d);
    let v = b.reduce(ReduceOp::Sum, sq, &[2]);
    let var = b.bin(BinaryOp::Div, v, count);
    let eps = b.konst(1e-5, &b.shape(var));
    let ve = b.bin(BinaryOp::Add, var, eps);
    let r = b.un(UnaryOp::Sqrt, ve);
    let r = b.un(UnaryOp::Recip, r);
    let re = b.expand_like(r, x);
    let y = b.bin(BinaryOp::Mul, d, re);
    let g = b.out(&[y]);
    let p = compile(&g, &fused()).unwrap();
    assert_eq!(p.steps.len(), 2, "{p}");
    let text = p.to_string();
    assert_eq!(text.matches("sum.init").count(), 3, "{text}");
    assert!(!text.contains(" / ") && !text.contains(" % "), "{text}");
    for (n, s) in [(1, 1), (2, 5), (3, 0), (0, 4)] {
        let bind = Bindings::from([(Symbol::new("n"), n), (Symbol::new("seq"), s)]);
        agree(&g, &p, &bind, (n * 10 + s) as u64).unwrap();
    }
}

/// Where a reduce over a symbolic axis is not read as rows, it keeps its kernel: a sum over the
/// first axis broadcast back along it (its reader would loop over the reduced axis outside the
/// rows), a sum read at its own shape, a sum read by three kernels, and a sum over an empty axis
/// beside the symbolic one, broadcast to a wider shape (its reader's loops run, the row's
/// input is empty).
#[test]
fn reduces_not_read_as_rows_keep_their_kernels() {
    let seq = Dim::sym("seq");
    // Over the first axis.
    let mut b = B::default();
    let x = b.input(DType::F32, &[seq, Dim::Const(4)]);
    let s = b.reduce(ReduceOp::Sum, x, &[0]);
    let se = b.expand_like(s, x);
    let y = b.bin(BinaryOp::Sub, x, se);
    let first = b.out(&[y]);
    // Read at its own shape, and broadcast.
    let mut b = B::default();
    let x = b.input(DType::F32, &[Dim::Const(4), seq]);
    let s = b.reduce(ReduceOp::Max, x, &[1]);
    let t = b.un(UnaryOp::Neg, s);
    let se = b.expand_like(s, x);
    let y = b.bin(BinaryOp::Sub, x, se);
    let own = b.out(&[y, t]);
    // Read by three kernels (three outputs).
    let mut b = B::default();
    let x = b.input(DType::F32, &[Dim::Const(4), seq]);
    let s = b.reduce(ReduceOp::Sum, x, &[1]);
    let se = b.expand_like(s, x);
    let ys: Vec<NodeId> =
        [BinaryOp::Sub, BinaryOp::Add, BinaryOp::Mul].into_iter().map(|op| b.bin(op, x, se)).collect();
    let three = b.out(&ys);
    // Over an empty axis and the symbolic one, read broadcast to `[3, 4, seq]`.
    let mut b = B::default();
    let x = b.input(DType::F32, &[Dim::Const(3), Dim::Const(0), seq]);
    let s = b.reduce(ReduceOp::Sum, x, &[1, 2]);
    let wide = [Dim::Const(3), Dim::Const(4), seq];
    let se = b.expand(s, &wide);
    let y = b.input(DType::F32, &wide);
    let z = b.bin(BinaryOp::Add, y, se);
    let empty = b.out(&[z]);
    for (g, kernels) in [(first, 2), (own, 3), (three, 4), (empty, 2)] {
        let p = compile(&g, &fused()).unwrap();
        assert_eq!(p.steps.len(), kernels, "{p}");
        for s in [1, 5] {
            agree(&g, &p, &Bindings::from([(Symbol::new("seq"), s)]), s as u64).unwrap();
        }
    }
}

#[test]
fn symbolic_attention_runs_for_two_lengths() {
    let mut b = B::default();
    let seq = Dim::sym("seq");
    let d = Dim::Const(4);
    let q = b.input(DType::F32, &[seq, d]);
    let k = b.input(DType::F32, &[seq, d]);
    let v = b.input(DType::F32, &[seq, d]);
    let kt = b.permute(k, &[1, 0]);
    let scores = b.matmul(q, kt);
    let p = softmax(&mut b, scores, 1);
    let y = b.matmul(p, v);
    let g = b.out(&[y]);
    let prog = compile(&g, &fused()).unwrap();
    assert_eq!(count_kernels(&prog, true), 2, "{prog}");
    for s in [3, 7] {
        let bind = Bindings::from([(Symbol::new("seq"), s)]);
        agree(&g, &prog, &bind, s as u64).unwrap();
        agree(&g, &compile(&g, &unfused()).unwrap(), &bind, s as u64).unwrap();
    }
}

#[test]
fn outputs_that_are_inputs_or_views_get_copies() {
    let mut b = B::default();
    let x = b.f32(&[2, 3]);
    let t = b.permute(x, &[1, 0]);
    let y = b.un(UnaryOp::Neg, x);
    check(
        b.out(&[x, t, y, y]),
        expect![[r#"
        buf0: f32[6] input 0
        buf1: f32[6] output 0
        buf2: f32[6] output 1
        buf3: f32[6] output 2
        k0 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..6 parallel {
            r0: f32 = load b1[i0]
            store b0[i0] = r0
          }
        }
        k1 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..3 parallel {
            for i1 in 0..2 {
              r0: f32 = load b1[(i0 + i1*3)]
              store b0[(i0*2 + i1)] = r0
            }
          }
        }
        k2 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..6 parallel {
            r0: f32 = load b1[i0]
            r1: f32 = neg r0
            store b0[i0] = r1
          }
        }
        launch k0(buf1, buf0)
        launch k1(buf2, buf0)
        launch k2(buf3, buf0)
        return buf1: f32[2, 3], buf2: f32[3, 2], buf3: f32[2, 3], buf3: f32[2, 3]
    "#]],
    );
}

#[test]
fn long_chains_are_cut_into_bounded_kernels() {
    let mut b = B::default();
    let mut x = b.f32(&[7]);
    for i in 0..1000 {
        x = b.un(if i % 2 == 0 { UnaryOp::Neg } else { UnaryOp::Sin }, x);
    }
    let g = b.out(&[x]);
    let p = compile(&g, &fused()).unwrap();
    assert_eq!(p.steps.len(), 1000usize.div_ceil(65));
    agree(&g, &p, &Bindings::new(), 3).unwrap();
}

fn consts(shape: &[Dim]) -> Vec<i64> {
    shape.iter().map(|d| d.as_const().unwrap()).collect()
}

/// A random shape of `numel` elements (prime factors in random groups, size-1 dims sprinkled in).
fn random_reshape(rng: &mut Rng, numel: i64) -> Vec<Dim> {
    if numel == 0 {
        return dims(&[rng.pick(&[1, 2]), 0]);
    }
    let mut factors = Vec::new();
    let mut n = numel;
    let mut p = 2;
    while n > 1 {
        while n % p == 0 {
            factors.push(p);
            n /= p;
        }
        p += 1;
    }
    let mut out: Vec<i64> = Vec::new();
    for f in factors {
        if out.is_empty() || rng.chance(50) {
            out.push(f);
        } else {
            let i = rng.below(out.len());
            out[i] *= f;
        }
    }
    if out.is_empty() || rng.chance(30) {
        let i = rng.below(out.len() + 1);
        out.insert(i, 1);
    }
    out.truncate(4.max(out.len()));
    dims(&out)
}

/// Builds a random graph of about `n_ops` ops over f32 (or i32) tensors.
fn random_graph(seed: u64, n_ops: usize) -> Graph {
    let mut rng = Rng::new(seed);
    let int = rng.chance(20);
    let dtype = if int { DType::I32 } else { DType::F32 };
    let mut b = B::default();
    let sizes = [1, 2, 3, 5];
    let mut pool: Vec<NodeId> = Vec::new();
    for _ in 0..1 + rng.below(2) {
        let rank = 1 + rng.below(3);
        let shape: Vec<i64> = (0..rank).map(|_| rng.pick(&sizes)).collect();
        pool.push(b.input(dtype, &dims(&shape)));
    }
    let leaf = |b: &mut B, rng: &mut Rng, shape: &[Dim]| -> NodeId {
        if rng.chance(50) {
            let value =
                if int { Scalar::Int(rng.below(5) as i64 - 2) } else { Scalar::Float(rng.pick(&[0.5, -1.0, 2.0])) };
            b.g.add_leaf(Op::Const(Const { value }), TensorType::new(dtype, shape.to_vec())).unwrap()
        } else if !shape.is_empty() && rng.chance(70) {
            let axis = rng.below(shape.len());
            b.g.add_leaf(Op::Iota(Iota { axis }), TensorType::new(dtype, shape.to_vec())).unwrap()
        } else {
            b.input(dtype, shape)
        }
    };
    for _ in 0..n_ops {
        let x = rng.pick(&pool);
        let shape = b.shape(x);
        let rank = shape.len();
        let numel: i64 = consts(&shape).iter().product();
        let partner = |b: &mut B, rng: &mut Rng, pool: &[NodeId]| -> NodeId {
            let same: Vec<NodeId> = pool.iter().copied().filter(|&n| b.shape(n) == shape).collect();
            if !same.is_empty() && rng.chance(70) { rng.pick(&same) } else { leaf(b, rng, &shape) }
        };
        let y = match rng.below(15) {
            0 | 1 => {
                let ops: &[UnaryOp] = if int {
                    &[UnaryOp::Neg, UnaryOp::Not]
                } else {
                    &[
                        UnaryOp::Neg,
                        UnaryOp::Exp2,
                        UnaryOp::Sin,
                        UnaryOp::Sqrt,
                        UnaryOp::Recip,
                        UnaryOp::Log2,
                        UnaryOp::Erf,
                        UnaryOp::Trunc,
                    ]
                };
                let op = rng.pick(ops);
                b.un(op, x)
            }
            2 | 3 => {
                let ops: &[BinaryOp] = if int {
                    &[
                        BinaryOp::Add,
                        BinaryOp::Sub,
                        BinaryOp::Mul,
                        BinaryOp::Div,
                        BinaryOp::Max,
                        BinaryOp::Min,
                        BinaryOp::Mod,
                        BinaryOp::And,
                        BinaryOp::Or,
                    ]
                } else {
                    &[
                        BinaryOp::Add,
                        BinaryOp::Sub,
                        BinaryOp::Mul,
                        BinaryOp::Div,
                        BinaryOp::Max,
                        BinaryOp::Min,
                        BinaryOp::Mod,
                    ]
                };
                let mut y = partner(&mut b, &mut rng, &pool);
                let op = rng.pick(ops);
                if int && matches!(op, BinaryOp::Div | BinaryOp::Mod) {
                    // An integer division by zero is an error of the run, reported only where
                    // the element is computed; these graphs compare values, so divisors are
                    // never 0.
                    let ty = TensorType::new(dtype, shape.clone());
                    let zero = b.g.add_leaf(Op::Const(Const { value: Scalar::Int(0) }), ty.clone()).unwrap();
                    let one = b.g.add_leaf(Op::Const(Const { value: Scalar::Int(1) }), ty).unwrap();
                    let is_zero = b.bin(BinaryOp::CmpEq, y, zero);
                    y = b.op(Op::Where, &[is_zero, one, y]);
                }
                b.bin(op, x, y)
            }
            4 => {
                let y = partner(&mut b, &mut rng, &pool);
                let c = b.bin(rng.pick(&[BinaryOp::CmpLt, BinaryOp::CmpEq, BinaryOp::CmpNe]), x, y);
                b.op(Op::Where, &[c, x, y])
            }
            5 => {
                let to = if int { DType::F32 } else { rng.pick(&[DType::I32, DType::F64]) };
                let c = b.op(Op::Cast(Cast { to }), &[x]);
                b.op(Op::Cast(Cast { to: dtype }), &[c])
            }
            6 | 7 if rank > 0 => {
                let axes: Vec<usize> = (0..rank).filter(|_| rng.chance(50)).collect();
                b.reduce(rng.pick(&[ReduceOp::Sum, ReduceOp::Max]), x, &axes)
            }
            8 => {
                let s = random_reshape(&mut rng, numel);
                b.reshape(x, &s)
            }
            9 if rank > 1 => {
                let mut perm: Vec<usize> = (0..rank).collect();
                for i in (1..rank).rev() {
                    perm.swap(i, rng.below(i + 1));
                }
                b.permute(x, &perm)
            }
            10 => {
                let (x, shape) = if shape.iter().any(|d| d.as_const() == Some(1)) || rank >= 4 {
                    (x, shape)
                } else {
                    let mut s = shape.clone();
                    s.insert(rng.below(rank + 1), Dim::Const(1));
                    (b.reshape(x, &s), s)
                };
                let target: Vec<Dim> = shape
                    .iter()
                    .map(|d| if d.as_const() == Some(1) { Dim::Const(rng.pick(&[1, 2, 3])) } else { *d })
                    .collect();
                b.expand(x, &target)
            }
            11 => {
                let padding =
                    shape.iter().map(|_| (Dim::Const(rng.below(3) as i64), Dim::Const(rng.below(2) as i64))).collect();
                let value = if int { Scalar::Int(7) } else { Scalar::Float(rng.pick(&[0.0, 1.5, -1.0])) };
                b.op(Op::Pad(Pad { padding, value }), &[x])
            }
            12 => {
                let ranges = consts(&shape)
                    .iter()
                    .map(|&n| {
                        let s = rng.below(n as usize + 1) as i64;
                        let e = s + rng.below((n - s) as usize + 1) as i64;
                        (Dim::Const(s), Dim::Const(e))
                    })
                    .collect();
                b.op(Op::Shrink(Shrink { ranges }), &[x])
            }
            13 | 14 if rank == 2 && !int => {
                // A matmul with a fresh weight, sometimes with a bias.
                let n = rng.pick(&sizes);
                let k = shape[1];
                let w = b.input(dtype, &[k, Dim::Const(n)]);
                let y = b.matmul(x, w);
                if rng.chance(50) {
                    let bias = b.input(dtype, &[Dim::Const(1), Dim::Const(n)]);
                    let be = b.expand_like(bias, y);
                    b.bin(BinaryOp::Add, y, be)
                } else {
                    y
                }
            }
            _ => b.un(if int { UnaryOp::Neg } else { UnaryOp::Sin }, x),
        };
        pool.push(y);
    }
    let mut outs = vec![*pool.last().unwrap()];
    for _ in 0..rng.below(3) {
        outs.push(rng.pick(&pool));
    }
    b.out(&outs)
}

fn check_random(seed: u64, n_ops: usize) -> Result<(), String> {
    let g = random_graph(seed, n_ops);
    for opts in [fused(), unfused(), CompileOptions::default()] {
        let p = compile(&g, &opts).map_err(|e| format!("compile: {e}\n{}", air::print(&g)))?;
        agree(&g, &p, &Bindings::new(), seed)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn compiled_programs_match_the_interpreter(seed in any::<u64>(), n_ops in 1usize..30) {
        if let Err(e) = check_random(seed, n_ops) {
            prop_assert!(false, "seed {seed}, {n_ops} ops: {e}");
        }
    }
}

/// `x`'s rows `t..t + 1`, columns `lo..lo + width`.
fn row_slice(b: &mut B, x: NodeId, t: i64, lo: Dim, width: Dim) -> NodeId {
    let ranges = vec![(Dim::Const(t), Dim::Const(t + 1)), (lo, lo + width)];
    b.op(Op::Shrink(Shrink { ranges }), &[x])
}

#[test]
fn slices_at_other_starts_reuse_the_kernel_built_for_the_first_moved_along() {
    // An unrolled loop's steps: step `t` reads row `t` of `x` twice (columns 0..3 and 2..5) and
    // row `t` of `y` ([3, n]: a symbolic row length). Each step after the first takes the first
    // step's kernel with its reads moved on (`schedule/memo.rs`): the same loop nest, the same
    // distance between the two reads of `x`, and each step computes its own rows.
    let n = Dim::sym("n");
    let mut b = B::default();
    let x = b.f32(&[3, 6]);
    let y = b.input(DType::F32, &[Dim::Const(3), n]);
    let mut outs = Vec::new();
    for t in 0..3 {
        let (u, v) = (
            row_slice(&mut b, x, t, Dim::Const(0), Dim::Const(3)),
            row_slice(&mut b, x, t, Dim::Const(2), Dim::Const(3)),
        );
        let s = b.bin(BinaryOp::Mul, u, v);
        outs.push(s);
        let w = row_slice(&mut b, y, t, Dim::Const(0), n);
        outs.push(b.un(UnaryOp::Neg, w));
    }
    // A read of `x` twice at another distance is another kernel, built on its own.
    let (u, v) =
        (row_slice(&mut b, x, 1, Dim::Const(0), Dim::Const(3)), row_slice(&mut b, x, 1, Dim::Const(3), Dim::Const(3)));
    outs.push(b.bin(BinaryOp::Mul, u, v));
    let g = b.out(&outs);
    let p = compile(&g, &fused()).unwrap();
    let mut bindings = Bindings::new();
    bindings.insert(Symbol::new("n"), 5);
    agree(&g, &p, &bindings, 3).unwrap();
    expect![[r#"
        symbols n
        buf0: f32[18] input 0
        buf1: f32[3*n] input 1
        buf2: f32[3] output 0
        buf3: f32[n] output 1
        buf4: f32[3] output 2
        buf5: f32[n] output 3
        buf6: f32[3] output 4
        buf7: f32[n] output 5
        buf8: f32[3] output 6
        k0 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..3 parallel {
            r0: f32 = load b1[i0]
            r1: f32 = load b1[(i0 + 2)]
            r2: f32 = mul r0, r1
            store b0[i0] = r2
          }
        }
        k1 = kernel(b0: out f32, b1: in f32; syms 1) {
          for i0 in 0..s0 parallel {
            r0: f32 = load b1[i0]
            r1: f32 = neg r0
            store b0[i0] = r1
          }
        }
        k2 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..3 parallel {
            r0: f32 = load b1[(i0 + 6)]
            r1: f32 = load b1[(i0 + 8)]
            r2: f32 = mul r0, r1
            store b0[i0] = r2
          }
        }
        k3 = kernel(b0: out f32, b1: in f32; syms 1) {
          for i0 in 0..s0 parallel {
            r0: f32 = load b1[(i0 + s0)]
            r1: f32 = neg r0
            store b0[i0] = r1
          }
        }
        k4 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..3 parallel {
            r0: f32 = load b1[(i0 + 12)]
            r1: f32 = load b1[(i0 + 14)]
            r2: f32 = mul r0, r1
            store b0[i0] = r2
          }
        }
        k5 = kernel(b0: out f32, b1: in f32; syms 1) {
          for i0 in 0..s0 parallel {
            r0: f32 = load b1[(i0 + s0*2)]
            r1: f32 = neg r0
            store b0[i0] = r1
          }
        }
        k6 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..3 parallel {
            r0: f32 = load b1[(i0 + 6)]
            r1: f32 = load b1[(i0 + 9)]
            r2: f32 = mul r0, r1
            store b0[i0] = r2
          }
        }
        launch k0(buf2, buf0)
        launch k1(buf3, buf1)
        launch k2(buf4, buf0)
        launch k3(buf5, buf1)
        launch k4(buf6, buf0)
        launch k5(buf7, buf1)
        launch k6(buf8, buf0)
        return buf2: f32[1, 3], buf3: f32[1, n], buf4: f32[1, 3], buf5: f32[1, n], buf6: f32[1, 3], buf7: f32[1, n], buf8: f32[1, 3]
    "#]]
    .assert_eq(&p.to_string());
}

#[test]
fn cat_pieces_computing_their_steps_write_their_own_windows() {
    // An unrolled RNN's output with no step's state materialized: each piece computes its step
    // (`exp2(-x_t + y)`, each `x_t` an input of its own) into its window. The pieces after the
    // first are keyed as the first (`schedule/memo.rs`: a pad to exactly the piece's window is
    // keyed by the window's size) and take its kernel with the writes moved to their windows;
    // every window holds its own step.
    let n = Dim::sym("n");
    let mut b = B::default();
    let xs: Vec<NodeId> = (0..3).map(|_| b.input(DType::F32, &[Dim::Const(1), n, Dim::Const(4)])).collect();
    let y = b.input(DType::F32, &[Dim::Const(1), n, Dim::Const(4)]);
    let steps: Vec<NodeId> = xs
        .iter()
        .map(|&xt| {
            let neg = b.un(UnaryOp::Neg, xt);
            let sum = b.bin(BinaryOp::Add, neg, y);
            b.un(UnaryOp::Exp2, sum)
        })
        .collect();
    let out = cat(&mut b, &steps, 0);
    let g = b.out(&[out]);
    let p = compile(&g, &fused()).unwrap();
    let stores: Vec<String> =
        p.to_string().lines().filter(|l| l.contains("store")).map(|l| l.trim().to_string()).collect();
    assert_eq!(stores, ["store b0[i0] = r4", "store b0[(i0 + s0*4)] = r4", "store b0[(i0 + s0*8)] = r4"], "{p}");
    let mut bindings = Bindings::new();
    bindings.insert(Symbol::new("n"), 3);
    agree(&g, &p, &bindings, 9).unwrap();
    agree(&g, &compile(&g, &unfused()).unwrap(), &bindings, 9).unwrap();
}

/// An unrolled loop of `seed`'s making: each step reads two windows of its slice of `x` (`[T,
/// 6, 8]`, the second at a fixed random distance from the first, so that steps share a kernel
/// moved along: `schedule/memo.rs`) and its slice of `y`, at a random step start, combines them
/// with a random op, and the steps are also concatenated: with the steps outputs of their own
/// (each concatenation piece a copy) or not (each piece computes its step). Compiled fused and
/// not, against the interpreter.
fn check_unrolled(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let steps = 2 + rng.below(4) as i64;
    let mut b = B::default();
    let x = b.f32(&[steps, 6, 8]);
    let y = b.f32(&[steps, 1, 8]);
    let (dr, dc) = (rng.below(3) as i64, rng.below(4) as i64);
    let op = rng.pick(&[BinaryOp::Add, BinaryOp::Mul, BinaryOp::Max, BinaryOp::Sub]);
    let window = |b: &mut B, t: i64, r: i64, c: i64| {
        let ranges = vec![
            (Dim::Const(t), Dim::Const(t + 1)),
            (Dim::Const(r), Dim::Const(r + 4)),
            (Dim::Const(c), Dim::Const(c + 4)),
        ];
        b.op(Op::Shrink(Shrink { ranges }), &[x])
    };
    let mut outs = Vec::new();
    for _ in 0..steps {
        let t = rng.below(steps as usize) as i64;
        let (u, v) = (window(&mut b, t, 0, 0), window(&mut b, t, dr, dc));
        let w = b.bin(op, u, v);
        let ranges =
            vec![(Dim::Const(t), Dim::Const(t + 1)), (Dim::Const(0), Dim::Const(1)), (Dim::Const(0), Dim::Const(4))];
        let yt = b.op(Op::Shrink(Shrink { ranges }), &[y]);
        let yt = b.expand(yt, &dims(&[1, 4, 4]));
        outs.push(b.bin(BinaryOp::Add, w, yt));
    }
    let cat_of = cat(&mut b, &outs, 0);
    if rng.below(2) == 0 {
        outs.clear();
    }
    outs.push(cat_of);
    let g = b.out(&outs);
    for opts in [fused(), unfused()] {
        let p = compile(&g, &opts).map_err(|e| format!("compile: {e}"))?;
        agree(&g, &p, &Bindings::new(), seed)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]

    #[test]
    fn unrolled_steps_match_the_interpreter(seed in any::<u64>()) {
        if let Err(e) = check_unrolled(seed) {
            prop_assert!(false, "seed {seed}: {e}");
        }
    }
}

#[test]
fn kernels_of_one_structure_are_built_once_and_bound_to_their_own_buffers() {
    // Two launches of one structure on other buffers share a kernel; a structure that reads one
    // buffer twice, one that reads it through another view, and one with another constant each
    // get their own, and every launch computes its own outputs from its own inputs (loop
    // kernels and matmuls both are remembered by structure, `schedule/memo.rs`).
    let mut b = B::default();
    let (x1, y1, x2, y2) = (b.f32(&[3, 3]), b.f32(&[3, 3]), b.f32(&[3, 3]), b.f32(&[3, 3]));
    let chain = |b: &mut B, u: NodeId, v: NodeId, c: f32| {
        let s = b.bin(BinaryOp::Add, u, v);
        let k = b.konst(c, &dims(&[3, 3]));
        b.bin(BinaryOp::Mul, s, k)
    };
    let o1 = chain(&mut b, x1, y1, 0.5);
    let o2 = chain(&mut b, y2, x2, 0.5);
    let o3 = chain(&mut b, x1, x1, 0.5);
    let t = b.permute(x2, &[1, 0]);
    let o4 = chain(&mut b, x2, t, 0.5);
    let o5 = chain(&mut b, x2, y2, 0.25);
    // Matmuls likewise: one kernel for two products on other buffers, another for a square.
    let (m1, m2, m3) = (b.matmul(x1, y1), b.matmul(y2, x2), b.matmul(x1, x1));
    let g = b.out(&[o1, o2, o3, o4, o5, m1, m2, m3]);
    let p = compile(&g, &fused()).unwrap();
    expect![[r#"
        buf0: f32[9] input 0
        buf1: f32[9] input 1
        buf2: f32[9] input 2
        buf3: f32[9] input 3
        buf4: f32[9] output 0
        buf5: f32[9] output 1
        buf6: f32[9] output 2
        buf7: f32[9] output 3
        buf8: f32[9] output 4
        buf9: f32[9] output 5
        buf10: f32[9] output 6
        buf11: f32[9] output 7
        k0 = kernel(b0: out f32, b1: in f32, b2: in f32) {
          for i0 in 0..9 parallel {
            r0: f32 = load b1[i0]
            r1: f32 = load b2[i0]
            r2: f32 = add r0, r1
            r3: f32 = const 0.5
            r4: f32 = mul r2, r3
            store b0[i0] = r4
          }
        }
        k1 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..9 parallel {
            r0: f32 = load b1[i0]
            r1: f32 = add r0, r0
            r2: f32 = const 0.5
            r3: f32 = mul r1, r2
            store b0[i0] = r3
          }
        }
        k2 = kernel(b0: out f32, b1: in f32) {
          for i0 in 0..3 parallel {
            r0: f32 = const 0.5
            for i1 in 0..3 {
              r1: f32 = load b1[(i0*3 + i1)]
              r2: f32 = load b1[(i0 + i1*3)]
              r3: f32 = add r1, r2
              r4: f32 = mul r3, r0
              store b0[(i0*3 + i1)] = r4
            }
          }
        }
        k3 = kernel(b0: out f32, b1: in f32, b2: in f32) {
          for i0 in 0..9 parallel {
            r0: f32 = load b1[i0]
            r1: f32 = load b2[i0]
            r2: f32 = add r0, r1
            r3: f32 = const 0.25
            r4: f32 = mul r2, r3
            store b0[i0] = r4
          }
        }
        k4 = matmul(b0: out f32, b1: in f32, b2: in f32) {
          batch 1, m 3, n 3, k 3, f32
          a = b1[0 + batch*0 + row*3 + col*1]
          b = b2[0 + batch*0 + row*3 + col*1]
          c = b0[0 + batch*9 + row*3 + col*1]
        }
        k5 = matmul(b0: out f32, b1: in f32) {
          batch 1, m 3, n 3, k 3, f32
          a = b1[0 + batch*0 + row*3 + col*1]
          b = b1[0 + batch*0 + row*3 + col*1]
          c = b0[0 + batch*9 + row*3 + col*1]
        }
        launch k0(buf4, buf0, buf1)
        launch k0(buf5, buf3, buf2)
        launch k1(buf6, buf0)
        launch k2(buf7, buf2)
        launch k3(buf8, buf2, buf3)
        launch k4(buf9, buf0, buf1)
        launch k4(buf10, buf3, buf2)
        launch k5(buf11, buf0)
        return buf4: f32[3, 3], buf5: f32[3, 3], buf6: f32[3, 3], buf7: f32[3, 3], buf8: f32[3, 3], buf9: f32[3, 3], buf10: f32[3, 3], buf11: f32[3, 3]
    "#]]
    .assert_eq(&p.to_string());
    agree(&g, &p, &Bindings::new(), 3).unwrap();
}

/// A sum of many distinct inputs (with a shared subexpression and a reduce between) compiled
/// with a kernel-buffer bound: every kernel binds at most that many buffers, the result is the
/// interpreter's, and without the bound it is one kernel.
#[test]
fn a_kernel_buffer_bound_cuts_wide_fused_expressions() {
    let mut b = B::default();
    let xs: Vec<NodeId> = (0..40).map(|_| b.f32(&[4, 6])).collect();
    let mut acc = xs[0];
    for (i, &x) in xs.iter().enumerate().skip(1) {
        let term = if i % 7 == 0 { b.un(UnaryOp::Exp2, x) } else { x };
        acc = b.bin(BinaryOp::Add, acc, term);
    }
    let total = b.reduce(ReduceOp::Sum, acc, &[1]);
    let total = b.reshape(total, &dims(&[4, 1]));
    let total = b.expand(total, &dims(&[4, 6]));
    let y = b.bin(BinaryOp::Mul, acc, total);
    b.g.set_outputs(vec![y]);
    let g = b.g;
    let unbounded = compile(&g, &fused()).unwrap();
    for bound in [6u32, 12, 33] {
        let options = CompileOptions { max_kernel_buffers: Some(bound), ..fused() };
        let p = compile(&g, &options).unwrap();
        for k in &p.kernels {
            assert!(
                k.params().len() as u32 <= bound,
                "a kernel binds {} buffers, over {bound}:\n{p}",
                k.params().len()
            );
        }
        assert!(p.kernels.len() > 1, "40 inputs under a bound of {bound} need several kernels:\n{p}");
        agree(&g, &p, &Bindings::new(), 3).unwrap();
    }
    assert!(unbounded.kernels.iter().any(|k| k.params().len() > 40), "unbounded, one kernel reads all:\n{unbounded}");
}
