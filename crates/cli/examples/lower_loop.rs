//! Records, traces and lowers (no code generation) the cached GPT forward `N` times, for profiling
//! the graph passes: `lower_loop [LAYERS] [N] [cached: 0|1]`.

use kiln_cli::model::{Gpt, GptConfig};
use kiln_cli::pipeline::Traced;

fn main() -> anyhow::Result<()> {
    let layers: usize = std::env::args().nth(1).map_or(Ok(8), |s| s.parse())?;
    let n: usize = std::env::args().nth(2).map_or(Ok(200), |s| s.parse())?;
    let cached = std::env::args().nth(3).is_none_or(|s| s == "1");
    let config = GptConfig { layers, start_pos: cached.then_some(2), ..GptConfig::default() };
    let gpt = Gpt::new(config, 0)?;
    let tokens = gpt.tokens(1);
    let t = std::time::Instant::now();
    let (mut fwd, mut tr, mut low) = (0.0, 0.0, 0.0);
    for _ in 0..n {
        let t0 = std::time::Instant::now();
        let (outputs, _) = gpt.outputs(&tokens)?;
        let t1 = std::time::Instant::now();
        let traced = Traced::of(&outputs.iter().collect::<Vec<_>>())?;
        let t2 = std::time::Instant::now();
        let p = lower::compile(&traced.graph, &lower::CompileOptions::default())?;
        std::hint::black_box(p);
        let t3 = std::time::Instant::now();
        fwd += (t1 - t0).as_secs_f64();
        tr += (t2 - t1).as_secs_f64();
        low += (t3 - t2).as_secs_f64();
    }
    let ms = |x: f64| x * 1e3 / n as f64;
    println!(
        "per iteration: forward {:.3} ms, trace {:.3} ms, lower {:.3} ms; total {:.3} ms",
        ms(fwd),
        ms(tr),
        ms(low),
        ms(t.elapsed().as_secs_f64())
    );
    Ok(())
}
