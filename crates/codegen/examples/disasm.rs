//! Prints the machine code of the sigmoid benchmark kernel (`KILN_DISASM` is set here); with an
//! argument `N`, of a fused chain of `N` sigmoids instead (one kernel, as the fuser emits it).
//! The listing is a `log` record, which the small logger below prints to stderr.
use air::{BinaryOp, DType, Scalar, UnaryOp};
use kiln_codegen::CpuCompiler;
use lower::kir::{Access, IExpr, Inst, LoopKernel, Param, Reg, Stmt, Var};

/// Prints every `info` (or more severe) record's message to stderr.
struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Info
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            eprintln!("{}", record.args());
        }
    }

    fn flush(&self) {}
}

fn main() {
    log::set_logger(&Stderr).expect("the first logger of this process");
    log::set_max_level(log::LevelFilter::Info);
    // SAFETY: single-threaded at this point.
    unsafe { std::env::set_var("KILN_DISASM", "1") };
    let chain: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let l = |n: u32, inst| Stmt::Let { reg: Reg(n), dtype: DType::F32, inst };
    let i = IExpr::Var(Var(0));
    let mut body = vec![l(0, Inst::Load { buf: 0, index: i.clone(), mask: None, other: Scalar::Float(0.0) })];
    let mut x = 0;
    for _ in 0..chain {
        body.extend([
            l(x + 1, Inst::Unary(UnaryOp::Neg, Reg(x))),
            l(x + 2, Inst::Const(Scalar::Float(std::f64::consts::LOG2_E))),
            l(x + 3, Inst::Binary(BinaryOp::Mul, Reg(x + 1), Reg(x + 2))),
            l(x + 4, Inst::Unary(UnaryOp::Exp2, Reg(x + 3))),
            l(x + 5, Inst::Const(Scalar::Float(1.0))),
            l(x + 6, Inst::Binary(BinaryOp::Add, Reg(x + 5), Reg(x + 4))),
            l(x + 7, Inst::Unary(UnaryOp::Recip, Reg(x + 6))),
        ]);
        x += 7;
    }
    body.push(Stmt::Store { buf: 1, index: i, value: Reg(x) });
    let k = LoopKernel {
        params: vec![
            Param { dtype: DType::F32, access: Access::Read },
            Param { dtype: DType::F32, access: Access::Write },
        ],
        n_syms: 1,
        body: vec![Stmt::Loop { var: Var(0), extent: IExpr::Sym(0), parallel: true, body }],
    };
    CpuCompiler::new().unwrap().compile(&k).unwrap();
}
