//! Data-parallel training of a 2-layer Transformer over MPI, and its own check: launched as
//! `mpirun -n 2 target/debug/examples/train_ddp [options]` (built with `--features mpi`).
//!
//! Every rank trains on its shard of each global batch; at the end the ranks compare their
//! parameters bit for bit (all-gather) and rank 0 trains one process on the global batches and
//! compares (within 1e-6). Exits 0 and prints `train_ddp: ok` on rank 0 only when both hold.
//!
//! Options: `--steps N` (10), `--step-delay-ms D` (sleep after each step, to leave time to kill
//! a rank mid-run), `--timeout-secs T` (the collectives' watchdog, 60), `--pid-dir DIR` (each
//! rank writes `DIR/rank<r>.pid`), `--no-reference` (skip the single-process comparison: for
//! timing runs), `--bench-model` (the larger Transformer of `scenario::BENCH` instead of the
//! tests' small one).

#[path = "../tests/scenario/mod.rs"]
mod scenario;

use std::process::ExitCode;
use std::time::Duration;

use kiln_dist::{Collective, MpiCollective};

struct Options {
    steps: usize,
    step_delay: Duration,
    timeout: Duration,
    pid_dir: Option<String>,
    reference: bool,
    sizes: scenario::Sizes,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        steps: 10,
        step_delay: Duration::ZERO,
        timeout: Duration::from_secs(60),
        pid_dir: None,
        reference: true,
        sizes: scenario::TEST,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let number = |name: &str, v: String| v.parse::<u64>().map_err(|e| format!("{name} {v}: {e}"));
        match arg.as_str() {
            "--steps" => o.steps = number("--steps", value("--steps")?)? as usize,
            "--step-delay-ms" => o.step_delay = Duration::from_millis(number(&arg, value(&arg)?)?),
            "--timeout-secs" => o.timeout = Duration::from_secs(number(&arg, value(&arg)?)?),
            "--pid-dir" => o.pid_dir = Some(value(&arg)?),
            "--no-reference" => o.reference = false,
            "--bench-model" => o.sizes = scenario::BENCH,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

fn run(o: &Options) -> Result<bool, String> {
    let comm = MpiCollective::with_timeout(o.timeout).map_err(|e| e.to_string())?;
    let (rank, size) = (comm.rank(), comm.size());
    if let Some(dir) = &o.pid_dir {
        std::fs::write(format!("{dir}/rank{rank}.pid"), std::process::id().to_string()).map_err(|e| e.to_string())?;
    }
    let weights = scenario::initial_weights(&o.sizes);
    let delay = o.step_delay;
    let run = scenario::train_ranks(comm, &o.sizes, &weights, o.steps, |rank, step| {
        println!("rank {rank}: step {step} done");
        std::thread::sleep(delay);
    })
    .map_err(|e| format!("rank {rank}: {e}"))?;
    let comm_fraction = run.communication_time.as_secs_f64() / run.step_time.as_secs_f64().max(1e-12);
    println!(
        "rank {rank} of {size}: losses {:?}; identical across ranks: {}; step {:.3} ms, all-reduce {:.3} ms ({:.1}% of the step)",
        run.losses,
        run.identical_across_ranks,
        run.step_time.as_secs_f64() * 1e3,
        run.communication_time.as_secs_f64() * 1e3,
        100.0 * comm_fraction
    );
    let mut ok = run.identical_across_ranks;
    if rank == 0 && o.reference {
        let (ref_losses, ref_params) = scenario::train_reference(&o.sizes, &weights, size, o.steps);
        let worst = scenario::max_difference(&run.params, &ref_params);
        let worst_loss = run.losses.iter().zip(&ref_losses).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        println!(
            "rank 0: vs one process on the global batch: max parameter difference {worst:.2e}, max loss difference {worst_loss:.2e}"
        );
        ok &= worst <= 1e-6 && worst_loss <= 1e-5;
    }
    Ok(ok)
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("train_ddp: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&options) {
        Ok(true) => {
            println!("train_ddp: ok");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            eprintln!("train_ddp: FAILED (see above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("train_ddp: error: {e}");
            ExitCode::FAILURE
        }
    }
}
