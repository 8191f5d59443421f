//! The index at the scale issue 29 names: one million slots. How fast a
//! restarted engine gets every record back (attach warm: the header's check
//! and every record's), against reading the same words once in the same
//! run (the limit: the records must be read); what a record and an
//! unrecord cost the engine's hot path; what a lookup costs through the key
//! table (a key present, a key absent, and the first hit after a warm
//! attach: a restarted engine's time to its first hit); and a survey of
//! every slot (free, and recorded oldest first).
//!
//! Run with `cargo bench -p hostpool-index --bench restore`, nothing else
//! running; the figures are in `docs/measurements.md`.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hostpool_index::{Fingerprint, Index, Start, words_for};

/// A stride through the slots (a prime), so successive lookups land on
/// other cache lines, as a restarted engine's do.
const STRIDE: u64 = 104_729;

const SLOTS: u64 = 1_000_000;

fn fingerprint() -> Fingerprint {
    Fingerprint::new([
        ("model", "Qwen/Qwen3-8B"),
        ("dtype", "bfloat16"),
        ("block_size", "16"),
        ("tp", "1"),
        ("hash", "sha256"),
    ])
    .expect("a fingerprint")
}

/// A vLLM key: a 32-byte block hash and a 4-byte group index.
fn key(n: u64) -> [u8; 36] {
    let mut k = [0u8; 36];
    for (i, c) in k.chunks_mut(8).enumerate() {
        let w = n
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(i as u32 * 7);
        c.copy_from_slice(&w.to_le_bytes()[..c.len()]);
    }
    k
}

fn restore(c: &mut Criterion) {
    let words: Vec<AtomicU64> = (0..words_for(SLOTS).expect("a size"))
        .map(|_| AtomicU64::new(0))
        .collect();
    let fp = fingerprint();
    let (index, _) = Index::attach(&words, SLOTS, &fp).expect("an index");
    for n in 0..SLOTS {
        index.record(n, &key(n)).expect("a record");
    }

    let mut g = c.benchmark_group("index-1M");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    g.throughput(Throughput::Elements(SLOTS));
    g.bench_function("read every word (the limit)", |b| {
        b.iter(|| {
            words
                .iter()
                .fold(0u64, |a, w| a ^ w.load(Ordering::Relaxed))
        })
    });
    g.bench_function("attach warm + every record back", |b| {
        b.iter(|| match Index::attach(black_box(&words), SLOTS, &fp) {
            Ok((index, Start::Warm)) => {
                let entries = index.entries();
                assert_eq!(entries.len() as u64, SLOTS);
                entries
            }
            _ => panic!("the index went cold"),
        })
    });
    g.bench_function("survey (free ascending, recorded oldest first)", |b| {
        b.iter(|| {
            let survey = index.survey();
            assert_eq!(survey.recorded.len() as u64, SLOTS);
            survey
        })
    });
    g.finish();

    let mut g = c.benchmark_group("index-find");
    g.throughput(Throughput::Elements(1));
    let mut n = 0u64;
    g.bench_function("find a present key", |b| {
        b.iter(|| {
            n = (n + STRIDE) % SLOTS;
            assert_eq!(index.find(black_box(&key(n))), Some(n));
        })
    });
    g.bench_function("find an absent key", |b| {
        b.iter(|| {
            n = (n + STRIDE) % SLOTS;
            assert_eq!(index.find(black_box(&key(SLOTS + n))), None);
        })
    });
    g.bench_function("attach warm + find one key (time to the first hit)", |b| {
        b.iter(|| {
            n = (n + STRIDE) % SLOTS;
            match Index::attach(black_box(&words), SLOTS, &fp) {
                Ok((index, Start::Warm)) => assert_eq!(index.find(&key(n)), Some(n)),
                _ => panic!("the index went cold"),
            }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("index-hot-path");
    g.throughput(Throughput::Elements(1));
    let mut n = 0u64;
    g.bench_function("unrecord + record one slot", |b| {
        b.iter(|| {
            let slot = n % SLOTS;
            index.unrecord(slot).expect("a slot");
            index.record(slot, &key(n)).expect("a record");
            n += 1;
        })
    });
    g.finish();
}

criterion_group!(benches, restore);
criterion_main!(benches);
