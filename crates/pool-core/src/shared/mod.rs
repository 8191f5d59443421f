//! Shared pools: the tensor-parallel ranks of one engine on one node map the
//! same memory, each prefaults only its own shard, and they meet at a barrier.
//!
//! This module is the API every rendezvous ([`crate::Rendezvous`]) shares:
//! the shard of each rank ([`shard`]), what the ranks must agree on
//! ([`SharedPoolSpec`]), the files' names (from [`crate::gc::data_path`] and
//! [`crate::gc::ctl_path`], which `gc` recognises) and the report
//! ([`SharingReport`]). The rendezvous themselves, which hand memory from
//! one process to another, are not the core's: [`map_shared`] hands the spec
//! to the [`Handoff`] linked in (`hostpool-handoff`).

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

use crate::config::{PoolConfig, SharingConfig};
use crate::error::{Error, Result};
use crate::file::MapContext;
use crate::host::capacity::CapacityCheck;
use crate::layout::{Extent, MappedSize};

/// This rank's prefault shard: page-aligned, disjoint from every other
/// rank's, the shards together covering the pool.
///
/// # Errors
/// Layout errors (zero world).
pub fn shard(size: MappedSize, sharing: &SharingConfig) -> Result<Extent> {
    let all = crate::layout::shards(size.mapped(), size.page(), sharing.world)?;
    all.get(sharing.rank as usize).copied().ok_or_else(|| {
        Error::config(format!(
            "rank {} is not below world {}",
            sharing.rank, sharing.world
        ))
    })
}

/// Whether this rank created the pool or joined it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Won the election: created and sized the files, ran the capacity checks.
    Creator,
    /// Attached to the creator's files.
    Joiner,
}

/// What every rank must agree on.
#[derive(Clone)]
pub struct SharedPoolSpec<'a> {
    /// Name, world, rank, timeout, control dir.
    pub sharing: &'a SharingConfig,
    /// Logical and mapped size and page size.
    pub size: MappedSize,
    /// Data files in pool order, with their extents.
    pub files: Vec<(PathBuf, Extent)>,
    /// Checks the creator runs before creating anything.
    pub capacity: &'a [CapacityCheck],
    /// Create one private, already-unlinked file for an extent (`O_TMPFILE`
    /// in the pool's directory, or a memfd): the memory of the socket
    /// rendezvous, which leaves nothing in any directory.
    pub create: &'a (dyn Fn(Extent) -> Result<std::os::fd::OwnedFd> + Sync),
    /// The same checks made again: the creator first removes the files of
    /// this pool that a crashed run left (they counted as used when the
    /// plan was made), then checks the node as it is.
    pub recheck: &'a (dyn Fn() -> Vec<CapacityCheck> + Sync),
    /// What to say when mapping fails.
    pub map: MapContext,
    /// The build's token: a request on it ends every wait of the
    /// rendezvous, the barrier's too.
    pub cancel: crate::interrupt::Cancel,
    /// What a failed creator does about the ranks not told yet.
    pub refusals: Refusals,
}

impl std::fmt::Debug for SharedPoolSpec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPoolSpec")
            .field("sharing", self.sharing)
            .field("size", &self.size)
            .field("files", &self.files)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// What a failed creator of a shared pool does about the ranks that have
/// not heard yet why it failed: they would otherwise become creators
/// themselves and wait out their attach timeout with the wrong cause. A
/// parameter of each build ([`crate::BuildOptions`]), not of the process.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub enum Refusals {
    /// A thread of this process answers them with the cause until every
    /// one has heard it or the attach deadline passes, then ends: for an
    /// engine, which lives on after the error its build returned.
    #[default]
    Thread,
    /// The pool's listening socket and what it answers go to this function,
    /// which serves them elsewhere: for a process that exits on the error
    /// (the CLI hands them to a helper process of its own).
    Hand(fn(std::os::fd::OwnedFd, RefusalTerms)),
    /// The ranks already waiting are told, and the socket is closed.
    Close,
}

/// What a failed creator's refusal says and for how long, apart from its
/// socket: what travels, as command-line arguments, to a process that
/// serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct RefusalTerms {
    /// The pool's name (for the operator: it says which pool the serving
    /// process answers for).
    pub pool: String,
    /// The refusal as the ranks receive it, encoded (JSON): opaque, to be
    /// given back as it is to the handoff that serves it.
    pub message: String,
    /// How many more ranks are to be told.
    pub untold: u32,
    /// How long the refusal still holds: the rest of the attach timeout.
    pub remaining: std::time::Duration,
}

/// Create or join a shared pool and map all of it, over the rendezvous
/// `spec.sharing` names, through the linked [`Handoff`].
///
/// # Errors
/// [`Error::Config`] when no handoff is linked; the rendezvous' capacity,
/// mapping, mismatch or peer errors (on error the peers are told and no file
/// is left behind).
pub fn map_shared(spec: SharedPoolSpec<'_>) -> Result<Box<dyn crate::file::Attachment>> {
    handoff("a shared pool")?.share(spec)
}

/// The `sharing` object of a report.
#[derive(Debug, Clone, Serialize)]
pub struct SharingReport {
    /// Pool name.
    pub name: String,
    /// Ranks.
    pub world: u32,
    /// This rank.
    pub rank: u32,
    /// Creator or joiner.
    pub role: Role,
    /// This rank's prefault shard.
    pub shard: crate::plugin::ExtentReport,
    /// The control file (file rendezvous only).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub control_file: String,
    /// How the ranks met: `socket` or `file`.
    pub rendezvous: &'static str,
}

impl SharingReport {
    /// The report's `sharing` object; `control_file` empty for the socket
    /// rendezvous.
    pub fn of(
        sharing: &SharingConfig,
        role: Role,
        shard: Extent,
        control_file: String,
    ) -> Option<serde_json::Value> {
        serde_json::to_value(SharingReport {
            name: sharing.name.clone(),
            world: sharing.world,
            rank: sharing.rank,
            role,
            shard: shard.into(),
            control_file,
            rendezvous: crate::choice::Choice::name(sharing.rendezvous),
        })
        .ok()
    }

    /// The `sharing` object of a rank that leased its pool from a keeper:
    /// every rank joins the keeper's pool.
    pub fn of_lease(sharing: &SharingConfig, shard: Extent) -> Option<serde_json::Value> {
        serde_json::to_value(SharingReport {
            name: sharing.name.clone(),
            world: sharing.world,
            rank: sharing.rank,
            role: Role::Joiner,
            shard: shard.into(),
            control_file: String::new(),
            rendezvous: "keeper",
        })
        .ok()
    }
}

/// Memory handed from one process to another: the rendezvous of a shared
/// pool's ranks and an engine's lease of a keeper's pool. The core names no
/// implementation: the crate that speaks the handoff (`hostpool-handoff`)
/// submits a [`HandoffPlugin`], and a build that shares or leases a pool asks
/// for it ([`handoff`]); a private pool needs none.
pub trait Handoff: Sync + fmt::Debug {
    /// Create or join the shared pool `spec` describes and map all of it.
    ///
    /// # Errors
    /// Capacity, mapping, mismatch or peer errors; on error the peers are
    /// told and no file is left behind.
    fn share(&self, spec: SharedPoolSpec<'_>) -> Result<Box<dyn crate::file::Attachment>>;

    /// Lease the pool `config.keeper` names and map it, waiting at most
    /// its attach timeout (`cancel` ends every wait).
    ///
    /// # Errors
    /// [`Error::Keeper`] (with `absent` when no keeper answers), a usage
    /// error when the keeper's pool is not the one asked for, mapping errors.
    fn lease(
        &self,
        config: &PoolConfig,
        cancel: &crate::interrupt::Cancel,
    ) -> Result<Box<dyn crate::file::Attachment>>;

    /// Where the keeper of kept pool `name` answers, as `ss -x` shows it.
    fn keeper_socket(&self, name: &str) -> String;
}

/// The record of the [`Handoff`] a build shares and leases pools through.
#[derive(Debug)]
#[non_exhaustive]
pub struct HandoffPlugin {
    /// Its name.
    pub name: &'static str,
    /// One line for `hostpool plugins`.
    pub summary: &'static str,
    /// The crate that submitted it.
    pub origin: &'static str,
    /// The handoff.
    pub handoff: &'static dyn Handoff,
}

impl HandoffPlugin {
    /// A record.
    pub const fn new(
        name: &'static str,
        summary: &'static str,
        origin: &'static str,
        handoff: &'static dyn Handoff,
    ) -> HandoffPlugin {
        HandoffPlugin {
            name,
            summary,
            origin,
            handoff,
        }
    }
}

inventory::collect!(HandoffPlugin);

// A handoff has no doctor hook of its own.
crate::plugin::record!(HandoffPlugin, "handoff", |_: &HandoffPlugin| None);

/// The one [`Handoff`] linked, for `what` (a shared pool, a lease).
///
/// # Errors
/// [`Error::Config`] when none is linked (a program on `pool-core` alone
/// that asks for a shared pool or a lease), or several are.
pub fn handoff(what: &str) -> Result<&'static dyn Handoff> {
    let reg = crate::plugin::registry::<HandoffPlugin>()?;
    let mut all = reg.values();
    match (all.next(), all.next()) {
        (Some(p), None) => Ok(p.handoff),
        (None, _) => Err(Error::config(format!(
            "{what} needs memory handed between processes, and this program links no handoff: \
             link the crate hostpool-handoff (`use hostpool_handoff as _;`), as the hostpool \
             library, its CLI and its Python package do"
        ))),
        (Some(_), Some(_)) => Err(Error::config(format!(
            "several handoffs are linked ({}); link one",
            reg.keys().copied().collect::<Vec<_>>().join(", ")
        ))),
    }
}
