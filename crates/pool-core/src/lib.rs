//! `pool-core`: everything a hostpool plugin or embedder depends on.
//!
//! - the plugin traits [`Backing`], [`Pinner`], [`Registrar`] and their
//!   records ([`BackingPlugin`], [`PinnerPlugin`], [`RegistrarPlugin`]),
//!   collected with `inventory` ([`plugin`]);
//! - the config ([`PoolConfig`]), read from TOML or JSON;
//! - the pure layout math ([`layout`]);
//! - the prefault engine ([`prefault`]) and capacity checks ([`capacity`]);
//! - a pool's life from plan to teardown ([`PoolPlan`], [`Pool`]);
//! - the conformance suite every backing runs (feature `conformance`).
//!
//! Unsafe code is confined to [`sys`].

pub mod capacity;
pub mod config;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod cost;
pub mod doctor;
pub mod error;
pub mod failpoint;
pub mod file;
pub mod fs;
pub mod gc;
pub mod layout;
pub mod memlock;
pub mod numa;
pub mod plugin;
pub mod pool;
pub mod prefault;
pub mod shared;
pub mod size;
pub mod sys;
pub mod traits;

pub use config::{PinConfig, PoolConfig, PrefaultChoice, SharingConfig};
pub use error::{Context, Error, Result, TeardownIssue};
pub use layout::{Extent, MappedSize, PageSize};
pub use plugin::{BackingPlugin, PinnerPlugin, RegistrarPlugin};
pub use pool::{Observer, Phase, PinStatus, Pool, PoolPlan, PoolReport, Quiet};
pub use size::ByteSize;
pub use traits::{
    Backing, BackingPlan, Mapping, Pin, Pinner, Region, Registrar, Registration, Span,
};

/// Re-exported so plugin crates submit records with the same `inventory`.
pub use inventory;
