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
