//! Runs predicts and then fit steps of one model of the suite in a loop, timing each, for a sampling
//! profiler: `fit_loop [MODEL N]`.
use kiln::Device;
use kiln_cli::runner::Runner;
use nn::{Sgd, Trainer, zoo};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "dense-large".into());
    let n: usize = args.next().map_or(Ok(200), |a| a.parse())?;
    let runner = Runner::on(Device::Cpu);
    let mut case = zoo::build(&name)?;
    runner.place_module(&mut *case.model)?;
    case.x = runner.place(case.x.clone())?;
    case.y = runner.place(case.y.clone())?;
    let mut predictor = nn::Predictor::new();
    for _ in 0..5 {
        let _ = predictor.predict(&mut *case.model, &case.x)?;
    }
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        let _ = predictor.predict(&mut *case.model, &case.x)?;
    }
    println!("{name}: {:.3} ms per predict", t0.elapsed().as_secs_f64() * 1e3 / n as f64);
    let mut trainer = Trainer::new(case.model, Sgd::new(0.01, 0.9), case.loss);
    for _ in 0..5 {
        trainer.step(&case.x, &case.y)?;
    }
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        trainer.step(&case.x, &case.y)?;
    }
    println!("{name}: {:.3} ms per fit step", t0.elapsed().as_secs_f64() * 1e3 / n as f64);
    Ok(())
}
