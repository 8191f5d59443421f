//! The system calls pool-core makes, and the only `unsafe` in it.
//!
//! Each function is a thin wrapper over one call. Plugins use them too, so the
//! raw-pointer handling lives in one audited place.

use std::io;
use std::ptr::{self, NonNull};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use rustix::mm::{Advice, MapFlags, ProtFlags};

pub mod numa;

/// The base page size of this machine (4 KiB on x86-64).
pub fn base_page_size() -> usize {
    rustix::param::page_size()
}

/// What kind of anonymous mapping to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnonMapOptions {
    /// `MAP_SHARED` (shared with children after `fork`) instead of `MAP_PRIVATE`.
    pub shared: bool,
    /// Align the start address to this many bytes (a power of two, at least
    /// the base page), e.g. 2 MiB so transparent huge pages can back all of it.
    pub align: usize,
}

/// Map `len` bytes of anonymous read-write memory (`mmap(MAP_ANONYMOUS)`),
/// aligned to `opts.align`.
///
/// # Errors
/// The `mmap` errno, e.g. `ENOMEM` when the kernel refuses the size.
pub fn map_anonymous(len: usize, opts: AnonMapOptions) -> io::Result<NonNull<u8>> {
    let page = base_page_size();
    let align = opts.align.max(page);
    if len == 0 || !align.is_power_of_two() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let extra = align - page;
    let total = len
        .checked_add(extra)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    let flags = if opts.shared {
        MapFlags::SHARED
    } else {
        MapFlags::PRIVATE
    };
    // SAFETY: a fresh anonymous mapping at an address the kernel picks
    // (null hint, no MAP_FIXED) cannot alias any existing Rust object.
    let base = unsafe {
        rustix::mm::mmap_anonymous(
            ptr::null_mut(),
            total,
            ProtFlags::READ | ProtFlags::WRITE,
            flags,
        )
    }?
    .cast::<u8>();
    let addr = base as usize;
    let aligned = addr.next_multiple_of(align);
    let head = aligned - addr;
    let tail = extra - head;
    if head > 0 {
        // SAFETY: [base, base+head) is the unused front of the mapping we just
        // made; nothing refers to it.
        unsafe { unmap(base, head) }?;
    }
    if tail > 0 {
        // SAFETY: [aligned+len, aligned+len+tail) is the unused back of the
        // same fresh mapping.
        unsafe { unmap(base.add(head + len), tail) }?;
    }
    NonNull::new(aligned as *mut u8).ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
}

/// Unmap `[addr, addr + len)` (`munmap`).
///
/// # Safety
/// The range must be a mapping (or part of one) owned by the caller, with no
/// live references into it and no further use of it afterwards.
pub unsafe fn unmap(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the range and will not use it again.
    unsafe { rustix::mm::munmap(addr.cast(), len) }.map_err(io::Error::from)
}

/// `madvise(MADV_POPULATE_WRITE)` (Linux 5.14): fault every page of the range
/// in for writing, as the kernel's own path, without touching the data.
///
/// # Safety
/// `[addr, addr + len)` must be a mapping the caller owns, page-aligned at
/// `addr`. The call does not change the contents of already-present pages.
pub unsafe fn populate_write(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: the caller guarantees the range is mapped and owned;
    // MADV_POPULATE_WRITE only faults pages in and never changes their data.
    unsafe { rustix::mm::madvise(addr.cast(), len, Advice::LinuxPopulateWrite) }
        .map_err(io::Error::from)
}

/// `madvise(MADV_HUGEPAGE)`: ask for transparent huge pages.
///
/// # Safety
/// `[addr, addr + len)` must be a mapping the caller owns, page-aligned at `addr`.
pub unsafe fn advise_hugepage(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: the caller guarantees the range is mapped and owned; the advice
    // only changes how future faults are served.
    unsafe { rustix::mm::madvise(addr.cast(), len, Advice::LinuxHugepage) }.map_err(io::Error::from)
}

/// Fault the pages of a range in for writing by touching one byte per page
/// with an atomic compare-and-exchange of the byte with itself. Used only when
/// the kernel lacks `MADV_POPULATE_WRITE`. Unlike a plain write, it never
/// clobbers a byte that a peer process writes concurrently, and unlike a plain
/// read it forces a write fault (a read fault would map the shared zero page).
///
/// # Safety
/// `[addr, addr + len)` must be mapped read-write, owned by the caller, and
/// `addr` aligned to `page`; a SIGBUS is possible when the backing runs out of
/// memory, which is why callers check capacity first.
pub unsafe fn touch_pages(addr: *mut u8, len: usize, page: usize) {
    let mut offset = 0;
    while offset < len {
        // SAFETY: offset < len, so the byte is inside the caller's mapping;
        // AtomicU8 has the alignment and size of u8, and every access from
        // this library to pool memory during prefault is atomic or by the
        // kernel, so there is no mixed non-atomic access to the byte.
        let byte = unsafe { AtomicU8::from_ptr(addr.add(offset)) };
        let current = byte.load(Ordering::Relaxed);
        let _ = byte.compare_exchange(current, current, Ordering::Relaxed, Ordering::Relaxed);
        offset += page;
    }
}

/// Whether this kernel supports `MADV_POPULATE_WRITE`, probed once per
/// process on one page of private anonymous memory. `EINVAL` means the advice
/// is unknown (kernels before 5.14).
pub fn populate_write_supported() -> bool {
    static PROBE: OnceLock<bool> = OnceLock::new();
    *PROBE.get_or_init(|| {
        let page = base_page_size();
        let Ok(p) = map_anonymous(
            page,
            AnonMapOptions {
                shared: false,
                align: page,
            },
        ) else {
            return false;
        };
        // SAFETY: p is the one-page mapping made just above.
        let supported = unsafe { populate_write(p.as_ptr(), page) }.is_ok();
        // SAFETY: same mapping, no references into it remain.
        if let Err(e) = unsafe { unmap(p.as_ptr(), page) } {
            tracing::warn!("munmap of the populate probe page failed: {e}");
        }
        supported
    })
}

/// How many base pages of `[addr, addr + len)` are resident (`mincore`).
///
/// # Safety
/// `[addr, addr + len)` must be mapped and `addr` base-page-aligned.
pub unsafe fn resident_base_pages(addr: *mut u8, len: usize) -> io::Result<u64> {
    let page = base_page_size();
    let pages = len.div_ceil(page);
    let mut total = 0u64;
    // Query in bounded batches so the vector stays small on huge pools.
    const BATCH: usize = 1 << 20;
    let mut vec = vec![0u8; pages.min(BATCH)];
    let mut done = 0usize;
    while done < pages {
        let n = (pages - done).min(BATCH);
        // SAFETY: the caller guarantees the range is mapped; `vec` has room
        // for `n` entries, one per base page of the sub-range queried.
        let rc = unsafe { libc::mincore(addr.add(done * page).cast(), n * page, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        total += vec[..n].iter().filter(|b| **b & 1 == 1).count() as u64;
        done += n;
    }
    Ok(total)
}

/// Copy `len` bytes of `pattern`-derived data into the range and read it
/// back: the data-path check of the conformance suite.
///
/// # Safety
/// `[addr, addr + len)` must be mapped read-write and owned by the caller, and
/// nothing else may access it during the call.
pub unsafe fn write_pattern(addr: *mut u8, len: usize, stride: usize, seed: u8) {
    let mut off = 0;
    while off < len {
        // SAFETY: off < len inside the caller's exclusive mapping.
        unsafe { ptr::write_volatile(addr.add(off), pattern_byte(off, seed)) };
        off += stride;
    }
    if len > 0 {
        // SAFETY: len - 1 < len, inside the mapping.
        unsafe { ptr::write_volatile(addr.add(len - 1), pattern_byte(len - 1, seed)) };
    }
}

/// Check what [`write_pattern`] wrote; returns the first offset that differs.
///
/// # Safety
/// As for [`write_pattern`].
pub unsafe fn check_pattern(addr: *const u8, len: usize, stride: usize, seed: u8) -> Option<usize> {
    let mut off = 0;
    let check = |off: usize| {
        // SAFETY: off < len inside the caller's mapping.
        let v = unsafe { ptr::read_volatile(addr.add(off)) };
        v == pattern_byte(off, seed)
    };
    while off < len {
        if !check(off) {
            return Some(off);
        }
        off += stride;
    }
    if len > 0 && !check(len - 1) {
        return Some(len - 1);
    }
    None
}

fn pattern_byte(off: usize, seed: u8) -> u8 {
    let x = (off as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56;
    (x as u8) ^ seed
}

/// Fill the range with `byte` (`memset`), for benchmarks and tests.
///
/// # Safety
/// `[addr, addr + len)` must be mapped read-write and exclusively the caller's.
pub unsafe fn fill(addr: *mut u8, len: usize, byte: u8) {
    // SAFETY: the caller guarantees exclusive access to the whole range.
    unsafe { ptr::write_bytes(addr, byte, len) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_anonymous_mapping_is_aligned_and_unmaps() {
        let align = 2 << 20;
        let len = 3 << 20;
        let p = map_anonymous(
            len,
            AnonMapOptions {
                shared: false,
                align,
            },
        )
        .unwrap();
        assert_eq!(
            p.as_ptr() as usize % align,
            0,
            "start must be aligned to {align}"
        );
        // SAFETY: fresh private mapping of len bytes, owned here.
        unsafe {
            assert_eq!(resident_base_pages(p.as_ptr(), len).unwrap(), 0);
            populate_write(p.as_ptr(), len).unwrap();
            assert_eq!(
                resident_base_pages(p.as_ptr(), len).unwrap(),
                (len / base_page_size()) as u64
            );
            write_pattern(p.as_ptr(), len, 4096, 7);
            assert_eq!(check_pattern(p.as_ptr(), len, 4096, 7), None);
            assert_eq!(check_pattern(p.as_ptr(), len, 4096, 8), Some(0));
            unmap(p.as_ptr(), len).unwrap();
        }
    }

    #[test]
    fn touch_faults_every_page_without_changing_data() {
        let page = base_page_size();
        let len = 64 * page;
        let p = map_anonymous(
            len,
            AnonMapOptions {
                shared: true,
                align: page,
            },
        )
        .unwrap();
        // SAFETY: fresh mapping owned here.
        unsafe {
            *p.as_ptr().add(page) = 42;
            touch_pages(p.as_ptr(), len, page);
            assert_eq!(resident_base_pages(p.as_ptr(), len).unwrap(), 64);
            assert_eq!(*p.as_ptr().add(page), 42, "touch must not change data");
            unmap(p.as_ptr(), len).unwrap();
        }
    }

    #[test]
    fn zero_length_and_bad_alignment_are_einval() {
        let e = map_anonymous(
            0,
            AnonMapOptions {
                shared: false,
                align: 4096,
            },
        )
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        let e = map_anonymous(
            4096,
            AnonMapOptions {
                shared: false,
                align: 3 << 12,
            },
        )
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn this_kernel_has_populate_write() {
        // The project targets Linux >= 5.14; CI runs 6.x. If this fails the
        // kernel is older and the touch fallback is what runs.
        assert!(
            populate_write_supported(),
            "kernel lacks MADV_POPULATE_WRITE"
        );
    }
}
