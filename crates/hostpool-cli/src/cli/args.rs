//! The flags that describe a pool, shared by `alloc`, `plan` and `doctor`,
//! and how they combine with `--config` into a [`PoolConfig`].

use std::num::NonZeroUsize;
use std::path::PathBuf;

use clap::Args;
use pool_core::host::memlock::MemlockPolicy;
use pool_core::{ByteSize, Error, PinScope, PoolConfig, PrefaultChoice, Rendezvous};

/// Flags that describe a pool; each overrides the same key of `--config`.
#[derive(Debug, Clone, Default, Args)]
pub struct PoolArgs {
    /// Config file (TOML, or JSON); flags override its keys.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Pool size: bytes or an IEC unit (4GiB, 512MiB). Default 1GiB.
    #[arg(long, value_name = "SIZE")]
    pub size: Option<ByteSize>,
    /// Backing plugin (anon, …, or auto).
    #[arg(long, value_name = "NAME")]
    pub backing: Option<String>,
    /// Directory for file-backed pools (a hugetlbfs mount or tmpfs).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Page size the backing must use (2MiB, 1GiB).
    #[arg(long, value_name = "SIZE")]
    pub page_size: Option<ByteSize>,
    /// Prefault threads (default: available cores, at least 64 MiB each).
    #[arg(long, value_name = "N")]
    pub threads: Option<NonZeroUsize>,
    /// Prefault method.
    #[arg(long, value_enum, value_name = "METHOD")]
    pub prefault: Option<PrefaultChoice>,
    /// Pin the pool with this pinner.
    #[arg(long, value_name = "KIND")]
    pub pin: Option<String>,
    /// Fail when pinning fails (default: warn and keep the pool pageable).
    #[arg(long)]
    pub pin_required: bool,
    /// Check the memlock bound before pinning (check), or not (ignore).
    #[arg(long, value_enum, value_name = "POLICY")]
    pub memlock_bound: Option<MemlockPolicy>,
    /// Pin the whole pool, or in a shared pool only this rank's shard.
    #[arg(long, value_enum, value_name = "SCOPE")]
    pub pin_scope: Option<PinScope>,
    /// Pin in the background: the pool is usable once prefaulted, and pinned
    /// chunk by chunk in address order (`pin.background`).
    #[arg(long)]
    pub pin_background: bool,
    /// The chunk a background pin takes at a time (default 256MiB, whole blocks).
    #[arg(long, value_name = "SIZE")]
    pub pin_background_chunk: Option<ByteSize>,
    /// Register the pool with this registrar (repeatable).
    #[arg(long, value_name = "KIND")]
    pub register: Vec<String>,
    /// Share the pool between ranks under this name (with --world and --rank).
    #[arg(long, value_name = "NAME", requires_all = ["world", "rank"])]
    pub shared: Option<String>,
    /// Number of ranks sharing the pool.
    #[arg(long, value_name = "N", requires = "shared")]
    pub world: Option<u32>,
    /// This process's rank, 0 to N-1.
    #[arg(long, value_name = "R", requires = "shared")]
    pub rank: Option<u32>,
    /// Seconds to wait for the creator and for ranks that never attach; with
    /// --keeper, for the keeper to hand the pool over (default 30).
    #[arg(long, value_name = "SECS")]
    pub attach_timeout: Option<f64>,
    /// Seconds to wait at the barrier for ranks that attached but do not
    /// arrive (stopped or hung; default 600).
    #[arg(long, value_name = "SECS", requires = "shared")]
    pub barrier_timeout: Option<f64>,
    /// How the ranks meet: `socket` (default: a unix socket, nothing in any
    /// directory) or `file` (a control file, for ranks that share only a
    /// directory).
    #[arg(long, value_enum, requires = "shared")]
    pub rendezvous: Option<Rendezvous>,
    /// Bind the pool's pages to a NUMA node: a number, `gpu` (the node of
    /// `[cuda] device`, from its PCI address), or for a shared pool one
    /// node per rank (`0,0,1,1`).
    #[arg(long, value_name = "N|gpu|LIST", value_parser = numa_node)]
    pub numa_node: Option<pool_core::NumaNode>,
    /// With backing auto: huge pages required, preferred (4 KiB pages when
    /// they run short, said in the report) or off.
    #[arg(long, value_enum, value_name = "POLICY")]
    pub huge_pages: Option<pool_core::HugePages>,
    /// Lease the pool from the keeper of this name (`hostpool keep`)
    /// instead of building it.
    #[arg(long, value_name = "NAME")]
    pub keeper: Option<String>,
    /// A tag to store with the lease, handed to the next lease (`lease.tag`).
    #[arg(long, value_name = "TAG", requires = "keeper")]
    pub keeper_tag: Option<String>,
    /// When no keeper answers: fail (default) or build a pool of this
    /// process's own.
    #[arg(long, value_enum, value_name = "WHAT", requires = "keeper")]
    pub keeper_fallback: Option<pool_core::KeeperFallback>,
}

impl PoolArgs {
    /// Whether any pool flag or `--config` was given.
    pub fn given(&self) -> bool {
        self.config.is_some() || self.flags_given()
    }

    /// Whether any pool flag other than `--config` was given. Destructured
    /// in full, so a new pool flag cannot be forgotten here.
    pub fn flags_given(&self) -> bool {
        let PoolArgs {
            config: _,
            size,
            backing,
            dir,
            page_size,
            threads,
            prefault,
            pin,
            pin_required,
            memlock_bound,
            pin_scope,
            pin_background,
            pin_background_chunk,
            register,
            shared,
            world,
            rank,
            attach_timeout,
            barrier_timeout,
            rendezvous,
            numa_node,
            keeper,
            keeper_tag,
            keeper_fallback,
            huge_pages,
        } = self;
        size.is_some()
            || backing.is_some()
            || dir.is_some()
            || page_size.is_some()
            || threads.is_some()
            || prefault.is_some()
            || pin.is_some()
            || *pin_required
            || memlock_bound.is_some()
            || pin_scope.is_some()
            || *pin_background
            || pin_background_chunk.is_some()
            || !register.is_empty()
            || shared.is_some()
            || world.is_some()
            || rank.is_some()
            || attach_timeout.is_some()
            || barrier_timeout.is_some()
            || rendezvous.is_some()
            || numa_node.is_some()
            || keeper.is_some()
            || keeper_tag.is_some()
            || keeper_fallback.is_some()
            || huge_pages.is_some()
    }
}

/// The config from `--config` (or the embedded default) with flags applied.
///
/// # Errors
/// [`Error::Config`] for an unreadable or invalid file.
pub fn resolve_config(args: &PoolArgs) -> Result<PoolConfig, Error> {
    let mut config = match &args.config {
        Some(path) => PoolConfig::from_path(path)?,
        None => PoolConfig::default(),
    };
    if let Some(size) = args.size {
        config.size = size;
    }
    if let Some(backing) = &args.backing {
        config.backing = backing.clone();
    }
    if let Some(dir) = &args.dir {
        config.dir = Some(dir.clone());
    }
    if let Some(page) = args.page_size {
        config.page_size = Some(page);
    }
    if let Some(threads) = args.threads {
        config.threads = Some(threads);
    }
    if let Some(prefault) = args.prefault {
        config.prefault = prefault;
    }
    if let Some(pin) = &args.pin {
        config.pin.kind = pool_core::pin_kind_from(pin.as_str());
    }
    if args.pin_required {
        config.pin.required = true;
    }
    if args.pin_background {
        config.pin.background = true;
    }
    if let Some(chunk) = args.pin_background_chunk {
        config.pin.background_chunk = Some(chunk);
    }
    if let Some(m) = args.memlock_bound {
        config.pin.memlock_bound = m;
    }
    if let Some(scope) = args.pin_scope {
        config.pin.scope = scope;
    }
    if !args.register.is_empty() {
        config.register = args.register.clone();
    }
    if let Some(node) = &args.numa_node {
        config.numa_node = Some(node.clone());
    }
    if let Some(h) = args.huge_pages {
        config.huge_pages = Some(h);
    }
    if let Some(keeper) = &args.keeper {
        config.lease.get_or_insert_default().keeper = Some(keeper.clone());
    }
    if let Some(tag) = &args.keeper_tag {
        config.lease.get_or_insert_default().tag = Some(tag.clone());
    }
    if let Some(f) = args.keeper_fallback {
        config.lease.get_or_insert_default().fallback = f;
    }
    // A lease asks the keeper for the size only when one was given.
    if let (Some(size), Some(lease)) = (args.size, config.lease.as_mut()) {
        lease.size = Some(size);
    }
    if let (Some(name), Some(world), Some(rank)) = (&args.shared, args.world, args.rank) {
        let previous = config.sharing.take();
        config.sharing = Some(pool_core::SharingConfig {
            name: name.clone(),
            world,
            rank,
            attach_timeout_secs: args
                .attach_timeout
                .or(previous.as_ref().map(|p| p.attach_timeout_secs))
                .unwrap_or(pool_core::DEFAULT_ATTACH_TIMEOUT_SECS),
            barrier_timeout_secs: args
                .barrier_timeout
                .or(previous.as_ref().map(|p| p.barrier_timeout_secs))
                .unwrap_or(pool_core::DEFAULT_BARRIER_TIMEOUT_SECS),
            rendezvous: args
                .rendezvous
                .or(previous.as_ref().map(|p| p.rendezvous))
                .unwrap_or_default(),
            control_dir: previous.and_then(|p| p.control_dir),
        });
    } else if let Some(s) = config.sharing.as_mut() {
        if let Some(r) = args.rendezvous {
            s.rendezvous = r;
        }
        if let Some(t) = args.attach_timeout {
            s.attach_timeout_secs = t;
        }
        if let Some(t) = args.barrier_timeout {
            s.barrier_timeout_secs = t;
        }
    } else if let Some(t) = args.attach_timeout {
        let Some(lease) = config.lease.as_mut() else {
            return Err(Error::config(
                "--attach-timeout goes with --shared (how long a rank waits for its peers) or \
                 --keeper (how long a lease waits for the keeper)",
            ));
        };
        lease.attach_timeout_secs = Some(t);
    }
    Ok(config)
}

/// `--numa-node`: `1`, `gpu` or `0,0,1,1`.
fn numa_node(s: &str) -> Result<pool_core::NumaNode, String> {
    pool_core::NumaNode::parse(s).map_err(|e| match e {
        pool_core::Error::Config { message } => message,
        other => other.to_string(),
    })
}
