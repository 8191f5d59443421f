//! Shared pools: the tensor-parallel ranks of one engine on one node map the
//! same memory, each prefaults only its own shard, and they meet at a barrier.
//!
//! This module is the API every rendezvous ([`crate::Rendezvous`]) shares:
//! the shard of each rank ([`shard`]), what the ranks must agree on
//! ([`SharedPoolSpec`]), the files' names (from [`crate::gc::data_path`] and
//! [`crate::gc::ctl_path`], which `gc` recognises) and the report
//! ([`SharingReport`]), and what a rendezvous or a lease hands back: an
//! [`Attachment`], which says how its memory came ([`Attached`]). The
//! rendezvous themselves, which hand memory from one process to another,
//! are not the core's: the build hands the spec to the [`crate::Handoff`]
//! it was given (`hostpool-handoff`'s).

use std::path::PathBuf;

use serde::Serialize;

use crate::config::SharingConfig;
use crate::error::{Error, Result};
use crate::file::{MapContext, PoolFile};
use crate::host::capacity::CapacityCheck;
use crate::layout::{Extent, MappedSize};
use crate::plugin::{Mapping, RankBarrier};
use crate::sys::Region;

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

/// The `sharing` object of a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
    ) -> SharingReport {
        SharingReport {
            name: sharing.name.clone(),
            world: sharing.world,
            rank: sharing.rank,
            role,
            shard: shard.into(),
            control_file,
            rendezvous: crate::choice::Choice::name(sharing.rendezvous),
        }
    }

    /// The `sharing` object of a rank that leased its pool from a keeper:
    /// every rank joins the keeper's pool.
    pub fn of_lease(sharing: &SharingConfig, shard: Extent) -> SharingReport {
        SharingReport {
            name: sharing.name.clone(),
            world: sharing.world,
            rank: sharing.rank,
            role: Role::Joiner,
            shard: shard.into(),
            control_file: String::new(),
            rendezvous: "keeper",
        }
    }
}

/// A mapping a build attached to: memory (a [`Mapping`]), how it came to
/// this process ([`Attachment::attached`], typed), and the meeting of a
/// shared pool's or a lease's ranks ([`Attachment::rendezvous`]). A
/// private pool's mapping, a shared pool's (the rendezvous', in
/// `hostpool-handoff`) and a lease's are attachments.
pub trait Attachment: Mapping {
    /// The open files the region maps, in pool order, each at its file
    /// offset 0 (linked or not): what another mapper of the same memory
    /// (`/proc/self/fd/N`, a Mooncake Store segment) opens. Empty for
    /// anonymous memory (a backing's own mapping).
    fn pool_files(&self) -> &[PoolFile] {
        &[]
    }

    /// How the memory came: mapped alone, a shared pool's share (the role
    /// this rank took), or a lease (what the keeper told).
    fn attached(&self) -> Attached {
        Attached::Own
    }

    /// The connection a lease holds to its keeper (a unix socket), on
    /// which an engine asks its keeper's CPU tier; `None` for memory that
    /// is not leased.
    fn keeper_conn(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// Called once after prefault with its outcome: a shared mapping meets
    /// its peers here (through `barrier`, or its built-in one) and the owner
    /// unlinks the files. Private mappings have nothing to do.
    ///
    /// # Errors
    /// [`crate::Error::Peer`] naming a rank that failed, died or never came.
    fn rendezvous(
        &mut self,
        outcome: std::result::Result<(), String>,
        barrier: Option<&dyn RankBarrier>,
    ) -> Result<()> {
        let _ = barrier;
        outcome.map_err(Error::config)
    }
}

/// How a pool's memory came to this process, as its attachment says: what
/// the report's `sharing` and `keeper` objects are made from.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Attached {
    /// Mapped by this process alone.
    Own,
    /// A share of a pool the ranks of one engine share: this rank's role
    /// and shard.
    Shared(SharingReport),
    /// Leased from a keeper: what it told, and this rank's share of the
    /// lease when the engine has several ranks.
    Leased {
        /// The lease.
        lease: crate::lease::LeaseReport,
        /// This rank, when the engine's ranks share the lease.
        ranks: Option<SharingReport>,
    },
}

impl Attached {
    /// Whether this process ran the plan's capacity checks: not a shared
    /// pool's joiner (the creator did, and once it has reserved the pages
    /// the figures look short to everyone else), not a lease.
    pub fn checked_capacity(&self) -> bool {
        match self {
            Attached::Own => true,
            Attached::Shared(s) => s.role == Role::Creator,
            Attached::Leased { .. } => false,
        }
    }

    /// The report's `sharing` object.
    pub fn sharing(&self) -> Option<&SharingReport> {
        match self {
            Attached::Own => None,
            Attached::Shared(s) => Some(s),
            Attached::Leased { ranks, .. } => ranks.as_ref(),
        }
    }

    /// The report's `keeper` object.
    pub fn lease(&self) -> Option<&crate::lease::LeaseReport> {
        match self {
            Attached::Leased { lease, .. } => Some(lease),
            _ => None,
        }
    }
}

/// A pool's attachment keeps its region mapped for as long as it lives, so
/// the core's owner of it may run the background pin on it.
impl crate::sys::Holds for Box<dyn Attachment> {
    fn held(&self) -> Region<'_> {
        self.region()
    }
}

/// A private pool of files is an attachment of one process.
impl Attachment for crate::file::FileMapping {
    fn pool_files(&self) -> &[PoolFile] {
        crate::file::FileMapping::pool_files(self)
    }
}
