//! Tiny Rust functions the generated code calls where an inline sequence is not worth it: f64
//! transcendentals (from `libm`, bit-identical to the reference interpreter), f32 `pow`/`fmod`,
//! the slow path of f32 `sin`, f32 -> f16 rounding, the full-width routines of `tile` and `stencil`,
//! and the copy of strided rows into and out of a tiled loop's scratch tiles.
//!
//! Each is registered with `JITBuilder::symbol` under a `kiln_` name, so nothing is looked up with
//! `dlsym`. Every JIT module declares them first, in [`Helper::ALL`]'s order, so helper `h` is
//! function `h.index()` of every module: kernels are emitted and compiled without a module (on any
//! thread) and name their helpers by that index, which the module resolves when it links them.

use cranelift_codegen::ir::{
    AbiParam, ExtFuncData, ExternalName, FuncRef, Function, Signature, UserExternalName, types,
};
use cranelift_codegen::isa::CallConv;

use super::{stencil, tile};

/// A helper the generated code may call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Helper {
    F32ToF16,
    PowF32,
    FmodF32,
    SinF32,
    Exp2F64,
    Log2F64,
    SinF64,
    ErfF64,
    PowF64,
    FmodF64,
    TileUnaryAvx2,
    TileBinaryAvx2,
    TileUnaryBase,
    TileBinaryBase,
    TileUnaryAvx512,
    TileBinaryAvx512,
    StencilAvx512,
    StencilBase,
    CopyRows,
}

impl Helper {
    pub(crate) const ALL: [Helper; 19] = [
        Helper::F32ToF16,
        Helper::PowF32,
        Helper::FmodF32,
        Helper::SinF32,
        Helper::Exp2F64,
        Helper::Log2F64,
        Helper::SinF64,
        Helper::ErfF64,
        Helper::PowF64,
        Helper::FmodF64,
        Helper::TileUnaryAvx2,
        Helper::TileBinaryAvx2,
        Helper::TileUnaryBase,
        Helper::TileBinaryBase,
        Helper::TileUnaryAvx512,
        Helper::TileBinaryAvx512,
        Helper::StencilAvx512,
        Helper::StencilBase,
        Helper::CopyRows,
    ];

    /// The helper's function index in every JIT module (its position in [`Helper::ALL`]).
    pub(crate) fn index(self) -> u32 {
        self as u32
    }

    /// Imports the helper into `func`, as `cranelift_module::Module::declare_func_in_func` would
    /// for function `self.index()` of a module (once per function; the caller caches the ref).
    pub(crate) fn import(self, func: &mut Function, call_conv: CallConv) -> FuncRef {
        let signature = func.import_signature(self.signature(call_conv));
        let name = func.declare_imported_user_function(UserExternalName { namespace: 0, index: self.index() });
        func.import_function(ExtFuncData {
            name: ExternalName::user(name),
            signature,
            // Imported, so not colocated: the call loads the helper's absolute address.
            colocated: false,
            patchable: false,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Helper::F32ToF16 => "kiln_f32_to_f16",
            Helper::PowF32 => "kiln_powf",
            Helper::FmodF32 => "kiln_fmodf",
            Helper::SinF32 => "kiln_sinf",
            Helper::Exp2F64 => "kiln_exp2",
            Helper::Log2F64 => "kiln_log2",
            Helper::SinF64 => "kiln_sin",
            Helper::ErfF64 => "kiln_erf",
            Helper::PowF64 => "kiln_pow",
            Helper::FmodF64 => "kiln_fmod",
            Helper::TileUnaryAvx512 => "kiln_tile_unary_avx512",
            Helper::TileBinaryAvx512 => "kiln_tile_binary_avx512",
            Helper::TileUnaryAvx2 => "kiln_tile_unary_avx2",
            Helper::TileBinaryAvx2 => "kiln_tile_binary_avx2",
            Helper::TileUnaryBase => "kiln_tile_unary_base",
            Helper::TileBinaryBase => "kiln_tile_binary_base",
            Helper::StencilAvx512 => "kiln_stencil_avx512",
            Helper::StencilBase => "kiln_stencil_base",
            Helper::CopyRows => "kiln_copy_rows",
        }
    }

    pub(crate) fn address(self) -> *const u8 {
        match self {
            Helper::F32ToF16 => f32_to_f16 as *const u8,
            Helper::PowF32 => powf as *const u8,
            Helper::FmodF32 => fmodf as *const u8,
            Helper::SinF32 => sinf as *const u8,
            Helper::Exp2F64 => exp2 as *const u8,
            Helper::Log2F64 => log2 as *const u8,
            Helper::SinF64 => sin as *const u8,
            Helper::ErfF64 => erf as *const u8,
            Helper::PowF64 => pow as *const u8,
            Helper::FmodF64 => fmod as *const u8,
            Helper::TileUnaryAvx512 => tile::unary_avx512 as *const u8,
            Helper::TileBinaryAvx512 => tile::binary_avx512 as *const u8,
            Helper::TileUnaryAvx2 => tile::unary_avx2 as *const u8,
            Helper::TileBinaryAvx2 => tile::binary_avx2 as *const u8,
            Helper::TileUnaryBase => tile::unary_base as *const u8,
            Helper::TileBinaryBase => tile::binary_base as *const u8,
            Helper::StencilAvx512 => stencil::stencil_avx512 as *const u8,
            Helper::StencilBase => stencil::stencil_base as *const u8,
            Helper::CopyRows => copy_rows as *const u8,
        }
    }

    pub(crate) fn signature(self, call_conv: CallConv) -> Signature {
        let mut sig = Signature::new(call_conv);
        let (params, ret) = match self {
            Helper::F32ToF16 => (&[types::F32][..], Some(types::I32)),
            Helper::SinF32 => (&[types::F32][..], Some(types::F32)),
            Helper::PowF32 | Helper::FmodF32 => (&[types::F32, types::F32][..], Some(types::F32)),
            Helper::Exp2F64 | Helper::Log2F64 | Helper::SinF64 | Helper::ErfF64 => {
                (&[types::F64][..], Some(types::F64))
            }
            Helper::PowF64 | Helper::FmodF64 => (&[types::F64, types::F64][..], Some(types::F64)),
            // (op, dst, src, n, params)
            Helper::TileUnaryAvx512 | Helper::TileUnaryAvx2 | Helper::TileUnaryBase => {
                (&[types::I32, types::I64, types::I64, types::I64, types::I64][..], None)
            }
            // (args)
            Helper::StencilAvx512 | Helper::StencilBase => (&[types::I64][..], None),
            // (dst, dst_step, src, src_step, rows, bytes)
            Helper::CopyRows => (&[types::I64; 6][..], None),
            // (mode, dst, a, b, n)
            Helper::TileBinaryAvx512 | Helper::TileBinaryAvx2 | Helper::TileBinaryBase => {
                (&[types::I32, types::I64, types::I64, types::I64, types::I64][..], None)
            }
        };
        sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        sig.returns.extend(ret.map(AbiParam::new));
        sig
    }
}

/// `rows` rows of `bytes` bytes from `src` to `dst`, the rows `src_step` and `dst_step` bytes
/// apart: a tiled loop's gather of strided rows into its scratch tile and scatter back
/// (`Emitter::copy_rows`), one call instead of an unrolled copy per row in every kernel; the
/// native tiled run (`native`) calls it too.
///
/// # Safety
/// Kernels pass rows inside their buffers or scratch tiles, a source row never overlapping a
/// destination row (a buffer and a stack tile).
pub(crate) unsafe extern "C" fn copy_rows(
    dst: *mut u8,
    dst_step: i64,
    src: *const u8,
    src_step: i64,
    rows: i64,
    bytes: i64,
) {
    for r in 0..rows.max(0) as isize {
        // SAFETY: the caller's contract.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.offset(r * src_step as isize),
                dst.offset(r * dst_step as isize),
                bytes.max(0) as usize,
            )
        };
    }
}

extern "C" fn f32_to_f16(x: f32) -> u32 {
    half::f16::from_f32(x).to_bits() as u32
}
extern "C" fn powf(x: f32, y: f32) -> f32 {
    libm::powf(x, y)
}
extern "C" fn fmodf(x: f32, y: f32) -> f32 {
    x % y
}
extern "C" fn sinf(x: f32) -> f32 {
    libm::sinf(x)
}
extern "C" fn exp2(x: f64) -> f64 {
    libm::exp2(x)
}
extern "C" fn log2(x: f64) -> f64 {
    libm::log2(x)
}
extern "C" fn sin(x: f64) -> f64 {
    libm::sin(x)
}
extern "C" fn erf(x: f64) -> f64 {
    libm::erf(x)
}
extern "C" fn pow(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}
extern "C" fn fmod(x: f64, y: f64) -> f64 {
    x % y
}
