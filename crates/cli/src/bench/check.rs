//! The result check every `kiln bench` suite runs once before it times anything: the suite's
//! outputs on the device under test against the reference interpreter (`air::interp`, called
//! directly or through the facade's `interp` device), on the same inputs, compared element by
//! element with a NaN-aware tolerance. A mismatch is an error ([`Mismatch`]) that aborts the suite:
//! a benchmark of a wrong answer is not a result.

use std::fmt;

use air::HostTensor;
use kiln::{Device, Tensor};

use crate::pipeline::Traced;
use crate::runner::Runner;

/// How far a value may be from the reference: `|got - want| <= atol + rtol * |want|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

impl Tolerance {
    /// Element-wise ops whose kernels use polynomial approximations (exp2, sin: about 1 ulp).
    pub const ELEMENTWISE: Tolerance = Tolerance { rtol: 1e-5, atol: 1e-6 };
    /// Sums of products (matmuls, reductions): the interpreter accumulates in `f64` left to right,
    /// the kernels in `f32` blocks in another order.
    pub const REDUCTION: Tolerance = Tolerance { rtol: 1e-4, atol: 1e-4 };
    /// Whole models: chains of reductions and approximations.
    pub const MODEL: Tolerance = Tolerance { rtol: 1e-3, atol: 1e-4 };
}

/// Outputs that differ from the reference: the error a suite aborts with.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// What was compared (suite, case, output).
    pub what: String,
    /// Why it does not match.
    pub detail: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "result check failed for {}: {} (reference: air::interp)", self.what, self.detail)
    }
}

impl std::error::Error for Mismatch {}

/// Whether `got` is within `tol` of `want`: NaN matches only NaN, an infinity only the same
/// infinity, and finite values within the tolerance.
pub fn close(got: f64, want: f64, tol: Tolerance) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got.is_infinite() || want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= tol.atol + tol.rtol * want.abs()
}

/// Compares one output with its reference: dtype, shape, then every element (see [`close`]).
pub fn compare(what: &str, got: &HostTensor, want: &HostTensor, tol: Tolerance) -> Result<(), Mismatch> {
    let fail = |detail: String| Err(Mismatch { what: what.to_string(), detail });
    if got.dtype() != want.dtype() {
        return fail(format!("dtype {} where the reference has {}", got.dtype(), want.dtype()));
    }
    if got.shape != want.shape {
        return fail(format!("shape {:?} where the reference has {:?}", got.shape, want.shape));
    }
    let (g, w) = (got.data.to_f64_vec(), want.data.to_f64_vec());
    let mut bad = 0usize;
    let mut first = None;
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        if close(a, b, tol) {
            continue;
        }
        bad += 1;
        first.get_or_insert(i);
        let err = if a.is_finite() && b.is_finite() { (a - b).abs() } else { f64::INFINITY };
        if worst.is_none_or(|(_, e)| err > e) {
            worst = Some((i, err));
        }
    }
    match (first, worst) {
        (Some(i), Some((j, err))) => fail(format!(
            "{bad} of {} elements beyond rtol {:e} atol {:e}; first at index {i}: got {} want {}; largest error {err:e} at index {j}: got {} want {}",
            g.len(),
            tol.rtol,
            tol.atol,
            g[i],
            w[i],
            g[j],
            w[j]
        )),
        _ => Ok(()),
    }
}

/// Compares every output with its reference (the counts must match too).
pub fn compare_all(what: &str, got: &[HostTensor], want: &[HostTensor], tol: Tolerance) -> Result<(), Mismatch> {
    if got.len() != want.len() {
        return Err(Mismatch {
            what: what.to_string(),
            detail: format!("{} outputs where the reference has {}", got.len(), want.len()),
        });
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let label = if got.len() == 1 { what.to_string() } else { format!("{what}, output {i}") };
        compare(&label, g, w, tol)?;
    }
    Ok(())
}

/// The host data of realized tensors.
pub fn hosts(tensors: &[Tensor]) -> anyhow::Result<Vec<HostTensor>> {
    Ok(tensors.iter().map(Tensor::to_host).collect::<kiln::Result<_>>()?)
}

/// Realizes what `build` records on `runner` and, from the same inputs, on the facade's `interp`
/// device, and compares the results. `build` must create its inputs deterministically and place
/// them with the runner it is given.
pub fn against_interp(
    what: &str,
    runner: &Runner,
    tol: Tolerance,
    build: impl Fn(&Runner) -> anyhow::Result<Vec<Tensor>>,
) -> anyhow::Result<()> {
    let realize = |r: &Runner| -> anyhow::Result<Vec<HostTensor>> {
        let lazy = build(r)?;
        let refs: Vec<&Tensor> = lazy.iter().collect();
        hosts(&r.realize(&refs)?)
    };
    let got = realize(runner)?;
    let want = realize(&Runner::on(Device::Interp))?;
    Ok(compare_all(what, &got, &want, tol)?)
}

/// Compares the outputs a device computed for `traced` with `air::interp::eval` of its graph.
pub fn against_eval(what: &str, traced: &Traced, got: &[HostTensor], tol: Tolerance) -> anyhow::Result<()> {
    let want = air::interp::eval(&traced.graph, &traced.inputs, &traced.bindings)?;
    Ok(compare_all(what, got, &want, tol)?)
}

/// Whether `error` is a result mismatch (and not, say, a model a device cannot run).
pub fn is_mismatch(error: &anyhow::Error) -> bool {
    error.downcast_ref::<Mismatch>().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: Tolerance = Tolerance { rtol: 1e-3, atol: 1e-6 };

    fn t(v: Vec<f32>) -> HostTensor {
        let n = v.len();
        HostTensor::from_vec(v, vec![n]).unwrap()
    }

    #[test]
    fn nan_matches_only_nan_and_infinities_only_themselves() {
        assert!(close(f64::NAN, f64::NAN, TOL));
        assert!(!close(f64::NAN, 1.0, TOL));
        assert!(!close(1.0, f64::NAN, TOL));
        assert!(close(f64::INFINITY, f64::INFINITY, TOL));
        assert!(!close(f64::INFINITY, f64::NEG_INFINITY, TOL));
        assert!(!close(f64::MAX, f64::INFINITY, TOL));
        assert!(close(1000.0, 1000.9, TOL));
        assert!(!close(1000.0, 1001.1, TOL));
    }

    #[test]
    fn compare_names_the_first_and_the_worst_difference() {
        let want = t(vec![1.0, 2.0, f32::NAN, 4.0]);
        assert_eq!(compare("x", &t(vec![1.0, 2.0, f32::NAN, 4.0]), &want, TOL), Ok(()));
        let err = compare("x", &t(vec![1.0, 2.5, f32::NAN, 9.0]), &want, TOL).unwrap_err();
        assert!(err.detail.starts_with("2 of 4 elements"), "{err}");
        assert!(err.detail.contains("first at index 1"), "{err}");
        assert!(err.detail.contains("at index 3: got 9 want 4"), "{err}");
        let err = compare("x", &t(vec![1.0, 2.0, 3.0, 4.0]), &want, TOL).unwrap_err();
        assert!(err.detail.contains("index 2: got 3 want NaN"), "{err}");
    }

    #[test]
    fn compare_rejects_other_shapes_dtypes_and_counts() {
        let want = t(vec![1.0, 2.0]);
        let reshaped = HostTensor::from_vec(vec![1.0f32, 2.0], vec![1, 2]).unwrap();
        assert!(compare("x", &reshaped, &want, TOL).unwrap_err().detail.contains("shape"));
        let ints = HostTensor::from_vec(vec![1i32, 2], vec![2]).unwrap();
        assert!(compare("x", &ints, &want, TOL).unwrap_err().detail.contains("dtype"));
        assert!(compare_all("x", &[], std::slice::from_ref(&want), TOL).is_err());
    }
}
