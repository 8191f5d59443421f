//! The plan's types: [`PoolPlan`], and where its memory comes from
//! ([`Source`]), resolved once, typed: a backing's memory this process maps
//! alone, a share of a pool the ranks of one engine create, a lease of a
//! kept pool, or a keeper's own kept files; and what pinning will do
//! ([`PinPlan`]). `plan.rs` makes them from a config; the build reads
//! these and nothing of the config they came from.

use std::path::PathBuf;
use std::sync::Arc;

use super::report::HugePagesReport;
use crate::config::{PinScope, PoolConfig, SharingConfig};
use crate::plugin::{Backing, BackingPlan, PinContext, Pinner, Registrar};
use crate::prefault::PrefaultPlan;

/// Everything a build will do, resolved from the config. Making a plan
/// creates, maps and reserves nothing, and a plan cannot change once made:
/// its parts are read through its methods. The build reads the plan alone:
/// where the memory comes from ([`Source`]), how it is faulted, pinned and
/// registered; never the config it was made from.
#[derive(Debug)]
pub struct PoolPlan {
    /// The config, for the caller (`hostpool plan`, doctor): the build
    /// reads none of it.
    pub(crate) config: PoolConfig,
    pub(crate) source: Source,
    pub(crate) prefault: PrefaultPlan,
    pub(crate) pin: Option<PinPlan>,
    pub(crate) registrars: Vec<Box<dyn Registrar>>,
    /// What pinners and registrars are told: the block and memlock policy.
    pub(crate) context: PinContext,
    pub(crate) numa: Option<super::numa::NumaPlan>,
}

/// What pinning will do.
#[derive(Debug, Clone)]
pub struct PinPlan {
    /// The pinner.
    pub pinner: Arc<dyn Pinner>,
    /// Whether a failure fails the pool (else it stays pageable).
    pub required: bool,
    /// The whole pool, or this rank's shard.
    pub scope: PinScope,
    /// Pin on a background thread, in chunks of this many bytes.
    pub background_chunk: Option<u64>,
    /// Whether `pin.background_chunk` was given (said when whole pages and
    /// blocks round it).
    pub chunk_asked: bool,
}

/// Where a pool's memory comes from: decided by the plan, for every backing
/// alike, and consumed by the build.
#[derive(Debug)]
#[non_exhaustive]
pub enum Source {
    /// This process maps it alone: the backing's own memory, or the files
    /// it planned, private (unlinked from birth).
    Own(Memory),
    /// The ranks of one engine share it over a rendezvous.
    Shared(Share),
    /// A keeper leases it.
    Leased(LeasePlan),
    /// A keeper's own pool: files other processes can be handed, mapped and
    /// prefaulted here, pinned and registered by none.
    Kept(Memory),
}

/// Memory a backing plans: what this process (or, in a shared pool, the
/// creator among its ranks) creates and maps.
#[derive(Debug)]
pub struct Memory {
    /// Why this backing.
    pub reason: String,
    /// The configured backing.
    pub backing: Box<dyn Backing>,
    /// What the backing will map.
    pub plan: BackingPlan,
    /// What `huge_pages` asked for and what the pool gets, when it asked.
    pub huge_pages: Option<HugePagesReport>,
}

/// A shared pool, as the plan decided it.
#[derive(Debug)]
pub struct Share {
    /// What the creator maps (and every rank checks its files against).
    pub memory: Memory,
    /// The ranks, this one, the rendezvous and its timeouts.
    pub sharing: SharingConfig,
    /// The data files' names, one per extent (empty paths for files only
    /// the socket passes).
    pub files: Vec<PathBuf>,
    /// With `huge_pages = "prefer"`, the plan of this rank with the other
    /// page size it could have chosen (huge pages, or base pages): a joiner
    /// whose creator chose that one builds it instead. `None`: a creator of
    /// other pages is a mismatch.
    pub creators_pages: Option<Box<PoolPlan>>,
}

/// A lease of a kept pool, as the plan decided it: what this process asks
/// its keeper, and what it builds when none answers.
#[derive(Debug)]
pub struct LeasePlan {
    /// The kept pool's name.
    pub keeper: String,
    /// The ranks of the engine that share the lease, when it has several.
    pub ranks: Option<SharingConfig>,
    /// The engine whose lease this process maps as its companion (none of
    /// its ranks).
    pub companion_of: Option<String>,
    /// The tag stored with the lease.
    pub tag: Option<String>,
    /// The size the kept pool must have, when one was asked for.
    pub size: Option<u64>,
    /// The page size the kept pool must have, when one was asked for.
    pub page: Option<u64>,
    /// How long to wait for the keeper to hand the pool over.
    pub attach_timeout_secs: f64,
    /// How long the ranks wait for each other at the lease's barrier.
    pub barrier_timeout_secs: f64,
    /// What this process builds when no keeper answers
    /// (`lease.fallback = "build"`), a plan of its own; `None`: the build
    /// fails instead.
    pub fallback: Option<Box<PoolPlan>>,
}

impl LeasePlan {
    /// The engine the lease is for: its ranks' shared pool name, or the
    /// engine a companion maps the lease of; empty for a lone process.
    pub fn engine(&self) -> &str {
        match (&self.ranks, &self.companion_of) {
            (Some(s), _) => &s.name,
            (None, Some(engine)) => engine,
            (None, None) => "",
        }
    }
}

impl Source {
    /// The ranks this process is one of: a shared pool's, or those sharing
    /// a lease.
    pub fn ranks(&self) -> Option<&SharingConfig> {
        match self {
            Source::Own(_) | Source::Kept(_) => None,
            Source::Shared(s) => Some(&s.sharing),
            Source::Leased(l) => l.ranks.as_ref(),
        }
    }

    /// The memory a backing plans for this process (the creator's, in a
    /// shared pool); `None` for a lease, whose memory is the keeper's.
    pub fn memory(&self) -> Option<&Memory> {
        match self {
            Source::Own(m) | Source::Kept(m) => Some(m),
            Source::Shared(s) => Some(&s.memory),
            Source::Leased(_) => None,
        }
    }
}
