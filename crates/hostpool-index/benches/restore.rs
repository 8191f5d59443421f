//! The index at the scale issue 29 names: one million slots. How fast a
//! restarted engine gets every record back (attach warm: the header's check
//! and every record's), against reading the same words once in the same
//! run (the limit: the records must be read); and what a record and an
//! unrecord cost the engine's hot path.
//!
//! Run with `cargo bench -p hostpool-index --bench restore`, nothing else
//! running; the figures are in `docs/measurements.md`.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hostpool_index::{Fingerprint, Index, Start, words_for};

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
