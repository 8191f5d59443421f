//! Layout math at pool scale: how long planning a 400 GiB pool takes.
//!
//! Run with `cargo bench -p hostpool-cli --bench layout`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use pool_core::{PageSize, SegmentSpec, registration_chunks, round_to_page, segments, shards};

const GIB: u64 = 1 << 30;
const POOL: u64 = 400 * GIB;

fn layout(c: &mut Criterion) {
    let mut g = c.benchmark_group("layout");

    g.bench_function(
        "registration_chunks/400GiB-4KiB-2MiB-block-64GiB-cap",
        |b| {
            b.iter(|| {
                registration_chunks(
                    black_box(POOL),
                    black_box(PageSize::BASE_4K),
                    black_box(2 << 20),
                    black_box(64 * GIB),
                )
            })
        },
    );

    g.bench_function("shards/400GiB-4KiB-16", |b| {
        b.iter(|| shards(black_box(POOL), black_box(PageSize::BASE_4K), black_box(16)))
    });

    let mapped = round_to_page(POOL, PageSize::BASE_4K).expect("400 GiB rounds to 4 KiB pages");
    g.bench_function("segments/400GiB-4KiB-count-64", |b| {
        b.iter(|| segments(black_box(&mapped), black_box(SegmentSpec::Count(64))))
    });

    g.bench_function("round_to_page/400GiB+1-2MiB", |b| {
        b.iter(|| round_to_page(black_box(POOL + 1), black_box(PageSize::HUGE_2M)))
    });

    g.finish();
}

criterion_group!(benches, layout);
criterion_main!(benches);
