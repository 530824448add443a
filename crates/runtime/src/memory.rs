//! Host memory for the VM: the 64-byte-aligned arena that holds every temporary, and the fresh,
//! zeroed output arrays that become the caller's `HostTensor`s without a copy.

use std::alloc::Layout;

use air::{DType, HostData};
use half::{bf16, f16};

use crate::error::{Result, RuntimeError};

/// Alignment of the arena's base (a cache line, and enough for any vector load).
pub const ARENA_ALIGN: usize = 64;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; ARENA_ALIGN]);

/// One allocation reused by every run; it only grows, and only when a run needs more.
#[derive(Default)]
pub struct Arena {
    lines: Vec<Line>,
}

impl Arena {
    /// Makes the arena hold at least `bytes` bytes. Growing replaces the allocation (the old
    /// contents are not kept: temporaries do not outlive a run).
    pub fn ensure(&mut self, bytes: usize) -> Result<()> {
        let lines = bytes.div_ceil(ARENA_ALIGN);
        if lines <= self.lines.len() {
            return Ok(());
        }
        let mut fresh: Vec<Line> = Vec::new();
        fresh.try_reserve_exact(lines).map_err(|_| RuntimeError::Alloc { bytes, what: "the arena" })?;
        fresh.resize(lines, Line([0; ARENA_ALIGN]));
        self.lines = fresh;
        Ok(())
    }

    /// The arena's base address (64-byte aligned; dangling but aligned while it is empty).
    pub fn base(&mut self) -> *mut u8 {
        self.lines.as_mut_ptr() as *mut u8
    }

    /// Bytes the arena holds now.
    pub fn capacity_bytes(&self) -> usize {
        self.lines.len() * ARENA_ALIGN
    }
}

/// A zero-filled `Vec<T>` of `n` elements, or an allocation error. Large arrays come from
/// `alloc_zeroed` (fresh pages from the OS are already zero, so nothing is written twice).
fn zeroed_vec<T: Copy>(n: usize, zero: T) -> Result<Vec<T>> {
    if n == 0 || std::mem::size_of::<T>() == 0 {
        let mut v = Vec::new();
        v.resize(n, zero);
        return Ok(v);
    }
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    let err = RuntimeError::Alloc { bytes, what: "an output" };
    let layout = Layout::array::<T>(n).map_err(|_| err)?;
    // SAFETY: `layout` has a non-zero size (n > 0 and T is not zero-sized).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if ptr.is_null() {
        return Err(RuntimeError::Alloc { bytes, what: "an output" });
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `[T; n]`, which is what
    // `Vec<T>` with capacity `n` uses; all-zero bytes are a valid value of every element type used
    // here (`bool`, ints, floats, `f16`, `bf16`), so all `n` elements are initialized.
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// A fresh zeroed array of `n` elements of `dtype`.
pub fn zeroed_host_data(dtype: DType, n: usize) -> Result<HostData> {
    Ok(match dtype {
        DType::Bool => HostData::Bool(zeroed_vec(n, false)?),
        DType::I32 => HostData::I32(zeroed_vec(n, 0i32)?),
        DType::I64 => HostData::I64(zeroed_vec(n, 0i64)?),
        DType::F16 => HostData::F16(zeroed_vec(n, f16::ZERO)?),
        DType::BF16 => HostData::BF16(zeroed_vec(n, bf16::ZERO)?),
        DType::F32 => HostData::F32(zeroed_vec(n, 0f32)?),
        DType::F64 => HostData::F64(zeroed_vec(n, 0f64)?),
    })
}

/// The address of the first element of `data`, for kernels that only read it.
pub fn data_ptr(data: &HostData) -> *mut u8 {
    air::with_host_data!(data, v => v.as_ptr() as *mut u8)
}

/// The address of the first element of `data`, for kernels that write it.
pub fn data_ptr_mut(data: &mut HostData) -> *mut u8 {
    air::with_host_data!(data, v => v.as_mut_ptr() as *mut u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_is_aligned_and_grows_only_when_needed() {
        let mut arena = Arena::default();
        arena.ensure(100).unwrap();
        let p = arena.base();
        assert_eq!(p as usize % ARENA_ALIGN, 0);
        assert_eq!(arena.capacity_bytes(), 128);
        arena.ensure(64).unwrap();
        assert_eq!(arena.base(), p);
        arena.ensure(1000).unwrap();
        assert_eq!(arena.base() as usize % ARENA_ALIGN, 0);
        assert!(arena.capacity_bytes() >= 1000);
    }

    #[test]
    fn outputs_are_zeroed_and_huge_ones_fail_cleanly() {
        for dtype in DType::ALL {
            let d = zeroed_host_data(dtype, 1000).unwrap();
            assert_eq!(d.len(), 1000);
            assert!(d.to_f64_vec().iter().all(|&x| x == 0.0));
        }
        assert!(matches!(zeroed_host_data(DType::F64, usize::MAX / 4), Err(RuntimeError::Alloc { .. })));
        assert!(Arena::default().ensure(usize::MAX / 2).is_err());
    }
}
