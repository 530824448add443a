//! Data-parallel training of a 2-layer Transformer over MPI, and its own check: launched as
//! `mpirun -n 2 target/debug/examples/train_ddp [options]` (built with `--features mpi`).
//!
//! Every rank trains on its shard of each global batch; at the end the ranks compare their
//! parameters bit for bit (all-gather) and rank 0 trains one process on the global batches and
//! compares (within 1e-6). Exits 0 and prints `train_ddp: ok` on rank 0 only when both hold.
//!
//! Options: `--steps N` (10), `--step-delay-ms D` (sleep after each step, to leave time to kill
//! a rank mid-run), `--timeout-secs T` (the collectives' timeout, 60), `--pid-dir DIR` (each
//! rank writes `DIR/rank<r>.pid`, and `DIR/rank<r>.exit` with the code it exits with),
//! `--hang-rank R` (rank `R` sleeps for ten minutes after its third step instead of joining the
//! next collective), `--no-reference` (skip the single-process comparison: for timing runs),
//! `--bench-model` (the larger Transformer of `scenario::BENCH` instead of the tests' small one),
//! `--time-all-reduce N` (instead of training: time 100 all-reduces of `N` f32s, each after a
//! barrier, and print the median and mean per rank).
//!
//! Exit codes: 0 ok, 1 a check failed, 2 bad arguments, 3 a collective failed (the error is
//! printed as `rank <r>: collective failed: ...`; the rank then checks that its poisoned
//! collective fails the next call at once), 4 any other error.

#[path = "../tests/scenario/mod.rs"]
mod scenario;

use std::cell::RefCell;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant};

use kiln_dist::{BufMut, Collective, DistError, ErrorKind, MpiCollective, ReduceOp};
use kiln_nn::NnError;

struct Options {
    steps: usize,
    step_delay: Duration,
    timeout: Duration,
    pid_dir: Option<String>,
    hang_rank: Option<usize>,
    time_all_reduce: Option<usize>,
    reference: bool,
    sizes: scenario::Sizes,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        steps: 10,
        step_delay: Duration::ZERO,
        timeout: Duration::from_secs(60),
        pid_dir: None,
        hang_rank: None,
        time_all_reduce: None,
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
            "--hang-rank" => o.hang_rank = Some(number(&arg, value(&arg)?)? as usize),
            "--time-all-reduce" => o.time_all_reduce = Some(number(&arg, value(&arg)?)? as usize),
            "--no-reference" => o.reference = false,
            "--bench-model" => o.sizes = scenario::BENCH,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

/// The collective, shared between the trainer and `run`, so that `run` can still call it after
/// the trainer failed.
#[derive(Clone)]
struct Shared(Rc<RefCell<MpiCollective>>);

impl Collective for Shared {
    fn rank(&self) -> usize {
        self.0.borrow().rank()
    }
    fn size(&self) -> usize {
        self.0.borrow().size()
    }
    fn all_reduce(&mut self, buf: BufMut<'_>, op: ReduceOp) -> kiln_dist::Result<()> {
        self.0.borrow_mut().all_reduce(buf, op)
    }
    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> kiln_dist::Result<()> {
        self.0.borrow_mut().broadcast(buf, root)
    }
    fn all_gather(&mut self, send: BufMut<'_>, recv: BufMut<'_>) -> kiln_dist::Result<()> {
        self.0.borrow_mut().all_gather(send, recv)
    }
    fn barrier(&mut self) -> kiln_dist::Result<()> {
        self.0.borrow_mut().barrier()
    }
}

/// Writes `line` and a newline to stderr in one write, so that `mpirun`, which merges the ranks'
/// output, cannot interleave another rank's output into it.
fn report(line: String) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// How `run` failed.
enum Failure {
    /// A collective failed: exit code 3.
    Collective(DistError),
    /// Anything else: exit code 4.
    Other(String),
}

/// Times 100 all-reduces (sum) of `n` f32s, each after a barrier so that the ranks start
/// together, and prints the median and the mean.
fn time_all_reduce(comm: &mut Shared, n: usize) -> kiln_dist::Result<()> {
    let mut buf = vec![comm.rank() as f32; n];
    for _ in 0..10 {
        comm.all_reduce(buf.as_mut_slice().into(), ReduceOp::Sum)?;
    }
    let mut times = Vec::with_capacity(100);
    for _ in 0..100 {
        comm.barrier()?;
        let started = Instant::now();
        comm.all_reduce(buf.as_mut_slice().into(), ReduceOp::Sum)?;
        times.push(started.elapsed());
    }
    let mean = times.iter().sum::<Duration>() / times.len() as u32;
    times.sort();
    report(format!(
        "rank {}: all_reduce of {n} f32: median {:.1} us, mean {:.1} us",
        comm.rank(),
        times[times.len() / 2].as_secs_f64() * 1e6,
        mean.as_secs_f64() * 1e6
    ));
    Ok(())
}

/// After a collective failed: the collective must fail the next call at once, naming the first
/// failure. Returns what to print.
fn check_poisoned(comm: &mut Shared, first: &DistError) -> Result<String, String> {
    let started = Instant::now();
    let later = comm.barrier();
    let took = started.elapsed();
    match later {
        Err(e @ DistError { kind: ErrorKind::GroupFailed(_), .. })
            if e.to_string().contains(&first.to_string()) && took < Duration::from_millis(100) =>
        {
            Ok(format!("a later barrier failed at once ({took:?}): {e}"))
        }
        other => Err(format!("a later barrier on the failed collective gave {other:?} after {took:?}")),
    }
}

fn run(o: &Options, rank_out: &mut Option<usize>) -> Result<bool, Failure> {
    let comm = MpiCollective::with_timeout(o.timeout).map_err(Failure::Collective)?;
    let (rank, size) = (comm.rank(), comm.size());
    *rank_out = Some(rank);
    let mut comm = Shared(Rc::new(RefCell::new(comm)));
    if let Some(dir) = &o.pid_dir {
        std::fs::write(format!("{dir}/rank{rank}.pid"), std::process::id().to_string())
            .map_err(|e| Failure::Other(e.to_string()))?;
    }
    if let Some(n) = o.time_all_reduce {
        time_all_reduce(&mut comm, n).map_err(Failure::Collective)?;
        return Ok(true);
    }
    let weights = scenario::initial_weights(&o.sizes);
    let delay = o.step_delay;
    let hang_rank = o.hang_rank;
    let trained = scenario::train_ranks(comm.clone(), &o.sizes, &weights, o.steps, |rank, step| {
        println!("rank {rank}: step {step} done");
        if hang_rank == Some(rank) && step == 2 {
            println!("rank {rank}: hanging instead of joining the next collective");
            std::thread::sleep(Duration::from_secs(600));
        }
        std::thread::sleep(delay);
    });
    let run = match trained {
        Ok(run) => run,
        Err(NnError::Dist(e)) => {
            report(format!("rank {rank}: collective failed: {e}"));
            match check_poisoned(&mut comm, &e) {
                Ok(message) => report(format!("rank {rank}: {message}")),
                Err(message) => return Err(Failure::Other(message)),
            }
            return Err(Failure::Collective(e));
        }
        Err(e) => return Err(Failure::Other(format!("rank {rank}: {e}"))),
    };
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
    let mut rank = None;
    let code = match run(&options, &mut rank) {
        Ok(true) => {
            println!("train_ddp: ok");
            0
        }
        Ok(false) => {
            eprintln!("train_ddp: FAILED (see above)");
            1
        }
        Err(Failure::Collective(e)) => {
            report(format!("train_ddp: error: {e}"));
            3
        }
        Err(Failure::Other(e)) => {
            report(format!("train_ddp: error: {e}"));
            4
        }
    };
    if let (Some(dir), Some(rank)) = (&options.pid_dir, rank)
        && let Err(e) = std::fs::write(format!("{dir}/rank{rank}.exit"), code.to_string())
    {
        eprintln!("train_ddp: cannot record the exit code in {dir}: {e}");
    }
    ExitCode::from(code)
}
