//! The tree of matmuls' realize of all products (`kiln bench tree-matmul`'s (b)) in a loop, for
//! a sampling profiler: `tree_realize [ITERS]`.

#[global_allocator]
static ALLOC: kiln_cli::Allocator = kiln_cli::ALLOCATOR;

use std::time::Instant;

use kiln_cli::workloads::tree::{Shape, operands, tree_of};

fn main() -> anyhow::Result<()> {
    let iters: usize = std::env::args().nth(1).map_or(Ok(200), |s| s.parse())?;
    let (a, b) = operands(Shape::default());
    let (ta, tb) = (tree_of(&a)?, tree_of(&b)?);
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let products = ta.matmul(&tb);
        kiln::realize(&products.leaves())?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    println!("tree realize: median {:.3} ms over {iters}", times[iters / 2]);
    Ok(())
}
