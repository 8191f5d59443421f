use proptest::prelude::*;

use super::*;

fn memory(capacity: u64) -> Vec<AtomicU64> {
    (0..words_for(capacity).unwrap())
        .map(|_| AtomicU64::new(0))
        .collect()
}

fn fp(block: &str) -> Fingerprint {
    Fingerprint::new([
        ("model", "Qwen/Qwen3-0.6B"),
        ("dtype", "bfloat16"),
        ("block_size", block),
        ("tp", "1"),
    ])
    .unwrap()
}

fn warm(index: &Index<'_>, start: Start) -> Vec<Entry> {
    match start {
        Start::Warm => index.entries(),
        Start::Cold(why) => panic!("cold: {why}"),
    }
}

fn cold(start: Start) -> Cold {
    match start {
        Start::Cold(why) => why,
        Start::Warm => panic!("warm"),
    }
}

#[test]
fn a_new_index_is_cold_then_warm_with_its_entries_in_order_of_use() {
    let mem = memory(8);
    let (index, start) = Index::attach(&mem, 8, &fp("16")).unwrap();
    assert_eq!(cold(start), Cold::NoIndex);
    assert!(index.is_empty());
    index.record(3, b"key-three").unwrap();
    index.record(1, b"key-one").unwrap();
    index.record(6, &[7u8; MAX_KEY]).unwrap();
    index.touch(3).unwrap();
    index.touch(5).unwrap(); // empty: nothing
    assert_eq!(index.len(), 3);
    let (index, start) = Index::attach(&mem, 8, &fp("16")).unwrap();
    let entries = warm(&index, start);
    let order: Vec<(u64, Vec<u8>)> = entries.into_iter().map(|e| (e.slot, e.key)).collect();
    assert_eq!(
        order,
        [
            (1, b"key-one".to_vec()),
            (6, vec![7u8; MAX_KEY]),
            (3, b"key-three".to_vec())
        ]
    );
    // Stamps go on from where they were.
    let stamp = index.record(0, b"later").unwrap();
    assert!(index.entries().iter().all(|e| e.stamp <= stamp));
    index.unrecord(6).unwrap();
    assert_eq!(index.get(6).unwrap(), None);
    assert_eq!(index.len(), 3);
    // Resumed for each operation, as a binding does: the same records.
    let resumed = Index::resume(&mem, 8).unwrap();
    assert_eq!(resumed.entries(), index.entries());
    assert!(Index::resume(&mem, 7).is_none(), "another capacity");
    assert!(Index::resume(&memory(1), 1).is_none(), "no index");
    assert!(Index::resume(&mem[..10], 8).is_none(), "too short");
}

#[test]
fn a_reader_that_knows_only_where_the_index_ends_finds_and_sums_it_up() {
    // A pool of 64 words whose last `len` words are the index, rounded up
    // to a 4 KiB page.
    let bytes = bytes_for(8).unwrap().next_multiple_of(4096);
    let len = (bytes / 8) as usize;
    let pool: Vec<AtomicU64> = (0..len + 64).map(|_| AtomicU64::new(0)).collect();
    assert!(locate(&pool, 4096).is_none(), "no index yet");
    let (index, _) = Index::attach(&pool[64..], 8, &fp("16")).unwrap();
    index.record(2, b"a").unwrap();
    index.record(5, b"b").unwrap();
    let found = locate(&pool, 4096).unwrap();
    assert_eq!(found.len(), len);
    let s = summary(found).unwrap();
    assert_eq!((s.capacity, s.records), (8, 2));
    assert_eq!(s.fingerprint, fp("16"));
    assert_eq!(s.fingerprint.get("model"), Some("Qwen/Qwen3-0.6B"));
    // A torn header: no summary.
    pool[64 + H_FP_TEXT].fetch_xor(1, Ordering::Relaxed);
    assert_eq!(summary(found), None);
}

#[test]
fn at_the_tail_another_capacity_still_names_the_field_that_changed() {
    // A pool that ends with an index of 8 slots, then one of 4 (another
    // offset: pages of 8 bytes, so that no rounding makes them start at the
    // same word): the cold start names what differs, not "no index".
    let words = (bytes_for(8).unwrap() / 8) as usize;
    let pool: Vec<AtomicU64> = (0..words + 512).map(|_| AtomicU64::new(0)).collect();
    let (index, start) = Index::attach_tail(&pool, 8, 8, &fp("16")).unwrap();
    assert_eq!(cold(start), Cold::NoIndex);
    index.record(3, b"k").unwrap();
    let (_, start) = Index::attach_tail(&pool, 4, 8, &fp("32")).unwrap();
    let Cold::Differs(d) = cold(start) else {
        panic!("the field is named");
    };
    assert_eq!(d.field, "block_size");
    assert_eq!(
        (d.stored.as_deref(), d.now.as_deref()),
        (Some("16"), Some("32"))
    );
    // The same identity at another capacity: the capacity is named.
    let (index, _) = Index::attach_tail(&pool, 8, 8, &fp("32")).unwrap();
    assert!(index.is_empty());
    let (_, start) = Index::attach_tail(&pool, 4, 8, &fp("32")).unwrap();
    assert_eq!(cold(start), Cold::Capacity { stored: 8, now: 4 });
    // The same capacity and identity: warm, as a plain attach.
    let (index, start) = Index::attach_tail(&pool, 4, 8, &fp("32")).unwrap();
    assert_eq!(start, Start::Warm);
    index.record(1, b"x").unwrap();
    assert_eq!(
        summary(locate(&pool, 8).unwrap()).map(|s| (s.capacity, s.records)),
        Some((4, 1))
    );
    // Too small a pool for the index.
    assert!(matches!(
        Index::attach_tail(&pool[..16], 4, 8, &fp("32")),
        Err(Error::TooSmall { .. })
    ));
}

/// A reader that knows only where the index ends finds it, for the
/// capacity its trailer says, and reads the records an attach wrote; none
/// before the first attach.
#[test]
fn resume_tail_finds_the_index_at_the_tail_for_its_capacity() {
    let words = (bytes_for(8).unwrap() / 8) as usize;
    let pool: Vec<AtomicU64> = (0..words + 512).map(|_| AtomicU64::new(0)).collect();
    assert!(Index::resume_tail(&pool, 8).is_none(), "no index yet");
    let (index, _) = Index::attach_tail(&pool, 8, 8, &fp("16")).unwrap();
    index.record(5, b"k").unwrap();
    let resumed = Index::resume_tail(&pool, 8).expect("found by its trailer");
    assert_eq!(
        (resumed.capacity(), resumed.seed(), resumed.find(b"k")),
        (8, index.seed(), Some(5))
    );
    // Another capacity made there since: that one is found.
    let (index, _) = Index::attach_tail(&pool, 4, 8, &fp("16")).unwrap();
    let resumed = Index::resume_tail(&pool, 8).expect("found by its trailer");
    assert_eq!((resumed.capacity(), resumed.seed()), (4, index.seed()));
}

#[test]
fn another_identity_or_size_starts_cold_naming_why_and_empties_the_index() {
    let mem = memory(4);
    let (index, _) = Index::attach(&mem, 4, &fp("16")).unwrap();
    index.record(2, b"k").unwrap();
    let (index, start) = Index::attach(&mem, 4, &fp("32")).unwrap();
    assert_eq!(
        cold(start),
        Cold::Differs(Difference {
            field: "block_size".into(),
            stored: Some("16".into()),
            now: Some("32".into()),
        })
    );
    assert!(index.is_empty(), "a cold start clears the index");
    // Back to the first identity: still empty (the records were cleared,
    // and the seed changed).
    let (index, start) = Index::attach(&mem, 4, &fp("16")).unwrap();
    assert!(matches!(cold(start), Cold::Differs(_)));
    index.record(1, b"again").unwrap();
    let (_, start) = Index::attach(&mem, 3, &fp("16")).unwrap();
    assert_eq!(cold(start), Cold::Capacity { stored: 4, now: 3 });
    let text = Cold::Differs(fp("16").differs(&fp("32")).unwrap()).to_string();
    assert_eq!(text, "`block_size` differs: stored 16, now 32");
}

#[test]
fn a_field_that_comes_or_goes_is_a_difference() {
    let a = fp("16");
    let b = Fingerprint::new(
        a.fields()
            .iter()
            .cloned()
            .chain([("pp".into(), "2".into())]),
    )
    .unwrap();
    let d = a.differs(&b).unwrap();
    assert_eq!(
        (d.field.as_str(), d.stored, d.now),
        ("pp", None, Some("2".into()))
    );
    let d = b.differs(&a).unwrap();
    assert_eq!(
        (d.field.as_str(), d.stored, d.now),
        ("pp", Some("2".into()), None)
    );
    assert_eq!(a.differs(&fp("16")), None);
    assert_ne!(a.digest(), b.digest());
    assert_eq!(a.digest(), fp("16").digest());
    assert_eq!(a.digest().len(), 32);
}

#[test]
fn a_torn_header_or_garbage_is_never_read_as_an_index() {
    let mem = memory(4);
    let (index, _) = Index::attach(&mem, 4, &fp("16")).unwrap();
    index.record(0, b"k").unwrap();
    // A byte of the fingerprint text changed under the check.
    mem[H_FP_TEXT].fetch_xor(1, Ordering::Relaxed);
    let (_, start) = Index::attach(&mem, 4, &fp("16")).unwrap();
    assert_eq!(cold(start), Cold::Unreadable);
    // A pool full of other bytes: no magic.
    let junk: Vec<AtomicU64> = (0..words_for(4).unwrap() as u64)
        .map(|i| AtomicU64::new(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect();
    let (index, start) = Index::attach(&junk, 4, &fp("16")).unwrap();
    assert_eq!(cold(start), Cold::NoIndex);
    assert!(index.is_empty());
}

#[test]
fn bad_inputs_are_refused_naming_them() {
    let mem = memory(2);
    assert_eq!(Index::attach(&mem, 0, &fp("16")).unwrap_err(), Error::Empty);
    let e = Index::attach(&mem, 3, &fp("16")).unwrap_err();
    assert!(matches!(e, Error::TooSmall { capacity: 3, .. }), "{e}");
    assert!(e.to_string().contains("needs"), "{e}");
    let (index, _) = Index::attach(&mem, 2, &fp("16")).unwrap();
    assert_eq!(
        index.record(2, b"k").unwrap_err(),
        Error::NoSlot {
            slot: 2,
            capacity: 2
        }
    );
    assert_eq!(
        index.record(0, &[0; MAX_KEY + 1]).unwrap_err(),
        Error::KeyTooLong { len: MAX_KEY + 1 }
    );
    assert!(Fingerprint::new([("a=b", "c")]).is_err());
    assert!(Fingerprint::new([("a", "c\nd")]).is_err());
    assert!(Fingerprint::new([("a", "x".repeat(MAX_FINGERPRINT))]).is_err());
    assert_eq!(bytes_for(u64::MAX), None);
    // A bucket names its slot plus one in 32 bits.
    assert_eq!(words_for(MAX_CAPACITY + 1), None);
    assert!(words_for(MAX_CAPACITY).is_some());
    let e = Index::attach(&mem, MAX_CAPACITY + 1, &fp("16")).unwrap_err();
    assert_eq!(
        e,
        Error::TooLarge {
            capacity: MAX_CAPACITY + 1
        }
    );
    assert!(e.to_string().contains("at most 4294967294 records"), "{e}");
}

#[test]
fn an_index_of_the_version_before_starts_cold() {
    let mem = memory(4);
    let (index, _) = Index::attach(&mem, 4, &fp("16")).unwrap();
    index.record(0, b"k").unwrap();
    // Version 1, under a check that holds: another layout (no key table).
    mem[H_VERSION].store(1, Ordering::Relaxed);
    mem[H_CHECK].store(header_check(&mem), Ordering::Relaxed);
    assert!(
        Index::resume(&mem, 4).is_none(),
        "resume reads no other version"
    );
    let (index, start) = Index::attach(&mem, 4, &fp("16")).unwrap();
    assert_eq!(cold(start), Cold::Unreadable);
    assert!(index.is_empty() && index.find(b"k").is_none());
}

#[test]
fn find_gives_a_keys_slot_and_survey_the_free_and_the_recorded() {
    let mem = memory(8);
    let (index, _) = Index::attach(&mem, 8, &fp("16")).unwrap();
    assert_eq!(index.find(b"k"), None);
    assert_eq!(
        index.survey(),
        Survey {
            free: (0..8).collect(),
            recorded: vec![]
        }
    );
    index.record(3, b"three").unwrap();
    index.record(1, b"one").unwrap();
    index.record(6, &[7u8; MAX_KEY]).unwrap();
    index.record(5, b"").unwrap();
    index.touch(3).unwrap();
    assert_eq!(index.find(b"three"), Some(3));
    assert_eq!(index.find(b"one"), Some(1));
    assert_eq!(index.find(&[7u8; MAX_KEY]), Some(6));
    assert_eq!(index.find(b""), Some(5), "the empty key is a key");
    assert_eq!(index.find(b"one\0"), None, "the length is part of the key");
    assert_eq!(
        index.find(&[7u8; MAX_KEY + 1]),
        None,
        "too long: never recorded"
    );
    assert_eq!(
        index.survey(),
        Survey {
            free: vec![0, 2, 4, 7],
            recorded: vec![1, 6, 5, 3]
        }
    );
    // Another key in slot 3: the old one is gone, its bucket stale.
    index.record(3, b"drei").unwrap();
    assert_eq!((index.find(b"three"), index.find(b"drei")), (None, Some(3)));
    index.unrecord(1).unwrap();
    assert_eq!(index.find(b"one"), None);
    // A restart: the same answers without reading a record first.
    let (index, start) = Index::attach(&mem, 8, &fp("16")).unwrap();
    assert_eq!(start, Start::Warm);
    assert_eq!(index.find(b"drei"), Some(3));
    assert_eq!(Index::resume(&mem, 8).unwrap().find(b""), Some(5));
    assert_eq!(index.survey().recorded, vec![6, 5, 3]);
    // Cleared, or started cold: nothing is found.
    index.clear();
    assert_eq!(index.find(b"drei"), None);
    assert_eq!(index.table.len(), 16);
    assert!(index.table.iter().all(|b| b.load(Ordering::Relaxed) == 0));
    assert_eq!(mem[H_FARTHEST].load(Ordering::Relaxed), 0);
    index.record(2, b"two").unwrap();
    let (index, start) = Index::attach(&mem, 8, &fp("32")).unwrap();
    assert!(matches!(start, Start::Cold(_)));
    assert_eq!(index.find(b"two"), None);
}

#[test]
fn a_record_whose_bucket_never_came_is_a_miss_and_a_stale_bucket_is_rejected() {
    let mem = memory(4);
    let (index, _) = Index::attach(&mem, 4, &fp("16")).unwrap();
    index.record(2, b"old").unwrap();
    // A writer killed between the record's publication and its bucket's
    // insert: the record is there, `find` misses it.
    index.publish(2, index.record_words(2).unwrap(), 3, &pack(b"new"));
    assert_eq!(index.get(2).unwrap().unwrap().key, b"new");
    assert_eq!(index.find(b"new"), None, "a miss: safe");
    assert_eq!(
        index.find(b"old"),
        None,
        "its bucket names a slot that changed"
    );
    // A bucket of the right tag whose slot's record is torn: rejected.
    index.record(1, b"torn").unwrap();
    index.record_words(1).unwrap()[R_KEY].fetch_xor(1, Ordering::Relaxed);
    assert_eq!(index.find(b"torn"), None);
    // Recorded again: found, the stale buckets reused rather than emptied.
    index.record(2, b"new").unwrap();
    assert_eq!(index.find(b"new"), Some(2));
    assert!(index.table.iter().all(|b| {
        let b = b.load(Ordering::Relaxed);
        b == 0 || b >> 32 != 0
    }));
}

#[test]
fn a_table_with_no_bucket_to_reuse_leaves_the_key_unfound() {
    // One slot, two buckets, both naming the live record (as no insert
    // makes them: the table is written by hand).
    let mem = memory(1);
    let (index, _) = Index::attach(&mem, 1, &fp("16")).unwrap();
    index.record(0, b"a").unwrap();
    let live = bucket(0, tag(key_hash(index.seed, 1, &pack(b"a"))));
    for b in index.table {
        b.store(live, Ordering::Relaxed);
    }
    // The farthest probe torn to anything: probes still stop at the table's
    // size.
    index.words[H_FARTHEST].store(u64::MAX, Ordering::Relaxed);
    index.insert(0, 1, &pack(b"b"));
    assert!(
        index
            .table
            .iter()
            .all(|b| b.load(Ordering::Relaxed) == live)
    );
    assert_eq!(index.find(b"b"), None, "a miss");
    assert_eq!(index.find(b"a"), Some(0));
}

/// Keys `n` of a churn: 36 bytes, as vLLM's, all different.
fn churn_key(n: u64) -> Vec<u8> {
    let mut k = n.to_le_bytes().repeat(4);
    k.extend((n as u32).to_le_bytes());
    k
}

#[test]
fn a_long_churn_reuses_stale_buckets_and_keeps_every_probe_short() {
    for (capacity, live) in [(4u64, 4u64), (64, 4)] {
        let mem = memory(capacity);
        let (index, _) = Index::attach(&mem, capacity, &fp("16")).unwrap();
        let mut held: Vec<Option<u64>> = vec![None; live as usize];
        for n in 0..100_000u64 {
            let slot = n % live;
            index.unrecord(slot).unwrap();
            index.record(slot, &churn_key(n)).unwrap();
            assert_eq!(index.find(&churn_key(n)), Some(slot), "key {n}");
            if let Some(old) = held[slot as usize].replace(n) {
                assert_eq!(index.find(&churn_key(old)), None, "key {old}, replaced");
            }
        }
        for (slot, n) in held.iter().enumerate() {
            assert_eq!(index.find(&churn_key(n.unwrap())), Some(slot as u64));
        }
        assert_eq!(index.find(&churn_key(100_000)), None);
        // Every bucket went non-empty long ago, and no empty bucket ends a
        // probe; but an insert stops at the first bucket that is not live,
        // and at most `live` are: no key is placed farther than that.
        assert!(index.table.iter().all(|b| b.load(Ordering::Relaxed) != 0));
        let farthest = mem[H_FARTHEST].load(Ordering::Relaxed);
        assert!(farthest <= live, "{capacity} slots: placed {farthest} away");
        assert!(index.probes() <= live as usize + 1);
    }
}

#[derive(Debug, Clone)]
enum Op {
    Record(u64, usize),
    Unrecord(u64),
    Touch(u64),
    Clear,
    Reattach,
}

/// A small alphabet of keys: collisions of slots and keys, re-records, the
/// empty key and the longest.
fn alphabet() -> Vec<Vec<u8>> {
    vec![
        b"".to_vec(),
        b"a".to_vec(),
        b"b".to_vec(),
        b"ab".to_vec(),
        b"0123456789abcdef0123456789abcdef0123".to_vec(),
        vec![7u8; MAX_KEY],
        vec![0u8; 8],
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<u64>(), 0..alphabet().len()).prop_map(|(s, k)| Op::Record(s, k)),
        3 => any::<u64>().prop_map(Op::Unrecord),
        2 => any::<u64>().prop_map(Op::Touch),
        1 => Just(Op::Clear),
        1 => Just(Op::Reattach),
    ]
}

proptest! {
    /// Random records, unrecords, touches, clears and restarts against a
    /// model (slot -> key, and the order of use): after each, every key the
    /// model holds is found at a slot that holds it, no other key is found,
    /// and the survey parts the slots as the model does, oldest use first.
    #[test]
    fn find_and_survey_agree_with_a_model(
        capacity in 1u64..64,
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let keys = alphabet();
        let mem = memory(capacity);
        let (mut index, _) = Index::attach(&mem, capacity, &fp("16")).unwrap();
        let mut model: std::collections::HashMap<u64, (usize, u64)> = Default::default();
        let mut clock = 0u64;
        for op in ops {
            match op {
                Op::Record(s, k) => {
                    let slot = s % capacity;
                    index.record(slot, &keys[k]).unwrap();
                    clock += 1;
                    model.insert(slot, (k, clock));
                }
                Op::Unrecord(s) => {
                    index.unrecord(s % capacity).unwrap();
                    model.remove(&(s % capacity));
                }
                Op::Touch(s) => {
                    index.touch(s % capacity).unwrap();
                    clock += 1;
                    if let Some((_, stamp)) = model.get_mut(&(s % capacity)) {
                        *stamp = clock;
                    }
                }
                Op::Clear => {
                    index.clear();
                    model.clear();
                }
                Op::Reattach => {
                    let (again, start) = Index::attach(&mem, capacity, &fp("16")).unwrap();
                    prop_assert_eq!(start, Start::Warm);
                    index = again;
                }
            }
            for (k, key) in keys.iter().enumerate() {
                let held = model.values().any(|(m, _)| *m == k);
                match index.find(key) {
                    Some(slot) => prop_assert_eq!(
                        model.get(&slot).map(|(m, _)| *m),
                        Some(k),
                        "key {:?} found at slot {}", key, slot
                    ),
                    None => prop_assert!(!held, "key {:?} recorded but not found", key),
                }
            }
            let mut recorded: Vec<(u64, u64)> = model.iter().map(|(s, (_, t))| (*t, *s)).collect();
            recorded.sort_unstable();
            let survey = index.survey();
            prop_assert_eq!(
                survey.free,
                (0..capacity).filter(|s| !model.contains_key(s)).collect::<Vec<_>>()
            );
            prop_assert_eq!(
                survey.recorded,
                recorded.into_iter().map(|(_, s)| s).collect::<Vec<_>>()
            );
        }
    }
}

proptest! {
    /// A process killed after any prefix of a record's stores (over a slot
    /// that held another key, or none) leaves the slot empty, or holding
    /// the whole new record once every store was made: never a record
    /// half old, half new.
    #[test]
    fn a_record_cut_short_anywhere_reads_empty_or_whole(
        old in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..=MAX_KEY)),
        new in proptest::collection::vec(any::<u8>(), 0..=MAX_KEY),
        slot in 0u64..4,
    ) {
        let mem = memory(4);
        let (index, _) = Index::attach(&mem, 4, &fp("16")).unwrap();
        if let Some(old) = &old {
            index.record(slot, old).unwrap();
        }
        let r = index.record_words(slot).unwrap();
        let mut packed = [0u64; KEY_WORDS];
        for (w, c) in packed.iter_mut().zip(new.chunks(8)) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            *w = u64::from_le_bytes(b);
        }
        let stores = index.stores(slot, 99, new.len() as u64, &packed);
        let before: Vec<u64> = r.iter().map(|w| w.load(Ordering::Relaxed)).collect();
        for cut in 0..=stores.len() {
            for (w, v) in r.iter().zip(&before) {
                w.store(*v, Ordering::Relaxed);
            }
            for (word, value) in &stores[..cut] {
                r[*word].store(*value, Ordering::Relaxed);
            }
            let got = index.get(slot).unwrap();
            match cut {
                0 => prop_assert_eq!(got.map(|e| e.key), old.clone()),
                c if c == stores.len() => prop_assert_eq!(got.map(|e| e.key), Some(new.clone())),
                _ => prop_assert_eq!(got, None, "cut after {} of {} stores", cut, stores.len()),
            }
        }
    }
}
