//! The three plugin traits and the region they hand each other.
//!
//! A pool is one [`Mapping`] made by one [`Backing`], optionally pinned by one
//! [`Pinner`] (a [`Pin`]), then registered by zero or more [`Registrar`]s
//! (each a [`Registration`]). Teardown runs in reverse: deregister, unpin,
//! then the mapping's own teardown (unmap, close, unlink). Teardown methods
//! consume their object, never panic, and return what they could not undo.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;

use crate::config::PoolConfig;
use crate::error::{Result, TeardownIssue};
use crate::host::capacity::CapacityCheck;
use crate::layout::{Extent, MappedSize};
use crate::sys::{Mmap, Placeholder, Region};

/// A collective the ranks meet at once their shards are prefaulted. The
/// embedding engine can implement it with its own (for example a
/// `torch.distributed` barrier); the built-in one uses the control file.
pub trait RankBarrier: Send + Sync {
    /// Called exactly once by every rank with its own setup outcome. Returns
    /// `Ok` once every rank has called it with `Ok`; otherwise an error that
    /// names the rank that failed, died or never came.
    ///
    /// # Errors
    /// [`crate::Error::Peer`] naming the rank.
    fn wait(&self, rank: u32, world: u32, outcome: std::result::Result<(), String>) -> Result<()>;
}

/// What a backing will do, resolved from the config: pure, nothing created.
///
/// Built with [`BackingPlan::new`] and its fields (the struct is
/// `#[non_exhaustive]`: a field added later breaks no plugin). What the
/// memory is made of is [`BackingPlan::source`]: the backing's own mapping
/// ([`MemorySource::Own`], made by [`Backing::map`]), or files the core
/// creates, maps and shares ([`MemorySource::Files`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BackingPlan {
    /// The backing's name.
    pub backing: &'static str,
    /// Logical and mapped size and the page size.
    pub size: MappedSize,
    /// Segments of a multi-file mapping (one extent for a single mapping).
    pub segments: Vec<Extent>,
    /// Files that will be created, if any.
    pub files: Vec<PathBuf>,
    /// Capacity checks made against the node.
    pub capacity: Vec<CapacityCheck>,
    /// Resolved plugin options, for the report.
    pub options: Value,
    /// Why each choice was made, one line each.
    pub explain: Vec<String>,
    /// What the memory is made of.
    pub source: MemorySource,
    /// Whether the backing asks the kernel for transparent huge pages (a
    /// hint): the report then says how much of the pool they really back.
    pub transparent_huge_pages: bool,
}

impl BackingPlan {
    /// A plan of `backing` for `size`: one segment, no files, no capacity
    /// checks, no options, no explanation, memory of the backing's own.
    pub fn new(backing: &'static str, size: MappedSize) -> BackingPlan {
        BackingPlan {
            backing,
            size,
            segments: vec![Extent {
                offset: 0,
                len: size.mapped(),
            }],
            files: Vec::new(),
            capacity: Vec::new(),
            options: Value::Null,
            explain: Vec::new(),
            source: MemorySource::Own,
            transparent_huge_pages: false,
        }
    }
}

/// What a pool's memory is made of.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum MemorySource {
    /// The backing maps it itself, in [`Backing::map`] (anonymous memory).
    Own,
    /// Files, one per extent, that the core creates with the backing's
    /// function, maps contiguously (`MAP_FIXED` into one reservation) and,
    /// for a shared pool, shares: over the socket it passes their
    /// descriptors, with the file rendezvous it names them in
    /// [`FilePlan::dir`].
    Files(FilePlan),
}

/// Creates one private, already-unlinked file of an extent's length: an
/// `O_TMPFILE` in the pool's directory, or a memfd.
pub type CreateFile = dyn Fn(Extent) -> Result<std::os::fd::OwnedFd> + Send + Sync;

/// Capacity checks made again when the node may have changed since the plan.
pub type Recheck = dyn Fn() -> Vec<CapacityCheck> + Send + Sync;

/// The files of a [`MemorySource::Files`] pool: what the backing says, the
/// core does.
#[derive(Clone)]
#[non_exhaustive]
pub struct FilePlan {
    /// The pool's extents, one file each, in pool order, covering it.
    pub extents: Vec<Extent>,
    /// Makes one file.
    pub create: std::sync::Arc<CreateFile>,
    /// The backing's capacity checks, made again by a shared pool's creator
    /// after it removed the files a crashed run left (they counted as used
    /// when the plan was made).
    pub recheck: std::sync::Arc<Recheck>,
    /// What to say when `mmap` fails with `ENOMEM`.
    pub enomem_remedy: String,
    /// Where a shared pool's named data files live with the file
    /// rendezvous (`None`: the memory has no name anywhere, a memfd, so only
    /// the socket rendezvous can share it).
    pub dir: Option<PathBuf>,
    /// Whether those names carry the extent's index (`name.0`, `name.1`, ...)
    /// even for one extent.
    pub indexed_names: bool,
}

impl FilePlan {
    /// Files of `extents`, made by `create`, with `recheck` and the `ENOMEM`
    /// remedy; no directory for named files.
    pub fn new(
        extents: Vec<Extent>,
        create: impl Fn(Extent) -> Result<std::os::fd::OwnedFd> + Send + Sync + 'static,
        recheck: impl Fn() -> Vec<CapacityCheck> + Send + Sync + 'static,
        enomem_remedy: impl Into<String>,
    ) -> FilePlan {
        FilePlan {
            extents,
            create: std::sync::Arc::new(create),
            recheck: std::sync::Arc::new(recheck),
            enomem_remedy: enomem_remedy.into(),
            dir: None,
            indexed_names: false,
        }
    }

    /// With named data files in `dir` for the file rendezvous, indexed or not.
    pub fn named_in(mut self, dir: PathBuf, indexed: bool) -> FilePlan {
        self.dir = Some(dir);
        self.indexed_names = indexed;
        self
    }
}

impl fmt::Debug for FilePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FilePlan")
            .field("extents", &self.extents)
            .field("enomem_remedy", &self.enomem_remedy)
            .field("dir", &self.dir)
            .field("indexed_names", &self.indexed_names)
            .finish_non_exhaustive()
    }
}

/// Where pool memory comes from.
pub trait Backing: Send + Sync + fmt::Debug {
    /// The plugin name.
    fn name(&self) -> &'static str;

    /// Resolve sizes, page size and segments, and check capacity. May read
    /// system state; creates, maps and reserves nothing.
    ///
    /// # Errors
    /// [`crate::Error::Config`] for settings this backing cannot honour.
    fn plan(&self, config: &PoolConfig) -> Result<BackingPlan>;

    /// Create the mapping a plan of [`MemorySource::Own`] describes, from the
    /// plan alone (the core maps [`MemorySource::Files`] itself). The
    /// default refuses: a backing whose plans are all files needs none.
    ///
    /// # Errors
    /// Whatever the system refused, with path, size, page size and remedy.
    fn map(&self, plan: &BackingPlan) -> Result<Box<dyn Mapping>> {
        Err(crate::Error::Plugin {
            what: plan.backing.to_string(),
            message: "this backing planned memory of its own but maps none; its plan must \
                      describe files (MemorySource::Files)"
                .into(),
            source: None,
        })
    }
}

/// A live mapping made by a backing ([`Backing::map`], for memory of its
/// own) or by the core: its region, the files it keeps alive, how to
/// reserve pages before a touch, and its teardown. What the core's own
/// kinds of mapping need besides (how the memory came, its files, a
/// rendezvous) is the core's ([`crate::shared::Attachment`]).
pub trait Mapping: Send + Sync + fmt::Debug {
    /// The mapped memory.
    fn region(&self) -> Region<'_>;

    /// Files that exist while the mapping lives (checked gone after teardown).
    fn files(&self) -> Vec<PathBuf> {
        Vec::new()
    }

    /// Make sure every page of `extent` can be supplied before it is touched
    /// one byte at a time (the prefault fallback on kernels without
    /// `MADV_POPULATE_WRITE`): a file allocates the range (`fallocate`),
    /// which fails with `ENOSPC` where a touch would die of SIGBUS.
    /// Anonymous memory has nothing to do.
    ///
    /// # Errors
    /// [`crate::Error::Os`] naming the file, the range and the remedy.
    fn reserve_for_touch(&self, extent: Extent) -> Result<()> {
        let _ = extent;
        Ok(())
    }

    /// Unmap and release. Never panics; returns what could not be undone.
    ///
    /// It also runs in a child that inherited the pool through `fork` (the
    /// pins and registrations are then skipped, being the parent's), so it
    /// gives back only the calling process's view.
    fn teardown(self: Box<Self>) -> Vec<TeardownIssue>;

    /// As [`Mapping::teardown`], but the region's address range stays
    /// reserved ([`crate::Mmap::unmap_keeping_range`]) until the returned
    /// placeholder is dropped, for an embedder whose callers may keep the
    /// address past the pool (`Pool::teardown_keeping_range`). The default
    /// keeps nothing: a backing that maps with [`crate::Mmap`] overrides it.
    fn teardown_keeping_range(self: Box<Self>) -> (Vec<TeardownIssue>, Option<Placeholder>) {
        (self.teardown(), None)
    }
}

/// Unmap a mapping's memory at teardown, keeping its address range
/// reserved when `keep_range` ([`Mmap::unmap_keeping_range`]): a failed
/// call is the report's issue, naming the range. What a [`Mapping`] over
/// an [`Mmap`] does in both of its teardowns.
pub fn unmap_at_teardown(
    mmap: Mmap,
    keep_range: bool,
) -> (Vec<TeardownIssue>, Option<Placeholder>) {
    let span = mmap.region().span();
    let (unmapped, kept) = if keep_range {
        match mmap.unmap_keeping_range() {
            Ok(p) => (Ok(()), Some(p)),
            Err(e) => (Err(e), None),
        }
    } else {
        (mmap.unmap(), None)
    };
    let issues = unmapped
        .err()
        .map(|e| {
            TeardownIssue::log(
                "munmap",
                format!(
                    "{:#x}+{} ({}): {e}",
                    span.addr,
                    span.len,
                    crate::layout::format_bytes(span.len)
                ),
            )
        })
        .into_iter()
        .collect();
    (issues, kept)
}

/// What a pinner or registrar is told besides the region: the settings of
/// the pool that concern it, never the whole config (its own table it read
/// when it was built).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PinContext {
    /// The caller's block in bytes (chunks and regions never split one);
    /// `None`: the page size.
    pub block_size: Option<u64>,
    /// Whether to compare the pool with the memlock bound first.
    pub memlock_bound: crate::host::memlock::MemlockPolicy,
}

impl PinContext {
    /// A context with this block and memlock policy.
    pub fn new(
        block_size: Option<u64>,
        memlock_bound: crate::host::memlock::MemlockPolicy,
    ) -> PinContext {
        PinContext {
            block_size,
            memlock_bound,
        }
    }

    /// What `config` says of the block and the memlock bound.
    pub fn of(config: &PoolConfig) -> PinContext {
        PinContext::new(
            config.block_size.map(crate::ByteSize::get),
            config.pin.memlock_bound,
        )
    }

    /// The block in bytes: the caller's, or `page`.
    pub fn block(&self, page: crate::layout::PageSize) -> u64 {
        self.block_size.unwrap_or(page.get())
    }
}

/// Makes a pool DMA-able (for example `cuMemHostRegister`, or `mlock`).
pub trait Pinner: Send + Sync + fmt::Debug {
    /// The plugin name.
    fn name(&self) -> &'static str;

    /// What pinning a pool of `size` would do (for example its registration
    /// chunks), for `hostpool plan`. Pure; `Null` when there is nothing to say.
    fn plan(&self, size: MappedSize, ctx: &PinContext) -> Value {
        let _ = (size, ctx);
        Value::Null
    }

    /// Pin the region. The returned pin must not keep the region: it keeps a
    /// [`crate::Span`] (`region.span()`) to undo itself, and the pool unpins before
    /// the mapping goes.
    ///
    /// # Errors
    /// [`crate::Error::NotAvailable`] when the host lacks what the pinner
    /// needs; other variants when pinning itself failed (nothing is left
    /// pinned either way).
    fn pin(&self, region: Region<'_>, ctx: &PinContext) -> Result<Box<dyn Pin>>;
}

/// A live pin.
pub trait Pin: Send + Sync + fmt::Debug {
    /// Chunks and other details for the report.
    fn details(&self) -> Value {
        Value::Null
    }

    /// Release the pin. Never panics; returns what could not be undone.
    fn unpin(self: Box<Self>) -> Vec<TeardownIssue>;
}

/// Registers a pool with a device (for example an RDMA NIC).
pub trait Registrar: Send + Sync + fmt::Debug {
    /// The plugin name.
    fn name(&self) -> &'static str;

    /// What registering a pool of `size` would do, for `hostpool plan`.
    /// Pure; `Null` when it depends on what only registration learns.
    fn plan(&self, size: MappedSize, ctx: &PinContext) -> Value {
        let _ = (size, ctx);
        Value::Null
    }

    /// Register the region.
    ///
    /// # Errors
    /// As for [`Pinner::pin`]; nothing is left registered on error.
    fn register(&self, region: Region<'_>, ctx: &PinContext) -> Result<Box<dyn Registration>>;
}

/// A live registration.
pub trait Registration: Send + Sync + fmt::Debug {
    /// Regions and keys for the report.
    fn details(&self) -> Value {
        Value::Null
    }

    /// Deregister. Never panics; returns what could not be undone.
    fn deregister(self: Box<Self>) -> Vec<TeardownIssue>;
}

/// An extent as it appears in reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ExtentReport {
    /// Offset from the start of the pool.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl From<Extent> for ExtentReport {
    fn from(e: Extent) -> Self {
        ExtentReport {
            offset: e.offset,
            len: e.len,
        }
    }
}
