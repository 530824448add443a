//! GEMV bandwidth: `x [1, k] @ W^T` with `W [n, k]` (a `Linear` at batch 1) over many distinct
//! weights (more bytes than the caches hold), GB/s of weight read, and how much of the process is
//! on transparent huge pages (`runtime::memory::note_input`).
//! `cargo run --release -p kiln-cli --example gemv_bw`

use std::time::Instant;

use kiln::Tensor;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for (k, n, count) in [(768usize, 768usize, 256), (768, 3072, 64), (768, 50257, 4)] {
        let x = Tensor::randn(&[1, k]);
        let ws: Vec<Tensor> = (0..count).map(|_| Tensor::randn(&[n, k])).collect();
        kiln::realize(&ws.iter().collect::<Vec<_>>())?;
        let mut f = kiln::jit(|a: &[Tensor]| a[0].matmul(&a[1].transpose(0, 1)));
        f.call(&[&x, &ws[0]])?;
        let mut times = Vec::new();
        for _ in 0..6 {
            let t = Instant::now();
            for w in &ws {
                drop(f.call(&[&x, w])?);
            }
            times.push(t.elapsed().as_secs_f64() / count as f64);
        }
        if let Ok(m) = std::fs::read_to_string("/proc/self/smaps_rollup")
            && let Some(l) = m.lines().find(|l| l.starts_with("AnonHugePages"))
        {
            print!("[{l}] ");
        }
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        println!("k {k} n {n} x{count}: {:.1} us, {:.1} GB/s", med * 1e6, (n * k * 4) as f64 / med / 1e9);
    }
    Ok(())
}
