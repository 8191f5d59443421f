//! The only `unsafe` code of this crate: the C reference's functions
//! (`benches/c/raw_populate.c`, compiled by `build.rs`; re-exported by
//! [`crate::reference`]), the fill of a pool (`FreshPool::memset`), and the one `mmap`
//! (with its `munmap`) that [`crate::benchkit::map_populate_once`] times.

#![allow(unsafe_code)]

use std::ffi::c_int;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use pool_core::Region;
use pool_core::{PageSize, round_to_page};

unsafe extern "C" {
    fn hostpool_raw_populate(addr: *mut u8, len: usize, threads: c_int) -> c_int;
    fn hostpool_raw_memset(addr: *mut u8, len: usize, threads: c_int) -> c_int;
}

/// The region's length and the thread count as the C functions take them.
fn c_args(region: &Region<'_>, threads: usize) -> io::Result<(usize, c_int)> {
    let len = usize::try_from(region.mapped_len())
        .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
    // The C side clamps to 1024 threads and rejects 0 with EINVAL.
    let threads = c_int::try_from(threads).unwrap_or(c_int::MAX);
    Ok((len, threads))
}

fn check(rc: c_int) -> io::Result<()> {
    match rc {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// Fault every page of `region` in with `madvise(MADV_POPULATE_WRITE)`, one
/// call per thread over `threads` even page-aligned slices. Data already
/// present is left unchanged.
///
/// # Errors
/// The first errno of a slice (`EFAULT` when the backing cannot supply a page,
/// `ENOMEM`, `EINVAL` for `threads == 0` or a kernel without the advice), or
/// of `pthread_create`.
pub fn raw_populate(region: &Region<'_>, threads: usize) -> io::Result<()> {
    let (len, threads) = c_args(region, threads)?;
    // SAFETY: a Region keeps its owner borrowed, which makes `[addr, addr + len)` a read-write
    // mapping, page-aligned at `addr`, that stays mapped while the region is
    // used, which covers this call. MADV_POPULATE_WRITE only faults pages in
    // and never changes their contents, so no Rust reference into the memory
    // can observe a write.
    check(unsafe { hostpool_raw_populate(region.addr(), len, threads) })
}

/// Write `1` to every byte of `region` with `memset`, one call per thread over
/// `threads` even page-aligned slices: the memory-bandwidth limit.
///
/// This overwrites the region's contents; it is meant for benchmark buffers.
///
/// # Safety
/// Nothing else may read or write the region during the call: it writes
/// every byte without synchronisation.
///
/// # Errors
/// `EINVAL` for `threads == 0`, or the errno of `pthread_create`.
pub unsafe fn raw_memset(region: &Region<'_>, threads: usize) -> io::Result<()> {
    let (len, threads) = c_args(region, threads)?;
    // SAFETY: a Region keeps its owner borrowed, which makes the whole range mapped read-write
    // for as long as the region is used, and the caller guarantees exclusive
    // access for the duration of the call; plain bytes have no invalid values.
    check(unsafe { hostpool_raw_memset(region.addr(), len, threads) })
}

/// Write `1` to every byte of `pool` with [`raw_memset`] on `threads`
/// threads. Safe: every `Region` borrows its pool, so `&mut` means none
/// exists meanwhile.
///
/// # Errors
/// As for [`raw_memset`]; `EINVAL` for a pool torn down.
pub(crate) fn memset_pool(pool: &mut pool_core::Pool, threads: usize) -> io::Result<()> {
    let region = pool
        .region()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: the exclusive borrow of the pool rules out any other Region of
    // it, so nothing else in this process reads or writes its memory during
    // the call.
    unsafe { raw_memset(&region, threads) }
}

/// Write `1` to every byte of `mmap` with [`raw_memset`] on `threads`
/// threads. Safe: `&mut` means no Region of the mapping exists meanwhile.
///
/// # Errors
/// As for [`raw_memset`].
pub fn memset_mmap(mmap: &mut pool_core::Mmap, threads: usize) -> io::Result<()> {
    // SAFETY: the exclusive borrow of the owner rules out any other access
    // from this process during the call.
    unsafe { raw_memset(&mmap.region(), threads) }
}

/// `mmap(MAP_POPULATE)` of `len` bytes with memmap2: private anonymous
/// memory without `fd`, else `MAP_SHARED` of the file from offset 0 (the
/// caller sized it to `len`). Unmapped when dropped.
///
/// # Errors
/// The `mmap` errno.
pub(crate) fn map_populated(
    len: usize,
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<memmap2::MmapMut> {
    let mut options = memmap2::MmapOptions::new();
    options.len(len).populate();
    match fd {
        None => options.map_anon(),
        // SAFETY: memmap2's map_mut is unsafe because another process could
        // truncate or change the file under the mapping. The file is this
        // process's own O_TMPFILE or memfd, which no other process opens,
        // sized to `len` by the caller, and borrowed for the whole call; the
        // mapping is never read as Rust data, only timed and unmapped.
        Some(fd) => unsafe { options.map_mut(fd.as_raw_fd()) },
    }
}

/// A `MAP_SHARED` read-write mapping of a whole file (memmap2), unmapped on
/// drop: a peer's view of a shared pool file, for the attach benchmarks.
#[derive(Debug)]
pub struct SharedMap {
    map: memmap2::MmapMut,
}

impl SharedMap {
    /// Map `len` bytes of `fd` (`MAP_SHARED`, with `MAP_POPULATE` when
    /// `populate`). The file must be at least `len` bytes long.
    ///
    /// # Panics
    /// When `mmap` fails (a benchmark has nothing to measure then).
    pub fn new(fd: BorrowedFd<'_>, len: usize, populate: bool) -> SharedMap {
        let mut options = memmap2::MmapOptions::new();
        options.len(len);
        if populate {
            options.populate();
        }
        // SAFETY: the file is a bench's own O_TMPFILE or memfd, sized to
        // `len` before, which no other process truncates; the mapping's bytes
        // are only touched through Regions (atomic accesses) and madvise.
        let map = unsafe { options.map_mut(fd.as_raw_fd()) }.expect("mmap of the pool file");
        SharedMap { map }
    }

    /// The start address, as a number.
    pub fn addr(&self) -> usize {
        self.map.as_ptr() as usize
    }

    /// `MADV_POPULATE_WRITE` (`write`) or `MADV_POPULATE_READ` over the
    /// whole mapping.
    ///
    /// # Panics
    /// When `madvise` fails.
    pub fn populate(&self, write: bool) {
        let advice = if write {
            memmap2::Advice::PopulateWrite
        } else {
            memmap2::Advice::PopulateRead
        };
        self.map.advise(advice).expect("madvise(MADV_POPULATE_*)");
    }

    /// The mapping as a region of `page`-sized pages (for the engine).
    ///
    /// # Panics
    /// When the length is not a multiple of `page`.
    pub fn region(&self, page: PageSize) -> Region<'_> {
        let size = round_to_page(self.map.len() as u64, page).expect("a page multiple");
        assert_eq!(size.mapped(), self.map.len() as u64, "a page multiple");
        let base = NonNull::new(self.map.as_ptr().cast_mut()).expect("mmap is never null");
        // SAFETY: the whole of our read-write mapping, a multiple of `page`
        // long; the kernel aligns a hugetlb file mapping to its page size;
        // the region borrows `self`, which unmaps only in drop.
        unsafe { Region::new(base, size) }
    }
}

#[cfg(test)]
mod tests {
    use std::ptr::NonNull;

    use pool_core::{AnonMapOptions, base_page_size};
    use pool_core::{PageSize, round_to_page};

    use super::*;

    /// A private anonymous mapping of `len` bytes, unmapped on drop.
    struct Anon {
        mmap: pool_core::Mmap,
        len: usize,
    }

    impl Anon {
        fn new(len: usize) -> Anon {
            let page = base_page_size();
            let size = round_to_page(len as u64, PageSize::BASE_4K).unwrap();
            let mmap = pool_core::Mmap::anonymous(
                size,
                AnonMapOptions {
                    shared: false,
                    align: page,
                },
            )
            .unwrap();
            Anon { mmap, len }
        }

        fn region(&self) -> Region<'_> {
            self.mmap.region()
        }

        fn resident(&self) -> u64 {
            self.region().resident_pages().unwrap()
        }

        fn pages(&self) -> u64 {
            (self.len / base_page_size()) as u64
        }
    }

    #[test]
    fn raw_populate_makes_every_page_resident_and_keeps_data() {
        // 1000 pages over 3 threads: the slices are uneven by one page.
        for threads in [1, 3] {
            let m = Anon::new(1000 * base_page_size());
            assert!(m.region().write_byte(5000, 42));
            assert_eq!(m.resident(), 1);
            raw_populate(&m.region(), threads).unwrap();
            assert_eq!(m.resident(), m.pages(), "{threads} thread(s)");
            let byte = m.region().read_byte(5000).unwrap();
            assert_eq!(byte, 42, "populate must not change data");
        }
    }

    #[test]
    fn raw_memset_makes_every_page_resident_and_writes_every_byte() {
        let m = Anon::new(257 * base_page_size());
        // SAFETY: the test's own buffer; nothing else touches it.
        unsafe { raw_memset(&m.region(), 4) }.unwrap();
        assert_eq!(m.resident(), m.pages());
        // SAFETY: the whole mapping is ours, initialised and not written
        // while this slice lives.
        let bytes = unsafe { std::slice::from_raw_parts(m.region().addr(), m.len) };
        assert!(bytes.iter().all(|b| *b == 1));
    }

    #[test]
    fn more_threads_than_pages_still_covers_everything() {
        let m = Anon::new(3 * base_page_size());
        raw_populate(&m.region(), 8).unwrap();
        assert_eq!(m.resident(), 3);
    }

    #[test]
    fn zero_threads_is_einval() {
        let m = Anon::new(base_page_size());
        assert_eq!(
            raw_populate(&m.region(), 0).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            // SAFETY: as above.
            unsafe { raw_memset(&m.region(), 0) }
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EINVAL)
        );
        assert_eq!(m.resident(), 0);
    }

    #[test]
    fn raw_populate_past_the_end_of_a_memfd_is_efault() {
        // A shared mapping of 4 MiB over a 1 MiB memfd: the pages past EOF
        // would SIGBUS on access, so MADV_POPULATE_WRITE returns EFAULT.
        // SAFETY: a NUL-terminated name; the fd is ours and closed below.
        let fd =
            unsafe { libc::memfd_create(c"hostpool-reference-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "{}", io::Error::last_os_error());
        // SAFETY: our fd.
        assert_eq!(unsafe { libc::ftruncate(fd, 1 << 20) }, 0);
        let len = 4usize << 20;
        // SAFETY: a fresh shared mapping of our memfd at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "{}", io::Error::last_os_error());
        let base = NonNull::new(p.cast::<u8>()).unwrap();
        // SAFETY: mapped read-write above for `len` bytes, page-aligned; only
        // the populate call (never a direct access) touches it.
        let region =
            unsafe { Region::new(base, round_to_page(len as u64, PageSize::BASE_4K).unwrap()) };
        for threads in [1, 2] {
            let e = raw_populate(&region, threads).unwrap_err();
            assert_eq!(
                e.raw_os_error(),
                Some(libc::EFAULT),
                "{threads} thread(s): {e}"
            );
        }
        // SAFETY: our mapping and fd; nothing refers to them any more.
        unsafe {
            assert_eq!(libc::munmap(base.as_ptr().cast(), len), 0);
            libc::close(fd);
        }
    }
}
