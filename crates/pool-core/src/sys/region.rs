//! [`Region`]: a borrowed view of live pool memory, and [`Mmap`] /
//! [`Reservation`]: the owners of the address ranges pool-core maps.
//!
//! A `Region<'a>` can only be had from something that keeps the memory
//! mapped for `'a` (an [`Mmap`], a [`crate::plugin::Mapping`], a [`crate::Pool`]), so
//! safe code cannot use one after teardown:
//!
//! ```compile_fail,E0505
//! use pool_core::{ByteSize, Pool, PoolConfig, PoolPlan, Quiet};
//!
//! fn stale(plan: &PoolPlan) -> pool_core::Result<()> {
//!     let pool = Pool::build(plan, &Quiet)?;
//!     let region = pool.region().unwrap();
//!     pool.teardown(); // error[E0505]: cannot move out of `pool` because it is borrowed
//!     let _ = region.read_byte(0);
//!     Ok(())
//! }
//! ```
//!
//! Its twin, the same code with the read before the teardown, compiles: so
//! the example above fails for the borrow alone, not for a typo (rustdoc on
//! stable does not check the error code).
//!
//! ```no_run
//! use pool_core::{ByteSize, Pool, PoolConfig, PoolPlan, Quiet};
//!
//! fn fresh(plan: &PoolPlan) -> pool_core::Result<()> {
//!     let pool = Pool::build(plan, &Quiet)?;
//!     let region = pool.region().unwrap();
//!     let _ = region.read_byte(0);
//!     pool.teardown();
//!     Ok(())
//! }
//! ```
//!
//! Every access a `Region` offers to the memory is either the kernel's
//! (`madvise`, `mincore`, `mbind`) or a relaxed atomic byte access, so
//! concurrent use from several threads, or from peer processes sharing the
//! pool, is never a data race. No `&[u8]` into pool memory is ever handed out.

use std::io;
use std::marker::PhantomData;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use crate::layout::{Extent, MappedSize, PageSize};

use super::{AnonMapOptions, base_page_size};

/// A mapped range of pool memory: base address, logical and mapped size, page
/// size, borrowed from the owner that keeps it mapped for `'a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region<'a> {
    base: NonNull<u8>,
    size: MappedSize,
    _owner: PhantomData<&'a ()>,
}

// SAFETY: a Region is an address and a length valid for 'a. Every access it
// offers to the memory is a relaxed atomic or a system call, so using it from
// several threads at once cannot race.
unsafe impl Send for Region<'_> {}
// SAFETY: as for Send.
unsafe impl Sync for Region<'_> {}

/// A plain description of a range: address, length and page size. It gives
/// no access to the memory, so pins and registrations keep one to undo
/// themselves (`munlock`, `cuMemHostUnregister`) without borrowing the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// The first byte's address.
    pub addr: usize,
    /// Bytes.
    pub len: u64,
    /// Page size of the memory.
    pub page: PageSize,
}

impl<'a> Region<'a> {
    /// Describe memory that some owner keeps mapped.
    ///
    /// # Safety
    /// `[base, base + size.mapped())` must be mapped read-write, `base` aligned
    /// to `size.page()`, and stay mapped (not unmapped, not replaced) for all
    /// of `'a`.
    pub unsafe fn new(base: NonNull<u8>, size: MappedSize) -> Region<'a> {
        Region {
            base,
            size,
            _owner: PhantomData,
        }
    }

    /// The base address. Dereferencing it is the caller's business (and
    /// `unsafe`); the methods below are the safe ways to use the memory.
    pub fn addr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The sizes and page size.
    pub fn size(&self) -> MappedSize {
        self.size
    }

    /// The page size.
    pub fn page(&self) -> PageSize {
        self.size.page()
    }

    /// Bytes mapped (a multiple of the page size).
    pub fn mapped_len(&self) -> u64 {
        self.size.mapped()
    }

    /// Bytes the caller asked for.
    pub fn logical_len(&self) -> u64 {
        self.size.logical()
    }

    /// Address, length and page size, with no access to the memory.
    pub fn span(&self) -> Span {
        Span {
            addr: self.base.as_ptr() as usize,
            len: self.mapped_len(),
            page: self.page(),
        }
    }

    /// The part of the region an extent names, or `None` when the extent is
    /// empty, not inside the region, or not aligned to its page size. An
    /// empty extent is never widened to anything.
    pub fn sub(&self, extent: Extent) -> Option<Region<'a>> {
        let page = self.page();
        if extent.len == 0
            || extent.end() > self.mapped_len()
            || !page.is_aligned(extent.offset)
            || !page.is_aligned(extent.len)
        {
            return None;
        }
        let base = NonNull::new(self.at(extent.offset)?)?;
        let size = crate::layout::round_to_page(extent.len, page).ok()?;
        // SAFETY: a page-aligned, non-empty sub-range of a region is mapped
        // read-write for as long as the region is ('a).
        Some(unsafe { Region::new(base, size) })
    }

    /// Whether the region is backed by reserved huge pages (a page larger
    /// than the base page).
    pub fn is_hugetlb(&self) -> bool {
        self.page().get() > base_page_size() as u64
    }

    /// The address of an offset inside the region (its end included), or
    /// `None` past its end.
    pub fn at(&self, offset: u64) -> Option<*mut u8> {
        if offset > self.size.mapped() {
            return None;
        }
        let offset = usize::try_from(offset).ok()?;
        Some(self.base.as_ptr().wrapping_add(offset))
    }

    /// The address and length of `extent`, checked to lie inside the region
    /// and to start on a page boundary.
    ///
    /// # Errors
    /// `ERANGE` otherwise.
    pub fn range(&self, extent: Extent) -> io::Result<(*mut u8, usize)> {
        let inside = extent.offset.checked_add(extent.len).is_some()
            && extent.end() <= self.mapped_len()
            && self.page().is_aligned(extent.offset);
        match (inside, self.at(extent.offset), usize::try_from(extent.len)) {
            (true, Some(addr), Ok(len)) => Ok((addr, len)),
            _ => Err(io::Error::from_raw_os_error(libc::ERANGE)),
        }
    }

    fn whole(&self) -> Extent {
        Extent {
            offset: 0,
            len: self.mapped_len(),
        }
    }

    /// `madvise(MADV_POPULATE_WRITE)` over `extent`: fault its pages in for
    /// writing without changing data already there.
    ///
    /// # Errors
    /// `ERANGE` for an extent outside the region, else the `madvise` errno
    /// (`EINVAL` when the kernel or the mapping lacks the advice).
    pub fn populate_write(&self, extent: Extent) -> io::Result<()> {
        let (addr, len) = self.range(extent)?;
        // SAFETY: the range is inside the region (checked), mapped for 'a.
        unsafe { super::populate_write(addr, len) }
    }

    /// `madvise(MADV_POPULATE_READ)` over `extent`: map pages that exist
    /// (a peer's shard) into this process's page tables.
    ///
    /// # Errors
    /// As for [`Region::populate_write`].
    pub fn populate_read(&self, extent: Extent) -> io::Result<()> {
        let (addr, len) = self.range(extent)?;
        // SAFETY: as for populate_write.
        unsafe { super::populate_read(addr, len) }
    }

    /// Fault `extent` in by touching one byte every `stride` bytes with an
    /// atomic compare-and-exchange of 0 with 0 (see `touch_pages`).
    ///
    /// # Errors
    /// `ERANGE` for an extent outside the region or a zero stride.
    pub fn touch(&self, extent: Extent, stride: usize) -> io::Result<()> {
        let (addr, len) = self.range(extent)?;
        if stride == 0 {
            return Err(io::Error::from_raw_os_error(libc::ERANGE));
        }
        // SAFETY: the range is inside the region, mapped read-write for 'a;
        // every access is atomic.
        unsafe { super::touch_pages(addr, len, stride) };
        Ok(())
    }

    /// Write zeros over `extent`, in place: the pages stay where they are
    /// (no page is freed or allocated, so nothing can run short), with
    /// relaxed atomic stores of eight bytes.
    ///
    /// # Errors
    /// `ERANGE` for an extent outside the region or not on a page boundary.
    pub fn zero(&self, extent: Extent) -> io::Result<()> {
        // A page boundary is eight-byte aligned; a tail shorter than a word
        // goes byte by byte.
        let words = self.words(extent)?;
        for w in words {
            w.store(0, Ordering::Relaxed);
        }
        for off in (words.len() as u64 * 8)..extent.len {
            self.write_byte(extent.offset + off, 0);
        }
        Ok(())
    }

    /// `extent` as eight-byte words that every process mapping the memory
    /// may load and store atomically: for a structure kept in the pool
    /// itself (a kept pool's index), whose writers and readers may be other
    /// processes, or a process that died half way.
    ///
    /// # Errors
    /// `ERANGE` for an extent outside the region or not on a page boundary.
    pub fn words(&self, extent: Extent) -> io::Result<&'a [AtomicU64]> {
        let (addr, len) = self.range(extent)?;
        // SAFETY: `[addr, addr + len)` is inside the region (checked by
        // `range`), mapped read-write for 'a; `addr` is page-aligned, so
        // eight-byte aligned, and AtomicU64 has u64's size and is valid for
        // every bit pattern; every access of this library to pool memory is
        // atomic or the kernel's.
        Ok(unsafe { std::slice::from_raw_parts(addr.cast::<AtomicU64>(), len / 8) })
    }

    /// `madvise(MADV_HUGEPAGE)` over the whole region.
    ///
    /// # Errors
    /// The `madvise` errno.
    pub fn advise_hugepage(&self) -> io::Result<()> {
        let (addr, len) = self.range(self.whole())?;
        // SAFETY: the whole region, mapped for 'a; advice changes no data.
        unsafe { super::advise_hugepage(addr, len) }
    }

    /// How many base pages of `extent` are resident (`mincore`).
    ///
    /// # Errors
    /// `ERANGE` outside the region; the `mincore` errno.
    pub fn resident_base_pages(&self, extent: Extent) -> io::Result<u64> {
        let (addr, len) = self.range(extent)?;
        // SAFETY: inside the region (checked), which is mapped for 'a.
        unsafe { super::resident_base_pages(addr, len) }
    }

    /// Resident base pages of the whole region.
    ///
    /// # Errors
    /// As for [`Region::resident_base_pages`].
    pub fn resident_pages(&self) -> io::Result<u64> {
        self.resident_base_pages(self.whole())
    }

    fn byte(&self, offset: u64) -> Option<&AtomicU8> {
        if offset >= self.mapped_len() {
            return None;
        }
        let p = self.at(offset)?;
        // SAFETY: offset < mapped, so the byte is inside memory mapped
        // read-write for 'a; AtomicU8 has u8's size and alignment, and all of
        // this library's accesses to pool memory are atomic or the kernel's.
        Some(unsafe { AtomicU8::from_ptr(p) })
    }

    /// Read one byte (a relaxed atomic load); `None` past the end.
    pub fn read_byte(&self, offset: u64) -> Option<u8> {
        self.byte(offset).map(|b| b.load(Ordering::Relaxed))
    }

    /// Write one byte (a relaxed atomic store); `false` past the end.
    pub fn write_byte(&self, offset: u64, value: u8) -> bool {
        self.byte(offset)
            .map(|b| b.store(value, Ordering::Relaxed))
            .is_some()
    }

    /// Write a seed-derived byte every `stride` bytes and at the last byte:
    /// the data-path check of the conformance suite.
    pub fn write_pattern(&self, stride: usize, seed: u8) {
        for off in pattern_offsets(self.mapped_len(), stride) {
            self.write_byte(off, super::pattern_byte(off as usize, seed));
        }
    }

    /// Check what [`Region::write_pattern`] wrote; the first offset that
    /// differs.
    pub fn check_pattern(&self, stride: usize, seed: u8) -> Option<u64> {
        pattern_offsets(self.mapped_len(), stride)
            .find(|&off| self.read_byte(off) != Some(super::pattern_byte(off as usize, seed)))
    }
}

fn pattern_offsets(len: u64, stride: usize) -> impl Iterator<Item = u64> {
    let stride = (stride as u64).max(1);
    (0..len)
        .step_by(usize::try_from(stride).unwrap_or(usize::MAX))
        .chain(len.checked_sub(1))
}

/// An owned mapping made by this process, unmapped when dropped: the memory
/// a [`Region`] borrows.
#[derive(Debug)]
pub struct Mmap {
    base: NonNull<u8>,
    size: MappedSize,
}

// SAFETY: the mapping is memory this value owns; the pointer is only used to
// make Regions (which borrow `self`) and to unmap, once.
unsafe impl Send for Mmap {}
// SAFETY: `&Mmap` gives out only Regions, whose accesses are atomic.
unsafe impl Sync for Mmap {}

fn mapped_usize(size: MappedSize) -> io::Result<usize> {
    usize::try_from(size.mapped()).map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))
}

impl Mmap {
    /// Map `size.mapped()` bytes of anonymous read-write memory
    /// (`mmap(MAP_ANONYMOUS)`), aligned to `opts.align` and to the page size.
    ///
    /// # Errors
    /// The `mmap` errno (`ENOMEM` when the kernel refuses the size, `EINVAL`
    /// for a zero size).
    pub fn anonymous(size: MappedSize, opts: AnonMapOptions) -> io::Result<Mmap> {
        let align = usize::try_from(size.page().get())
            .unwrap_or(usize::MAX)
            .max(opts.align);
        // SAFETY: the new mapping goes straight into its owner, which unmaps
        // it once, on drop or `unmap`.
        let base =
            unsafe { super::map_anonymous(mapped_usize(size)?, AnonMapOptions { align, ..opts }) }?;
        Ok(Mmap { base, size })
    }

    /// The memory, for as long as `self` is borrowed.
    pub fn region(&self) -> Region<'_> {
        // SAFETY: every byte of [base, base + mapped) is mapped read-write by
        // construction (anonymous, or a Reservation whose every byte a file
        // was mapped over), aligned to the page, and unmapped only when self
        // is dropped or consumed, which the borrow prevents.
        unsafe { Region::new(self.base, self.size) }
    }

    /// Unmap now, reporting the `munmap` errno.
    ///
    /// # Errors
    /// The `munmap` errno (the range is then forgotten, never reused).
    pub fn unmap(self) -> io::Result<()> {
        let this = std::mem::ManuallyDrop::new(self);
        this.release()
    }

    /// Release the pool's memory but keep its address range reserved: the
    /// mapping is replaced in place (`MAP_FIXED`, atomically: no other
    /// mapping of this process can take the range meanwhile) by a
    /// [`Placeholder`], which unmaps it when dropped.
    ///
    /// # Errors
    /// The errno of the replacement; the range is then unmapped as by
    /// [`Mmap::unmap`] (and that call's errno, if it fails too, is logged).
    pub fn unmap_keeping_range(self) -> io::Result<Placeholder> {
        let this = std::mem::ManuallyDrop::new(self);
        let len = mapped_usize(this.size)?;
        // SAFETY: our own mapping, consumed here; Regions borrowing it are
        // gone (this takes self by value).
        match unsafe { super::replace_with_placeholder(this.base.as_ptr(), len) } {
            Ok(readable) => Ok(Placeholder {
                base: this.base,
                len,
                readable,
            }),
            Err(e) => {
                if let Err(u) = this.release() {
                    tracing::warn!("munmap of {:p}+{len} failed: {u}", this.base);
                }
                Err(e)
            }
        }
    }

    fn release(&self) -> io::Result<()> {
        let len = mapped_usize(self.size)?;
        // SAFETY: our own mapping; Regions borrowing it are gone (unmap
        // consumes self, drop runs last).
        unsafe { super::unmap(self.base.as_ptr(), len) }
    }
}

/// The address range a pool was mapped at, after the pool was released:
/// private zero pages (`MAP_NORESERVE`, no memory until written) that keep
/// the range from being reused until this value is dropped, when it is
/// unmapped. Made by [`Mmap::unmap_keeping_range`], for a pool by
/// `Pool::teardown_keeping_range`.
///
/// It is for embedders that hand the pool's address to code that may keep
/// it past the pool (a `torch.frombuffer` tensor keeps the pointer but not
/// the buffer export): such a stale pointer then reads zeros and writes to
/// pages nobody else has, instead of reaching memory the process mapped
/// there afterwards. The pool's own memory (huge pages, files, pins) is
/// given back at release as always.
#[derive(Debug)]
pub struct Placeholder {
    base: NonNull<u8>,
    len: usize,
    /// Its pages are readable (not `PROT_NONE`).
    readable: bool,
}

// SAFETY: a range this value owns, accessed through it only by an atomic
// load (`first_byte`) and unmapped once, on drop.
unsafe impl Send for Placeholder {}
// SAFETY: `&Placeholder` gives only an atomic load of one byte.
unsafe impl Sync for Placeholder {}

impl Placeholder {
    /// The first byte of the range (its private zero pages: never the
    /// pool's data), for a check that the pool's memory is gone; `None`
    /// where the placeholder is `PROT_NONE`.
    pub fn first_byte(&self) -> Option<u8> {
        self.readable.then(|| {
            // SAFETY: the placeholder's own mapping, mapped readable
            // (checked just before), alive while `self` is borrowed; read
            // atomically, since a stale pointer of the caller's may write it
            // meanwhile.
            let byte = unsafe { AtomicU8::from_ptr(self.base.as_ptr()) };
            byte.load(Ordering::Relaxed)
        })
    }

    /// The range's start.
    pub fn addr(&self) -> usize {
        self.base.as_ptr() as usize
    }
    /// The range's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the range is empty (never: a pool has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Placeholder {
    fn drop(&mut self) {
        // SAFETY: the placeholder mapping this value owns; nothing in this
        // process uses it through safe references.
        if let Err(e) = unsafe { super::unmap(self.base.as_ptr(), self.len) } {
            tracing::warn!(
                "munmap of the placeholder {:p}+{} failed: {e}",
                self.base,
                self.len
            );
        }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            tracing::warn!(
                "munmap of {:p}+{} failed: {e}",
                self.base,
                self.size.mapped()
            );
        }
    }
}

/// Why [`Reservation::map_file`] refused an extent; nothing was mapped.
#[derive(Debug, thiserror::Error)]
pub enum FixedMapError {
    /// The extent is empty or reaches past the reservation.
    #[error("segment {offset}+{len} is empty or outside the {reserved}-byte reservation")]
    Outside {
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// Bytes reserved.
        reserved: u64,
    },
    /// The offset or length is not a multiple of the page size.
    #[error("segment {offset}+{len} is not aligned to the {page} page size")]
    Misaligned {
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// The page size.
        page: PageSize,
    },
    /// The extent overlaps a segment already mapped.
    #[error("segment {offset}+{len} overlaps the segment already mapped at {other}")]
    Overlap {
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// Offset of the segment it overlaps.
        other: u64,
    },
    /// `mmap` itself failed.
    #[error("mmap(MAP_SHARED | MAP_FIXED) failed")]
    Os(#[source] io::Error),
}

/// An inaccessible (`PROT_NONE`) range of address space that files are
/// mapped into with `MAP_FIXED`, then turned into an [`Mmap`] once every byte
/// is covered. `MAP_FIXED` only ever replaces bytes of this reservation, so no
/// extent can clobber memory outside it.
#[derive(Debug)]
pub struct Reservation {
    mmap: Mmap,
    /// Mapped extents, sorted by offset and disjoint.
    mapped: Vec<Extent>,
}

impl Reservation {
    /// Reserve `size.mapped()` bytes, aligned to the page size
    /// (`PROT_NONE`, `MAP_NORESERVE`).
    ///
    /// # Errors
    /// The `mmap` errno.
    pub fn new(size: MappedSize) -> io::Result<Reservation> {
        let align = usize::try_from(size.page().get()).unwrap_or(usize::MAX);
        // SAFETY: the reservation goes straight into its owner, which
        // unmaps it once.
        let base = unsafe { super::reserve(mapped_usize(size)?, align) }?;
        Ok(Reservation {
            mmap: Mmap { base, size },
            mapped: Vec::new(),
        })
    }

    /// The reservation's size and page size.
    pub fn size(&self) -> MappedSize {
        self.mmap.size
    }

    /// Map `extent.len` bytes of `fd` from file offset 0 read-write,
    /// `MAP_SHARED | MAP_FIXED`, at `extent.offset` into the reservation.
    ///
    /// On hugetlbfs this reserves the huge pages: too few give `ENOMEM`
    /// here, never SIGBUS later, because `MAP_NORESERVE` is not used.
    ///
    /// # Errors
    /// [`FixedMapError`] for an extent that is empty, outside the
    /// reservation, not page-aligned or overlapping one already mapped
    /// (nothing is mapped then), or the `mmap` errno.
    pub fn map_file(&mut self, extent: Extent, fd: BorrowedFd<'_>) -> Result<(), FixedMapError> {
        let size = self.mmap.size;
        let Extent { offset, len } = extent;
        let end = offset.checked_add(len);
        if len == 0 || end.is_none_or(|end| end > size.mapped()) {
            return Err(FixedMapError::Outside {
                offset,
                len,
                reserved: size.mapped(),
            });
        }
        let page = size.page();
        if !page.is_aligned(offset) || !page.is_aligned(len) {
            return Err(FixedMapError::Misaligned { offset, len, page });
        }
        let at = self.mapped.partition_point(|m| m.offset < offset);
        let neighbours = [at.checked_sub(1), Some(at)];
        for m in neighbours
            .into_iter()
            .flatten()
            .filter_map(|i| self.mapped.get(i))
        {
            if m.offset < extent.end() && offset < m.end() {
                return Err(FixedMapError::Overlap {
                    offset,
                    len,
                    other: m.offset,
                });
            }
        }
        let (addr, len_usize) = self.mmap_range(extent).map_err(FixedMapError::Os)?;
        // SAFETY: [addr, addr + len) lies inside our own reservation (checked
        // above), which no Region refers to yet (regions exist only once the
        // reservation has become an Mmap), so replacing it clobbers nothing.
        unsafe { super::map_file_fixed(addr, len_usize, fd, 0) }.map_err(FixedMapError::Os)?;
        self.mapped.insert(at, extent);
        Ok(())
    }

    fn mmap_range(&self, extent: Extent) -> io::Result<(*mut u8, usize)> {
        let offset = usize::try_from(extent.offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::ERANGE))?;
        let len =
            usize::try_from(extent.len).map_err(|_| io::Error::from_raw_os_error(libc::ERANGE))?;
        Ok((self.mmap.base.as_ptr().wrapping_add(offset), len))
    }

    /// The first gap no file covers, if any.
    pub fn first_gap(&self) -> Option<Extent> {
        let mut cursor = 0;
        for m in &self.mapped {
            if m.offset > cursor {
                return Some(Extent {
                    offset: cursor,
                    len: m.offset - cursor,
                });
            }
            cursor = m.end();
        }
        let mapped = self.mmap.size.mapped();
        (cursor < mapped).then_some(Extent {
            offset: cursor,
            len: mapped - cursor,
        })
    }

    /// The finished mapping, once files cover every byte.
    ///
    /// # Errors
    /// The reservation back, with the first uncovered extent.
    pub fn finish(self) -> Result<Mmap, (Reservation, Extent)> {
        match self.first_gap() {
            None => Ok(self.mmap),
            Some(gap) => Err((self, gap)),
        }
    }
}
