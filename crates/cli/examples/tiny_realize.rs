//! Time per cached realize of one tiny op: `tiny_realize [OP] [N] [ITERS]` (`neg` or `sigmoid`,
//! default `neg 1 2000000`): the per-call overhead of `kiln bench unary`'s "single op, realized"
//! row at n = 1, in a loop long enough to profile (`perf record`).

use std::time::Instant;

use kiln::Tensor;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let op = std::env::args().nth(1).unwrap_or_else(|| "neg".into());
    let n: usize = std::env::args().nth(2).map_or(Ok(1), |s| s.parse())?;
    let iters: usize = std::env::args().nth(3).map_or(Ok(2_000_000), |s| s.parse())?;
    let x = Tensor::from_vec(vec![0.5f32; n], &[n]);
    x.realize()?;
    let apply = |x: &Tensor| if op == "sigmoid" { x.sigmoid() } else { x.neg() };
    for _ in 0..1000 {
        apply(&x).realize()?;
    }
    let start = Instant::now();
    for _ in 0..iters {
        apply(&x).realize()?;
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
    println!("{op} n={n}: {us:.3} us per realize");
    Ok(())
}
