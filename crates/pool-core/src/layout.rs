//! Pure layout math for host-memory pools.
//!
//! This module decides how a pool of tens to hundreds of GiB is laid out in
//! bytes: which page size it uses, how a requested size is rounded up to whole
//! pages, how a mapping is split into backing segments, how prefaulting is
//! sharded across threads or ranks, and how the mapping is cut into chunks for
//! `cuMemHostRegister` and into RDMA memory regions.
//!
//! Everything here is integer arithmetic on byte offsets with no I/O. No
//! function panics: every sum and product is checked, and a size that does not
//! fit in 64 bits is reported as [`LayoutError::Overflow`], never wrapped.
//! Every list of [`Extent`]s returned here is in order, contiguous and covers
//! `[0, mapped)` exactly.

use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};

/// Smallest supported page size: 4 KiB.
const MIN_PAGE: u64 = 4 << 10;
/// Largest supported page size: 16 GiB.
const MAX_PAGE: u64 = 16 << 30;
/// Upper bound on the number of extents reserved up front; longer lists grow
/// on demand instead of asking for a huge allocation in one go.
const CAPACITY_HINT_LIMIT: u64 = 1 << 16;

/// A page size: a power of two between 4 KiB and 16 GiB inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageSize(u64);

impl PageSize {
    /// The 4 KiB base page.
    pub const BASE_4K: PageSize = PageSize(4 << 10);
    /// The 2 MiB huge page.
    pub const HUGE_2M: PageSize = PageSize(2 << 20);
    /// The 1 GiB huge page.
    pub const HUGE_1G: PageSize = PageSize(1 << 30);

    /// Validates `bytes` as a page size.
    ///
    /// Fails with [`LayoutError::NotPowerOfTwo`] when `bytes` is not a power of
    /// two (zero included) and with [`LayoutError::PageSizeOutOfRange`] when it
    /// is a power of two outside 4 KiB..=16 GiB.
    pub fn new(bytes: u64) -> Result<PageSize, LayoutError> {
        if !bytes.is_power_of_two() {
            return Err(LayoutError::NotPowerOfTwo { bytes });
        }
        if !(MIN_PAGE..=MAX_PAGE).contains(&bytes) {
            return Err(LayoutError::PageSizeOutOfRange { bytes });
        }
        Ok(PageSize(bytes))
    }

    /// The page size in bytes.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// `page - 1`: the low bits that must be zero in an aligned value.
    const fn mask(self) -> u64 {
        // The page size is at least 4 KiB, so this never saturates.
        self.0.saturating_sub(1)
    }

    /// `log2(page)`.
    const fn shift(self) -> u32 {
        self.0.trailing_zeros()
    }

    /// The page size as a non-zero value.
    fn non_zero(self) -> NonZeroU64 {
        // The page size is at least 4 KiB, so the fallback is never taken.
        NonZeroU64::new(self.0).unwrap_or(NonZeroU64::MIN)
    }

    /// Whether `v` is a multiple of the page size.
    pub fn is_aligned(self, v: u64) -> bool {
        v & self.mask() == 0
    }

    /// Rounds `v` up to the next multiple of the page size.
    ///
    /// Fails with [`LayoutError::Overflow`] when the result does not fit in a
    /// `u64`.
    pub fn round_up(self, v: u64) -> Result<u64, LayoutError> {
        self.round_up_named(v, "size")
    }

    /// [`PageSize::round_up`] with the name of the rounded quantity used in
    /// the error.
    fn round_up_named(self, v: u64, what: &'static str) -> Result<u64, LayoutError> {
        v.checked_add(self.mask())
            .map(|bumped| bumped & !self.mask())
            .ok_or(LayoutError::Overflow {
                what,
                bytes: v,
                page: self.0,
            })
    }

    /// Rounds `v` down to a multiple of the page size.
    pub fn round_down(self, v: u64) -> u64 {
        v & !self.mask()
    }

    /// The number of pages needed to hold `v` bytes: `ceil(v / page)`.
    ///
    /// Never overflows, even for `v` near `u64::MAX`.
    pub fn pages(self, v: u64) -> u64 {
        // `v >> shift` is at most `u64::MAX >> 12`, so adding one cannot wrap.
        (v >> self.shift()).saturating_add(u64::from(!self.is_aligned(v)))
    }
}

impl fmt::Display for PageSize {
    /// Renders the exact IEC size, e.g. `4 KiB`, `2 MiB`, `1 GiB`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&format_bytes(self.0))
    }
}

/// A half-open byte range `[offset, offset + len)` inside a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Extent {
    /// First byte of the range, from the start of the mapping.
    pub offset: u64,
    /// Length of the range in bytes.
    pub len: u64,
}

impl Extent {
    /// One past the last byte: `offset + len`.
    ///
    /// Extents built by this module never overflow here; for a hand-built
    /// extent whose end does not fit in a `u64` the result saturates at
    /// `u64::MAX` instead of wrapping.
    pub const fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }

    /// Whether the extent holds no bytes.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Logical size the caller asked for vs the size actually mapped (rounded up
/// to the page).
///
/// Built by [`round_to_page`]; `mapped` is always a non-zero multiple of the
/// page size and `mapped - page < logical <= mapped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedSize {
    logical: u64,
    mapped: u64,
    page: PageSize,
}

impl MappedSize {
    /// The size the caller asked for, in bytes.
    pub const fn logical(self) -> u64 {
        self.logical
    }

    /// The size actually mapped: `logical` rounded up to the page size.
    pub const fn mapped(self) -> u64 {
        self.mapped
    }

    /// The page size of the mapping.
    pub const fn page(self) -> PageSize {
        self.page
    }

    /// The number of pages mapped: `mapped / page`.
    pub const fn pages(self) -> u64 {
        self.mapped >> self.page.shift()
    }
}

/// Rounds a requested size up to whole pages.
///
/// Fails with [`LayoutError::ZeroSize`] when `logical` is zero and with
/// [`LayoutError::Overflow`] when the rounded size does not fit in a `u64`.
pub fn round_to_page(logical: u64, page: PageSize) -> Result<MappedSize, LayoutError> {
    if logical == 0 {
        return Err(LayoutError::ZeroSize {
            what: "logical size",
        });
    }
    let mapped = page.round_up_named(logical, "logical size")?;
    Ok(MappedSize {
        logical,
        mapped,
        page,
    })
}

/// How a multi-file mapping is split into segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentSpec {
    /// Exactly this many segments, as even as whole pages allow.
    Count(u32),
    /// Segments of this many bytes (rounded up to the page size); the last
    /// segment holds the remainder.
    Size(u64),
}

/// Splits a mapping into backing segments.
///
/// The result is contiguous, in order, has page-aligned offsets and lengths,
/// no empty segment, and covers exactly `[0, mapped)`.
///
/// - [`SegmentSpec::Count`]`(n)`: exactly `n` segments whose lengths differ by
///   at most one page; the first `pages % n` segments get the extra page.
///   Fails with [`LayoutError::ZeroCount`] when `n == 0` and with
///   [`LayoutError::TooManySegments`] when `n` exceeds the number of pages.
/// - [`SegmentSpec::Size`]`(s)`: `s` is rounded up to the page size and every
///   segment but the last has that length. Fails with
///   [`LayoutError::ZeroSize`] when `s == 0` and with
///   [`LayoutError::Overflow`] when rounding `s` up overflows.
pub fn segments(size: &MappedSize, spec: SegmentSpec) -> Result<Vec<Extent>, LayoutError> {
    match spec {
        SegmentSpec::Count(count) => {
            let n = NonZeroU32::new(count).ok_or(LayoutError::ZeroCount {
                what: "segment count",
            })?;
            let pages = size.pages();
            if u64::from(count) > pages {
                return Err(LayoutError::TooManySegments { count, pages });
            }
            even_split(size.mapped(), size.page(), n)
        }
        SegmentSpec::Size(bytes) => {
            let zero = LayoutError::ZeroSize {
                what: "segment size",
            };
            if bytes == 0 {
                return Err(zero);
            }
            let rounded = size.page().round_up_named(bytes, "segment size")?;
            // A non-zero size rounds up to at least one page.
            let seg = NonZeroU64::new(rounded).ok_or(zero)?;
            Ok(split_fixed(size.mapped(), seg))
        }
    }
}

/// Splits `[0, mapped)` into per-rank or per-thread prefault shards.
///
/// Returns exactly `n` extents, in order, disjoint, page-aligned and covering
/// `[0, mapped)`; their lengths differ by at most one page and the first
/// `pages % n` shards get the extra page. When there are fewer pages than
/// shards, the trailing shards are empty (length zero, offset at the end of
/// the previous shard); `mapped == 0` gives `n` empty shards.
///
/// Fails with [`LayoutError::NotAligned`] when `mapped` is not a multiple of
/// the page size and with [`LayoutError::ZeroCount`] when `n == 0`.
pub fn shards(mapped: u64, page: PageSize, n: u32) -> Result<Vec<Extent>, LayoutError> {
    check_aligned(mapped, page)?;
    let n = NonZeroU32::new(n).ok_or(LayoutError::ZeroCount {
        what: "shard count",
    })?;
    even_split(mapped, page, n)
}

/// Splits a mapping into chunks for `cuMemHostRegister` under a soft byte cap.
///
/// The caller lays out fixed-size blocks of `block` bytes from offset 0. With
/// `unit = lcm(page, block)`, every interior chunk boundary is a multiple of
/// `unit`, so it is page-aligned and never falls inside a block. Every chunk
/// but the last is `max(unit, floor(cap / unit) * unit)` bytes long and the
/// last holds the remainder. A unit larger than `cap` is therefore
/// registered whole: a chunk exceeds `cap` only when it is at most one unit
/// (exactly one unit, or a shorter final remainder). The chunks are
/// contiguous, non-empty and cover `[0, mapped)`; `mapped == 0` gives an
/// empty list.
///
/// Fails with [`LayoutError::ZeroSize`] when `block` or `cap` is zero, with
/// [`LayoutError::NotAligned`] when `mapped` is not a multiple of the page
/// size and with [`LayoutError::Overflow`] when `lcm(page, block)` overflows.
pub fn registration_chunks(
    mapped: u64,
    page: PageSize,
    block: u64,
    cap: u64,
) -> Result<Vec<Extent>, LayoutError> {
    let block = non_zero_size(block, "block size")?;
    let cap = non_zero_size(cap, "registration cap")?;
    let unit = block_unit(mapped, page, block)?;
    let chunk = whole_units(cap, unit).max(unit);
    Ok(split_fixed(mapped, chunk))
}

/// Splits a mapping into RDMA memory regions no longer than `max_mr_size`.
///
/// Like [`registration_chunks`], but `max_mr_size` is a hard device limit:
/// every region is at most `max_mr_size` bytes, every interior boundary is a
/// multiple of `lcm(page, block)` and every region but the last is
/// `floor(max_mr_size / unit) * unit` bytes long.
///
/// Fails with [`LayoutError::ZeroSize`] when `block` or `max_mr_size` is
/// zero, with [`LayoutError::NotAligned`] when `mapped` is not a multiple of
/// the page size, with [`LayoutError::Overflow`] when `lcm(page, block)`
/// overflows and with [`LayoutError::UnitExceedsLimit`] when that unit is
/// larger than `max_mr_size`.
pub fn mr_regions(
    mapped: u64,
    page: PageSize,
    block: u64,
    max_mr_size: u64,
) -> Result<Vec<Extent>, LayoutError> {
    let block = non_zero_size(block, "block size")?;
    let limit = non_zero_size(max_mr_size, "max_mr_size")?;
    let unit = block_unit(mapped, page, block)?;
    if unit > limit {
        return Err(LayoutError::UnitExceedsLimit {
            unit: unit.get(),
            limit: max_mr_size,
        });
    }
    // `unit <= limit`, so at least one whole unit fits.
    let region = whole_units(limit, unit).max(unit);
    Ok(split_fixed(mapped, region))
}

/// The least common multiple of `a` and `b`.
///
/// Fails with [`LayoutError::ZeroSize`] when either is zero and with
/// [`LayoutError::Overflow`] when the result does not fit in a `u64`.
pub fn lcm(a: u64, b: u64) -> Result<u64, LayoutError> {
    let a_nz = non_zero_size(a, "first lcm operand")?;
    let b_nz = non_zero_size(b, "second lcm operand")?;
    lcm_non_zero(a_nz, b_nz)
        .map(NonZeroU64::get)
        .ok_or(LayoutError::Overflow {
            what: "least common multiple",
            bytes: a,
            page: b,
        })
}

/// The largest pool hostpool maps: 64 PiB, the user address space of
/// x86-64 with 5-level page tables (and far beyond any node's memory).
pub const MAX_POOL_BYTES: u64 = 1 << 56;

/// Renders a byte count for operators.
///
/// Uses the largest IEC unit (B, KiB, MiB, GiB, TiB, PiB, EiB) that is not
/// larger than `b`. When `b` is a whole number of that unit it is shown
/// exactly (`4096` gives `4 KiB`, `384 << 30` gives `384 GiB`); otherwise it is
/// shown with two decimals, truncated rather than rounded so the figure never
/// overstates the size (`3 << 29` gives `1.50 GiB`).
pub fn format_bytes(b: u64) -> String {
    let unit_index = b.checked_ilog2().map_or(0, |log2| log2 / 10);
    let shift = unit_index.saturating_mul(10);
    let name = unit_name(unit_index);
    let whole = b >> shift;
    let rest = b & ((1u64 << shift).saturating_sub(1));
    if rest == 0 {
        format!("{whole} {name}")
    } else {
        // `rest < 2^shift`, so this is below 100 and the product fits easily.
        let hundredths = (u128::from(rest) * 100) >> shift;
        format!("{whole}.{hundredths:02} {name}")
    }
}

/// Why a layout could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// A byte size that must be positive was zero.
    #[error("{what} is zero bytes; give a size such as 4GiB")]
    ZeroSize {
        /// Which size was zero.
        what: &'static str,
    },
    /// A count that must be positive was zero.
    #[error("{what} is zero; give a count of at least 1")]
    ZeroCount {
        /// Which count was zero.
        what: &'static str,
    },
    /// Rounding or combining sizes would not fit in a 64-bit byte count.
    #[error(
        "{what} of {bytes} bytes is too large: making it a multiple of {page} bytes overflows a 64-bit byte count; use a smaller size"
    )]
    Overflow {
        /// Which size overflowed.
        what: &'static str,
        /// The size being rounded or combined.
        bytes: u64,
        /// The page size (or other factor) it had to become a multiple of.
        page: u64,
    },
    /// A page size was not a power of two.
    #[error("page size {bytes} bytes is not a power of two; use 4KiB, 2MiB or 1GiB")]
    NotPowerOfTwo {
        /// The rejected page size.
        bytes: u64,
    },
    /// A page size was a power of two outside 4 KiB..=16 GiB.
    #[error(
        "page size {bytes} bytes is outside the supported range of 4KiB to 16GiB; use 4KiB, 2MiB or 1GiB"
    )]
    PageSizeOutOfRange {
        /// The rejected page size.
        bytes: u64,
    },
    /// A size that must be whole pages was not.
    #[error(
        "{what} of {bytes} bytes is not a multiple of the {} page size; round it up to whole pages first (see round_to_page)",
        format_bytes(*.page)
    )]
    NotAligned {
        /// Which size was misaligned.
        what: &'static str,
        /// The misaligned size.
        bytes: u64,
        /// The page size it must be a multiple of.
        page: u64,
    },
    /// More segments were requested than the mapping has pages.
    #[error(
        "cannot split {pages} pages into {count} segments; use at most {pages} segments or a smaller page size"
    )]
    TooManySegments {
        /// The requested number of segments.
        count: u32,
        /// The number of pages in the mapping.
        pages: u64,
    },
    /// `lcm(page, block)` is larger than the device's `max_mr_size`.
    #[error(
        "a block/page unit of {unit} bytes is larger than the device's max_mr_size of {limit} bytes and cannot be registered; use a smaller block or page size"
    )]
    UnitExceedsLimit {
        /// `lcm(page, block)` in bytes.
        unit: u64,
        /// The device's `max_mr_size` in bytes.
        limit: u64,
    },
}

/// The IEC unit name for `1024^index` bytes.
const fn unit_name(index: u32) -> &'static str {
    match index {
        0 => "B",
        1 => "KiB",
        2 => "MiB",
        3 => "GiB",
        4 => "TiB",
        5 => "PiB",
        _ => "EiB",
    }
}

/// Rejects a zero byte size with [`LayoutError::ZeroSize`].
fn non_zero_size(bytes: u64, what: &'static str) -> Result<NonZeroU64, LayoutError> {
    NonZeroU64::new(bytes).ok_or(LayoutError::ZeroSize { what })
}

/// Rejects a mapping size that is not whole pages.
fn check_aligned(mapped: u64, page: PageSize) -> Result<(), LayoutError> {
    if page.is_aligned(mapped) {
        Ok(())
    } else {
        Err(LayoutError::NotAligned {
            what: "mapped size",
            bytes: mapped,
            page: page.get(),
        })
    }
}

/// Checks `mapped` and returns `lcm(page, block)`, the granularity of chunk
/// boundaries that are page-aligned and never split a block.
fn block_unit(mapped: u64, page: PageSize, block: NonZeroU64) -> Result<NonZeroU64, LayoutError> {
    check_aligned(mapped, page)?;
    lcm_non_zero(page.non_zero(), block).ok_or(LayoutError::Overflow {
        what: "block size",
        bytes: block.get(),
        page: page.get(),
    })
}

/// The greatest common divisor (Euclid).
fn gcd(a: NonZeroU64, b: NonZeroU64) -> NonZeroU64 {
    let (mut x, mut y) = (a.get(), b);
    loop {
        match NonZeroU64::new(x % y) {
            None => return y,
            Some(r) => {
                x = y.get();
                y = r;
            }
        }
    }
}

/// The least common multiple, or `None` when it does not fit in a `u64`.
fn lcm_non_zero(a: NonZeroU64, b: NonZeroU64) -> Option<NonZeroU64> {
    NonZeroU64::new(a.get() / gcd(a, b)).and_then(|reduced| reduced.checked_mul(b))
}

/// `floor(limit / unit) * unit`, or `unit` when that is zero.
fn whole_units(limit: NonZeroU64, unit: NonZeroU64) -> NonZeroU64 {
    // `limit % unit <= limit`, so the subtraction never saturates.
    let floored = limit.get().saturating_sub(limit.get() % unit);
    NonZeroU64::new(floored).unwrap_or(unit)
}

/// How many extents to reserve up front for a list of `n`.
fn capacity_hint(n: u64) -> usize {
    usize::try_from(n.min(CAPACITY_HINT_LIMIT)).unwrap_or(0)
}

/// Splits the page-aligned `[0, mapped)` into exactly `n` extents whose page
/// counts differ by at most one, the extra pages going to the first ones.
fn even_split(mapped: u64, page: PageSize, n: NonZeroU32) -> Result<Vec<Extent>, LayoutError> {
    let overflow = || LayoutError::Overflow {
        what: "mapped size",
        bytes: mapped,
        page: page.get(),
    };
    let pages = mapped >> page.shift();
    let n = NonZeroU64::from(n);
    let base = pages / n;
    let extra = pages % n;
    let mut out = Vec::with_capacity(capacity_hint(n.get()));
    let mut offset = 0u64;
    for i in 0..n.get() {
        // The lengths sum to `mapped`, so none of these can overflow.
        let len_pages = base
            .checked_add(u64::from(i < extra))
            .ok_or_else(overflow)?;
        let len = len_pages.checked_mul(page.get()).ok_or_else(overflow)?;
        out.push(Extent { offset, len });
        offset = offset.checked_add(len).ok_or_else(overflow)?;
    }
    Ok(out)
}

/// Splits `[0, total)` into extents of `chunk` bytes, the last one holding
/// the remainder; `total == 0` gives an empty list.
fn split_fixed(total: u64, chunk: NonZeroU64) -> Vec<Extent> {
    let mut out = Vec::with_capacity(capacity_hint((total / chunk).saturating_add(1)));
    let mut offset = 0u64;
    while let Some(remaining) = total.checked_sub(offset).and_then(NonZeroU64::new) {
        let len = remaining.min(chunk).get();
        out.push(Extent { offset, len });
        // `offset + len <= total`, so this never saturates.
        offset = offset.saturating_add(len);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

    fn ps(bytes: u64) -> PageSize {
        PageSize::new(bytes).expect("test page size is valid")
    }

    fn ext(offset: u64, len: u64) -> Extent {
        Extent { offset, len }
    }

    /// Independent oracle: gcd in u128.
    fn gcd128(mut a: u128, mut b: u128) -> u128 {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    }

    /// Independent oracle: lcm in u128 (never overflows for u64 inputs).
    fn lcm128(a: u64, b: u64) -> u128 {
        let (a, b) = (u128::from(a), u128::from(b));
        a / gcd128(a, b) * b
    }

    /// Parses a `format_bytes` string into (hundredths or whole, scale, has decimals).
    fn parse_bytes(s: &str) -> Option<(u128, u128, bool)> {
        let (num, unit) = s.split_once(' ')?;
        let index = UNITS.iter().position(|u| *u == unit)?;
        let scale = 1u128 << (10 * index);
        match num.split_once('.') {
            Some((whole, frac)) if frac.len() == 2 => {
                let whole: u128 = whole.parse().ok()?;
                let frac: u128 = frac.parse().ok()?;
                Some((whole * 100 + frac, scale, true))
            }
            Some(_) => None,
            None => Some((num.parse().ok()?, scale, false)),
        }
    }

    /// Checks that `extents` are in order, contiguous from 0, and cover
    /// exactly `[0, total)`; empty extents only when `allow_empty`.
    fn check_tiling(
        extents: &[Extent],
        total: u64,
        allow_empty: bool,
    ) -> Result<(), TestCaseError> {
        let mut expected = 0u64;
        for (i, e) in extents.iter().enumerate() {
            prop_assert_eq!(
                e.offset,
                expected,
                "extent {} must start where the previous one ended (in order, contiguous, disjoint)",
                i
            );
            prop_assert!(
                e.offset.checked_add(e.len).is_some(),
                "extent {} end must not overflow u64",
                i
            );
            prop_assert!(
                allow_empty || !e.is_empty(),
                "extent {} must be non-empty",
                i
            );
            expected = e.end();
        }
        prop_assert_eq!(expected, total, "extents must cover exactly [0, total)");
        Ok(())
    }

    /// Checks `registration_chunks` output against its specification.
    fn check_registration(
        mapped: u64,
        page: PageSize,
        block: u64,
        cap: u64,
    ) -> Result<(), TestCaseError> {
        let result = registration_chunks(mapped, page, block, cap);
        let unit = lcm128(page.get(), block);
        let Ok(unit) = u64::try_from(unit) else {
            prop_assert!(
                matches!(result, Err(LayoutError::Overflow { what: "block size", bytes, page: p })
                    if bytes == block && p == page.get()),
                "lcm(page, block) overflowing u64 must be Err(Overflow), got {:?}",
                result
            );
            return Ok(());
        };
        let chunks = result.map_err(|e| TestCaseError::fail(format!("unexpected error {e}")))?;
        check_tiling(&chunks, mapped, false)?;
        let expected_chunk = (cap / unit * unit).max(unit);
        let last = chunks.len().saturating_sub(1);
        for (i, c) in chunks.iter().enumerate() {
            prop_assert!(
                c.len <= cap || c.len <= unit,
                "a chunk may exceed the cap only when it is at most one unit: {:?} cap {} unit {}",
                c,
                cap,
                unit
            );
            if i < last {
                prop_assert_eq!(
                    c.len,
                    expected_chunk,
                    "every chunk but the last is max(unit, floor(cap / unit) * unit)"
                );
                let boundary = c.end();
                prop_assert!(
                    boundary % unit == 0,
                    "interior boundary {} must be a multiple of lcm(page, block) = {}",
                    boundary,
                    unit
                );
                prop_assert!(
                    boundary % block == 0,
                    "interior boundary {} must never split a block of {}",
                    boundary,
                    block
                );
                prop_assert!(
                    page.is_aligned(boundary),
                    "interior boundary {} must be page-aligned",
                    boundary
                );
            } else {
                prop_assert!(
                    c.len <= expected_chunk,
                    "the last chunk holds the remainder, at most one full chunk"
                );
            }
        }
        Ok(())
    }

    /// Checks `mr_regions` output against its specification.
    fn check_mr(mapped: u64, page: PageSize, block: u64, max: u64) -> Result<(), TestCaseError> {
        let result = mr_regions(mapped, page, block, max);
        let unit = lcm128(page.get(), block);
        let Ok(unit) = u64::try_from(unit) else {
            prop_assert!(
                matches!(result, Err(LayoutError::Overflow { .. })),
                "lcm(page, block) overflowing u64 must be Err(Overflow), got {:?}",
                result
            );
            return Ok(());
        };
        if unit > max {
            prop_assert_eq!(
                result,
                Err(LayoutError::UnitExceedsLimit { unit, limit: max }),
                "unit > max_mr_size must be exactly Err(UnitExceedsLimit)"
            );
            return Ok(());
        }
        let regions =
            result.map_err(|e| TestCaseError::fail(format!("unit <= max must succeed: {e}")))?;
        check_tiling(&regions, mapped, false)?;
        let expected = max / unit * unit;
        let last = regions.len().saturating_sub(1);
        for (i, r) in regions.iter().enumerate() {
            prop_assert!(
                r.len <= max,
                "every region len must be <= max_mr_size: {:?} > {}",
                r,
                max
            );
            if i < last {
                prop_assert_eq!(
                    r.len,
                    expected,
                    "every region but the last is floor(max / unit) * unit"
                );
                prop_assert!(
                    r.end() % unit == 0 && r.end() % block == 0,
                    "interior boundary {} must be a multiple of unit {} and block {}",
                    r.end(),
                    unit,
                    block
                );
            }
        }
        Ok(())
    }

    fn any_page() -> impl Strategy<Value = PageSize> {
        (12u32..=34).prop_map(|s| ps(1 << s))
    }

    /// Blocks of the shape `k << j`: small odd factors times powers of two,
    /// so that lcm(page, block) ranges from one page to far above it.
    fn any_block() -> impl Strategy<Value = u64> {
        (1u64..=12, 0u32..=32).prop_map(|(k, j)| k << j)
    }

    /// A page and a logical size: either at most 4096 pages, or within 4096
    /// pages of the largest mappable size.
    fn page_and_logical() -> impl Strategy<Value = (PageSize, u64)> {
        any_page().prop_flat_map(|p| {
            let top = p.round_down(u64::MAX);
            let span = p.get() * 4096;
            (Just(p), prop_oneof![1..=span, (top - span)..=top])
        })
    }

    /// A page and a page-aligned mapping of at most `max_pages` pages, or
    /// within `max_pages` pages of the top of the address space.
    fn page_and_mapped(max_pages: u64) -> impl Strategy<Value = (PageSize, u64)> {
        any_page().prop_flat_map(move |p| {
            let top_pages = u64::MAX >> p.shift();
            (
                Just(p),
                prop_oneof![0..=max_pages, (top_pages - max_pages)..=top_pages]
                    .prop_map(move |pages| pages << p.shift()),
            )
        })
    }

    // ---- unit tests with exact values ----

    #[test]
    fn page_size_constants_have_documented_sizes_and_display() {
        assert_eq!(PageSize::BASE_4K.get(), 4096);
        assert_eq!(PageSize::HUGE_2M.get(), 2 * MIB);
        assert_eq!(PageSize::HUGE_1G.get(), GIB);
        assert_eq!(PageSize::BASE_4K.to_string(), "4 KiB");
        assert_eq!(PageSize::HUGE_2M.to_string(), "2 MiB");
        assert_eq!(PageSize::HUGE_1G.to_string(), "1 GiB");
        assert_eq!(ps(16 * GIB).to_string(), "16 GiB");
        assert_eq!(ps(64 * KIB).to_string(), "64 KiB");
        assert_eq!(format!("[{:>7}]", PageSize::BASE_4K), "[  4 KiB]");
    }

    #[test]
    fn page_size_new_rejects_non_powers_of_two_and_out_of_range_sizes() {
        assert!(matches!(
            PageSize::new(0),
            Err(LayoutError::NotPowerOfTwo { bytes: 0 })
        ));
        assert!(matches!(
            PageSize::new(3000),
            Err(LayoutError::NotPowerOfTwo { bytes: 3000 })
        ));
        assert!(matches!(
            PageSize::new(u64::MAX),
            Err(LayoutError::NotPowerOfTwo { bytes: u64::MAX })
        ));
        assert!(matches!(
            PageSize::new(2048),
            Err(LayoutError::PageSizeOutOfRange { bytes: 2048 })
        ));
        assert!(matches!(
            PageSize::new(32 * GIB),
            Err(LayoutError::PageSizeOutOfRange { .. })
        ));
        assert!(matches!(
            PageSize::new(1 << 63),
            Err(LayoutError::PageSizeOutOfRange { .. })
        ));
        assert_eq!(PageSize::new(4096), Ok(PageSize::BASE_4K));
        assert_eq!(PageSize::new(16 * GIB).map(PageSize::get), Ok(16 * GIB));
    }

    #[test]
    fn page_size_rounding_exact_values() {
        let p = PageSize::BASE_4K;
        assert_eq!(p.round_up(0), Ok(0));
        assert_eq!(p.round_up(1), Ok(4096));
        assert_eq!(p.round_up(4096), Ok(4096));
        assert_eq!(p.round_up(4097), Ok(8192));
        assert_eq!(p.round_up(u64::MAX - 4095), Ok(u64::MAX - 4095));
        assert!(matches!(
            p.round_up(u64::MAX - 4094),
            Err(LayoutError::Overflow { what: "size", bytes, page: 4096 }) if bytes == u64::MAX - 4094
        ));
        assert!(matches!(
            p.round_up(u64::MAX),
            Err(LayoutError::Overflow { .. })
        ));
        assert_eq!(p.round_down(4095), 0);
        assert_eq!(p.round_down(8191), 4096);
        assert_eq!(p.round_down(u64::MAX), u64::MAX - 4095);
        assert_eq!(p.pages(0), 0);
        assert_eq!(p.pages(1), 1);
        assert_eq!(p.pages(4096), 1);
        assert_eq!(p.pages(4097), 2);
        assert_eq!(p.pages(u64::MAX), 1 << 52);
        assert_eq!(ps(16 * GIB).pages(u64::MAX), 1 << 30);
        assert!(p.is_aligned(0));
        assert!(p.is_aligned(8192));
        assert!(!p.is_aligned(4095));
        assert!(!p.is_aligned(u64::MAX));
    }

    #[test]
    fn format_bytes_exact_strings() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1), "1 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1024), "1 KiB");
        assert_eq!(format_bytes(4096), "4 KiB");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(2 * MIB), "2 MiB");
        assert_eq!(format_bytes(384 * GIB), "384 GiB");
        assert_eq!(format_bytes(3 * GIB / 2), "1.50 GiB");
        assert_eq!(format_bytes(GIB + 1), "1.00 GiB");
        assert_eq!(format_bytes(GIB - 1), "1023.99 MiB");
        assert_eq!(format_bytes(1 << 40), "1 TiB");
        assert_eq!(format_bytes(1 << 50), "1 PiB");
        assert_eq!(format_bytes(1 << 60), "1 EiB");
        assert_eq!(format_bytes(u64::MAX), "15.99 EiB");
    }

    #[test]
    fn extent_end_and_is_empty_exact_values() {
        assert_eq!(ext(4096, 8192).end(), 12288);
        assert!(!ext(4096, 8192).is_empty());
        assert!(ext(4096, 0).is_empty());
        assert_eq!(ext(u64::MAX, 0).end(), u64::MAX);
        // A hand-built extent past u64::MAX saturates instead of wrapping.
        assert_eq!(ext(u64::MAX, 1).end(), u64::MAX);
    }

    #[test]
    fn round_to_page_exact_values_and_errors() {
        let m = round_to_page(5000, PageSize::BASE_4K).expect("fits");
        assert_eq!((m.logical(), m.mapped(), m.pages()), (5000, 8192, 2));
        assert_eq!(m.page(), PageSize::BASE_4K);
        let m = round_to_page(384 * GIB, PageSize::HUGE_1G).expect("fits");
        assert_eq!((m.mapped(), m.pages()), (384 * GIB, 384));
        let m = round_to_page(1, PageSize::HUGE_1G).expect("fits");
        assert_eq!((m.mapped(), m.pages()), (GIB, 1));
        assert!(matches!(
            round_to_page(0, PageSize::HUGE_2M),
            Err(LayoutError::ZeroSize {
                what: "logical size"
            })
        ));
        assert!(matches!(
            round_to_page(u64::MAX, PageSize::HUGE_2M),
            Err(LayoutError::Overflow { what: "logical size", bytes: u64::MAX, page })
                if page == 2 * MIB
        ));
    }

    #[test]
    fn segments_by_count_exact_small_case() {
        let m = round_to_page(10 * 4096, PageSize::BASE_4K).expect("fits");
        assert_eq!(
            segments(&m, SegmentSpec::Count(3)),
            Ok(vec![
                ext(0, 4 * 4096),
                ext(4 * 4096, 3 * 4096),
                ext(7 * 4096, 3 * 4096)
            ])
        );
        assert_eq!(
            segments(&m, SegmentSpec::Count(1)),
            Ok(vec![ext(0, 10 * 4096)])
        );
        assert_eq!(
            segments(&m, SegmentSpec::Count(10)).map(|v| v.len()),
            Ok(10)
        );
        assert!(matches!(
            segments(&m, SegmentSpec::Count(11)),
            Err(LayoutError::TooManySegments {
                count: 11,
                pages: 10
            })
        ));
        assert!(matches!(
            segments(&m, SegmentSpec::Count(0)),
            Err(LayoutError::ZeroCount {
                what: "segment count"
            })
        ));
    }

    #[test]
    fn segments_by_size_exact_small_case() {
        let m = round_to_page(10 * GIB, PageSize::HUGE_1G).expect("fits");
        assert_eq!(
            segments(&m, SegmentSpec::Size(4 * GIB)),
            Ok(vec![
                ext(0, 4 * GIB),
                ext(4 * GIB, 4 * GIB),
                ext(8 * GIB, 2 * GIB)
            ])
        );
        // 3.5 GiB rounds up to 4 GiB segments.
        assert_eq!(
            segments(&m, SegmentSpec::Size(7 * GIB / 2)),
            Ok(vec![
                ext(0, 4 * GIB),
                ext(4 * GIB, 4 * GIB),
                ext(8 * GIB, 2 * GIB)
            ])
        );
        assert_eq!(
            segments(&m, SegmentSpec::Size(64 * GIB)),
            Ok(vec![ext(0, 10 * GIB)])
        );
        assert!(matches!(
            segments(&m, SegmentSpec::Size(0)),
            Err(LayoutError::ZeroSize {
                what: "segment size"
            })
        ));
        assert!(matches!(
            segments(&m, SegmentSpec::Size(u64::MAX)),
            Err(LayoutError::Overflow { what: "segment size", bytes: u64::MAX, page }) if page == GIB
        ));
    }

    #[test]
    fn shards_exact_small_cases_including_empty_shards() {
        let p = PageSize::BASE_4K;
        assert_eq!(
            shards(5 * 4096, p, 2),
            Ok(vec![ext(0, 3 * 4096), ext(3 * 4096, 2 * 4096)])
        );
        assert_eq!(
            shards(2 * 4096, p, 4),
            Ok(vec![
                ext(0, 4096),
                ext(4096, 4096),
                ext(8192, 0),
                ext(8192, 0)
            ])
        );
        assert_eq!(shards(0, p, 3), Ok(vec![ext(0, 0); 3]));
        assert!(matches!(
            shards(4096, p, 0),
            Err(LayoutError::ZeroCount {
                what: "shard count"
            })
        ));
        assert!(matches!(
            shards(4097, p, 2),
            Err(LayoutError::NotAligned {
                what: "mapped size",
                bytes: 4097,
                page: 4096
            })
        ));
        let top = p.round_down(u64::MAX);
        let s = shards(top, p, 2).expect("fits");
        assert_eq!(s, vec![ext(0, 1 << 63), ext(1 << 63, (1 << 63) - 4096)]);
    }

    #[test]
    fn registration_chunks_exact_small_cases() {
        let p = PageSize::HUGE_2M;
        // unit = lcm(2 MiB, 3 MiB) = 6 MiB
        assert_eq!(
            registration_chunks(10 * MIB, p, 3 * MIB, 13 * MIB),
            Ok(vec![ext(0, 10 * MIB)])
        );
        assert_eq!(
            registration_chunks(10 * MIB, p, 3 * MIB, 4 * MIB),
            Ok(vec![ext(0, 6 * MIB), ext(6 * MIB, 4 * MIB)])
        );
        assert_eq!(
            registration_chunks(30 * MIB, p, 3 * MIB, 13 * MIB),
            Ok(vec![
                ext(0, 12 * MIB),
                ext(12 * MIB, 12 * MIB),
                ext(24 * MIB, 6 * MIB)
            ])
        );
        // Blocks smaller than a page: unit is the page.
        assert_eq!(
            registration_chunks(8 * MIB, p, 64 * KIB, 5 * MIB),
            Ok(vec![ext(0, 4 * MIB), ext(4 * MIB, 4 * MIB)])
        );
        assert_eq!(registration_chunks(0, p, 3 * MIB, 4 * MIB), Ok(vec![]));
    }

    /// Engines' copy units need not be multiples of 4 KiB: vLLM's 61 × 512 B
    /// on 4 KiB pages cuts on lcm = 61 × 4 KiB, SGLang's 300 MiB pages on 2 MiB
    /// pages on 300 MiB, and a 1-byte block on the page.
    #[test]
    fn engine_blocks_that_are_not_page_multiples_cut_on_their_lcm_with_the_page() {
        let vllm = 61 * 512;
        let unit = 61 * 4096;
        assert_eq!(lcm(4096, vllm), Ok(unit));
        let p = PageSize::BASE_4K;
        let chunks = registration_chunks(16 * MIB, p, vllm, MIB).unwrap();
        // floor(1 MiB / 244 KiB) = 4 units a chunk.
        assert_eq!(chunks[0], ext(0, 4 * unit));
        assert_eq!(chunks.len(), (16 * MIB).div_ceil(4 * unit) as usize);
        let regions = mr_regions(16 * MIB, p, vllm, 3 * MIB).unwrap();
        assert_eq!(regions[0], ext(0, 12 * unit));
        for e in chunks
            .iter()
            .rev()
            .skip(1)
            .chain(regions.iter().rev().skip(1))
        {
            let b = e.end();
            assert!(
                b % unit == 0 && b % vllm == 0 && b % 4096 == 0,
                "interior boundary {b} of {e:?}"
            );
        }
        assert_eq!(chunks.last().unwrap().end(), 16 * MIB);
        assert_eq!(regions.last().unwrap().end(), 16 * MIB);
        // A unit above the cap is registered whole.
        assert_eq!(
            registration_chunks(2 * unit, p, vllm, 4096),
            Ok(vec![ext(0, unit), ext(unit, unit)])
        );

        let sglang = 300 * MIB;
        let p = PageSize::HUGE_2M;
        assert_eq!(lcm(p.get(), sglang), Ok(sglang));
        assert_eq!(
            registration_chunks(1200 * MIB, p, sglang, GIB),
            Ok(vec![ext(0, 900 * MIB), ext(900 * MIB, 300 * MIB)])
        );
        assert_eq!(
            mr_regions(1000 * MIB, p, sglang, 700 * MIB),
            Ok(vec![ext(0, 600 * MIB), ext(600 * MIB, 400 * MIB)])
        );

        // One byte: the unit is the page.
        assert_eq!(
            registration_chunks(5 * 4096, PageSize::BASE_4K, 1, 8192),
            Ok(vec![ext(0, 8192), ext(8192, 8192), ext(16384, 4096)])
        );
    }

    #[test]
    fn registration_chunks_errors() {
        let p = PageSize::HUGE_2M;
        assert!(matches!(
            registration_chunks(2 * MIB, p, 0, GIB),
            Err(LayoutError::ZeroSize { what: "block size" })
        ));
        assert!(matches!(
            registration_chunks(2 * MIB, p, MIB, 0),
            Err(LayoutError::ZeroSize {
                what: "registration cap"
            })
        ));
        assert!(matches!(
            registration_chunks(MIB, p, MIB, GIB),
            Err(LayoutError::NotAligned {
                what: "mapped size",
                ..
            })
        ));
        let odd = u64::MAX;
        assert!(matches!(
            registration_chunks(0, p, odd, GIB),
            Err(LayoutError::Overflow { what: "block size", bytes: u64::MAX, page }) if page == 2 * MIB
        ));
    }

    #[test]
    fn mr_regions_exact_small_cases_and_errors() {
        let p = PageSize::HUGE_2M;
        assert_eq!(
            mr_regions(30 * MIB, p, 3 * MIB, 13 * MIB),
            Ok(vec![
                ext(0, 12 * MIB),
                ext(12 * MIB, 12 * MIB),
                ext(24 * MIB, 6 * MIB)
            ])
        );
        assert_eq!(
            mr_regions(10 * MIB, p, 3 * MIB, 6 * MIB),
            Ok(vec![ext(0, 6 * MIB), ext(6 * MIB, 4 * MIB)])
        );
        assert_eq!(mr_regions(0, p, 3 * MIB, 6 * MIB), Ok(vec![]));
        assert!(matches!(
            mr_regions(10 * MIB, p, 3 * MIB, 4 * MIB),
            Err(LayoutError::UnitExceedsLimit { unit, limit }) if unit == 6 * MIB && limit == 4 * MIB
        ));
        assert!(matches!(
            mr_regions(2 * MIB, p, 0, GIB),
            Err(LayoutError::ZeroSize { what: "block size" })
        ));
        assert!(matches!(
            mr_regions(2 * MIB, p, MIB, 0),
            Err(LayoutError::ZeroSize {
                what: "max_mr_size"
            })
        ));
        assert!(matches!(
            mr_regions(3 * MIB, p, MIB, GIB),
            Err(LayoutError::NotAligned { .. })
        ));
        assert!(matches!(
            mr_regions(0, p, u64::MAX, u64::MAX),
            Err(LayoutError::Overflow {
                what: "block size",
                ..
            })
        ));
    }

    #[test]
    fn lcm_exact_values_and_errors() {
        assert_eq!(lcm(4, 6), Ok(12));
        assert_eq!(lcm(2 * MIB, 3 * MIB), Ok(6 * MIB));
        assert_eq!(lcm(4096, 64 * KIB), Ok(64 * KIB));
        assert_eq!(lcm(1, u64::MAX), Ok(u64::MAX));
        assert_eq!(lcm(u64::MAX, u64::MAX), Ok(u64::MAX));
        assert!(matches!(
            lcm(0, 5),
            Err(LayoutError::ZeroSize {
                what: "first lcm operand"
            })
        ));
        assert!(matches!(
            lcm(5, 0),
            Err(LayoutError::ZeroSize {
                what: "second lcm operand"
            })
        ));
        assert!(matches!(
            lcm(u64::MAX, 2),
            Err(LayoutError::Overflow {
                what: "least common multiple",
                bytes: u64::MAX,
                page: 2
            })
        ));
        assert_eq!(lcm(1 << 32, (1 << 32) - 1), Ok(u64::MAX - (1 << 32) + 1));
    }

    #[test]
    fn error_messages_are_lowercase_fragments_that_mention_the_values() {
        let errors = [
            LayoutError::ZeroSize { what: "block size" },
            LayoutError::ZeroCount {
                what: "shard count",
            },
            LayoutError::Overflow {
                what: "logical size",
                bytes: u64::MAX,
                page: 4096,
            },
            LayoutError::NotPowerOfTwo { bytes: 3000 },
            LayoutError::PageSizeOutOfRange { bytes: 2048 },
            LayoutError::NotAligned {
                what: "mapped size",
                bytes: 5000,
                page: 4096,
            },
            LayoutError::TooManySegments {
                count: 11,
                pages: 10,
            },
            LayoutError::UnitExceedsLimit {
                unit: 6 * MIB,
                limit: 4 * MIB,
            },
        ];
        for e in &errors {
            let msg = e.to_string();
            let first = msg.chars().next().unwrap_or('X');
            assert!(
                first.is_ascii_lowercase(),
                "message must start lowercase: {msg}"
            );
            assert!(
                !msg.ends_with('.'),
                "message must not end with a period: {msg}"
            );
            assert!(msg.contains("; "), "message must say how to fix it: {msg}");
        }
        let overflow = errors[2].to_string();
        assert!(overflow.contains(&u64::MAX.to_string()) && overflow.contains("4096"));
        assert!(overflow.contains("too large"));
        assert_eq!(
            errors[5].to_string(),
            "mapped size of 5000 bytes is not a multiple of the 4 KiB page size; round it up to whole pages first (see round_to_page)"
        );
        let unit = errors[7].to_string();
        assert!(
            unit.contains("6291456") && unit.contains("4194304") && unit.contains("max_mr_size")
        );
    }

    // ---- property tests ----

    proptest! {
        #[test]
        fn page_size_new_accepts_exactly_powers_of_two_from_4k_to_16g(
            bytes in prop_oneof![
                any::<u64>(),
                (0u32..64).prop_map(|s| 1u64 << s),
                (0u32..64).prop_map(|s| (1u64 << s).wrapping_add(1)),
            ]
        ) {
            let in_range = (4 * KIB..=16 * GIB).contains(&bytes);
            match PageSize::new(bytes) {
                Ok(p) => prop_assert!(
                    p.get() == bytes && bytes.is_power_of_two() && in_range,
                    "new accepts only powers of two in 4KiB..=16GiB and get returns them: {}", bytes
                ),
                Err(LayoutError::NotPowerOfTwo { bytes: b }) => prop_assert!(
                    b == bytes && !bytes.is_power_of_two(),
                    "NotPowerOfTwo only for non powers of two: {}", bytes
                ),
                Err(LayoutError::PageSizeOutOfRange { bytes: b }) => prop_assert!(
                    b == bytes && bytes.is_power_of_two() && !in_range,
                    "PageSizeOutOfRange only for powers of two outside the range: {}", bytes
                ),
                Err(other) => prop_assert!(false, "unexpected error {:?}", other),
            }
        }

        #[test]
        fn page_size_round_up_is_least_aligned_value_at_or_above_or_overflow_error(
            p in any_page(),
            v in prop_oneof![any::<u64>(), 0u64..=1 << 40, (u64::MAX - (1 << 36))..=u64::MAX],
        ) {
            let page = u128::from(p.get());
            let oracle = u128::from(v).div_ceil(page) * page;
            match p.round_up(v) {
                Ok(r) => prop_assert!(
                    u128::from(r) == oracle && r >= v && r - v < p.get() && p.is_aligned(r),
                    "round_up(v) is the least page multiple >= v: v {} r {}", v, r
                ),
                Err(e) => prop_assert!(
                    oracle > u128::from(u64::MAX)
                        && matches!(e, LayoutError::Overflow { bytes, page, .. } if bytes == v && page == p.get()),
                    "round_up fails with Overflow exactly when the result exceeds u64::MAX: v {} {:?}", v, e
                ),
            }
        }

        #[test]
        fn page_size_round_down_is_greatest_aligned_value_at_or_below(
            p in any_page(),
            v in prop_oneof![any::<u64>(), 0u64..=1 << 40, (u64::MAX - (1 << 36))..=u64::MAX],
        ) {
            let r = p.round_down(v);
            prop_assert!(
                r <= v && v - r < p.get() && p.is_aligned(r),
                "round_down(v) is the greatest page multiple <= v: v {} r {}", v, r
            );
        }

        #[test]
        fn page_size_pages_is_ceil_division_and_never_overflows(
            p in any_page(),
            v in prop_oneof![any::<u64>(), 0u64..=1 << 40, (u64::MAX - (1 << 36))..=u64::MAX],
        ) {
            let oracle = u128::from(v).div_ceil(u128::from(p.get()));
            prop_assert_eq!(u128::from(p.pages(v)), oracle, "pages(v) == ceil(v / page)");
        }

        #[test]
        fn page_size_is_aligned_iff_value_is_a_multiple_of_the_page(
            p in any_page(),
            v in prop_oneof![any::<u64>(), (0u64..=1 << 20).prop_map(|k| k << 12)],
        ) {
            prop_assert_eq!(p.is_aligned(v), v % p.get() == 0, "is_aligned(v) iff v % page == 0");
        }

        #[test]
        fn page_size_get_round_trips_and_display_is_its_exact_iec_size(p in any_page()) {
            prop_assert_eq!(PageSize::new(p.get()), Ok(p), "new(get()) round-trips");
            let shown = p.to_string();
            let parsed = parse_bytes(&shown);
            prop_assert!(
                matches!(parsed, Some((whole, scale, false)) if whole * scale == u128::from(p.get()) && whole < 1024),
                "Display of a page size is its exact size in the largest unit: {}", shown
            );
        }

        #[test]
        fn format_bytes_is_exact_in_largest_unit_or_truncated_to_hundredths(
            b in prop_oneof![
                any::<u64>(),
                0u64..=1 << 21,
                (1u64..=1023, 0u32..=6).prop_map(|(k, i)| (k << (10 * i)).max(1)),
            ]
        ) {
            let shown = format_bytes(b);
            let parsed = parse_bytes(&shown);
            prop_assert!(parsed.is_some(), "format_bytes output must be '<number> <IEC unit>': {}", shown);
            let (value, scale, decimals) = parsed.unwrap_or_default();
            let b128 = u128::from(b);
            if decimals {
                prop_assert!(
                    b128 % scale != 0 && value * scale <= b128 * 100 && b128 * 100 < (value + 1) * scale,
                    "inexact sizes show the value truncated to hundredths: {} -> {}", b, shown
                );
                prop_assert!((100..102_400).contains(&value), "inexact sizes use the largest unit: {}", shown);
            } else {
                prop_assert_eq!(value * scale, b128, "exact sizes are rendered exactly: {}", shown);
                prop_assert!(
                    value < 1024 && (value >= 1 || b == 0),
                    "exact sizes use the largest unit: {}", shown
                );
            }
        }

        #[test]
        fn extent_end_is_offset_plus_len_and_empty_iff_len_is_zero(
            (offset, len) in any::<u64>().prop_flat_map(|o| (Just(o), prop_oneof![Just(0), 0..=u64::MAX - o]))
        ) {
            let e = ext(offset, len);
            prop_assert_eq!(e.end(), offset + len, "end() == offset + len");
            prop_assert_eq!(e.is_empty(), len == 0, "is_empty() iff len == 0");
        }

        #[test]
        fn round_to_page_maps_least_page_multiple_at_or_above_logical(
            p in any_page(),
            logical in prop_oneof![Just(0u64), any::<u64>(), 1u64..=1 << 40, (u64::MAX - (1 << 36))..=u64::MAX],
        ) {
            let result = round_to_page(logical, p);
            if logical == 0 {
                prop_assert!(matches!(result, Err(LayoutError::ZeroSize { .. })), "zero logical size is ZeroSize");
            } else if logical > p.round_down(u64::MAX) {
                prop_assert!(
                    matches!(result, Err(LayoutError::Overflow { bytes, page, .. }) if bytes == logical && page == p.get()),
                    "logical above the last page boundary below u64::MAX is Err(Overflow): {:?}", result
                );
            } else {
                let m = result.map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(
                    m.mapped() >= logical && m.mapped() - logical < p.get() && m.mapped() % p.get() == 0,
                    "mapped >= logical, mapped - logical < page, mapped % page == 0: {:?}", m
                );
                prop_assert!(
                    m.logical() == logical && m.page() == p && m.pages() == m.mapped() / p.get(),
                    "getters report logical, page and pages = mapped / page: {:?}", m
                );
            }
        }

        #[test]
        fn round_to_page_overflow_near_u64_max_is_an_error(
            (p, logical) in any_page().prop_flat_map(|p| (Just(p), (u64::MAX - p.get() + 2)..=u64::MAX))
        ) {
            prop_assert!(
                matches!(
                    round_to_page(logical, p),
                    Err(LayoutError::Overflow { what: "logical size", bytes, page }) if bytes == logical && page == p.get()
                ),
                "rounding a size within one page of u64::MAX overflows to Err(Overflow), never wraps"
            );
        }

        #[test]
        fn segments_by_count_are_exactly_n_even_contiguous_aligned_and_nonempty(
            (p, logical, n) in page_and_logical().prop_flat_map(|(p, logical)| {
                let max_n = u32::try_from(p.pages(logical).min(2048)).unwrap_or(1);
                (Just(p), Just(logical), 1..=max_n)
            })
        ) {
            let m = round_to_page(logical, p).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let segs = segments(&m, SegmentSpec::Count(n)).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(segs.len(), n as usize, "Count(n) gives exactly n segments");
            check_tiling(&segs, m.mapped(), false)?;
            let (base, extra) = (m.pages() / u64::from(n), m.pages() % u64::from(n));
            for (i, s) in segs.iter().enumerate() {
                prop_assert!(p.is_aligned(s.offset) && p.is_aligned(s.len), "segment {} is page-aligned", i);
                let want = (base + u64::from((i as u64) < extra)) * p.get();
                prop_assert_eq!(s.len, want, "segments are even: the first pages % n get one extra page");
            }
        }

        #[test]
        fn segments_by_count_fail_exactly_when_n_is_zero_or_exceeds_the_page_count(
            p in any_page(),
            pages in 1u64..=512,
            n in prop_oneof![0u32..=600, any::<u32>()],
        ) {
            let m = round_to_page(pages * p.get(), p).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let result = segments(&m, SegmentSpec::Count(n));
            if n == 0 {
                prop_assert!(matches!(result, Err(LayoutError::ZeroCount { .. })), "Count(0) is ZeroCount");
            } else if u64::from(n) > pages {
                prop_assert_eq!(
                    result,
                    Err(LayoutError::TooManySegments { count: n, pages }),
                    "Count(n) with n > pages is TooManySegments"
                );
            } else {
                prop_assert_eq!(result.map(|v| v.len()), Ok(n as usize), "Count(n) with 1 <= n <= pages succeeds");
            }
        }

        #[test]
        fn segments_by_size_are_equal_page_rounded_with_the_remainder_last(
            (p, logical, s) in page_and_logical().prop_flat_map(|(p, logical)| {
                let mapped = p.round_up(logical).unwrap_or(0);
                let lo = (mapped >> 12).max(1);
                (Just(p), Just(logical), prop_oneof![lo..=mapped.saturating_mul(2), lo..=lo.saturating_mul(4)])
            })
        ) {
            let m = round_to_page(logical, p).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let segs = segments(&m, SegmentSpec::Size(s)).map_err(|e| TestCaseError::fail(e.to_string()))?;
            check_tiling(&segs, m.mapped(), false)?;
            let seg = u64::try_from(u128::from(s).div_ceil(u128::from(p.get())) * u128::from(p.get()))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let count = m.mapped().div_ceil(seg);
            prop_assert_eq!(segs.len() as u64, count, "Size(s) gives ceil(mapped / round_up(s)) segments");
            for (i, sg) in segs.iter().enumerate() {
                prop_assert!(p.is_aligned(sg.offset) && p.is_aligned(sg.len), "segment {} is page-aligned", i);
                if (i as u64) + 1 < count {
                    prop_assert_eq!(sg.len, seg, "every segment but the last has length round_up(s)");
                } else {
                    prop_assert!(sg.len <= seg, "the last segment holds the remainder");
                }
            }
        }

        #[test]
        fn segments_by_size_overflow_near_u64_max_is_an_error(
            (p, s) in any_page().prop_flat_map(|p| (Just(p), (u64::MAX - p.get() + 2)..=u64::MAX)),
            logical in 1u64..=1 << 40,
        ) {
            let m = round_to_page(logical, p).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(
                matches!(
                    segments(&m, SegmentSpec::Size(s)),
                    Err(LayoutError::Overflow { what: "segment size", bytes, .. }) if bytes == s
                ),
                "a segment size that overflows when rounded up is Err(Overflow), never wraps"
            );
        }

        #[test]
        fn shards_are_exactly_n_disjoint_page_aligned_even_and_cover_the_mapping(
            (p, mapped) in page_and_mapped(5000),
            n in 1u32..=3000,
        ) {
            let s = shards(mapped, p, n).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(s.len(), n as usize, "shards gives exactly n extents");
            check_tiling(&s, mapped, true)?;
            let pages = mapped / p.get();
            let (base, extra) = (pages / u64::from(n), pages % u64::from(n));
            let (mut min, mut max) = (u64::MAX, 0);
            for (i, e) in s.iter().enumerate() {
                prop_assert!(p.is_aligned(e.offset) && p.is_aligned(e.len), "shard {} is page-aligned", i);
                let want = (base + u64::from((i as u64) < extra)) * p.get();
                prop_assert_eq!(e.len, want, "the first pages % n shards get the extra page");
                (min, max) = (min.min(e.len), max.max(e.len));
            }
            prop_assert!(max - min <= p.get(), "shard lengths differ by at most one page");
        }

        #[test]
        fn shards_reject_unaligned_mappings_and_zero_counts(
            p in any_page(),
            mapped in any::<u64>(),
            n in prop_oneof![Just(0u32), 1u32..=4],
        ) {
            let result = shards(mapped, p, n);
            if p.is_aligned(mapped) {
                prop_assert!(n == 0 || result.is_ok(), "an aligned mapping with n >= 1 succeeds");
            } else {
                prop_assert!(
                    matches!(result, Err(LayoutError::NotAligned { what: "mapped size", bytes, page })
                        if bytes == mapped && page == p.get()),
                    "an unaligned mapping is NotAligned: {:?}", result
                );
            }
            prop_assert!(
                matches!(shards(p.round_down(mapped), p, 0), Err(LayoutError::ZeroCount { what: "shard count" })),
                "n == 0 with an aligned mapping is ZeroCount"
            );
        }

        #[test]
        fn registration_chunk_boundaries_are_unit_multiples_never_split_blocks_and_respect_cap(
            (p, mapped) in page_and_mapped(4096).prop_filter("small mappings", |(p, m)| *m <= p.get() * 4096),
            block in any_block(),
            cap in prop_oneof![1u64..=1 << 20, 1u64..=1 << 44, any::<u64>()],
        ) {
            check_registration(mapped, p, block, cap)?;
        }

        #[test]
        fn registration_chunks_near_u64_max_are_exact_and_do_not_overflow(
            (p, mapped) in page_and_mapped(4096),
            block in prop_oneof![any_block(), 1u64..=u64::MAX],
            cap in (u64::MAX >> 10)..=u64::MAX,
        ) {
            check_registration(mapped, p, block, cap)?;
        }

        #[test]
        fn registration_chunks_fail_with_overflow_exactly_when_lcm_of_page_and_block_overflows(
            p in (31u32..=34).prop_map(|s| ps(1 << s)),
            block in prop_oneof![(1u64 << 31..=u64::MAX).prop_map(|b| b | 1), any::<u64>().prop_map(|b| b.max(1))],
            cap in 1u64..=u64::MAX,
        ) {
            let result = registration_chunks(0, p, block, cap);
            if lcm128(p.get(), block) > u128::from(u64::MAX) {
                prop_assert!(
                    matches!(result, Err(LayoutError::Overflow { what: "block size", bytes, .. }) if bytes == block),
                    "lcm(page, block) overflowing u64 is Err(Overflow), never a wrap: {:?}", result
                );
            } else {
                prop_assert_eq!(result, Ok(vec![]), "a zero mapping with a representable unit gives no chunks");
            }
        }

        #[test]
        fn mr_regions_fit_max_mr_size_or_fail_exactly_when_unit_exceeds_it(
            (p, mapped) in page_and_mapped(4096).prop_filter("small mappings", |(p, m)| *m <= p.get() * 4096),
            block in any_block(),
            max in prop_oneof![1u64..=1 << 24, 1u64..=1 << 40, any::<u64>().prop_map(|m| m.max(1))],
        ) {
            check_mr(mapped, p, block, max)?;
        }

        #[test]
        fn mr_regions_near_u64_max_fit_max_mr_size_or_fail_exactly_when_unit_exceeds_it(
            (p, mapped) in page_and_mapped(4096),
            block in prop_oneof![any_block(), 1u64..=u64::MAX],
            max in (u64::MAX >> 10)..=u64::MAX,
        ) {
            check_mr(mapped, p, block, max)?;
        }

        #[test]
        fn any_positive_block_cuts_on_multiples_of_its_lcm_with_the_page(
            block in 1u64..=10_000_000,
            p in prop_oneof![Just(PageSize::BASE_4K), Just(PageSize::HUGE_2M)],
            units in 1u64..=40,
            cap in 1u64..=1 << 32,
        ) {
            let unit = u64::try_from(lcm128(p.get(), block))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(lcm(p.get(), block), Ok(unit));
            // A mapping of a few units, plus a part of one when that is whole pages.
            let mapped = units * unit + p.round_down(unit / 2);
            let chunks = registration_chunks(mapped, p, block, cap)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let regions = mr_regions(mapped, p, block, cap.max(unit))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            for list in [&chunks, &regions] {
                check_tiling(list, mapped, false)?;
                for e in &list[..list.len() - 1] {
                    let b = e.end();
                    prop_assert!(
                        b % unit == 0 && b % block == 0 && p.is_aligned(b),
                        "interior boundary {} of {:?} must be a multiple of lcm({}, {}) = {}, of the block and of the page",
                        b, e, p.get(), block, unit
                    );
                }
            }
        }

        #[test]
        fn lcm_is_divisible_by_both_and_least_or_overflow_error(
            a in prop_oneof![0u64..=1 << 20, any::<u64>(), (1u64..=12, 0u32..=60).prop_map(|(k, j)| k << j)],
            b in prop_oneof![0u64..=1 << 20, any::<u64>(), (1u64..=12, 0u32..=60).prop_map(|(k, j)| k << j)],
        ) {
            let result = lcm(a, b);
            if a == 0 || b == 0 {
                prop_assert!(matches!(result, Err(LayoutError::ZeroSize { .. })), "a zero operand is ZeroSize");
                return Ok(());
            }
            let oracle = lcm128(a, b);
            match result {
                Ok(l) => {
                    prop_assert!(l % a == 0 && l % b == 0, "lcm(a, b) is divisible by both a and b");
                    prop_assert_eq!(u128::from(l), oracle, "lcm(a, b) is the least common multiple");
                }
                Err(e) => prop_assert!(
                    oracle > u128::from(u64::MAX)
                        && matches!(e, LayoutError::Overflow { bytes, page, .. } if bytes == a && page == b),
                    "lcm is Err(Overflow) exactly when the lcm exceeds u64::MAX, never a wrap: {:?}", e
                ),
            }
        }
    }
}
