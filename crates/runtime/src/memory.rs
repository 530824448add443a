//! Host memory for the VM: the 64-byte-aligned arena that holds every temporary, and the fresh
//! output arrays that become the caller's `HostTensor`s without a copy.

use std::alloc::Layout;
use std::sync::{Mutex, PoisonError};

use air::{DType, HostData};
use half::{bf16, f16};

use crate::error::{Result, RuntimeError};

/// Alignment of the arena's base (a cache line, and enough for any vector load).
pub const ARENA_ALIGN: usize = 64;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; ARENA_ALIGN]);

/// One allocation reused by every run; it only grows, and only when a run needs more. A dropped
/// arena's memory goes to the process's spare arenas ([`SpareArenas`]), which the next arena to
/// grow takes from (zeroed again) before it asks the allocator.
///
/// Why: fresh memory costs a page fault per 4 KiB page on its first write, and on this virtual
/// machine a fault on memory the process had not touched before took about 4 us: the exported
/// conv-32's 0.87 MiB arena cost its first run up to 0.8 ms of faults when the program before it
/// had been dropped (the allocator had released that memory), where the whole run takes about
/// 0.05 ms without them. Every new program of a process (a new shape, an imported model, a
/// cleared cache) starts with a first run.
#[derive(Default)]
pub struct Arena {
    lines: Vec<Line>,
}

/// Arenas of dropped programs, kept for the next arena that grows (see [`Arena`]).
static SPARE_ARENAS: Mutex<SpareArenas> = Mutex::new(SpareArenas { arenas: Vec::new() });

/// How many dropped arenas the process keeps.
const SPARE_ARENAS_MAX: usize = 4;

/// How many bytes of dropped arenas the process keeps at most (memory held for no program).
const SPARE_ARENA_BYTES_MAX: usize = 64 << 20;

/// Dropped arenas' memory: at most [`SPARE_ARENAS_MAX`] of them and [`SPARE_ARENA_BYTES_MAX`]
/// bytes in all, the largest kept first.
struct SpareArenas {
    arenas: Vec<Vec<Line>>,
}

impl SpareArenas {
    /// The smallest spare of `lines` to twice as many lines, taken out (a larger one stays for a
    /// larger program).
    fn take(&mut self, lines: usize) -> Option<Vec<Line>> {
        let fits = |a: &Vec<Line>| (lines..=lines.saturating_mul(2)).contains(&a.len());
        let best = (0..self.arenas.len()).filter(|&i| fits(&self.arenas[i])).min_by_key(|&i| self.arenas[i].len());
        best.map(|i| self.arenas.swap_remove(i))
    }

    /// Keeps `lines` (unless empty or over the byte limit alone), then drops the smallest spares
    /// until the limits hold.
    fn keep(&mut self, lines: Vec<Line>) {
        if lines.is_empty() || lines.len() * ARENA_ALIGN > SPARE_ARENA_BYTES_MAX {
            return;
        }
        self.arenas.push(lines);
        self.arenas.sort_unstable_by_key(|a| std::cmp::Reverse(a.len()));
        let mut total = 0;
        let kept = self
            .arenas
            .iter()
            .take(SPARE_ARENAS_MAX)
            .take_while(|a| {
                total += a.len() * ARENA_ALIGN;
                total <= SPARE_ARENA_BYTES_MAX
            })
            .count();
        self.arenas.truncate(kept);
    }
}

/// The process's spare arenas, locked (a poisoned lock still holds whole arenas).
fn spare_arenas() -> std::sync::MutexGuard<'static, SpareArenas> {
    SPARE_ARENAS.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Arena {
    /// Makes the arena hold at least `bytes` bytes, zeroed. Growing replaces the allocation (the
    /// old contents are not kept: temporaries do not outlive a run) with a spare arena that fits
    /// ([`SpareArenas::take`]), else fresh memory.
    pub fn ensure(&mut self, bytes: usize) -> Result<()> {
        let lines = bytes.div_ceil(ARENA_ALIGN);
        if lines <= self.lines.len() {
            return Ok(());
        }
        let spare = spare_arenas().take(lines);
        let grown = match spare {
            Some(mut spare) => {
                spare.fill(Line([0; ARENA_ALIGN]));
                spare
            }
            None => {
                let mut fresh: Vec<Line> = Vec::new();
                fresh.try_reserve_exact(lines).map_err(|_| RuntimeError::Alloc { bytes, what: "the arena" })?;
                advise_huge_pages(fresh.as_ptr() as *const u8, lines * ARENA_ALIGN);
                fresh.resize(lines, Line([0; ARENA_ALIGN]));
                fresh
            }
        };
        spare_arenas().keep(std::mem::replace(&mut self.lines, grown));
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

impl Drop for Arena {
    fn drop(&mut self) {
        spare_arenas().keep(std::mem::take(&mut self.lines));
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
    // Fresh pages from `calloc`'s mmap are untouched: the hint takes effect on the first write.
    advise_huge_pages(ptr as *const u8, bytes);
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

/// An empty `Vec<T>` with room for exactly `n` elements, reserved fallibly: a size the allocator
/// refuses is [`RuntimeError::Alloc`] (for `what`), never an abort.
pub fn reserved_vec<T>(n: usize, what: &'static str) -> Result<Vec<T>> {
    let mut v: Vec<T> = Vec::new();
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    v.try_reserve_exact(n).map_err(|_| RuntimeError::Alloc { bytes, what })?;
    advise_huge_pages(v.as_ptr() as *const u8, bytes);
    Ok(v)
}

/// An empty `Vec<T>` with room for exactly `n` elements (nothing written), or an allocation
/// error. In debug builds it is filled with `poison` instead, so that an element no kernel writes
/// shows up in tests (NaN for floats) rather than as whatever the allocator handed out.
fn unwritten_vec<T: Copy>(n: usize, poison: T) -> Result<Vec<T>> {
    let mut v = reserved_vec(n, "an output")?;
    if cfg!(debug_assertions) {
        v.resize(n, poison);
    }
    Ok(v)
}

/// A fresh array with room for `n` elements of `dtype` whose elements the program's kernels
/// write before anything reads them: nothing is zeroed (a `calloc` would write every byte of a
/// recycled block, or fault in fresh pages ahead of the kernel). Its length is 0 until
/// [`mark_written`] (in debug builds it holds `n` poison values: NaN, `MIN`, `true`).
pub fn unwritten_host_data(dtype: DType, n: usize) -> Result<HostData> {
    Ok(match dtype {
        DType::Bool => HostData::Bool(unwritten_vec(n, true)?),
        DType::I32 => HostData::I32(unwritten_vec(n, i32::MIN)?),
        DType::I64 => HostData::I64(unwritten_vec(n, i64::MIN)?),
        DType::F16 => HostData::F16(unwritten_vec(n, f16::NAN)?),
        DType::BF16 => HostData::BF16(unwritten_vec(n, bf16::NAN)?),
        DType::F32 => HostData::F32(unwritten_vec(n, f32::NAN)?),
        DType::F64 => HostData::F64(unwritten_vec(n, f64::NAN)?),
    })
}

/// Gives `data` (from [`unwritten_host_data`] or [`zeroed_host_data`]) its full length `n`.
///
/// # Safety
/// Every one of the first `n` elements has been written with a valid value of its type (bools as
/// 0 or 1), and `data` has room for `n` elements.
pub unsafe fn mark_written(data: &mut HostData, n: usize) {
    air::with_host_data!(data, v => {
        debug_assert!(v.capacity() >= n);
        // SAFETY: the caller guarantees the capacity and that the elements are initialized.
        unsafe { v.set_len(n) }
    })
}

/// Largest block glibc's `malloc` serves from its heap once [`tune_host_allocator`] ran (32 MiB:
/// the most `M_MMAP_THRESHOLD` accepts on 64-bit glibc); bigger ones are still `mmap`ed.
pub const HEAP_BLOCK_MAX: usize = 32 << 20;

/// Free memory at the top of glibc's heap kept for reuse instead of being returned to the OS once
/// [`tune_host_allocator`] ran.
pub const HEAP_KEEP_FREE: usize = 512 << 20;

/// Environment variable for the allocator tuning: `1` makes the first [`crate::CpuDevice`] of the
/// process apply it ([`tune_host_allocator_if_requested`]); `0` makes [`tune_host_allocator`] a
/// no-op, even where an application calls it (the `kiln` command and the benchmarks do).
pub const MALLOC_TUNING_ENV: &str = "KILN_MALLOC_TUNING";

/// Tunes glibc's `malloc` for a runtime that hands out big, short-lived output arrays, for the
/// whole process. The library never calls it on its own: an application opts in by calling it
/// (or `kiln::tune_host_allocator`), ideally once at start-up, or by setting
/// `KILN_MALLOC_TUNING=1`. Returns whether the settings were applied (only on Linux with glibc,
/// and never with `KILN_MALLOC_TUNING=0`); calling it again changes nothing.
///
/// What it changes: glibc's `M_MMAP_THRESHOLD` to [`HEAP_BLOCK_MAX`] (32 MiB) and
/// `M_TRIM_THRESHOLD` to [`HEAP_KEEP_FREE`] (512 MiB), which also turns glibc's on-the-fly
/// adjustment of both off. These are settings of the C allocator, so they apply to every
/// allocation of the process, not only Kiln's.
///
/// Why: outputs are fresh `Vec`s the caller owns (see the VM docs), so the runtime cannot pool
/// them; they go back to the global allocator when the caller drops them. glibc serves blocks
/// above its `mmap` threshold (128 KiB at first, raised on the fly up to 32 MiB) with fresh
/// `mmap`s, and gives free memory at the top of its heap back to the OS past a trim threshold
/// (twice the `mmap` threshold). Either way the next run's outputs land on fresh pages and pay a
/// page fault per 4 KiB *inside the kernels* (BENCHMARKS.md has a measured tree of matmuls). With
/// the two thresholds raised, freed outputs stay in the heap and the next run reuses them warm.
/// The cost: up to [`HEAP_KEEP_FREE`] of freed memory stays mapped (and counted in the RSS) after
/// a peak. This is the knob ML runtimes commonly turn (or replace the allocator outright with
/// jemalloc/tcmalloc); a program with its own `#[global_allocator]` is unaffected in practice.
pub fn tune_host_allocator() -> bool {
    if env_says("0") {
        return false;
    }
    static APPLIED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *APPLIED.get_or_init(glibc_mallopt)
}

/// [`tune_host_allocator`] when `KILN_MALLOC_TUNING=1`, else nothing (returns `false`); called by
/// every new [`crate::CpuDevice`].
pub fn tune_host_allocator_if_requested() -> bool {
    env_says("1") && tune_host_allocator()
}

/// Whether `KILN_MALLOC_TUNING` is set to `value`.
fn env_says(value: &str) -> bool {
    std::env::var(MALLOC_TUNING_ENV).is_ok_and(|v| v.trim() == value)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn glibc_mallopt() -> bool {
    // SAFETY: `mallopt` only changes allocator parameters; both values are in the ranges glibc
    // accepts (it returns 0 and changes nothing otherwise).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, HEAP_BLOCK_MAX as libc::c_int) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, HEAP_KEEP_FREE as libc::c_int) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn glibc_mallopt() -> bool {
    false
}

/// The size of a transparent huge page on x86-64 and aarch64 Linux (a PMD mapping).
pub const HUGE_PAGE: usize = 2 << 20;

/// Arrays of at least this many bytes are backed with huge pages where the OS allows (see
/// [`advise_huge_pages`] and [`note_input`]); a smaller one holds at most one whole aligned huge
/// page.
pub const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// The whole 2 MiB pages inside `[ptr, ptr + bytes)`, as (start, length), if any.
fn huge_interior(ptr: *const u8, bytes: usize) -> Option<(usize, usize)> {
    let start = (ptr as usize).checked_next_multiple_of(HUGE_PAGE)?;
    let end = (ptr as usize).checked_add(bytes)? / HUGE_PAGE * HUGE_PAGE;
    (end > start).then(|| (start, end - start))
}

/// Asks Linux to back the whole 2 MiB pages of a fresh, not yet touched allocation with
/// transparent huge pages (`madvise(MADV_HUGEPAGE)`): the first write then faults in 2 MiB at a
/// time, and a kernel streaming the array later misses the TLB 512 times less often. Only
/// arrays of at least [`HUGE_PAGE_MIN_BYTES`]; a hint: an error (no THP support) changes nothing.
pub fn advise_huge_pages(ptr: *const u8, bytes: usize) {
    if bytes >= HUGE_PAGE_MIN_BYTES
        && let Some((start, len)) = huge_interior(ptr, bytes)
    {
        madvise(start, len, Advice::HugePage);
    }
}

/// What [`note_input`] knows of a big input array, by address and length.
#[derive(Clone, Copy, PartialEq)]
enum Seen {
    /// Not bound before.
    Fresh,
    /// Bound once.
    Once,
    /// Bound again, and collapsed into huge pages then.
    Collapsed,
}

/// The big input arrays bound so far, by (address, bytes); forgotten past [`NOTED_MAX`].
static NOTED: std::sync::LazyLock<std::sync::Mutex<rustc_hash::FxHashMap<(usize, usize), Seen>>> =
    std::sync::LazyLock::new(Default::default);
const NOTED_MAX: usize = 4096;

/// Called for every input array a CPU run binds. The second time an array of at least
/// [`HUGE_PAGE_MIN_BYTES`] is bound (a weight, bound on every call of a model), its whole 2 MiB
/// pages are collapsed into transparent huge pages (`madvise(MADV_COLLAPSE)`, Linux 6.1+): the
/// kernels that stream it from memory then stop paying a TLB miss every 4 KiB (measured with
/// `examples/gemv_bw`: the 154 MB GEMV of GPT-2's vocabulary projection reads 22 GB/s on 4 KiB
/// pages, 31 GB/s on huge pages). The collapse copies the array once; arrays bound only once
/// never pay it. Addresses are only compared, never dereferenced: a freed array whose address
/// comes back misses one collapse, nothing worse.
pub fn note_input(data: &HostData) {
    let bytes = data.len() * data.dtype().size_bytes();
    if bytes < HUGE_PAGE_MIN_BYTES || !cfg!(target_os = "linux") {
        return;
    }
    let ptr = data_ptr(data) as usize;
    let collapse = {
        let mut noted = NOTED.lock().unwrap_or_else(|p| p.into_inner());
        if noted.len() >= NOTED_MAX && !noted.contains_key(&(ptr, bytes)) {
            noted.clear();
        }
        let seen = noted.entry((ptr, bytes)).or_insert(Seen::Fresh);
        let collapse = *seen == Seen::Once;
        *seen = match *seen {
            Seen::Fresh => Seen::Once,
            _ => Seen::Collapsed,
        };
        collapse
    };
    if collapse && let Some((start, len)) = huge_interior(ptr as *const u8, bytes) {
        madvise(start, len, Advice::Collapse);
    }
}

#[derive(Clone, Copy)]
enum Advice {
    HugePage,
    Collapse,
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn madvise(start: usize, len: usize, advice: Advice) {
    let advice = match advice {
        Advice::HugePage => libc::MADV_HUGEPAGE,
        Advice::Collapse => libc::MADV_COLLAPSE,
    };
    // SAFETY: `[start, start + len)` lies inside one live allocation of the caller's, and both
    // advices only change how its pages are backed, never their contents (a collapse copies the
    // pages into a huge page with the same data). The result is ignored: a kernel without THP
    // (EINVAL) or out of huge pages (ENOMEM, EAGAIN) leaves the memory as it was.
    unsafe {
        libc::madvise(start as *mut libc::c_void, len, advice);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn madvise(_start: usize, _len: usize, _advice: Advice) {}

/// Sets every element of `data` to zero (`false` for bools).
pub fn zero(data: &mut HostData) {
    air::with_host_data!(data, v => v.fill(Default::default()))
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
    fn huge_pages_cover_only_whole_aligned_pages_inside_the_range() {
        let at = |p: usize| p as *const u8;
        assert_eq!(huge_interior(at(HUGE_PAGE), 2 * HUGE_PAGE), Some((HUGE_PAGE, 2 * HUGE_PAGE)));
        assert_eq!(huge_interior(at(HUGE_PAGE + 16), 3 * HUGE_PAGE), Some((2 * HUGE_PAGE, 2 * HUGE_PAGE)));
        assert_eq!(huge_interior(at(HUGE_PAGE + 16), 2 * HUGE_PAGE), Some((2 * HUGE_PAGE, HUGE_PAGE)));
        assert_eq!(huge_interior(at(HUGE_PAGE + 16), HUGE_PAGE), None);
        assert_eq!(huge_interior(at(usize::MAX - 8), 4), None);
    }

    #[test]
    fn big_inputs_bound_twice_are_collapsed_and_keep_their_values() {
        let n = HUGE_PAGE_MIN_BYTES / 4 + 1000;
        let data = HostData::F32((0..n).map(|i| i as f32).collect());
        note_input(&data);
        note_input(&data);
        note_input(&data);
        let HostData::F32(v) = &data else { unreachable!() };
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as f32));
        let fresh = zeroed_host_data(DType::F32, n).unwrap();
        assert!(matches!(&fresh, HostData::F32(v) if v.len() == n && v.iter().all(|&x| x == 0.0)));
    }

    #[test]
    fn arena_is_aligned_and_grows_only_when_needed() {
        let mut arena = Arena::default();
        arena.ensure(100).unwrap();
        let p = arena.base();
        assert_eq!(p as usize % ARENA_ALIGN, 0);
        // (Another test's dropped arena of up to twice the size may be taken.)
        assert!((128..=256).contains(&arena.capacity_bytes()));
        arena.ensure(64).unwrap();
        assert_eq!(arena.base(), p);
        arena.ensure(1000).unwrap();
        assert_eq!(arena.base() as usize % ARENA_ALIGN, 0);
        assert!(arena.capacity_bytes() >= 1000);
    }

    #[test]
    fn an_arena_made_from_a_dropped_one_starts_zeroed() {
        let bytes = 3 << 20;
        for _ in 0..3 {
            let mut arena = Arena::default();
            arena.ensure(bytes).unwrap();
            let base = arena.base();
            // SAFETY: the arena holds at least `bytes` bytes.
            let view = unsafe { std::slice::from_raw_parts_mut(base, bytes) };
            assert!(view.iter().all(|&b| b == 0));
            view.fill(0xab);
        }
    }

    #[test]
    fn spare_arenas_keep_the_largest_within_their_limits_and_give_the_smallest_that_fits() {
        let lines = |n: usize| vec![Line([0; ARENA_ALIGN]); n];
        let mut spares = SpareArenas { arenas: Vec::new() };
        for n in [10, 40, 20, 30, 50] {
            spares.keep(lines(n));
        }
        // At most SPARE_ARENAS_MAX, the smallest dropped.
        let mut kept: Vec<usize> = spares.arenas.iter().map(Vec::len).collect();
        kept.sort_unstable();
        assert_eq!(kept, [20, 30, 40, 50]);
        // The smallest of `lines..=2 * lines`, or none.
        assert_eq!(spares.take(25).map(|a| a.len()), Some(30));
        assert_eq!(spares.take(10).map(|a| a.len()), Some(20));
        assert_eq!(spares.take(10).map(|a| a.len()), None);
        assert_eq!(spares.take(60).map(|a| a.len()), None);
        // Nothing over the byte limit is kept, and the total stays within it.
        let big = SPARE_ARENA_BYTES_MAX / ARENA_ALIGN;
        spares.keep(lines(big + 1));
        assert!(spares.arenas.iter().all(|a| a.len() <= big));
        spares.keep(lines(big));
        spares.keep(lines(big / 2));
        let total: usize = spares.arenas.iter().map(|a| a.len() * ARENA_ALIGN).sum();
        assert!(total <= SPARE_ARENA_BYTES_MAX);
        assert_eq!(spares.arenas[0].len(), big);
    }

    #[test]
    fn unwritten_outputs_take_their_length_when_marked() {
        for dtype in DType::ALL {
            let mut d = unwritten_host_data(dtype, 1000).unwrap();
            let ptr = data_ptr_mut(&mut d);
            // SAFETY: the array has room for 1000 elements of `dtype`; zero bytes are valid.
            unsafe {
                std::ptr::write_bytes(ptr, 0, 1000 * dtype.size_bytes());
                mark_written(&mut d, 1000);
            }
            assert_eq!(d.len(), 1000);
            assert_eq!(data_ptr(&d), ptr);
            assert!(d.to_f64_vec().iter().all(|&x| x == 0.0));
        }
        assert!(matches!(unwritten_host_data(DType::F64, usize::MAX / 4), Err(RuntimeError::Alloc { .. })));
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
