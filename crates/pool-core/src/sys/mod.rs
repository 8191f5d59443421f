//! The only `unsafe` in pool-core: the calls that touch memory by address,
//! and the owners that make them safe to use.
//!
//! Private to the crate: plugins and embedders reach it through its safe
//! face, re-exported at the crate root ([`Region`], [`Mmap`],
//! [`Reservation`], ...): memory reached through them is alive for as long
//! as they are borrowed. The raw mapping calls are `unsafe fn`s whose
//! callers hand the new mapping to its owner at once, and the background
//! pin's thread runs on an [`Owner`], which joins it before the mapping
//! goes. Calls that need no `unsafe` (`statfs`, `flock`, sockets) live with
//! the code that makes them.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::{self, NonNull};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use rustix::mm::{Advice, MapFlags, ProtFlags};

pub mod numa;
mod region;
mod worker;

pub use region::{FixedMapError, Mmap, Placeholder, Region, Reservation, Span};
pub(crate) use worker::{Holds, Owner};

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
///
/// # Safety
/// The caller owns the returned mapping: it must unmap it exactly once (at
/// once wrapped in an owner, [`Mmap`]) and hand out no reference that
/// outlives that.
pub(crate) unsafe fn map_anonymous(len: usize, opts: AnonMapOptions) -> io::Result<NonNull<u8>> {
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

/// Replace `[addr, addr + len)` with fresh private zero pages that reserve
/// the range (`mmap(MAP_FIXED | MAP_ANONYMOUS | MAP_NORESERVE)`), releasing
/// what was mapped there as `munmap` would; `PROT_NONE` where the kernel
/// refuses read-write (strict overcommit). Whether the pages are readable.
///
/// # Safety
/// As for [`unmap`]: the range is the caller's, and what was mapped there is
/// never used again through the caller's own references.
pub unsafe fn replace_with_placeholder(addr: *mut u8, len: usize) -> io::Result<bool> {
    let flags = MapFlags::PRIVATE | MapFlags::FIXED | MapFlags::NORESERVE;
    for prot in [ProtFlags::READ | ProtFlags::WRITE, ProtFlags::empty()] {
        // SAFETY: MAP_FIXED replaces only the caller's own range.
        match unsafe { rustix::mm::mmap_anonymous(addr.cast(), len, prot, flags) } {
            Ok(_) => return Ok(!prot.is_empty()),
            Err(e) if prot.is_empty() => return Err(e.into()),
            Err(_) => {}
        }
    }
    Err(io::Error::from_raw_os_error(libc::ENOMEM))
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

/// `madvise(MADV_POPULATE_READ)` (Linux 5.14): map pages that already exist
/// into this process's page tables without dirtying them: the fastest way
/// for a rank to attach to the shards its peers faulted (measured in
/// `benches/backings.rs`, on par with `MAP_POPULATE` without a remap).
///
/// # Safety
/// As for [`populate_write`].
pub unsafe fn populate_read(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: the caller guarantees the range is mapped and owned;
    // MADV_POPULATE_READ only maps pages in.
    unsafe { rustix::mm::madvise(addr.cast(), len, Advice::LinuxPopulateRead) }
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
/// with an atomic compare-and-exchange of 0 with 0, and no load before it.
/// Used only when the kernel lacks `MADV_POPULATE_WRITE`.
///
/// - One fault per page: a load first would map the shared zero page and
///   the write would then fault again to copy it (`hostpool bench` measured
///   twice the faults and a third of the speed on private memory).
/// - It never changes data: a zero byte is written as zero, and a non-zero
///   byte fails the compare and stays (on x86 a failed `lock cmpxchg` still
///   writes back the old value, so it still takes a write fault; elsewhere a
///   non-zero byte means the page already holds data).
/// - Unlike a plain read-modify-write it cannot clobber a byte a peer
///   process writes concurrently.
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
        let _ = byte.compare_exchange(0, 0, Ordering::Relaxed, Ordering::Relaxed);
        offset += page;
    }
}

/// Whether this kernel supports `MADV_POPULATE_WRITE`, probed once per
/// process on one page of private anonymous memory.
///
/// # Errors
/// Only `EINVAL` means "unsupported" (kernels before 5.14 do not know the
/// advice): any other errno (`EIO`, `ENOMEM`, a failed `mmap` of the probe
/// page) is returned as it is, never taken for a missing feature.
pub fn populate_write_probe() -> io::Result<bool> {
    static PROBE: OnceLock<Result<bool, i32>> = OnceLock::new();
    let cached = PROBE.get_or_init(|| {
        let errno = |e: io::Error| e.raw_os_error().unwrap_or(libc::EIO);
        if let Some(e) = crate::failpoint::check("populate-write-probe") {
            return Err(errno(e));
        }
        let page = base_page_size();
        // SAFETY: owned here and unmapped below.
        let p = unsafe {
            map_anonymous(
                page,
                AnonMapOptions {
                    shared: false,
                    align: page,
                },
            )
        }
        .map_err(errno)?;
        // SAFETY: p is the one-page mapping made just above.
        let outcome = unsafe { populate_write(p.as_ptr(), page) };
        // SAFETY: same mapping, no references into it remain.
        if let Err(e) = unsafe { unmap(p.as_ptr(), page) } {
            tracing::warn!("munmap of the populate probe page failed: {e}");
        }
        match outcome {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
            Err(e) => Err(errno(e)),
        }
    });
    cached.map_err(io::Error::from_raw_os_error)
}

/// Whether `populate_write_probe` found the call supported (an error
/// counts as no), for reports that only show the fact.
pub fn populate_write_supported() -> bool {
    matches!(populate_write_probe(), Ok(true))
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

pub(crate) fn pattern_byte(off: usize, seed: u8) -> u8 {
    let x = (off as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56;
    (x as u8) ^ seed
}

/// Fork a child that writes `value` at `offset` of `region` and exits, and
/// wait for it: the check that a shared backing's memory really is shared
/// with a child (a private one keeps the parent's byte).
///
/// # Errors
/// The `fork` or `waitpid` errno; `ERANGE` when the offset is outside the
/// region; `ECHILD` when the child did not exit 0.
#[cfg(feature = "conformance")]
pub fn child_writes_byte(region: &Region<'_>, offset: u64, value: u8) -> io::Result<()> {
    if region.read_byte(offset).is_none() {
        return Err(io::Error::from_raw_os_error(libc::ERANGE));
    }
    // SAFETY: the child only does a relaxed atomic store into memory the
    // region keeps mapped (inherited by fork) and calls _exit, which is
    // async-signal-safe; it touches no lock, allocator or stdio.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        region.write_byte(offset, value);
        // SAFETY: _exit ends the child at once without running the parent's
        // atexit handlers or destructors.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waitpid writes the status of our own child into `status`.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        return Err(io::Error::last_os_error());
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::ECHILD))
    }
}

/// Reserve `len` bytes of address space, inaccessible (`PROT_NONE`,
/// `MAP_NORESERVE`), with the start aligned to `align`: the frame that
/// [`map_file_fixed`] maps segment files into.
///
/// # Errors
/// The `mmap` errno.
///
/// # Safety
/// As for [`map_anonymous`]: the caller owns the reservation and unmaps it
/// exactly once (its owner is [`Reservation`]).
pub(crate) unsafe fn reserve(len: usize, align: usize) -> io::Result<NonNull<u8>> {
    let page = base_page_size();
    let align = align.max(page);
    if len == 0 || !align.is_power_of_two() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let total = len
        .checked_add(align - page)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    // SAFETY: a fresh inaccessible anonymous mapping at a kernel-chosen address
    // aliases nothing.
    let base = unsafe {
        rustix::mm::mmap_anonymous(
            ptr::null_mut(),
            total,
            ProtFlags::empty(),
            MapFlags::PRIVATE | MapFlags::NORESERVE,
        )
    }?
    .cast::<u8>();
    let addr = base as usize;
    let aligned = addr.next_multiple_of(align);
    let head = aligned - addr;
    let tail = total - head - len;
    if head > 0 {
        // SAFETY: the unused front of the reservation made above.
        unsafe { unmap(base, head) }?;
    }
    if tail > 0 {
        // SAFETY: the unused back of the same reservation.
        unsafe { unmap(base.add(head + len), tail) }?;
    }
    NonNull::new(aligned as *mut u8).ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
}

/// Map `len` bytes of `fd` from `offset` read-write, `MAP_SHARED | MAP_FIXED`,
/// at `addr`, replacing what is there (a reservation from [`reserve`]).
///
/// On hugetlbfs this reserves the huge pages: too few give `ENOMEM` here
/// rather than SIGBUS later, because `MAP_NORESERVE` is not used.
///
/// # Safety
/// `[addr, addr + len)` must lie inside a reservation the caller owns, with
/// no live references into it; `addr` and `len` aligned to the file's page size.
pub unsafe fn map_file_fixed(
    addr: *mut u8,
    len: usize,
    fd: BorrowedFd<'_>,
    offset: u64,
) -> io::Result<()> {
    // SAFETY: the caller owns the reserved range, so replacing it with
    // MAP_FIXED cannot clobber anything else.
    let got = unsafe {
        rustix::mm::mmap(
            addr.cast(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED | MapFlags::FIXED,
            fd,
            offset,
        )
    }?;
    if got.cast::<u8>() != addr {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    Ok(())
}

/// Map a whole shared file at `addr` `len` bytes read-write (`MAP_SHARED`,
/// kernel-chosen address) — used for the small control file of shared pools.
///
/// # Errors
/// The `mmap` errno.
///
/// # Safety
/// As for [`map_anonymous`]: the caller owns the mapping and unmaps it
/// exactly once (its owner is [`SharedView`]).
pub(crate) unsafe fn map_file(len: usize, fd: BorrowedFd<'_>) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh shared mapping at a kernel-chosen address aliases no
    // Rust object; the caller owns it and unmaps it.
    let p = unsafe {
        rustix::mm::mmap(
            ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        )
    }?;
    NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
}

/// Types that may be viewed in shared memory written by other processes.
///
/// # Safety
/// Every bit pattern (all-zero included) must be a valid value, all mutation
/// must go through atomics, and the type must have no `Drop` glue: other
/// processes read and write it concurrently without Rust's knowledge.
pub unsafe trait AtomicsOnly: Sync {}

/// A file mapped `MAP_SHARED` and viewed as one `T`: the control block of a
/// shared pool that every rank maps.
#[derive(Debug)]
pub struct SharedView<T: AtomicsOnly> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: T is Sync and only mutated through atomics (AtomicsOnly); the view
// owns its mapping and unmaps it once, in Drop.
unsafe impl<T: AtomicsOnly> Send for SharedView<T> {}
// SAFETY: as for Send; `&SharedView` gives out only `&T`.
unsafe impl<T: AtomicsOnly> Sync for SharedView<T> {}

impl<T: AtomicsOnly> SharedView<T> {
    /// The mapped length for `T`: its size rounded up to the base page.
    pub fn len_for() -> usize {
        std::mem::size_of::<T>().next_multiple_of(base_page_size())
    }

    /// Map `fd`, which must already be at least [`Self::len_for`] bytes long.
    ///
    /// # Errors
    /// `EINVAL` when the file is too short; the `mmap` errno otherwise.
    pub fn map(fd: BorrowedFd<'_>) -> io::Result<Self> {
        let len = Self::len_for();
        let size = rustix::fs::fstat(fd)?.st_size;
        if u64::try_from(size).unwrap_or(0) < len as u64 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: the mapping goes into the view, which unmaps it once on
        // drop, or is unmapped here at once.
        let p = unsafe { map_file(len, fd) }?;
        if !(p.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
            // SAFETY: the mapping made just above, never handed out.
            let _ = unsafe { unmap(p.as_ptr(), len) };
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        Ok(SharedView { ptr: p.cast(), len })
    }

    /// The shared value.
    pub fn get(&self) -> &T {
        // SAFETY: the mapping is at least size_of::<T>() long and aligned
        // (checked in `map`), lives until Drop, and T is valid for any bytes
        // and mutated only through atomics (AtomicsOnly).
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: AtomicsOnly> Drop for SharedView<T> {
    fn drop(&mut self) {
        // SAFETY: our own mapping; `get` borrows end with `self`.
        if let Err(e) = unsafe { unmap(self.ptr.as_ptr().cast(), self.len) } {
            tracing::warn!(
                "munmap of a shared control block at {:p} failed: {e}",
                self.ptr
            );
        }
    }
}

/// Take a non-blocking open-file-description write lock on one byte
/// (`fcntl(F_OFD_SETLK)`). The lock lives as long as the open file
/// description, and the kernel drops it when the process dies, however it
/// dies: the liveness signal of shared-pool ranks.
///
/// # Errors
/// `EAGAIN`/`EACCES` when another description holds it; other errnos as returned.
pub fn ofd_lock_byte(fd: BorrowedFd<'_>, byte: i64) -> io::Result<()> {
    let mut fl = flock_for(byte, libc::F_WRLCK);
    // SAFETY: F_OFD_SETLK reads the fully initialised `flock` struct.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether some other open file description holds a lock on the byte
/// (`fcntl(F_OFD_GETLK)`); our own locks do not count.
///
/// # Errors
/// The `fcntl` errno.
pub fn ofd_byte_locked(fd: BorrowedFd<'_>, byte: i64) -> io::Result<bool> {
    let mut fl = flock_for(byte, libc::F_WRLCK);
    // SAFETY: F_OFD_GETLK reads and writes back the `flock` struct we own.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

fn flock_for(byte: i64, kind: libc::c_int) -> libc::flock {
    // SAFETY: `flock` is a plain C struct for which all-zero is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte;
    fl.l_len = 1;
    fl
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped_at(addr: usize) -> bool {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .any(|l| {
                let range = l.split_whitespace().next().unwrap();
                let (a, b) = range.split_once('-').unwrap();
                let (a, b) = (
                    usize::from_str_radix(a, 16).unwrap(),
                    usize::from_str_radix(b, 16).unwrap(),
                );
                (a..b).contains(&addr)
            })
    }

    #[test]
    fn a_placeholder_keeps_a_released_pools_range_until_dropped() {
        use crate::layout::PageSize;
        let size = crate::layout::round_to_page(8 << 20, PageSize::BASE_4K).unwrap();
        let opts = AnonMapOptions {
            shared: false,
            align: 4096,
        };
        let mmap = Mmap::anonymous(size, opts).unwrap();
        mmap.region().write_pattern(4096, 7);
        let addr = mmap.region().addr() as usize;
        let kept = mmap.unmap_keeping_range().unwrap();
        assert_eq!((kept.addr(), kept.len()), (addr, 8 << 20));
        assert!(mapped_at(addr), "the range stays reserved");
        // SAFETY: the placeholder's private zero pages, mapped read-write
        // and owned by `kept`: the pool's data is gone.
        let first = unsafe { std::ptr::read_volatile(addr as *const u8) };
        assert_eq!(first, 0);
        drop(kept);
        assert!(!mapped_at(addr), "dropping the placeholder unmaps it");
        // Unmapped otherwise, as always.
        let mmap = Mmap::anonymous(size, opts).unwrap();
        let addr = mmap.region().addr() as usize;
        mmap.unmap().unwrap();
        assert!(!mapped_at(addr));
    }

    #[test]
    fn aligned_anonymous_mapping_is_aligned_and_unmaps() {
        let align = 2 << 20;
        let len = 3 << 20;
        // SAFETY: owned here and unmapped below.
        let p = unsafe {
            map_anonymous(
                len,
                AnonMapOptions {
                    shared: false,
                    align,
                },
            )
        }
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
            unmap(p.as_ptr(), len).unwrap();
        }
    }

    #[test]
    fn touch_faults_every_page_without_changing_data() {
        let page = base_page_size();
        let len = 64 * page;
        // SAFETY: owned here and unmapped below.
        let p = unsafe {
            map_anonymous(
                len,
                AnonMapOptions {
                    shared: true,
                    align: page,
                },
            )
        }
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
        // SAFETY: both calls fail before they map anything.
        let e = unsafe {
            map_anonymous(
                0,
                AnonMapOptions {
                    shared: false,
                    align: 4096,
                },
            )
        }
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        // SAFETY: as above.
        let e = unsafe {
            map_anonymous(
                4096,
                AnonMapOptions {
                    shared: false,
                    align: 3 << 12,
                },
            )
        }
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn reservation_is_aligned_and_file_maps_into_it() {
        let fd =
            rustix::fs::memfd_create("hostpool-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 2 << 20).unwrap();
        // SAFETY: unmapped below.
        let r = unsafe { reserve(4 << 20, 2 << 20) }.unwrap();
        assert_eq!(r.as_ptr() as usize % (2 << 20), 0);
        // SAFETY: the second half of our own reservation.
        unsafe {
            map_file_fixed(
                r.as_ptr().add(2 << 20),
                2 << 20,
                rustix::fd::AsFd::as_fd(&fd),
                0,
            )
            .unwrap();
            r.as_ptr().add((2 << 20) + 5).write_volatile(9);
            unmap(r.as_ptr(), 4 << 20).unwrap();
        }
        let mut b = [0u8; 1];
        rustix::io::pread(&fd, &mut b, 5).unwrap();
        assert_eq!(b[0], 9, "the write landed in the file");
    }

    #[test]
    fn ofd_locks_are_seen_by_other_descriptions_only() {
        use rustix::fd::AsFd;
        let path = std::env::temp_dir().join(format!("hostpool-ofd-test-{}", std::process::id()));
        let a = std::fs::File::create(&path).unwrap();
        let b = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(!ofd_byte_locked(b.as_fd(), 7).unwrap());
        ofd_lock_byte(a.as_fd(), 7).unwrap();
        assert!(
            ofd_byte_locked(b.as_fd(), 7).unwrap(),
            "b must see a's lock"
        );
        assert!(
            !ofd_byte_locked(a.as_fd(), 7).unwrap(),
            "a's own lock does not conflict"
        );
        assert!(!ofd_byte_locked(b.as_fd(), 8).unwrap());
        let e = ofd_lock_byte(b.as_fd(), 7).unwrap_err();
        assert!(
            matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)),
            "{e}"
        );
        drop(a);
        assert!(
            !ofd_byte_locked(b.as_fd(), 7).unwrap(),
            "closing releases the lock"
        );
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
