//! Times one product `a [m, k] @ b [k, n]` through `kiln::jit` (the tenth percentile of the
//! calls' times, which calibration's slower runs stay above):
//! `mm_shape M K N [calls]`.

use std::time::Instant;

use kiln::Tensor;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse()).collect::<Result<_, _>>()?;
    let (m, k, n) = (args[0], args[1], args[2]);
    let calls = args.get(3).copied().unwrap_or(2000);
    let a = Tensor::randn(&[m, k]);
    let b = Tensor::randn(&[k, n]);
    kiln::realize(&[&a, &b])?;
    let mut f = kiln::jit(|t: &[Tensor]| t[0].matmul(&t[1]));
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        drop(f.call(&[&a, &b])?);
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let p10 = times[times.len() / 10];
    println!("{m}x{k}x{n}: {:.2} us, {:.1} GFLOP/s", p10 * 1e6, 2.0 * (m * k * n) as f64 / p10 / 1e9);
    Ok(())
}
