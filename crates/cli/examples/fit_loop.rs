//! Runs predicts and then fit steps of one model of the suite in a loop, timing each, for a sampling
//! profiler: `fit_loop [MODEL N [FIT_N]]` (`FIT_N` fit steps, `N` by default).

use kiln::Device;
use kiln_cli::bench::models;
use kiln_cli::runner::Runner;
use nn::Trainer;

/// Milliseconds per call of `f` over `n` calls, after five untimed ones and the JIT's tier-up
/// (as `kiln bench models` times them).
fn per_call(n: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    for _ in 0..5 {
        f()?;
    }
    kiln::wait_tier_up();
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        f()?;
    }
    Ok(t0.elapsed().as_secs_f64() * 1e3 / n as f64)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "dense-large".into());
    let n: usize = args.next().map_or(Ok(200), |a| a.parse())?;
    let fit_n: usize = args.next().map_or(Ok(n), |a| a.parse())?;
    let mut case = models::placed(&name, &Runner::on(Device::Cpu))?;
    let mut predictor = nn::Predictor::new();
    let ms = per_call(n, || {
        let _ = predictor.predict(&mut *case.model, &case.x)?;
        Ok(())
    })?;
    println!("{name}: {ms:.3} ms per predict");
    let mut trainer = Trainer::new(case.model, models::optimizer(), case.loss);
    let ms = per_call(fit_n, || {
        trainer.step(&case.x, &case.y)?;
        Ok(())
    })?;
    println!("{name}: {ms:.3} ms per fit step");
    Ok(())
}
