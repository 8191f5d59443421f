//! A keeper's status (`hostpool keep status`): the state's
//! ([`Serving::status`]) with what the memory says, the build's NUMA report
//! and the index an engine keeps at the pool's tail, read from the pool's
//! files.
//!
//! [`Serving::status`]: super::state::Serving::status

use std::os::fd::OwnedFd;

use hostpool_handoff::lease::{IndexStatus, KeeperStatus};
use pool_core::Extent;

use super::Memory;
use super::state::Serving;

/// The status of the keeper `s` of `memory` (sent as its JSON:
/// `Message::StatusOf`).
pub(super) fn status(s: &Serving, memory: &Memory) -> KeeperStatus {
    let f = s.figures();
    s.status(
        serde_json::to_value(&memory.pool.report().numa).unwrap_or_default(),
        index_status(&memory.files, f.mapped, f.page),
    )
}

/// The blocks the index at the tail of `memory` records now (`None`
/// without one): what a keeper whose pool came back says it came back
/// with ([`Serving::set_came_back_blocks`], once, at its start).
#[allow(
    dead_code,
    reason = "called by the keeper's start once it adopted a pool"
)]
pub(super) fn index_blocks(s: &Serving, memory: &Memory) -> Option<u64> {
    let f = s.figures();
    index_status(&memory.files, f.mapped, f.page).map(|i| i.records)
}

/// The index an engine keeps at the pool's tail (`Pool.index`), read
/// without changing it: its slots, the records it holds, and the digest of
/// the fingerprint with the model it names; `None` when there is none.
///
/// Read from the files with `pread`, never through the mapping: a holder
/// may have truncated a file in a directory (tmpfs, hugetlbfs: they take
/// no seals), and a read past its end through the mapping is a SIGBUS,
/// where `pread` returns short and the index reads as none.
fn index_status(files: &[(OwnedFd, Extent)], mapped: u64, page: u64) -> Option<IndexStatus> {
    let trailer = read_range(files, mapped.saturating_sub(16), 16).map(|b| {
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        [word(0), word(1)]
    });
    let summary = trailer
        .and_then(|t| hostpool_index::extent_len(t, page))
        .filter(|len| *len <= mapped)
        .and_then(|len| read_range(files, mapped - len, len))
        .and_then(|bytes| {
            let words: Vec<std::sync::atomic::AtomicU64> = bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])).into())
                .collect();
            hostpool_index::summary(&words)
        });
    summary.map(|s| IndexStatus {
        slots: s.capacity,
        records: s.records as u64,
        digest: s.fingerprint.digest(),
        model: s.fingerprint.get("model").map(str::to_string),
    })
}

/// The pool's bytes `[offset, offset + len)`, read from the files that
/// tile it; `None` when a file is short (truncated) or a read fails.
fn read_range(files: &[(OwnedFd, Extent)], offset: u64, len: u64) -> Option<Vec<u8>> {
    let mut out = vec![0u8; usize::try_from(len).ok()?];
    let end = offset.checked_add(len)?;
    for (fd, e) in files {
        let (start, stop) = (offset.max(e.offset), end.min(e.end()));
        if start >= stop {
            continue;
        }
        let dst =
            &mut out[usize::try_from(start - offset).ok()?..usize::try_from(stop - offset).ok()?];
        let mut done = 0;
        while done < dst.len() {
            let at = start - e.offset + done as u64;
            match rustix::io::pread(fd, &mut dst[done..], at) {
                Ok(0) | Err(_) => return None,
                Ok(n) => done += n,
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `bytes`, in memory.
    fn memfd(bytes: &[u8]) -> OwnedFd {
        let fd = rustix::fs::memfd_create("keeper-status-test", rustix::fs::MemfdFlags::CLOEXEC)
            .unwrap();
        rustix::io::write(&fd, bytes).unwrap();
        fd
    }

    #[test]
    fn a_range_reads_across_the_files_that_tile_the_pool_and_none_past_a_truncated_one() {
        let files = vec![
            (memfd(b"abcd"), Extent { offset: 0, len: 4 }),
            (memfd(b"efgh"), Extent { offset: 4, len: 4 }),
        ];
        assert_eq!(read_range(&files, 2, 4).as_deref(), Some(&b"cdef"[..]));
        assert_eq!(read_range(&files, 0, 8).as_deref(), Some(&b"abcdefgh"[..]));
        rustix::fs::ftruncate(&files[1].0, 1).unwrap();
        assert_eq!(read_range(&files, 2, 4), None, "the second file is short");
        assert_eq!(read_range(&files, 0, 4).as_deref(), Some(&b"abcd"[..]));
        // No index at the tail of these bytes.
        assert_eq!(index_status(&files[..1], 4, 4096), None);
    }
}
