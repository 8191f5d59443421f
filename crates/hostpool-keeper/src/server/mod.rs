//! The keeper: builds a pool once, then serves leases of it on its socket
//! until told to stop.
//!
//! Split by concern, the state apart from the I/O:
//!
//! - `state` ([`Serving`]): the state machine. What the
//!   keeper knows (the leases in force, one per tenant, their ranks and
//!   companions, the
//!   attaches that wait, failed leases, idle/clearing/broken, stopping) and
//!   every transition: a hello answered (`state::answer`), a rank joined,
//!   a lease's ranks arriving, releasing, dying and its end
//!   (`state::lease`), waiting attaches, stop requests, the status JSON. It
//!   names connections by id and holds no socket, file or pool: its unit
//!   tests run as an ordinary user.
//! - `io` ([`Sockets`]): the listener and the connections,
//!   by id. It accepts, reads hellos and what the ranks say, feeds that to
//!   the state and sends what the state returns (leases with the pool's
//!   descriptors, refusals, `Go`, failures), closing what it lets go.
//! - `status`: the status with what the memory says (the index at the
//!   pool's tail, read from its files); `clear`: clearing the pool between
//!   leases, on its own thread.
//! - here: [`Keeper`] (start, serve, teardown) and its loop, which ties the
//!   three together with the clock and the stop requests.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::KeptPoolConfig;
use io::Sockets;
use pool_core::Result;
use pool_core::prefault::PrefaultPlan;
use pool_core::{Extent, format_bytes};
use pool_core::{Observer, Pool, PoolPlan, PoolReport};
use state::{Figures, Serving, Stops};

pub use state::CameBack;

mod clear;
mod io;
mod mappers;
mod state;
mod status;
mod tier;

/// The number of stop requests a keeper has been given (SIGTERMs): the
/// first drains its leases, the second ends it at once.
pub type StopRequests = AtomicU32;

/// The memory a keeper keeps, built once.
#[derive(Debug)]
struct Memory {
    pool: Pool,
    /// A second descriptor of each of the pool's files, with its extent:
    /// what a lease is handed.
    files: Vec<(OwnedFd, Extent)>,
    prefault: PrefaultPlan,
    /// An adopted pool's files while processes that mapped them before the
    /// restart may still map them (checked every [`FROM_BEFORE_EVERY`]).
    from_before: Option<Vec<pool_core::file::FileId>>,
}

/// How often an adopted pool's keeper looks for the processes that mapped
/// the pool before its restart.
const FROM_BEFORE_EVERY: Duration = Duration::from_millis(250);

impl Memory {
    /// Why the pool's memory is gone, if a holder of one of its files (an
    /// engine, or a process it handed the descriptor to) truncated it:
    /// touching it, or handing it over, would be a SIGBUS.
    fn truncated(&self) -> Option<String> {
        let files = self.files.iter().map(|(fd, e)| (fd.as_fd(), *e));
        match pool_core::file::first_short(files) {
            Ok(None) => None,
            Ok(Some((i, len))) => Some(format!(
                "its file {i} was truncated to {} (its extent is {}) by a process that held its \
                 descriptor, so that part of its memory is gone",
                format_bytes(len),
                format_bytes(self.files[i].1.len)
            )),
            Err(e) => Some(format!("fstat of its files failed: {e}")),
        }
    }
}

/// A keeper of one pool: built with [`Keeper::start`], served with
/// [`Keeper::serve`], torn down with [`Keeper::teardown`] (or on drop).
#[derive(Debug)]
pub struct Keeper {
    memory: Memory,
    serving: Serving,
    sockets: Sockets,
}

impl Keeper {
    /// Take the pool's socket name, then build the pool (capacity checks,
    /// map, NUMA binding, prefault).
    ///
    /// # Errors
    /// [`Error::Config`] for a pool a keeper cannot keep; [`Error::Conflict`]
    /// when the socket name is taken (another keeper of that name, or any
    /// other process); the build's errors ([`Error::Interrupted`] once
    /// `cancel` is cancelled).
    ///
    /// [`Error::Config`]: pool_core::Error::Config
    /// [`Error::Conflict`]: pool_core::Error::Conflict
    /// [`Error::Interrupted`]: pool_core::Error::Interrupted
    pub fn start(
        config: KeptPoolConfig,
        observer: &dyn Observer,
        cancel: &pool_core::interrupt::Cancel,
    ) -> Result<Keeper> {
        Keeper::start_from(config, observer, cancel, None)
    }

    /// [`Keeper::start`], adopting the pool's `files` when given (handed
    /// back by systemd's file descriptor store): checked against the plan,
    /// then mapped as they are, bytes and index, instead of built. A
    /// keeper of `content = "zero"` builds anyway (its bytes would be
    /// cleared), and the files are closed.
    ///
    /// # Errors
    /// As [`Keeper::start`]; [`Error::Conflict`] for files that are not the
    /// pool the config plans (nothing is mapped, and nothing built).
    ///
    /// [`Error::Conflict`]: pool_core::Error::Conflict
    pub fn start_from(
        config: KeptPoolConfig,
        observer: &dyn Observer,
        cancel: &pool_core::interrupt::Cancel,
        adopt: Option<(Vec<OwnedFd>, CameBack)>,
    ) -> Result<Keeper> {
        config.validate()?;
        let plan = PoolPlan::kept(config.pool.clone())?;
        let listener = io::bind(&config.name)?;
        pool_core::failpoint::stall("keeper-before-build");
        let adopt = adopt.filter(|_| config.content == crate::Content::Keep);
        let persisted = match (&config.persist, &adopt) {
            // Handed back whole by systemd: the persisted files are the same
            // memory (the store holds what this keeper made there).
            (Some(dir), None) => Some(crate::persist::open_or_make(
                dir,
                &config.name,
                &plan.kept_extents(),
            )?),
            _ => None,
        };
        let (pool, files, came_back) = match (adopt, persisted) {
            (Some((files, from)), _) => {
                let (pool, files) = Pool::adopt_kept(&plan, files, observer)?;
                (pool, files, from)
            }
            (None, Some(p)) if p.found => {
                let (pool, files) = Pool::adopt_kept(&plan, p.fds, observer)?;
                (pool, files, CameBack::Persist)
            }
            (None, Some(crate::persist::Files { fds, paths, .. })) => {
                let built = Pool::build_kept_on(&plan, fds, observer, cancel);
                // A build that failed leaves no file behind.
                let (pool, files) = built.inspect_err(|_| crate::persist::remove(&paths))?;
                (pool, files, CameBack::Built)
            }
            (None, None) => {
                // Neither: a tenant that lived through the keeper before may
                // hand the pool back, within adopt_within_secs.
                let within = Duration::from_secs_f64(config.adopt_within_secs);
                let back = (config.content == crate::Content::Keep && !within.is_zero())
                    .then(|| io::wait_hand_back(&listener, &config.name, &plan, within, observer))
                    .flatten();
                match back {
                    Some((pool, files)) => (pool, files, CameBack::Tenants),
                    None => {
                        let (pool, files) = Pool::build_kept(&plan, observer, cancel)?;
                        (pool, files, CameBack::Built)
                    }
                }
            }
        };
        let from_before = (came_back != CameBack::Built).then(|| {
            files
                .iter()
                .filter_map(|(fd, _)| pool_core::file::file_id(fd).ok())
                .collect()
        });
        let report = pool.report();
        let mut serving = Serving::new(
            config,
            Figures {
                logical: report.logical_bytes,
                mapped: report.mapped_bytes,
                page: report.page_size,
                backing: report.backing.clone(),
                numa_node: plan.numa().as_ref().and_then(|n| n.node),
                came_back,
            },
        );
        let memory = Memory {
            pool,
            files,
            prefault: plan.prefault().clone(),
            from_before,
        };
        // An adopted pool: the blocks its index came back with.
        if came_back != CameBack::Built {
            let blocks = status::index_blocks(&serving, &memory);
            serving.set_came_back_blocks(blocks);
            tracing::info!(
                "kept pool `{}` came back from {} with {} block(s) in its index",
                serving.name(),
                came_back.name(),
                blocks.unwrap_or(0)
            );
        }
        Ok(Keeper {
            memory,
            serving,
            sockets: Sockets::new(listener),
        })
    }

    /// How its pool came to this keeper.
    pub fn came_back(&self) -> CameBack {
        self.serving.figures().came_back
    }

    /// A descriptor of each of the pool's files, in pool order: what
    /// systemd's file descriptor store is handed ([`crate::fdstore::store`]).
    pub fn files(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        self.memory.files.iter().map(|(fd, _)| fd.as_fd()).collect()
    }

    /// The kept pool's name.
    pub fn name(&self) -> &str {
        self.serving.name()
    }

    /// The build's report (map and prefault).
    pub fn report(&self) -> &PoolReport {
        self.memory.pool.report()
    }

    /// The keeper's status, as `hostpool keep status --json` prints it.
    pub fn status(&self) -> hostpool_handoff::lease::KeeperStatus {
        status::status(&self.serving, &self.memory)
    }

    /// Serve leases until stopped: the first stop request (`stops` ≥ 1)
    /// refuses new leases and waits up to `drain` for every tenant's lease
    /// to end; a second ends serving at once. A lease still in force then
    /// keeps its mapping (the kernel frees the memory when it unmaps).
    ///
    /// Each turn: the stop requests, the clearing's end, then whatever the
    /// sockets bring (new connections, what the lease's ranks say, hellos,
    /// waiting attaches), each fed to the state by the I/O side.
    pub fn serve(&mut self, stops: &StopRequests, drain: Duration) {
        let memory = &self.memory;
        let s = &mut self.serving;
        let io = &mut self.sockets;
        let Some(region) = memory.pool.region() else {
            return;
        };
        let abort = AtomicBool::new(false);
        let words = region.words(Extent {
            offset: 0,
            len: region.mapped_len(),
        });
        let name = s.name().to_string();
        let mut tier = words
            .ok()
            .map(|w| tier::TierServer::new(name, w, region.page().get()));
        // An adopted pool: the processes that mapped it at adoption (the
        // engines that lived through the restart, and their workers).
        let mut from_before = memory
            .from_before
            .clone()
            .map(|ids| {
                let pids = mappers::mapping(&ids);
                (ids, pids)
            })
            .filter(|(_, pids)| !pids.is_empty());
        let mut looked = None::<Instant>;
        std::thread::scope(|scope| {
            let mut clearing: Option<std::thread::ScopedJoinHandle<'_, Result<f64>>> = None;
            loop {
                let now = Instant::now();
                // An adopted pool: no chunk is granted to a writer while a process that mapped
                // the pool before the restart maps it still, and has not come
                // back as a tenant that told its stores in flight (nor is a
                // child of one: an engine's workers).
                if let Some((ids, before)) = &from_before
                    && looked.is_none_or(|t| now.duration_since(t) >= FROM_BEFORE_EVERY)
                {
                    looked = Some(now);
                    let back: Vec<u32> = tier
                        .as_ref()
                        .map(|t| t.rejoined())
                        .unwrap_or_default()
                        .into_iter()
                        .flat_map(|t| s.tenant_pids(t))
                        .collect();
                    let still: Vec<u32> = mappers::mapping(ids)
                        .into_iter()
                        .filter(|p| before.contains(p) && !mappers::descends_from(*p, &back))
                        .collect();
                    let why = (!still.is_empty()).then(|| {
                        format!(
                            "pid(s) {still:?} mapped the pool before the keeper's restart and \
                             may still write chunks granted to them; chunks are granted again \
                             once they are gone or have come back"
                        )
                    });
                    if why.is_none() {
                        from_before = None;
                    }
                    if let Some(t) = tier.as_mut() {
                        t.close_grants(why);
                    }
                }
                match s.on_stops(stops.load(Ordering::SeqCst), drain, clearing.is_some(), now) {
                    Stops::Serve => {}
                    Stops::Drain(refused) => {
                        for r in refused {
                            io.refuse(r);
                        }
                    }
                    Stops::Exit => break,
                    Stops::DrainTimedOut => {
                        tracing::warn!(
                            "kept pool `{}`: its lease did not end within {:.1} s of the stop \
                             request; stopping anyway (the engine keeps its mapping)",
                            s.name(),
                            drain.as_secs_f64()
                        );
                        break;
                    }
                }
                if clearing.as_ref().is_some_and(|h| h.is_finished()) {
                    let done = clearing.take().map(|h| h.join());
                    s.cleared(done);
                }
                io.accept(s);
                io.watch_lease(s, tier.as_mut());
                // Each tenant whose processes are all gone ends alone; the
                // last one's end starts the clearing.
                for tenant in s.ended() {
                    let now = Instant::now();
                    pool_core::failpoint::stall("keeper-lease-end");
                    if let Some(t) = tier.as_mut() {
                        t.reap(tenant);
                    }
                    if s.end_lease(tenant, now) {
                        if let Some(t) = tier.as_mut() {
                            t.forget();
                        }
                        let name = s.name().to_string();
                        let abort = &abort;
                        clearing =
                            Some(scope.spawn(move || clear::clear(&name, region, memory, abort)));
                    }
                }
                // A lease whose ranks said something (or hung up) since is
                // settled, and one that ended is over, before a new hello is
                // read: an engine's restart never finds its own predecessor's
                // lease in force.
                if !io.lease_unsettled(s) {
                    io.read_hellos(s, memory);
                }
                if clearing.is_none() {
                    io.serve_waiting(s, memory);
                }
                io.expire_waiting(s, Instant::now());
            }
            if let Some(h) = clearing.take() {
                abort.store(true, Ordering::SeqCst);
                let _ = h.join();
            }
        });
        // Whoever is still attached hears that the keeper is going.
        self.sockets.tell(&self.serving.farewell());
    }

    /// Close the socket, unmap and close the pool; the teardown's report.
    pub fn teardown(self) -> PoolReport {
        let Keeper {
            memory,
            serving,
            sockets,
        } = self;
        drop(sockets);
        drop(serving);
        let Memory { pool, files, .. } = memory;
        drop(files);
        pool.teardown()
    }
}
