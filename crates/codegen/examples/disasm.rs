//! Prints the machine code of the sigmoid benchmark kernel (`KILN_DISASM` is set here).
use air::{BinaryOp, DType, Scalar, UnaryOp};
use kiln_codegen::CpuCompiler;
use lower::kir::{Access, IExpr, Inst, LoopKernel, Param, Reg, Stmt, Var};

fn main() {
    // SAFETY: single-threaded at this point.
    unsafe { std::env::set_var("KILN_DISASM", "1") };
    let l = |n: u32, inst| Stmt::Let { reg: Reg(n), dtype: DType::F32, inst };
    let i = IExpr::Var(Var(0));
    let body = vec![
        l(0, Inst::Load { buf: 0, index: i.clone(), mask: None, other: Scalar::Float(0.0) }),
        l(1, Inst::Unary(UnaryOp::Neg, Reg(0))),
        l(2, Inst::Const(Scalar::Float(std::f64::consts::LOG2_E))),
        l(3, Inst::Binary(BinaryOp::Mul, Reg(1), Reg(2))),
        l(4, Inst::Unary(UnaryOp::Exp2, Reg(3))),
        l(5, Inst::Const(Scalar::Float(1.0))),
        l(6, Inst::Binary(BinaryOp::Add, Reg(5), Reg(4))),
        l(7, Inst::Unary(UnaryOp::Recip, Reg(6))),
        Stmt::Store { buf: 1, index: i, value: Reg(7) },
    ];
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
