//! The keeper: builds a pool once, then serves leases of it on its socket
//! until told to stop.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rustix::net::SocketFlags;
use serde_json::{Value, json};

use super::{Content, KeptPoolConfig};
use hostpool_handoff::lease::{
    FromKeeper, LeaseEnd, LeaseInfo, PreviousLease, ToKeeper, address, socket_name,
};
use hostpool_handoff::wire::{self, FDS_PER_MSG, Received, TICK};
use pool_core::Choice;
use pool_core::Region;
use pool_core::prefault::PrefaultPlan;
use pool_core::{Error, Result};
use pool_core::{Extent, format_bytes, round_to_page};
use pool_core::{Observer, Pool, PoolPlan, PoolReport};

/// The number of stop requests a keeper has been given (SIGTERMs): the
/// first drains its leases, the second ends it at once.
pub type StopRequests = AtomicU32;

/// How long a new connection has to say what it wants.
const HELLO_WITHIN: Duration = Duration::from_secs(5);

/// The memory a keeper keeps, built once.
#[derive(Debug)]
struct Memory {
    pool: Pool,
    /// A second descriptor of each of the pool's files, with its extent:
    /// what a lease is handed.
    files: Vec<(OwnedFd, Extent)>,
    prefault: PrefaultPlan,
}

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

/// One rank of a lease.
#[derive(Debug)]
struct Rank {
    rank: u32,
    pid: u32,
    uid: u32,
    fd: Option<OwnedFd>,
    arrived: bool,
    released: bool,
}

/// The lease in force.
#[derive(Debug)]
struct Lease {
    engine: String,
    world: u32,
    since: SystemTime,
    attach_deadline: Instant,
    barrier_deadline: Instant,
    tag: Option<String>,
    ranks: Vec<Rank>,
    /// Every rank attached and arrived (a world of 1: at once).
    live: bool,
    /// The lease failed; its ranks were told and are going.
    failed: bool,
    /// The first rank that died, by pid.
    died: Option<u32>,
    generation: u64,
}

/// A lease that failed while its ranks attached.
#[derive(Debug)]
struct FailedLease {
    engine: String,
    ranks: Vec<u32>,
    message: String,
    pid: Option<u32>,
    until: Instant,
}

/// An attach that waits for the pool to be cleared.
#[derive(Debug)]
struct Waiting {
    conn: OwnedFd,
    uid: u32,
    pid: u32,
    hello: ToKeeper,
    until: Instant,
}

/// What a keeper is doing besides its lease.
#[derive(Debug, Clone, PartialEq)]
enum State {
    Idle,
    Zeroing {
        since: Instant,
    },
    /// The pool could not be cleared: every lease is refused with why.
    Broken(String),
}

/// Everything of a keeper but its memory.
#[derive(Debug)]
struct Serving {
    config: KeptPoolConfig,
    listener: OwnedFd,
    instance: String,
    started_at: SystemTime,
    generation: u64,
    previous: Option<PreviousLease>,
    tag: Option<String>,
    lease: Option<Lease>,
    waiting: Vec<Waiting>,
    hellos: Vec<(OwnedFd, Instant)>,
    /// Leases of a world > 1 that failed, until their attach timeout: a rank
    /// of that engine that comes late is told why, rather than starting a
    /// lease that waits for ranks that are gone.
    failed: Vec<FailedLease>,
    state: State,
    last_clear_seconds: Option<f64>,
    stopping: bool,
    uid: u32,
    /// The kept pool's figures, for leases and status.
    logical: u64,
    mapped: u64,
    page: u64,
    backing: String,
    numa_node: Option<u32>,
}

/// A keeper of one pool: built with [`Keeper::start`], served with
/// [`Keeper::serve`], torn down with [`Keeper::teardown`] (or on drop).
#[derive(Debug)]
pub struct Keeper {
    memory: Memory,
    serving: Serving,
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
    pub fn start(
        config: KeptPoolConfig,
        observer: &dyn Observer,
        cancel: &pool_core::interrupt::Cancel,
    ) -> Result<Keeper> {
        config.validate()?;
        let plan = PoolPlan::new(config.plan_config())?;
        let listener = bind(&config.name)?;
        pool_core::failpoint::stall("keeper-before-build");
        let (pool, files) = Pool::build_kept(&plan, observer, cancel)?;
        let report = pool.report();
        let serving = Serving {
            listener,
            instance: instance_id(),
            started_at: SystemTime::now(),
            generation: 0,
            previous: None,
            tag: None,
            lease: None,
            waiting: Vec::new(),
            hellos: Vec::new(),
            failed: Vec::new(),
            state: State::Idle,
            last_clear_seconds: None,
            stopping: false,
            uid: rustix::process::geteuid().as_raw(),
            logical: report.logical_bytes,
            mapped: report.mapped_bytes,
            page: report.page_size,
            backing: report.backing.clone(),
            numa_node: plan.numa().as_ref().and_then(|n| n.node),
            config,
        };
        Ok(Keeper {
            memory: Memory {
                pool,
                files,
                prefault: plan.prefault().clone(),
            },
            serving,
        })
    }

    /// The kept pool's name.
    pub fn name(&self) -> &str {
        &self.serving.config.name
    }

    /// The build's report (map and prefault).
    pub fn report(&self) -> &PoolReport {
        self.memory.pool.report()
    }

    /// The keeper's status, as `hostpool keep status --json` prints it.
    pub fn status(&self) -> Value {
        self.serving.status(&self.memory.pool)
    }

    /// Serve leases until stopped: the first stop request (`stops` ≥ 1)
    /// refuses new leases and waits up to `drain` for the lease in force to
    /// end; a second ends serving at once. A lease still in force then keeps
    /// its mapping (the kernel frees the memory when it unmaps).
    pub fn serve(&mut self, stops: &StopRequests, drain: Duration) {
        let memory = &self.memory;
        let s = &mut self.serving;
        let Some(region) = memory.pool.region() else {
            return;
        };
        let abort = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let mut clearing: Option<std::thread::ScopedJoinHandle<'_, Result<f64>>> = None;
            let mut drain_until = None;
            loop {
                let asked = stops.load(Ordering::SeqCst);
                if asked >= 2 {
                    break;
                }
                if asked == 1 && !s.stopping {
                    s.stopping = true;
                    drain_until = Some(Instant::now() + drain);
                    for w in std::mem::take(&mut s.waiting) {
                        s.refuse(&w.conn, false, s.stopping_message(), None);
                    }
                }
                if s.stopping && s.lease.is_none() && clearing.is_none() {
                    break;
                }
                if drain_until.is_some_and(|d| Instant::now() >= d) {
                    tracing::warn!(
                        "kept pool `{}`: its lease did not end within {:.1} s of the stop request; \
                         stopping anyway (the engine keeps its mapping)",
                        s.config.name,
                        drain.as_secs_f64()
                    );
                    break;
                }
                if clearing.as_ref().is_some_and(|h| h.is_finished()) {
                    let done = clearing.take().map(|h| h.join());
                    s.cleared(done);
                }
                s.accept();
                s.watch_lease();
                if s.lease_over()
                    && s.end_lease()
                    && s.config.content == Content::Zero
                    && !s.stopping
                {
                    s.state = State::Zeroing {
                        since: Instant::now(),
                    };
                    let name = s.config.name.clone();
                    let abort = &abort;
                    clearing = Some(scope.spawn(move || clear(&name, region, memory, abort)));
                }
                // A lease whose ranks said something (or hung up) since is
                // settled, and one that ended is over, before a new hello is
                // read: an engine's restart never finds its own predecessor's
                // lease in force.
                if !s.lease_unsettled() {
                    s.read_hellos(memory);
                }
                if clearing.is_none() {
                    s.serve_waiting(memory);
                }
                s.expire_waiting();
            }
            if let Some(h) = clearing.take() {
                abort.store(true, Ordering::SeqCst);
                let _ = h.join();
            }
        });
        // Whoever is still attached hears that the keeper is going.
        if let Some(lease) = &self.serving.lease {
            for r in &lease.ranks {
                if let Some(fd) = &r.fd {
                    let _ = wire::send(
                        fd,
                        &FromKeeper::Failed {
                            message: format!(
                                "the keeper of `{}` stopped; the engine keeps its mapping",
                                self.serving.config.name
                            ),
                            ranks: Vec::new(),
                            pid: Some(std::process::id()),
                        },
                        &[],
                    );
                }
            }
        }
    }

    /// Close the socket, unmap and close the pool; the teardown's report.
    pub fn teardown(self) -> PoolReport {
        let Keeper { memory, serving } = self;
        drop(serving);
        let Memory { pool, files, .. } = memory;
        drop(files);
        pool.teardown()
    }
}

/// Bind the kept pool's socket, or say who holds its name.
fn bind(name: &str) -> Result<OwnedFd> {
    let addr = address(name)?;
    let sock = wire::seqpacket()?;
    match rustix::net::bind(&sock, &addr) {
        Ok(()) => {}
        Err(e) if e == rustix::io::Errno::ADDRINUSE => {
            // Who holds the name, and whether it answers as a keeper, over
            // one connection to it.
            let holder = wire::seqpacket()?;
            let who = rustix::net::connect(&holder, &addr)
                .ok()
                .and_then(|()| wire::peer_cred(&holder).ok());
            let keeper = who.is_some()
                && wire::send(&holder, &ToKeeper::Status, &[]).is_ok()
                && matches!(
                    wire::recv::<FromKeeper>(
                        &holder,
                        Instant::now() + Duration::from_secs(5),
                        &mut Vec::new(),
                        None
                    ),
                    Ok(Received::Msg(FromKeeper::Status(_)))
                );
            let message = match (who, keeper) {
                (Some((uid, pid)), true) => format!(
                    "a keeper of `{name}` already runs (pid {pid}, uid {uid}) on {}; stop it \
                     first, or give this pool another name",
                    socket_name(name)
                ),
                (Some((uid, pid)), false) => format!(
                    "the socket name {} is held by pid {pid} of uid {uid}, which is not a keeper \
                     that answers; stop that process, or give the pool another name",
                    socket_name(name)
                ),
                (None, _) => format!(
                    "the socket name {} is taken by a process that does not accept connections; \
                     find it with `ss -xlp | grep hostpool-keep` and stop it, or give the pool \
                     another name",
                    socket_name(name)
                ),
            };
            return Err(Error::Conflict {
                path: socket_name(name).into(),
                message,
            });
        }
        Err(e) => return Err(wire::os("bind", e, "binding the keeper's socket failed")),
    }
    rustix::net::listen(&sock, 64).map_err(|e| wire::os("listen", e, "the keeper's socket"))?;
    rustix::io::ioctl_fionbio(&sock, true)
        .map_err(|e| wire::os("ioctl(FIONBIO)", e, "the keeper's socket"))?;
    Ok(sock)
}

/// A client's timeout as a duration: a tenth of a second to a day, and the
/// default attach timeout for one that is not a number (a client's bad
/// input must not end the keeper).
fn seconds(secs: f64) -> Duration {
    let secs = if secs.is_finite() {
        secs
    } else {
        pool_core::DEFAULT_ATTACH_TIMEOUT_SECS
    };
    Duration::from_secs_f64(secs.clamp(0.1, 86_400.0))
}

/// A keeper instance's id: changes with every start.
fn instance_id() -> String {
    let mut bytes = [0u8; 8];
    let seeded = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_ok();
    if !seeded {
        let t = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        bytes = ((t as u64) ^ u64::from(std::process::id()).rotate_left(40)).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Clear the pool between leases: zero it in place on the prefault plan's
/// threads. Its pages stay resident and allocated (nothing is punched out
/// and faulted again), so no other process can take them in between and
/// the next lease finds them as the build left them.
fn clear(name: &str, region: Region<'_>, memory: &Memory, abort: &AtomicBool) -> Result<f64> {
    let t = Instant::now();
    // A file a lease truncated would make the zeroing a SIGBUS: check
    // first (the lease is over, so no holder is left to truncate it now
    // but one that kept a descriptor against the rules).
    if let Some(why) = memory.truncated() {
        return Err(Error::Keeper {
            name: name.to_string(),
            message: why,
            pid: None,
            absent: false,
        });
    }
    if let Some(e) = pool_core::failpoint::check("keeper-clear") {
        return Err(Error::os(
            "zeroing",
            e,
            pool_core::Context::new(0, region.page())
                .remedy(format!("clearing kept pool `{name}` between leases failed")),
        ));
    }
    pool_core::failpoint::stall("keeper-zeroing");
    // A keeper that stops serving (a second stop request, or the drain
    // timeout) stops the zeroing too, at its next step.
    pool_core::prefault::zero(&region, &memory.prefault, &|| abort.load(Ordering::SeqCst))?;
    Ok(t.elapsed().as_secs_f64())
}

impl Serving {
    fn stopping_message(&self) -> String {
        format!(
            "the keeper of `{}` (pid {}) is stopping and takes no new leases; start it again \
             ({}) once it has stopped",
            self.config.name,
            std::process::id(),
            socket_name(&self.config.name)
        )
    }

    fn refuse(&self, conn: &OwnedFd, usage: bool, message: String, pid: Option<u32>) {
        let _ = wire::send(
            conn,
            &FromKeeper::Refused {
                usage,
                message,
                pid,
            },
            &[],
        );
    }

    /// Wait up to a tick for anything to read: a connection, a hello, a
    /// rank's message or hang-up. Then take new connections: each has
    /// [`HELLO_WITHIN`] to say what it wants.
    fn accept(&mut self) {
        let mut fds = vec![self.listener.as_fd()];
        fds.extend(self.hellos.iter().map(|(c, _)| c.as_fd()));
        if let Some(l) = &self.lease {
            fds.extend(
                l.ranks
                    .iter()
                    .filter_map(|r| r.fd.as_ref().map(AsFd::as_fd)),
            );
        }
        fds.extend(self.waiting.iter().map(|w| w.conn.as_fd()));
        wire::wait_any(&fds, TICK);
        while let Ok(conn) = rustix::net::accept_with(&self.listener, SocketFlags::CLOEXEC) {
            self.hellos.push((conn, Instant::now() + HELLO_WITHIN));
        }
    }

    /// Read what new connections want, refusing users that are not allowed.
    fn read_hellos(&mut self, memory: &Memory) {
        let now = Instant::now();
        let hellos = std::mem::take(&mut self.hellos);
        for (conn, until) in hellos {
            if !wire::ready(&conn) {
                if now < until {
                    self.hellos.push((conn, until));
                }
                continue;
            }
            let Ok((uid, pid)) = wire::peer_cred(&conn) else {
                continue;
            };
            let msg = match wire::recv::<ToKeeper>(&conn, now + TICK, &mut Vec::new(), None) {
                Ok(Received::Msg(msg)) => msg,
                Ok(Received::Gone | Received::TimedOut) => continue,
                // Too long, or not one of ours: say so, rather than leave the
                // client to guess that the keeper died.
                Err(e) => {
                    self.refuse(
                        &conn,
                        false,
                        format!(
                            "the keeper of `{}` could not read the request of pid {pid}: {}; a \
                             client of the same hostpool version sends what it reads (a \
                             keeper_tag of at most {} bytes)",
                            self.config.name,
                            e.chain_message(),
                            pool_core::MAX_KEEPER_TAG_BYTES
                        ),
                        None,
                    );
                    continue;
                }
            };
            if uid != self.uid && uid != 0 && !self.config.allow_uids.contains(&uid) {
                let allowed: Vec<String> =
                    self.config.allow_uids.iter().map(u32::to_string).collect();
                self.refuse(
                    &conn,
                    false,
                    format!(
                        "uid {uid} may not use kept pool `{}`: its keeper runs as uid {} and \
                         allows [{}]; add {uid} to the pool's allow_uids, or run the engine as \
                         an allowed user",
                        self.config.name,
                        self.uid,
                        allowed.join(", ")
                    ),
                    None,
                );
                continue;
            }
            match msg {
                ToKeeper::Status => {
                    let _ = wire::send(&conn, &FromKeeper::Status(self.status(&memory.pool)), &[]);
                }
                hello @ ToKeeper::Hello { .. } => self.hello(memory, conn, uid, pid, hello),
                _ => {}
            }
        }
    }

    /// An engine's rank asks for a lease.
    fn hello(&mut self, memory: &Memory, conn: OwnedFd, uid: u32, pid: u32, hello: ToKeeper) {
        let ToKeeper::Hello {
            world,
            rank,
            engine,
            size,
            page,
            tag,
            attach_timeout_secs,
            barrier_timeout_secs,
        } = &hello
        else {
            return;
        };
        pool_core::failpoint::stall("keeper-hello");
        let name = self.config.name.clone();
        // A client that gave up before it was served (its attach timeout
        // passed while the keeper was stopped or busy) gets no lease: it
        // would count a generation and end as `died` without ever holding it.
        if wire::hung_up(&conn) {
            tracing::debug!("kept pool `{name}`: pid {pid} hung up before it was served");
            return;
        }
        if self.stopping {
            self.refuse(
                &conn,
                false,
                self.stopping_message(),
                Some(std::process::id()),
            );
            return;
        }
        if !matches!(self.state, State::Broken(_))
            && let Some(why) = memory.truncated()
        {
            tracing::error!("kept pool `{name}` is unusable: {why}");
            self.state = State::Broken(why);
        }
        if let State::Broken(why) = &self.state {
            self.refuse(
                &conn,
                false,
                format!(
                    "kept pool `{name}` is unusable: {why}; restart its keeper (pid {})",
                    std::process::id()
                ),
                Some(std::process::id()),
            );
            return;
        }
        if let Some(message) = self.mismatch(*size, *page, *world, *rank) {
            self.refuse(&conn, true, message, None);
            return;
        }
        let now = Instant::now();
        self.failed.retain(|f| f.until > now);
        if let Some(f) = self
            .failed
            .iter()
            .find(|f| !engine.is_empty() && f.engine == *engine && !f.ranks.contains(rank))
        {
            let message = format!(
                "the lease of engine `{engine}` failed before rank {rank} attached: {}",
                f.message
            );
            self.refuse(&conn, false, message, f.pid);
            return;
        }
        if let Some(lease) = &self.lease {
            let joins = !lease.live
                && !lease.failed
                && lease.engine == *engine
                && !engine.is_empty()
                && lease.world == *world
                && !lease.ranks.iter().any(|r| r.rank == *rank);
            if !joins {
                let holder = lease.ranks.first().map_or(0, |r| r.pid);
                let ranks: Vec<String> = lease
                    .ranks
                    .iter()
                    .map(|r| format!("rank {} pid {}", r.rank, r.pid))
                    .collect();
                let message = format!(
                    "kept pool `{name}` is leased by pid {holder} since {} ({}{}); one lease at a \
                     time: stop that engine first{}",
                    pool_core::rfc3339(lease.since),
                    ranks.join(", "),
                    if lease.engine.is_empty() {
                        String::new()
                    } else {
                        format!(", engine `{}`", lease.engine)
                    },
                    if !engine.is_empty()
                        && lease.engine == *engine
                        && lease.ranks.iter().any(|r| r.rank == *rank)
                    {
                        format!(" (rank {rank} is already attached: give each rank its own --rank)")
                    } else {
                        String::new()
                    }
                );
                self.refuse(&conn, false, message, (holder != 0).then_some(holder));
                return;
            }
        } else if matches!(self.state, State::Zeroing { .. }) {
            let until = Instant::now() + seconds(*attach_timeout_secs);
            self.waiting.push(Waiting {
                conn,
                uid,
                pid,
                hello,
                until,
            });
            return;
        } else {
            // A new lease of this engine: its ranks start again.
            self.failed.retain(|f| f.engine != *engine);
            self.generation += 1;
            let now = Instant::now();
            let attach = seconds(*attach_timeout_secs);
            let barrier = seconds(*barrier_timeout_secs);
            self.lease = Some(Lease {
                engine: engine.clone(),
                world: *world,
                since: SystemTime::now(),
                attach_deadline: now + attach,
                barrier_deadline: now + attach + barrier,
                tag: None,
                ranks: Vec::new(),
                live: false,
                failed: false,
                died: None,
                generation: self.generation,
            });
        }
        let info = LeaseInfo {
            name: name.clone(),
            instance: self.instance.clone(),
            generation: self.generation,
            content: self.config.content.name().to_string(),
            previous: self.previous.clone(),
            tag: self.tag.clone(),
            keeper_pid: std::process::id(),
        };
        pool_core::failpoint::stall("keeper-passing-fds");
        let sent = send_lease(&conn, memory, info, self);
        let Some(lease) = self.lease.as_mut() else {
            return;
        };
        if lease.tag.is_none() {
            lease.tag.clone_from(tag);
        }
        lease.ranks.push(Rank {
            rank: *rank,
            pid,
            uid,
            fd: sent.is_ok().then_some(conn),
            arrived: false,
            released: false,
        });
        if sent.is_err() {
            lease.died.get_or_insert(pid);
        }
        if lease.world == 1 && sent.is_ok() {
            lease.live = true;
        }
        pool_core::failpoint::stall("keeper-leased");
    }

    /// Why an engine's size, page size, world or rank do not fit the pool.
    fn mismatch(
        &self,
        size: Option<u64>,
        page: Option<u64>,
        world: u32,
        rank: u32,
    ) -> Option<String> {
        let name = &self.config.name;
        if world == 0 || world > pool_core::MAX_WORLD || rank >= world {
            return Some(format!(
                "rank {rank} of world {world} cannot lease kept pool `{name}`: world must be 1 to \
                 {} and rank below it",
                pool_core::MAX_WORLD
            ));
        }
        if let Some(p) = page
            && p != self.page
        {
            return Some(format!(
                "the engine asks for {} pages, but kept pool `{name}` has {} pages; ask for \
                 page_size = \"{}\" or none",
                format_bytes(p),
                format_bytes(self.page),
                format_bytes(self.page)
            ));
        }
        if let Some(s) = size {
            let fits = pool_core::PageSize::new(self.page)
                .ok()
                .and_then(|pg| round_to_page(s, pg).ok())
                .is_some_and(|m| m.mapped() == self.mapped);
            if !fits {
                return Some(format!(
                    "the engine asks for {}, but kept pool `{name}` is {} ({} mapped); ask for \
                     size = \"{}\", or give no size to take the pool as it is",
                    format_bytes(s),
                    format_bytes(self.logical),
                    format_bytes(self.mapped),
                    format_bytes(self.logical)
                ));
            }
        }
        None
    }

    /// Read what the lease's ranks say: arrivals, releases, deaths.
    fn watch_lease(&mut self) {
        let name = self.config.name.clone();
        let Some(lease) = self.lease.as_mut() else {
            return;
        };
        let mut failure: Option<(String, Vec<u32>, Option<u32>)> = None;
        // The failure that blames rank `r` for `what` it did.
        let blame = |r: &Rank, what: String| {
            (
                format!("kept pool `{name}`: rank {} (pid {}) {what}", r.rank, r.pid),
                vec![r.rank],
                Some(r.pid),
            )
        };
        for r in lease.ranks.iter_mut() {
            let Some(fd) = &r.fd else { continue };
            if !wire::ready(fd) {
                continue;
            }
            match wire::recv::<ToKeeper>(fd, Instant::now() + TICK, &mut Vec::new(), None) {
                Ok(Received::Msg(ToKeeper::Arrived { error: None })) => r.arrived = true,
                Ok(Received::Msg(ToKeeper::Arrived { error: Some(e) })) => {
                    r.arrived = true;
                    if !lease.live && !lease.failed && failure.is_none() {
                        failure = Some(blame(r, format!("failed: {e}")));
                    }
                }
                Ok(Received::Msg(ToKeeper::Release)) => r.released = true,
                Ok(Received::Msg(_) | Received::TimedOut) => {}
                Ok(Received::Gone) | Err(_) => {
                    r.fd = None;
                    if !r.released {
                        lease.died.get_or_insert(r.pid);
                        if !lease.live && !lease.failed && failure.is_none() {
                            failure = Some(blame(r, "died while attaching".into()));
                        }
                    }
                }
            }
        }
        if !lease.live && !lease.failed && failure.is_none() {
            let now = Instant::now();
            let all_here = lease.ranks.len() == lease.world as usize;
            if all_here && lease.ranks.iter().all(|r| r.arrived && r.fd.is_some()) {
                lease.live = true;
                for r in &lease.ranks {
                    if let Some(fd) = &r.fd {
                        let _ = wire::send(fd, &FromKeeper::Go, &[]);
                    }
                }
            } else if !all_here && now >= lease.attach_deadline {
                let missing: Vec<u32> = (0..lease.world)
                    .filter(|k| !lease.ranks.iter().any(|r| r.rank == *k))
                    .collect();
                let list: Vec<String> = missing.iter().map(u32::to_string).collect();
                failure = Some((
                    format!(
                        "kept pool `{name}`: rank(s) {} never attached within the attach \
                         timeout; start all {} ranks, or raise --attach-timeout",
                        list.join(", "),
                        lease.world
                    ),
                    missing,
                    None,
                ));
            } else if now >= lease.barrier_deadline {
                let late: Vec<&Rank> = lease.ranks.iter().filter(|r| !r.arrived).collect();
                let named: Vec<String> = late
                    .iter()
                    .map(|r| format!("rank {} (pid {})", r.rank, r.pid))
                    .collect();
                failure = Some((
                    format!(
                        "kept pool `{name}`: {} attached but did not map the pool within the \
                         barrier timeout; check the process",
                        named.join(", ")
                    ),
                    late.iter().map(|r| r.rank).collect(),
                    late.first().map(|r| r.pid),
                ));
            }
        }
        if let Some((message, ranks, pid)) = failure {
            lease.failed = true;
            if lease.world > 1 {
                self.failed.push(FailedLease {
                    engine: lease.engine.clone(),
                    ranks: lease.ranks.iter().map(|r| r.rank).collect(),
                    message: message.clone(),
                    pid,
                    until: lease.attach_deadline,
                });
            }
            for r in &lease.ranks {
                if let Some(fd) = &r.fd {
                    let _ = wire::send(
                        fd,
                        &FromKeeper::Failed {
                            message: message.clone(),
                            ranks: ranks.clone(),
                            pid,
                        },
                        &[],
                    );
                }
            }
        }
    }

    /// Whether a rank of the lease in force has something unread (a
    /// message, or its hang-up).
    fn lease_unsettled(&self) -> bool {
        self.lease.as_ref().is_some_and(|l| {
            l.ranks
                .iter()
                .any(|r| r.fd.as_ref().is_some_and(wire::ready))
        })
    }

    /// Whether the lease in force has ended: every rank's connection is gone.
    fn lease_over(&self) -> bool {
        self.lease
            .as_ref()
            .is_some_and(|l| !l.ranks.is_empty() && l.ranks.iter().all(|r| r.fd.is_none()))
    }

    /// Take the pool back from the lease that ended; `true` if there was one.
    fn end_lease(&mut self) -> bool {
        let Some(lease) = self.lease.take() else {
            return false;
        };
        pool_core::failpoint::stall("keeper-lease-end");
        let how = if lease.died.is_some() {
            LeaseEnd::Died
        } else {
            LeaseEnd::Closed
        };
        let pid = lease
            .died
            .or(lease.ranks.first().map(|r| r.pid))
            .unwrap_or(0);
        tracing::info!(
            "kept pool `{}`: lease {} of pid {pid} ended ({})",
            self.config.name,
            lease.generation,
            if how == LeaseEnd::Died {
                "died"
            } else {
                "closed"
            }
        );
        self.previous = Some(PreviousLease {
            pid,
            how,
            ended_at: pool_core::rfc3339(SystemTime::now()),
        });
        self.tag = lease.tag;
        true
    }

    /// The clearing thread ended.
    fn cleared(&mut self, done: Option<std::thread::Result<Result<f64>>>) {
        match done {
            Some(Ok(Ok(secs))) => {
                self.last_clear_seconds = Some(secs);
                self.state = State::Idle;
            }
            Some(Ok(Err(e))) => {
                tracing::error!("kept pool `{}` could not be cleared: {e}", self.config.name);
                self.state = State::Broken(format!(
                    "clearing it between leases failed: {}",
                    e.chain_message()
                ));
            }
            _ => self.state = State::Broken("the clearing thread panicked".into()),
        }
    }

    /// Leases that waited for the pool to be cleared, in arrival order.
    fn serve_waiting(&mut self, memory: &Memory) {
        while !self.waiting.is_empty() && self.lease.as_ref().is_none_or(|l| !l.live) {
            let w = self.waiting.remove(0);
            if wire::ready(&w.conn) {
                // It hung up while waiting.
                continue;
            }
            self.hello(memory, w.conn, w.uid, w.pid, w.hello);
            if self.lease.as_ref().is_some_and(|l| l.live) {
                break;
            }
        }
    }

    /// Waiting attaches that hung up are dropped; those past their timeout
    /// are told why.
    fn expire_waiting(&mut self) {
        let now = Instant::now();
        self.waiting.retain(|w| !wire::ready(&w.conn));
        let (late, keep): (Vec<Waiting>, Vec<Waiting>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| now >= w.until);
        self.waiting = keep;
        for w in late {
            let since = match self.state {
                State::Zeroing { since } => since.elapsed().as_secs_f64(),
                _ => 0.0,
            };
            self.refuse(
                &w.conn,
                false,
                format!(
                    "kept pool `{}` was still being cleared after the previous lease \
                     ({since:.1} s so far); raise --attach-timeout, or use content = \"keep\"",
                    self.config.name
                ),
                None,
            );
        }
    }

    fn status(&self, pool: &Pool) -> Value {
        let state = match (&self.state, &self.lease, self.stopping) {
            (_, _, true) => "stopping",
            (State::Broken(_), _, _) => "broken",
            (State::Zeroing { .. }, _, _) => "clearing",
            (_, Some(_), _) => "leased",
            _ => "idle",
        };
        let lease = self.lease.as_ref().map(|l| {
            json!({
                "pid": l.ranks.first().map(|r| r.pid),
                "uid": l.ranks.first().map(|r| r.uid),
                "since": pool_core::rfc3339(l.since),
                "engine": l.engine,
                "world": l.world,
                "generation": l.generation,
                "live": l.live,
                "ranks": l.ranks.iter().filter(|r| r.fd.is_some()).map(|r| json!({"rank": r.rank, "pid": r.pid, "uid": r.uid})).collect::<Vec<_>>(),
            })
        });
        json!({
            "name": self.config.name,
            "socket": socket_name(&self.config.name),
            "pid": std::process::id(),
            "uid": self.uid,
            "instance": self.instance,
            "started_at": pool_core::rfc3339(self.started_at),
            "state": state,
            "broken": match &self.state { State::Broken(why) => Some(why.clone()), _ => None },
            "backing": self.backing,
            "size": self.logical,
            "mapped": self.mapped,
            "page_size": self.page,
            "numa_node": self.numa_node,
            "numa": pool.report().numa,
            "content": self.config.content.name(),
            "allow_uids": self.config.allow_uids,
            "generation": self.generation,
            "lease": lease,
            "waiting": self.waiting.len(),
            "previous": self.previous,
            "tag": self.tag,
            "last_clear_seconds": self.last_clear_seconds,
        })
    }
}

/// Send a lease: its info and the pool's figures, with the files'
/// descriptors in as many messages as they need.
fn send_lease(
    conn: &OwnedFd,
    memory: &Memory,
    info: LeaseInfo,
    s: &Serving,
) -> std::io::Result<()> {
    let mut chunks = memory.files.chunks(FDS_PER_MSG).map(|c| {
        let fds: Vec<BorrowedFd<'_>> = c.iter().map(|(fd, _)| fd.as_fd()).collect();
        let extents: Vec<(u64, u64)> = c.iter().map(|(_, e)| (e.offset, e.len)).collect();
        (fds, extents)
    });
    let (first, extents) = chunks.next().unwrap_or_default();
    wire::send(
        conn,
        &FromKeeper::Lease {
            info,
            logical: s.logical,
            mapped: s.mapped,
            page: s.page,
            backing: s.backing.clone(),
            extents,
            files: memory.files.len(),
        },
        &first,
    )?;
    chunks.try_for_each(|(fds, extents)| wire::send(conn, &FromKeeper::Files { extents }, &fds))
}
