//! The index survives its writer's death at any moment: a child process
//! records and unrecords keys in an index in shared memory as fast as it
//! can, and is SIGKILLed at a random moment, 50 times; after each, every
//! entry the index gives back is whole (its key is the one written for
//! that slot, never half of two), and the entries of the rounds before
//! that the child did not touch again are still there. Every entry's key
//! is found at its slot through the key table, but for the few records a
//! child published and was killed before their bucket was stored (at most
//! one a round: a miss, never a wrong slot); keys not recorded are not
//! found.

use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hostpool_index::{Entry, Fingerprint, Index, Start, bytes_for};
use pool_core::file::{MapContext, PoolFile, file_id, map_files};
use pool_core::{Extent, PageSize, round_to_page};

const CAPACITY: u64 = 512;
const FILE_ENV: &str = "HOSTPOOL_INDEX_TEST_FILE";
const ROUND_ENV: &str = "HOSTPOOL_INDEX_TEST_ROUND";

fn fingerprint() -> Fingerprint {
    Fingerprint::new([("model", "kill-test"), ("block_size", "16")]).unwrap()
}

/// The key round `round` writes to `slot` at its `n`-th write: the slot,
/// the round and `n`, then bytes that depend on all three, 36 bytes in all.
fn key(slot: u64, round: u64, n: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(36);
    k.extend(slot.to_le_bytes());
    k.extend(round.to_le_bytes());
    k.extend(n.to_le_bytes());
    let tag = slot
        .wrapping_mul(31)
        .wrapping_add(round.wrapping_mul(17))
        .wrapping_add(n);
    k.extend((0..12).map(|i| (tag.wrapping_add(i) % 251) as u8));
    k
}

/// Whether `e` is a key some round wrote to its slot, whole.
fn whole(e: &Entry) -> bool {
    let word = |i: usize| u64::from_le_bytes(e.key[i * 8..i * 8 + 8].try_into().unwrap());
    e.key.len() == 36 && word(0) == e.slot && e.key == key(e.slot, word(1), word(2))
}

fn len() -> u64 {
    round_to_page(bytes_for(CAPACITY).unwrap(), PageSize::BASE_4K)
        .unwrap()
        .mapped()
}

/// Map `fd` (the index's file) shared.
fn map(fd: OwnedFd) -> pool_core::file::FileMapping {
    let id = file_id(&fd).unwrap();
    let size = round_to_page(len(), PageSize::BASE_4K).unwrap();
    let whole = Extent {
        offset: 0,
        len: len(),
    };
    map_files(
        vec![PoolFile {
            fd,
            path: None,
            id,
            extent: whole,
        }],
        size,
        &MapContext::default(),
    )
    .unwrap()
}

/// The index's words: all of the mapping.
fn words_of(mapping: &pool_core::file::FileMapping) -> &[std::sync::atomic::AtomicU64] {
    mapping
        .region()
        .words(Extent {
            offset: 0,
            len: len(),
        })
        .unwrap()
}

/// The entries, and those of them whose key `find` misses; panics when it
/// finds a key at a slot that does not hold it.
fn entries_of(mapping: &pool_core::file::FileMapping, round: u64) -> (Vec<Entry>, Vec<Entry>) {
    let words = words_of(mapping);
    let index = match Index::attach(words, CAPACITY, &fingerprint()).unwrap() {
        (index, Start::Warm) => index,
        (_, Start::Cold(why)) => panic!("the index went cold: {why}"),
    };
    let entries = index.entries();
    let mut missed = Vec::new();
    for e in &entries {
        match index.find(&e.key) {
            Some(slot) => {
                let held = index.get(slot).unwrap().map(|h| h.key);
                assert_eq!(
                    held.as_ref(),
                    Some(&e.key),
                    "round {round}: found at {slot}"
                );
            }
            None => missed.push(e.clone()),
        }
    }
    // A key no round wrote: not found.
    assert_eq!(index.find(&key(0, u64::MAX, 0)), None, "round {round}");
    (entries, missed)
}

/// The child: record and unrecord keys until killed.
#[test]
#[ignore = "run by a_writer_killed_at_any_moment_leaves_only_whole_records"]
fn child_writes_records_until_killed() {
    let Some(path) = std::env::var_os(FILE_ENV) else {
        return;
    };
    let round: u64 = std::env::var(ROUND_ENV).unwrap().parse().unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mapping = map(OwnedFd::from(file));
    let words = words_of(&mapping);
    let (index, start) = Index::attach(words, CAPACITY, &fingerprint()).unwrap();
    assert!(
        matches!(start, Start::Warm),
        "the parent formatted it: {start:?}"
    );
    // Each round writes its own stretch of slots, then wraps around them
    // for ever: slots of earlier rounds outside it keep their keys.
    let base = (round * 7) % CAPACITY;
    let mut n = 0u64;
    loop {
        let slot = (base + n % 64) % CAPACITY;
        index.unrecord(slot).unwrap();
        index.record(slot, &key(slot, round, n)).unwrap();
        if n.is_multiple_of(5) {
            index.touch((slot + 1) % CAPACITY).unwrap();
        }
        if n == 64 {
            println!("writing");
        }
        n += 1;
    }
}

#[test]
fn a_writer_killed_at_any_moment_leaves_only_whole_records() {
    let fd =
        rustix::fs::memfd_create("hostpool-index-kill", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, len()).unwrap();
    let path = format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd());
    let mapping = map(fd);
    let (_, start) = Index::attach(words_of(&mapping), CAPACITY, &fingerprint()).unwrap();
    assert!(matches!(start, Start::Cold(_)));
    let exe = std::env::current_exe().unwrap();
    let mut seen = 0usize;
    for round in 0..50u64 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "child_writes_records_until_killed",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(FILE_ENV, &path)
            .env(ROUND_ENV, round.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // The event: the child has written a stretch of records.
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !line.contains("writing") {
            line.clear();
            let n = out.read_line(&mut line).unwrap();
            assert!(n > 0, "round {round}: the writer ended before writing");
            assert!(Instant::now() < deadline, "round {round}: no writer");
        }
        // A random moment of the writing (the fault injected, not a wait
        // for anything).
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        std::thread::sleep(Duration::from_micros(u64::from(nanos % 3000)));
        child.kill().unwrap();
        child.wait().unwrap();
        let (entries, missed) = entries_of(&mapping, round);
        assert!(
            missed.len() as u64 <= round + 1,
            "round {round}: find misses {missed:?}"
        );
        let torn: Vec<&Entry> = entries.iter().filter(|e| !whole(e)).collect();
        assert!(torn.is_empty(), "round {round}: torn records {torn:?}");
        assert!(
            entries.len() >= seen.min(64),
            "round {round}: {} entries, {seen} before",
            entries.len()
        );
        seen = entries.len();
        let stamps: Vec<u64> = entries.iter().map(|e| e.stamp).collect();
        assert!(stamps.is_sorted(), "entries come oldest use first");
    }
    assert!(seen >= 64, "the writers recorded {seen} slots");
}
