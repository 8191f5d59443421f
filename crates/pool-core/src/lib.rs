//! `pool-core`: the core of hostpool, which plugins extend and engines embed.
//!
//! At the root, what an embedder uses: [`PoolConfig`] (TOML, JSON or built
//! in code) → [`PoolPlan`] (pure: plugins resolved, layout, capacity
//! verdicts, prefault threads) → [`Pool`] (map, prefault, pin, register) →
//! [`PoolReport`], torn down in reverse; [`Error`] says what went wrong and
//! how to fix it. Every public item has one path: the root re-exports only
//! what private modules define (a test in `tests/workspace.rs` checks), and
//! the public modules are facades, each for one audience:
//!
//! - [`plugin`]: what a plugin implements and submits: the traits
//!   [`Backing`](plugin::Backing), [`Pinner`](plugin::Pinner),
//!   [`Registrar`](plugin::Registrar), their records collected with
//!   `inventory` (with the `auto` claim, cost figures and doctor hook each
//!   plugin owns), the registry, and the doctor's finding types;
//! - [`host`]: facts about this node that several plugins read, each read in
//!   one place: filesystems and the mount table, memory and cgroup limits,
//!   the memlock bound, NUMA topology;
//! - [`file`](mod@file): the mechanisms every file backing shares (private and
//!   exclusive files, memfds, files stitched into one mapping);
//! - [`prefault`]: the prefault engine; [`shared`]: pools shared by the
//!   ranks of one engine; [`lease`]: what a lease of a kept pool is told; [`gc`]; [`interrupt`];
//! - at the root, the layout math ([`PageSize`], [`MappedSize`],
//!   [`Extent`], [`round_to_page`], [`registration_chunks`], ...);
//! - at the root too, the owners of mappings ([`Mmap`], [`Reservation`])
//!   and [`Region`], the borrowed view of live pool memory; the private
//!   `sys` module behind them holds the crate's only `unsafe`;
//! - `conformance` (feature `conformance`): the suite every backing runs.

mod background;
mod choice;
mod config;
mod error;
mod pool;
mod size;

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod failpoint;
pub mod file;
pub mod gc;
pub mod host;
pub mod interrupt;
mod layout;
pub mod lease;
pub mod plugin;
pub mod prefault;
pub mod shared;
mod sys;
mod time;

pub use background::{DEFAULT_CHUNK as DEFAULT_BACKGROUND_CHUNK, PinProgress, PinStatus};
pub use choice::{Choice, ChoiceError};
pub use config::{
    DEFAULT_ATTACH_TIMEOUT_SECS, DEFAULT_BARRIER_TIMEOUT_SECS, Format, HISPARSE_KEYS, HugePages,
    KeeperFallback, LeaseConfig, MAX_ATTACH_TIMEOUT_SECS, MAX_FILES, MAX_KEEPER_TAG_BYTES,
    MAX_WORLD, MOVED_KEYS, NumaNode, PIN_OFF, POOL_KEYS, PinConfig, PinScope, PoolConfig,
    PrefaultChoice, Rendezvous, SharingConfig, check_name, pin_kind_from,
};
pub use error::{Context, Error, Result, TeardownIssue};
pub use layout::{
    Extent, LayoutError, MAX_POOL_BYTES, MappedSize, PageSize, SegmentSpec, format_bytes, lcm,
    mr_regions, registration_chunks, round_to_page, segments, shards,
};
pub use pool::{
    BuildOptions, GpuPlace, Handoff, HugePagesReport, LeasePlan, Memory, NUMA_SAMPLES, NumaPlan,
    NumaReport, Observer, Phase, Phases, PinPlan, PinPlanReport, PinReport, PlanReport, Pool,
    PoolPlan, PoolReport, PrefaultPlanReport, Quiet, RegistrationReport, ShardPlacement, Share,
    Source, ThpReport,
};
pub use size::{ByteSize, SizeError};
#[cfg(feature = "conformance")]
pub use sys::child_writes_byte;
pub use sys::{
    AnonMapOptions, FixedMapError, Mmap, Placeholder, Region, Reservation, Span, base_page_size,
    populate_write_supported,
};
pub use time::rfc3339;

/// Re-exported so plugin crates submit records with the same `inventory`.
pub use inventory;

/// hostpool's version: the workspace's, which the CLI's `--version`, the
/// Python package's `__version__`, the wheel's metadata and every report
/// carry.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
