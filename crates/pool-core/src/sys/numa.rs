//! Raw NUMA memory-policy system calls: `mbind(2)` and `get_mempolicy(2)`.
//!
//! rustix has no wrapper for either, so they go through `libc::syscall`. Every
//! argument is passed as a full `unsigned long`: the kernel reads whole
//! registers, and a variadic `int` leaves the upper half undefined.
//!
//! # The nodemask and `maxnode`
//! A nodemask is an array of `unsigned long`, node *n* being bit `n % 64` of
//! word `n / 64`. The kernel decrements `maxnode` before use and reads only
//! `maxnode - 1` bits, so a mask of `bits` bits is passed as `bits + 1`
//! ([`NodeMask::maxnode`]); passing `bits` would silently drop the top node
//! (`maxnode = 1` is an empty mask, which `MPOL_BIND` refuses with `EINVAL`;
//! a test holds this).
//!
//! # `get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR)` faults pages in
//! The kernel answers this query by pinning the page with
//! `get_user_pages_fast(addr, 1, 0, …)`, a *read* lookup that faults a missing
//! page in (verified on Linux 6.18, and tested below):
//! - private anonymous memory gets the shared zero page (the huge zero page
//!   in a THP-eligible range), and the answer is the node of the zero page,
//!   not of any memory the pool owns;
//! - shared anonymous memory (shmem) and tmpfs/hugetlbfs files get a real,
//!   newly allocated page, on whatever node the policy picks.
//!
//! So the raw call is never a harmless probe of an unfaulted page.
//! [`page_node`] checks residency with `mincore` first and does not ask about
//! pages that are not in memory.
//!
//! Where the kernel lacks NUMA (`CONFIG_NUMA=n`) both calls return `ENOSYS`;
//! a container's seccomp profile may refuse them with `EPERM` (Docker's
//! default allows them only with `CAP_SYS_NICE`).

use std::io;

use libc::{c_int, c_long, c_uint, c_ulong};

use super::Region;

/// `MPOL_BIND`: allocate only from the nodes in the mask (the OOM killer, not
/// another node, is what happens when they are full).
pub const MPOL_BIND: c_int = 2;
/// `get_mempolicy` flag: return a node number instead of a policy.
pub const MPOL_F_NODE: c_ulong = 1;
/// `get_mempolicy` flag: look at the policy (or, with [`MPOL_F_NODE`], the
/// page) at an address rather than the thread's policy.
pub const MPOL_F_ADDR: c_ulong = 2;
/// `mbind` flag: fail with `EIO` when pages already present do not follow the
/// policy (and, with [`MPOL_MF_MOVE`], could not be moved).
pub const MPOL_MF_STRICT: c_uint = 1;
/// `mbind` flag: migrate pages of this process that are already present on
/// other nodes.
pub const MPOL_MF_MOVE: c_uint = 2;

/// Bits in one nodemask word.
const WORD_BITS: usize = c_ulong::BITS as usize;
/// The kernel refuses `maxnode` above `PAGE_SIZE * 8` (32768 with 4 KiB
/// pages). With `maxnode = words * 64 + 1`, that allows 511 words.
const MAX_WORDS: usize = (4096 * 8 - 1) / WORD_BITS;
/// The largest node number a [`NodeMask`] can name (32703). The kernel's own
/// limit (`MAX_NUMNODES`, at most 1024) is far below it.
pub const MAX_NODE: u32 = (MAX_WORDS * WORD_BITS - 1) as u32;

/// A set of NUMA nodes in the kernel's nodemask layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMask {
    words: Vec<c_ulong>,
}

impl NodeMask {
    /// The mask holding `node` alone, as short as it can be (whole words).
    ///
    /// # Errors
    /// `EINVAL` past [`MAX_NODE`], which no kernel accepts.
    pub fn single(node: u32) -> io::Result<NodeMask> {
        if node > MAX_NODE {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let node = node as usize;
        let mut words = vec![0; node / WORD_BITS + 1];
        words[node / WORD_BITS] = 1 << (node % WORD_BITS);
        Ok(NodeMask { words })
    }

    /// Whether `node` is in the set (for the tests).
    #[cfg(test)]
    pub fn contains(&self, node: u32) -> bool {
        let node = node as usize;
        self.words
            .get(node / WORD_BITS)
            .is_some_and(|w| w & (1 << (node % WORD_BITS)) != 0)
    }

    /// The mask's length in bits (a multiple of 64).
    pub fn bits(&self) -> usize {
        self.words.len() * WORD_BITS
    }

    /// The `maxnode` argument for this mask: [`bits`](Self::bits) + 1, since
    /// the kernel reads `maxnode - 1` bits.
    pub fn maxnode(&self) -> c_ulong {
        (self.bits() + 1) as c_ulong
    }

    /// The words, as the kernel reads them (for the tests).
    #[cfg(test)]
    pub fn words(&self) -> &[c_ulong] {
        &self.words
    }
}

/// `mbind(addr, len, mode, nodes, nodes.maxnode(), flags)`: set the memory
/// policy of a range. Pages faulted afterwards follow it; pages already present
/// are moved only with [`MPOL_MF_MOVE`].
///
/// # Errors
/// The errno: `EINVAL` for a node that is offline, has no memory or lies
/// outside this process's cpuset (or for an unaligned `addr`); `EFAULT` when
/// part of the range is not mapped; `EIO` with [`MPOL_MF_STRICT`] when present
/// pages could not be moved; `ENOSYS` without `CONFIG_NUMA`; `EPERM` under a
/// seccomp profile that forbids it.
///
/// # Safety
/// `[addr, addr + len)` must be a mapping the caller owns, `addr` base-page
/// aligned. The call preserves the contents of every page (moving a page
/// copies it), but it changes where the owner's memory lives, and with
/// [`MPOL_MF_MOVE`] it migrates pages that may be in use; it must not be
/// pointed at memory that belongs to someone else (the Rust heap, a peer's
/// mapping).
pub unsafe fn mbind(
    addr: *mut u8,
    len: usize,
    mode: c_int,
    nodes: &NodeMask,
    flags: c_uint,
) -> io::Result<()> {
    // SAFETY: mbind reads `nodes.maxnode() - 1` bits, exactly the words of
    // `nodes`, which outlives the call; it writes no user memory. The caller
    // guarantees the range is its own mapping.
    let rc: c_long = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr as c_ulong,
            len as c_ulong,
            mode as c_ulong,
            nodes.words.as_ptr(),
            nodes.maxnode(),
            flags as c_ulong,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `get_mempolicy(&node, NULL, 0, addr, MPOL_F_NODE | MPOL_F_ADDR)`: the node
/// of the page that backs `addr`.
///
/// **Faults the page in when it is not present** (see the module docs): a
/// private page gets the zero page and the answer is the zero page's node; a
/// shared page is allocated. Use [`page_node`] to ask without side effects.
///
/// # Errors
/// The errno: `EFAULT` when `addr` is not mapped or not readable, `ENOSYS`
/// without `CONFIG_NUMA`, `EPERM` under a seccomp profile that forbids it.
///
/// # Safety
/// `addr` must lie in a mapping the caller owns. The call writes no memory of
/// the caller's but the returned node, and never changes a page's contents,
/// but it may fault a page in (allocating it for shared memory).
pub unsafe fn node_of_page(addr: *mut u8) -> io::Result<i32> {
    let mut node: c_int = -1;
    // SAFETY: the kernel writes one int to `node`, a live local; the mask
    // pointer is NULL with maxnode 0, so nothing else is written. The caller
    // owns the mapping at `addr`, which the kernel only reads (looks up).
    let rc: c_long = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut c_int,
            std::ptr::null_mut::<c_ulong>(),
            0 as c_ulong,
            addr as c_ulong,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    if rc == 0 {
        Ok(node)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bind the whole mapped range of `region` to `node`
/// ([`mbind`] with [`MPOL_BIND`] and `flags`).
///
/// # Errors
/// As for [`mbind`]; `EINVAL` without a call past [`MAX_NODE`].
pub fn bind_region(region: &Region, node: u32, flags: c_uint) -> io::Result<()> {
    let nodes = NodeMask::single(node)?;
    let len = usize::try_from(region.mapped_len())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a Region is mapped read-write and page-aligned for as long as it
    // is used (the contract of `Region::new`), and belongs to the pool that
    // handed it out.
    unsafe { mbind(region.addr(), len, MPOL_BIND, &nodes, flags) }
}

/// The node of the base page at `offset` in `region`, or `None` when no page
/// is in memory there (never faulted, or swapped out). Residency is checked
/// with `mincore` first, so unlike [`node_of_page`] this never faults a page
/// in. A private page that was only ever read is backed by the zero page and
/// reports the zero page's node.
///
/// # Errors
/// `EINVAL` for an offset past the end or not base-page aligned; otherwise
/// the errno of `mincore` or [`node_of_page`].
pub fn page_node(region: &Region, offset: u64) -> io::Result<Option<i32>> {
    let base = super::base_page_size();
    if offset >= region.mapped_len() || !offset.is_multiple_of(base as u64) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let addr = region
        .at(offset)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: offset < mapped_len and base-page aligned, so [addr, addr+base)
    // is one base page inside the region, mapped by `Region::new`'s contract.
    let resident = unsafe { super::resident_base_pages(addr, base) }?;
    if resident == 0 {
        return Ok(None);
    }
    // SAFETY: as above; the page is present, so the lookup faults nothing in.
    unsafe { node_of_page(addr) }.map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{AnonMapOptions, base_page_size, map_anonymous, resident_base_pages, unmap};

    fn anon(len: usize, shared: bool) -> *mut u8 {
        // SAFETY: each test unmaps what it maps.
        unsafe {
            map_anonymous(
                len,
                AnonMapOptions {
                    shared,
                    align: base_page_size(),
                },
            )
        }
        .unwrap()
        .as_ptr()
    }

    #[test]
    fn node_masks_are_whole_words_and_maxnode_is_bits_plus_one() {
        let m = NodeMask::single(0).unwrap();
        assert_eq!(m.words(), &[1]);
        assert_eq!((m.bits(), m.maxnode()), (64, 65));
        let m = NodeMask::single(63).unwrap();
        assert_eq!(m.words(), &[1 << 63]);
        assert_eq!(m.maxnode(), 65);
        assert!(m.contains(63) && !m.contains(62) && !m.contains(64));
        let m = NodeMask::single(64).unwrap();
        assert_eq!(m.words(), &[0, 1]);
        assert_eq!(m.maxnode(), 129);
        let m = NodeMask::single(MAX_NODE).unwrap();
        assert!(m.maxnode() <= 4096 * 8, "the kernel's limit on maxnode");
        let e = NodeMask::single(MAX_NODE + 1).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn kernel_reads_maxnode_minus_one_bits() {
        let page = base_page_size();
        let p = anon(page, false);
        let mask: [c_ulong; 1] = [1]; // node 0
        let call = |maxnode: c_ulong| {
            // SAFETY: p is a one-page mapping owned here; the kernel reads at
            // most maxnode - 1 <= 64 bits, within `mask`.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_mbind,
                    p as c_ulong,
                    page as c_ulong,
                    MPOL_BIND as c_ulong,
                    mask.as_ptr(),
                    maxnode,
                    0 as c_ulong,
                )
            };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error().raw_os_error())
            }
        };
        // maxnode 1 = zero bits: an empty mask, which MPOL_BIND refuses.
        assert_eq!(call(1), Err(Some(libc::EINVAL)));
        // maxnode 2 = one bit: node 0.
        assert_eq!(call(2), Ok(()));
        assert_eq!(call(65), Ok(()));
        // SAFETY: the mapping made above, unused from here on.
        unsafe { unmap(p, page) }.unwrap();
    }

    #[test]
    fn mbind_to_an_offline_node_is_einval_and_to_node_0_works() {
        let len = 16 * base_page_size();
        let p = anon(len, false);
        // SAFETY: p is a fresh mapping of len bytes owned here.
        unsafe {
            let e = mbind(
                p,
                len,
                MPOL_BIND,
                &NodeMask::single(63).unwrap(),
                MPOL_MF_STRICT | MPOL_MF_MOVE,
            )
            .unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
            let e = mbind(p, len, MPOL_BIND, &NodeMask::single(1000).unwrap(), 0).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
            mbind(
                p,
                len,
                MPOL_BIND,
                &NodeMask::single(0).unwrap(),
                MPOL_MF_STRICT | MPOL_MF_MOVE,
            )
            .unwrap();
            unmap(p, len).unwrap();
        }
    }

    /// Documents the kernel: the raw query faults a missing private page in
    /// with the zero page (present afterwards, nothing allocated) and answers
    /// with the zero page's node.
    #[test]
    fn raw_query_faults_an_unfaulted_private_page_in() {
        let page = base_page_size();
        let p = anon(4 * page, false);
        // SAFETY: p is a fresh private mapping owned here.
        unsafe {
            assert_eq!(resident_base_pages(p, page).unwrap(), 0);
            let node = node_of_page(p).unwrap();
            assert_eq!(node, 0, "the zero page's node on this one-node host");
            assert_eq!(
                resident_base_pages(p, page).unwrap(),
                1,
                "the query mapped the zero page"
            );
            assert_eq!(*p, 0);
            assert_eq!(resident_base_pages(p.add(page), 3 * page).unwrap(), 0);
            unmap(p, 4 * page).unwrap();
        }
    }

    /// Documents the kernel: on shared memory the raw query allocates the page.
    #[test]
    fn raw_query_allocates_an_unfaulted_shared_page() {
        let page = base_page_size();
        let p = anon(4 * page, true);
        // SAFETY: p is a fresh shared mapping owned here.
        unsafe {
            assert_eq!(resident_base_pages(p, page).unwrap(), 0);
            assert_eq!(node_of_page(p.add(page)).unwrap(), 0);
            assert_eq!(resident_base_pages(p.add(page), page).unwrap(), 1);
            unmap(p, 4 * page).unwrap();
        }
    }

    #[test]
    fn raw_query_on_inaccessible_memory_is_efault() {
        let page = base_page_size();
        // SAFETY: a fresh PROT_NONE mapping at an address the kernel picks.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                page,
                rustix::mm::ProtFlags::empty(),
                rustix::mm::MapFlags::PRIVATE,
            )
        }
        .unwrap()
        .cast::<u8>();
        // SAFETY: p is the mapping made above, owned here.
        unsafe {
            let e = node_of_page(p).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
            unmap(p, page).unwrap();
        }
    }

    #[test]
    fn page_node_does_not_fault_and_rejects_bad_offsets() {
        let page = base_page_size();
        let len = 8 * page;
        let p = anon(len, true);
        let size =
            crate::layout::round_to_page(len as u64, crate::layout::PageSize::BASE_4K).unwrap();
        // SAFETY: p is a fresh mapping of len bytes, 4 KiB aligned, owned
        // here and unmapped only after the last use of the region.
        let region = unsafe { Region::new(std::ptr::NonNull::new(p).unwrap(), size) };
        assert_eq!(page_node(&region, 0).unwrap(), None);
        assert_eq!(page_node(&region, 7 * page as u64).unwrap(), None);
        // SAFETY: p..p+len is owned here.
        assert_eq!(unsafe { resident_base_pages(p, len) }.unwrap(), 0);
        // SAFETY: as above; write one byte of the third page.
        unsafe { *p.add(2 * page) = 1 };
        assert_eq!(page_node(&region, 2 * page as u64).unwrap(), Some(0));
        for bad in [len as u64, 1, page as u64 + 8] {
            let e = page_node(&region, bad).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "offset {bad}");
        }
        // SAFETY: the region is not used after this.
        unsafe { unmap(p, len) }.unwrap();
    }
}
