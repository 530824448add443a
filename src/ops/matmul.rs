//! Matrix multiplication, built as the canonical expand-multiply-sum pattern that the compiler's
//! `lower` pass recognises. [`canonical_matmul`] is the only place that builds it.

use air::{BinaryOp, DType, Dim, ReduceOp, Shape};
use smallvec::SmallVec;

use crate::shape::{broadcast_shapes, show};
use crate::tensor::{Site, Tensor};

/// THE canonical matmul pattern. For `a: [...a, M, K]` and `b: [...b, K, N]` (both of rank >= 2,
/// one dtype, batch dims `...a` and `...b` broadcasting to `...`), it builds exactly:
///
/// ```text
/// a  -> reshape [1.., ...a, M, 1, K] -> expand [..., M, N, K]      (leading 1s pad to the batch rank)
/// b  -> permute (swap last two) [...b, N, K]
///    -> reshape [1.., ...b, 1, N, K] -> expand [..., M, N, K]
/// mul(a', b') -> reduce sum over the last axis [..., M, N, 1] -> reshape [..., M, N]
/// ```
///
/// Every step is emitted even when it changes nothing (an expand with `N = 1`), so the pattern
/// has one shape the `lower` pass can match on; the permute and the reshapes compose with a view
/// of the same kind that they read (`Tensor::permute_to`, `Tensor::reshape_to`: `Linear`'s
/// transposed weight is read as it is), which leaves the same movement chain to match.
pub(crate) fn canonical_matmul(site: Site, a: &Tensor, b: &Tensor, batch: &Shape) -> Tensor {
    let (ra, rb) = (a.ndim(), b.ndim());
    let (m, k) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let n = b.shape()[rb - 1];
    let one = Dim::Const(1);

    let ones = |rank: usize| std::iter::repeat_n(one, batch.len() + 2 - rank);
    let full: Shape = batch.iter().cloned().chain([m, n, k]).collect();

    let a_shape: Shape = ones(ra).chain(a.shape()[..ra - 2].iter().cloned()).chain([m, one, k]).collect();
    let a3 = a.reshape_to(site, a_shape).p_expand(site, full.clone());

    let mut perm: SmallVec<[usize; 4]> = (0..rb).collect();
    perm.swap(rb - 2, rb - 1);
    let b_shape: Shape = ones(rb).chain(b.shape()[..rb - 2].iter().cloned()).chain([one, n, k]).collect();
    let b3 = b.permute_to(site, perm).reshape_to(site, b_shape).p_expand(site, full.clone());

    let product = a3.p_binary(site, BinaryOp::Mul, &b3);
    let summed = product.p_reduce(site, ReduceOp::Sum, smallvec::smallvec![full.len() - 1]);
    let out: Shape = batch.iter().cloned().chain([m, n]).collect();
    summed.p_reshape(site, out)
}

impl Tensor {
    /// Matrix product with `torch.matmul` semantics: batch dims broadcast; a 1-D left operand is
    /// a row vector and a 1-D right operand a column vector, their added axis removed afterwards
    /// (two 1-D operands give their dot product, shape `[]`). Operands are promoted to one dtype.
    /// See [`canonical_matmul`] for the graph this builds.
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Tensor {
        let site = Site::here("matmul");
        for t in [self, rhs] {
            if t.error().is_some() {
                return t.clone();
            }
        }
        let (sa, sb) = (self.shape(), rhs.shape());
        if sa.is_empty() || sb.is_empty() {
            return site.fail(format!("both operands need at least one dim, got shapes {} and {}", show(sa), show(sb)));
        }
        let dtype = DType::promote(self.dtype(), rhs.dtype());
        if dtype.is_bool() {
            return site.fail(format!("unsupported dtype {dtype} (shapes {} and {})", show(sa), show(sb)));
        }
        let ka = &sa[sa.len() - 1];
        let kb = if sb.len() == 1 { &sb[0] } else { &sb[sb.len() - 2] };
        if ka != kb {
            return site.fail(format!(
                "shapes {} and {} do not match (contracting dims {ka} vs {kb})",
                show(sa),
                show(sb)
            ));
        }
        let mut a = self.p_cast(site, dtype);
        let mut b = rhs.p_cast(site, dtype);
        if sa.len() == 1 {
            a = a.p_reshape(site, smallvec::smallvec![Dim::Const(1), *ka]);
        }
        if sb.len() == 1 {
            b = b.p_reshape(site, smallvec::smallvec![*kb, Dim::Const(1)]);
        }
        // An operand that failed to cast or reshape (a size that overflows) has no dims to read.
        if let Some(failed) = [&a, &b].into_iter().find(|t| t.inner.error.is_some()) {
            return failed.clone();
        }
        let batch = match broadcast_shapes(&a.shape()[..a.ndim() - 2], &b.shape()[..b.ndim() - 2]) {
            Ok(batch) => batch,
            Err(_) => {
                return site.fail(format!(
                    "batch dims of shapes {} and {} cannot be broadcast together",
                    show(sa),
                    show(sb)
                ));
            }
        };
        let out = canonical_matmul(site, &a, &b, &batch);
        // A failed product (its size overflows) is an error tensor without dims to drop.
        if out.inner.error.is_none() && (sa.len() == 1 || sb.len() == 1) {
            let mut shape = out.shape().clone();
            if sb.len() == 1 {
                shape.pop();
            }
            if sa.len() == 1 {
                let r = shape.len();
                shape.remove(r - 1 - usize::from(sb.len() != 1));
            }
            return out.p_reshape(site, shape);
        }
        out
    }
}
