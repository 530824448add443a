//! `--dump DIR`: the graph after each pass of the profiled compilation (air text and DOT), the
//! kernel IR of the program, the Cranelift IR of every loop kernel and the WGSL of every kernel.
//!
//! `lower::compile`'s observer sees pass names and node counts but not the graph, so the graph
//! passes are replayed here with `lower`'s public steps (verify, then `rewrite::optimize`), on a
//! copy, outside the timed profile.

use std::path::{Path, PathBuf};

use air::Graph;
use anyhow::Context as _;
use lower::Program;
use lower::kir::Kernel;

/// Writes the dump files into `dir` (created if needed); returns the paths written.
pub fn write(dir: &Path, traced: &Graph, program: &Program) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    let mut put = |name: String, text: String| -> anyhow::Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    let mut graph = traced.clone();
    put("00-traced.air".into(), air::text::print(&graph))?;
    put("00-traced.dot".into(), air::dot::to_dot(&graph))?;
    air::verify(&graph)?;
    let stats = lower::rewrite::optimize(&mut graph);
    put("01-optimize.air".into(), air::text::print(&graph))?;
    put("01-optimize.dot".into(), air::dot::to_dot(&graph))?;
    put("01-optimize.stats".into(), stats.to_string())?;
    put("02-program.kir".into(), program.to_string())?;
    for (i, kernel) in program.kernels.iter().enumerate() {
        if let Kernel::Loops(k) = kernel {
            let clif = codegen::clif_text(k).unwrap_or_else(|e| format!("; clif_text failed: {e}\n"));
            put(format!("03-k{i}.clif"), clif)?;
        }
        let wgsl = match codegen::wgsl::generate(kernel) {
            Ok(w) => w.source,
            Err(e) => format!("// no WGSL for this kernel: {e}\n"),
        };
        put(format!("04-k{i}.wgsl"), wgsl)?;
    }
    Ok(written)
}
