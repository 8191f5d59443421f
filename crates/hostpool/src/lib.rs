//! `hostpool`: large host-memory pools for GPU KV-cache offload.
//!
//! This library links every built-in plugin and re-exports [`pool_core`]: a
//! program that embeds hostpool (the Python package among them) depends on
//! this crate, or on `pool-core` plus the plugin crates it wants, naming each
//! one so it is linked. The `hostpool` command lives beside it, in
//! `hostpool-cli`, so an embedder links no CLI code (no clap, no progress
//! bars, no benchmarks).
//!
//! ```no_run
//! use hostpool::pool_core::{ByteSize, Pool, PoolConfig, PoolPlan, Quiet};
//!
//! let config = PoolConfig { size: ByteSize::gib(4), ..PoolConfig::default() };
//! let plan = PoolPlan::new(config)?;
//! let pool = Pool::build(&plan, &Quiet)?;
//! println!("{} bytes at {}", pool.report().mapped_bytes, pool.report().address);
//! let report = pool.teardown();
//! # Ok::<(), hostpool::pool_core::Error>(())
//! ```

pub use pool_core;

/// Memory handed between processes: shared pools' rendezvous and leases of
/// kept pools (the keeper itself, a daemon, is `hostpool-keeper`, which only
/// the CLI links).
pub use hostpool_handoff;

// A plugin crate that is never named is not linked and its records vanish
// silently: name every built-in. `tests/cli.rs` asserts the exact set.
use adapter_mooncake as _;
use backing_anon as _;
use backing_hugetlbfs as _;
use backing_shm_segmented as _;
use pinner_cuda as _;
use pinner_mlock as _;
use registrar_nixl as _;
use registrar_rdma as _;
