//! Harness pieces shared by the criterion benches (`prefault`, `backings`).
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, SamplingMode, Throughput};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Whether criterion measures (`cargo bench`) rather than smoke-tests
/// (`cargo test --benches` runs each routine once).
pub fn measuring() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// The group name carries the size, so criterion never compares runs of
/// different sizes with each other.
pub fn group_name(kind: &str, size: u64) -> String {
    if size.is_multiple_of(GIB) {
        format!("{kind}-{}GiB", size / GIB)
    } else {
        format!("{kind}-{}MiB", size / MIB)
    }
}

pub fn configure(g: &mut BenchmarkGroup<'_, WallTime>, size: u64) {
    // Flat sampling: 10 samples of the same iteration count, at least one
    // each, instead of criterion's 1+2+...+10 linear ramp.
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Bytes(size));
}

/// `<target>/criterion/<name>`, where the ratios of a bench run go.
pub fn ratios_path(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")));
    target.join("criterion").join(name)
}

/// Write a bench's ratios as JSON next to criterion's reports, and say where.
pub fn write_ratios(name: &str, json: &serde_json::Value) {
    let path = ratios_path(name);
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| {
            std::fs::write(
                &path,
                serde_json::to_string_pretty(json).unwrap_or_default(),
            )
        });
    match written {
        Ok(()) => println!("\nratios written to {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
}

/// What a bench times: the plain-C reference or the engine.
#[derive(Clone, Copy)]
pub enum Method {
    /// One `madvise(MADV_POPULATE_WRITE)` per thread, in C.
    RawC,
    /// pool-core's prefault engine.
    Engine,
}

impl Method {
    /// The method's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Method::RawC => "raw-c",
            Method::Engine => "engine",
        }
    }
}

/// `pairs` back-to-back raw-C/engine runs, alternating which goes first so
/// that load that comes and goes hits both alike. Each ratio is the C time
/// over the engine time (engine throughput over C throughput).
pub fn paired_ratios(pairs: usize, mut once: impl FnMut(Method) -> Duration) -> Vec<f64> {
    (0..pairs)
        .map(|i| {
            let (c, engine) = if i % 2 == 0 {
                let c = once(Method::RawC);
                (c, once(Method::Engine))
            } else {
                let engine = once(Method::Engine);
                (once(Method::RawC), engine)
            };
            c.as_secs_f64() / engine.as_secs_f64().max(1e-9)
        })
        .collect()
}
