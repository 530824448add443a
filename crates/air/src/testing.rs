//! Number comparisons for tests: the one helper every test tree uses to compare a result with a
//! reference, so that no test can pass on NaN, on an empty comparison or on mismatched lengths.
//!
//! This module exists for tests (Kiln's own and its users'); nothing in the compiler calls it.
//!
//! [`check_close`] compares element by element with `|got - want| <= atol + rtol * |want|`, and
//! treats the special values strictly: a NaN matches only a NaN, an infinity only the same
//! infinity, so an output that is NaN where the reference is finite (an unwritten buffer, a
//! broken kernel) fails however loose the tolerance. [`check_equal`] is the exact version for
//! integers, booleans and bit-exact floats. Both refuse to compare zero elements and lengths
//! that differ, and report the worst element (index, got, want).

use std::fmt;

use crate::host::{HostData, HostTensor};

/// How close two floats must be: `|got - want| <= atol + rtol * |want|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    /// The absolute part (what matters near zero).
    pub atol: f64,
    /// The relative part (what matters for large values).
    pub rtol: f64,
}

impl Tol {
    /// The same bound absolute and relative: `|got - want| <= tol * (1 + |want|)`.
    pub fn both(tol: f64) -> Tol {
        Tol { atol: tol, rtol: tol }
    }

    /// Exact equality of numbers (special values still compare as [`check_close`] says).
    pub const EXACT: Tol = Tol { atol: 0.0, rtol: 0.0 };

    fn bound(self, want: f64) -> f64 {
        self.atol + self.rtol * want.abs()
    }
}

/// What a comparison that passed measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Closeness {
    /// Elements compared (never zero).
    pub compared: usize,
    /// The largest `|got - want|` over the finite elements.
    pub max_abs: f64,
    /// The largest `|got - want| / (1 + |want|)` over the finite elements: the error measure of
    /// [`Tol::both`].
    pub max_err: f64,
    /// The largest fraction of the allowed bound any element used (0 when the tolerance is exact
    /// and every element matched).
    pub used: f64,
}

/// Why a comparison failed.
#[derive(Clone, Debug, PartialEq)]
pub enum Mismatch {
    /// Nothing to compare: a test that compares zero elements proves nothing.
    Empty,
    /// The two sides have different lengths.
    Lengths {
        /// Elements of the result.
        got: usize,
        /// Elements of the reference.
        want: usize,
    },
    /// Some elements differ; `index`, `got` and `want` are those of the worst (a NaN or infinity
    /// mismatch counts as worse than any finite difference).
    Values {
        /// How many elements are out of tolerance.
        bad: usize,
        /// How many were compared.
        compared: usize,
        /// The worst element's flat index.
        index: usize,
        /// Its value in the result.
        got: String,
        /// Its value in the reference.
        want: String,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Empty => write!(f, "zero elements compared (an empty comparison proves nothing)"),
            Mismatch::Lengths { got, want } => write!(f, "{got} elements, the reference has {want}"),
            Mismatch::Values { bad, compared, index, got, want } => {
                write!(f, "{bad} of {compared} elements differ; worst at index {index}: got {got}, want {want}")
            }
        }
    }
}

impl std::error::Error for Mismatch {}

fn lengths(got: usize, want: usize) -> Result<(), Mismatch> {
    if got != want {
        Err(Mismatch::Lengths { got, want })
    } else if got == 0 {
        Err(Mismatch::Empty)
    } else {
        Ok(())
    }
}

/// How far `got` is from `want` in units of the allowed bound: `None` when they match exactly or
/// are both NaN, infinity for a special-value mismatch (NaN against a number, an infinity against
/// anything but itself).
fn excess(got: f64, want: f64, tol: Tol) -> Option<f64> {
    if got == want || (got.is_nan() && want.is_nan()) {
        return None;
    }
    if !got.is_finite() || !want.is_finite() {
        return Some(f64::INFINITY);
    }
    let diff = (got - want).abs();
    let bound = tol.bound(want);
    Some(if bound > 0.0 { diff / bound } else { f64::INFINITY })
}

/// Compares `got` with the reference `want` element by element (see the module docs), in f64
/// (`f32` and `f64` slices alike).
pub fn check_close<T: Copy + Into<f64>>(got: &[T], want: &[T], tol: Tol) -> Result<Closeness, Mismatch> {
    lengths(got.len(), want.len())?;
    let mut closeness = Closeness { compared: got.len(), max_abs: 0.0, max_err: 0.0, used: 0.0 };
    let mut worst: Option<(usize, f64)> = None;
    let mut bad = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g, w): (f64, f64) = (g.into(), w.into());
        let Some(ratio) = excess(g, w, tol) else { continue };
        if ratio.is_finite() {
            let diff = (g - w).abs();
            closeness.max_abs = closeness.max_abs.max(diff);
            closeness.max_err = closeness.max_err.max(diff / (1.0 + w.abs()));
        }
        if ratio <= 1.0 {
            closeness.used = closeness.used.max(ratio);
        } else {
            bad += 1;
            if worst.is_none_or(|(_, r)| ratio > r) {
                worst = Some((i, ratio));
            }
        }
    }
    match worst {
        None => Ok(closeness),
        Some((index, _)) => Err(Mismatch::Values {
            bad,
            compared: got.len(),
            index,
            got: got[index].into().to_string(),
            want: want[index].into().to_string(),
        }),
    }
}

/// Compares exactly (integers, booleans, bit patterns), reporting the first difference.
pub fn check_equal<T: PartialEq + fmt::Debug>(got: &[T], want: &[T]) -> Result<usize, Mismatch> {
    lengths(got.len(), want.len())?;
    let bad = got.iter().zip(want).filter(|(g, w)| g != w).count();
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(got.len()),
        Some(index) => Err(Mismatch::Values {
            bad,
            compared: got.len(),
            index,
            got: format!("{:?}", got[index]),
            want: format!("{:?}", want[index]),
        }),
    }
}

/// [`check_close`] that panics with `what` and the mismatch; returns what it measured.
#[track_caller]
pub fn assert_close<T: Copy + Into<f64>>(what: &str, got: &[T], want: &[T], tol: Tol) -> Closeness {
    check_close(got, want, tol).unwrap_or_else(|e| panic!("{what}: {e} (tolerance {tol:?})"))
}

/// [`check_equal`] that panics with `what` and the mismatch; returns the elements compared.
#[track_caller]
pub fn assert_equal<T: PartialEq + fmt::Debug>(what: &str, got: &[T], want: &[T]) -> usize {
    check_equal(got, want).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Compares two host tensors: the same dtype and shape, floats with [`check_close`], integers and
/// booleans with [`check_equal`]. The error names the dtypes and shapes or the worst element.
pub fn check_host(got: &HostTensor, want: &HostTensor, tol: Tol) -> Result<Closeness, String> {
    if got.dtype() != want.dtype() || got.shape != want.shape {
        return Err(format!("got {}{:?}, want {}{:?}", got.dtype(), got.shape, want.dtype(), want.shape));
    }
    let exact = |compared| Closeness { compared, max_abs: 0.0, max_err: 0.0, used: 0.0 };
    let result = match (&*got.data, &*want.data) {
        (HostData::Bool(g), HostData::Bool(w)) => check_equal(g, w).map(exact),
        (HostData::I32(g), HostData::I32(w)) => check_equal(g, w).map(exact),
        (HostData::I64(g), HostData::I64(w)) => check_equal(g, w).map(exact),
        (g, w) => check_close(&g.to_f64_vec(), &w.to_f64_vec(), tol),
    };
    result.map_err(|e| format!("{e} (shape {:?})", want.shape))
}

/// [`check_host`] that panics with `what` and the mismatch.
#[track_caller]
pub fn assert_host(what: &str, got: &HostTensor, want: &HostTensor, tol: Tol) -> Closeness {
    check_host(got, want, tol).unwrap_or_else(|e| panic!("{what}: {e} (tolerance {tol:?})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_where_the_reference_is_finite_fails_at_any_tolerance() {
        let loose = Tol::both(1e30);
        let err = check_close(&[1.0, f64::NAN, 3.0], &[1.0, 2.0, 3.0], loose).unwrap_err();
        assert_eq!(err, Mismatch::Values { bad: 1, compared: 3, index: 1, got: "NaN".into(), want: "2".into() });
        // An all-NaN output against a finite reference: every element fails.
        let all_nan = vec![f64::NAN; 4];
        assert!(matches!(check_close(&all_nan, &[0.0; 4], loose), Err(Mismatch::Values { bad: 4, .. })));
        // The reverse: a number where the reference is NaN.
        assert!(check_close(&[0.0], &[f64::NAN], loose).is_err());
    }

    #[test]
    fn infinities_must_match_in_sign() {
        let tol = Tol::both(1e-3);
        assert!(check_close(&[f64::INFINITY], &[f64::INFINITY], tol).is_ok());
        assert!(check_close(&[f64::NEG_INFINITY], &[f64::INFINITY], tol).is_err());
        assert!(check_close(&[f64::INFINITY], &[1e300], Tol::both(1e30)).is_err());
        assert!(check_close(&[f64::MAX], &[f64::INFINITY], Tol::both(1e30)).is_err());
        // NaN matches NaN: the reference says the result is undefined there.
        assert!(check_close(&[f64::NAN], &[f64::NAN], tol).is_ok());
    }

    #[test]
    fn empty_and_mismatched_lengths_fail() {
        assert_eq!(check_close::<f64>(&[], &[], Tol::both(1.0)), Err(Mismatch::Empty));
        assert_eq!(check_close(&[1.0], &[1.0, 2.0], Tol::both(1.0)), Err(Mismatch::Lengths { got: 1, want: 2 }));
        assert_eq!(check_equal::<i32>(&[], &[]), Err(Mismatch::Empty));
        assert_eq!(check_equal(&[1, 2], &[1]), Err(Mismatch::Lengths { got: 2, want: 1 }));
    }

    #[test]
    fn reports_the_worst_element_and_the_tolerance_used() {
        let tol = Tol { atol: 0.0, rtol: 0.1 };
        let err = check_close(&[1.05, 2.5, 30.0], &[1.0, 2.0, 10.0], tol).unwrap_err();
        // 2.5 vs 2 uses 2.5x the bound; 30 vs 10 uses 20x: the worst is index 2.
        assert!(matches!(err, Mismatch::Values { bad: 2, index: 2, .. }), "{err}");
        let ok = check_close(&[1.05, 2.0], &[1.0, 2.0], tol).unwrap();
        assert_eq!(ok.compared, 2);
        assert!((ok.used - 0.5).abs() < 1e-9 && (ok.max_abs - 0.05).abs() < 1e-9, "{ok:?}");
        assert_eq!(check_close(&[1.0], &[1.0], Tol::EXACT).unwrap().used, 0.0);
        assert!(check_close(&[1.0 + 1e-15], &[1.0], Tol::EXACT).is_err());
    }

    #[test]
    fn host_tensors_compare_by_dtype() {
        let f = |v: Vec<f32>| HostTensor::from_vec(v.clone(), vec![v.len()]).unwrap();
        assert!(check_host(&f(vec![1.0, 2.0]), &f(vec![1.0, 2.0 + 1e-7]), Tol::both(1e-6)).is_ok());
        assert!(check_host(&f(vec![f32::NAN]), &f(vec![0.0]), Tol::both(1e9)).is_err());
        assert!(check_host(&f(vec![]), &f(vec![]), Tol::both(1.0)).is_err());
        let i = HostTensor::from_vec(vec![i64::MAX, 1], vec![2]).unwrap();
        let j = HostTensor::from_vec(vec![i64::MAX - 1, 1], vec![2]).unwrap();
        assert!(check_host(&i, &j, Tol::both(1.0)).is_err(), "integers compare exactly, even past 2^53");
        assert!(check_host(&f(vec![1.0, 2.0]), &i, Tol::both(1.0)).unwrap_err().contains("got f32[2], want i64[2]"));
    }

    #[test]
    fn exact_comparison_reports_the_first_difference() {
        assert_eq!(check_equal(&[1, 2, 3], &[1, 2, 3]), Ok(3));
        let err = check_equal(&[true, false, false], &[true, true, true]).unwrap_err();
        assert_eq!(err.to_string(), "2 of 3 elements differ; worst at index 1: got false, want true");
    }
}
