//! Timing helpers: medians of repeated runs, with a time budget so large sizes do not run for
//! ever and small ones get enough samples.

use std::time::{Duration, Instant};

/// The median of `samples` (the mean of the middle two for an even count); 0 for none.
pub fn median(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 }
}

/// The smallest of `samples` (infinity when there are none).
pub fn fastest(samples: &[f64]) -> f64 {
    samples.iter().copied().fold(f64::INFINITY, f64::min)
}

/// How many times to run a measurement.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Untimed runs first.
    pub warmup: usize,
    /// At least this many timed runs...
    pub min_runs: usize,
    /// ...and more, up to `max_runs`, while the timed runs took less than `time`.
    pub max_runs: usize,
    pub time: Duration,
}

impl Budget {
    /// A few runs only: CI smoke runs.
    pub const SMOKE: Budget = Budget { warmup: 1, min_runs: 2, max_runs: 3, time: Duration::from_millis(20) };
    /// The default for steady-state measurements.
    pub const STEADY: Budget = Budget { warmup: 3, min_runs: 5, max_runs: 200, time: Duration::from_millis(300) };
}

/// Milliseconds per call of `f` (median over the budget's runs); the first error stops it. After
/// the warm-up it waits for the CPU's optimised code (`kiln::wait_tier_up`): what it times is the
/// steady state, not the JIT's quick tier.
pub fn measure_ms<T>(budget: Budget, mut f: impl FnMut() -> anyhow::Result<T>) -> anyhow::Result<f64> {
    for _ in 0..budget.warmup {
        std::hint::black_box(f()?);
    }
    kiln::wait_tier_up();
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < budget.min_runs || (samples.len() < budget.max_runs && start.elapsed() < budget.time) {
        let t0 = Instant::now();
        std::hint::black_box(f()?);
        samples.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(&samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn measure_runs_at_least_min_runs() {
        let mut calls = 0;
        let ms = measure_ms(Budget { warmup: 2, min_runs: 3, max_runs: 3, time: Duration::ZERO }, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 5);
        assert!(ms >= 0.0);
    }
}
