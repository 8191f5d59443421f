//! The keeper: builds a pool once, then serves leases of it on its socket
//! until told to stop.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rustix::net::SocketFlags;
use serde_json::{Value, json};

use super::{Content, KeptPoolConfig};
use hostpool_handoff::Message;
use hostpool_handoff::barrier::{Barrier, Deadline, Event, Failure, Mark, Verdict};
use hostpool_handoff::lease::{LeaseEnd, LeaseInfo, PreviousLease, address, socket_name};
use hostpool_handoff::wire::{self, Received, TICK};
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

impl Rank {
    /// The rank as the barrier sees it.
    fn mark(&self) -> Mark {
        Mark {
            rank: self.rank,
            pid: self.pid,
            arrived: self.arrived,
            present: self.fd.is_some(),
        }
    }
}

/// The lease in force.
#[derive(Debug)]
struct Lease {
    engine: String,
    world: u32,
    since: SystemTime,
    /// The barrier of its ranks, until it is live or failed.
    barrier: Barrier,
    tag: Option<String>,
    ranks: Vec<Rank>,
    /// Processes of the engine that map the lease without being one of its
    /// ranks (`keeper_companion_of`: vLLM's scheduler, which keeps the
    /// pool's index): no barrier; the lease ends once they went too.
    companions: Vec<Rank>,
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
    hello: Message,
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

/// How a keeper answers a hello ([`Serving::answer`]).
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    /// Refused, saying why (`usage`: the request itself was wrong).
    Refuse {
        usage: bool,
        message: String,
        pid: Option<u32>,
    },
    /// Served once the pool is cleared, or refused at `until`.
    Wait { until: Instant },
    /// Handed the pool.
    Grant,
}

/// What the stop requests so far tell a keeper to do ([`Serving::on_stops`]).
#[derive(Debug)]
enum Stops {
    /// Go on serving.
    Serve,
    /// The first request: go on draining; refuse these waiting attaches.
    Drain(Vec<Waiting>),
    /// End now: a second request, or nothing left to drain.
    Exit,
    /// The drain timeout passed with a lease still in force.
    DrainTimedOut,
}

/// What a rank of the lease said or did ([`Serving::on_rank`]).
#[derive(Debug, Clone, PartialEq)]
enum RankEvent {
    /// It mapped the pool (with its error, if its setup failed).
    Arrived(Option<String>),
    /// It released the lease (a clean end).
    Released,
    /// Its connection ended.
    Gone,
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
    /// When a draining keeper stops anyway, lease or not.
    drain_until: Option<Instant>,
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
        let serving = Serving::new(
            config,
            listener,
            Figures {
                logical: report.logical_bytes,
                mapped: report.mapped_bytes,
                page: report.page_size,
                backing: report.backing.clone(),
                numa_node: plan.numa().as_ref().and_then(|n| n.node),
            },
        );
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
        self.serving.status(&self.memory)
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
            loop {
                let now = Instant::now();
                match s.on_stops(stops.load(Ordering::SeqCst), drain, clearing.is_some(), now) {
                    Stops::Serve => {}
                    Stops::Drain(refused) => {
                        for w in refused {
                            s.refuse(&w.conn, false, s.stopping_message(), None);
                        }
                    }
                    Stops::Exit => break,
                    Stops::DrainTimedOut => {
                        tracing::warn!(
                            "kept pool `{}`: its lease did not end within {:.1} s of the stop \
                             request; stopping anyway (the engine keeps its mapping)",
                            s.config.name,
                            drain.as_secs_f64()
                        );
                        break;
                    }
                }
                if clearing.as_ref().is_some_and(|h| h.is_finished()) {
                    let done = clearing.take().map(|h| h.join());
                    s.cleared(done);
                }
                s.accept();
                s.watch_lease();
                if s.lease_over() && s.end_lease(Instant::now()) {
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
            for r in lease.ranks.iter().chain(&lease.companions) {
                if let Some(fd) = &r.fd {
                    let _ = wire::send(
                        fd,
                        &Message::Failed {
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
                && wire::send(&holder, &Message::Status, &[]).is_ok()
                && matches!(
                    wire::recv::<Message>(
                        &holder,
                        Instant::now() + Duration::from_secs(5),
                        &mut Vec::new(),
                        None
                    ),
                    Ok(Received::Msg(Message::StatusOf(_)))
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

/// A kept pool's figures, for its leases and its status.
#[derive(Debug)]
struct Figures {
    logical: u64,
    mapped: u64,
    page: u64,
    backing: String,
    numa_node: Option<u32>,
}

impl Serving {
    /// An idle keeper of the pool `figures` describes, on `listener`.
    fn new(config: KeptPoolConfig, listener: OwnedFd, figures: Figures) -> Serving {
        Serving {
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
            drain_until: None,
            uid: rustix::process::geteuid().as_raw(),
            logical: figures.logical,
            mapped: figures.mapped,
            page: figures.page,
            backing: figures.backing,
            numa_node: figures.numa_node,
            config,
        }
    }

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
            &Message::Refused {
                usage,
                message,
                ranks: Vec::new(),
                pid,
                page: None,
            },
            &[],
        );
    }

    /// The stop requests so far (`asked`): the first drains (no new lease,
    /// the waiting attaches are refused, the lease in force may end within
    /// `drain`), the second ends the keeper at once; a draining keeper ends
    /// once no lease and no clearing is left, or at its drain deadline.
    fn on_stops(&mut self, asked: u32, drain: Duration, clearing: bool, now: Instant) -> Stops {
        if asked >= 2 {
            return Stops::Exit;
        }
        let mut refused = Vec::new();
        if asked == 1 && !self.stopping {
            self.stopping = true;
            self.drain_until = Some(now + drain);
            refused = std::mem::take(&mut self.waiting);
        }
        if self.stopping && self.lease.is_none() && !clearing {
            return Stops::Exit;
        }
        if self.drain_until.is_some_and(|d| now >= d) {
            return Stops::DrainTimedOut;
        }
        if refused.is_empty() {
            Stops::Serve
        } else {
            Stops::Drain(refused)
        }
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
            let msg = match wire::recv::<Message>(&conn, now + TICK, &mut Vec::new(), None) {
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
                Message::Status => {
                    let _ = wire::send(&conn, &Message::StatusOf(self.status(memory)), &[]);
                }
                hello @ Message::Hello { .. } => self.hello(memory, conn, uid, pid, hello),
                _ => {}
            }
        }
    }

    /// An engine's rank asks for a lease.
    fn hello(&mut self, memory: &Memory, conn: OwnedFd, uid: u32, pid: u32, hello: Message) {
        let Message::Hello {
            rank,
            tag,
            companion,
            ..
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
        match self.answer(&hello, || memory.truncated(), Instant::now()) {
            Answer::Refuse {
                usage,
                message,
                pid,
            } => {
                self.refuse(&conn, usage, message, pid);
                return;
            }
            Answer::Wait { until } => {
                self.waiting.push(Waiting {
                    conn,
                    uid,
                    pid,
                    hello,
                    until,
                });
                return;
            }
            Answer::Grant => {}
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
        if *companion {
            tracing::info!("kept pool `{name}`: pid {pid} maps the lease as a companion");
            lease.companions.push(Rank {
                rank: 0,
                pid,
                uid,
                fd: sent.is_ok().then_some(conn),
                arrived: true,
                released: false,
            });
            return;
        }
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

    /// What a hello is answered with, from the keeper's state alone, and
    /// the state it leaves: refused (stopping, broken, a size or page size
    /// that does not fit, a failed lease of the same engine, another
    /// engine's lease in force), told to wait (the pool is being cleared),
    /// or granted (a new lease, generation + 1, or a rank joining its
    /// engine's lease). `truncated` says whether a holder truncated the
    /// pool's files, which breaks it for good.
    fn answer(
        &mut self,
        hello: &Message,
        truncated: impl FnOnce() -> Option<String>,
        now: Instant,
    ) -> Answer {
        let Message::Hello {
            protocol,
            world,
            rank,
            engine,
            companion,
            size,
            page,
            attach_timeout_secs,
            barrier_timeout_secs,
            ..
        } = hello
        else {
            return Answer::Refuse {
                usage: false,
                message: "not a hello".into(),
                pid: None,
            };
        };
        let name = self.config.name.clone();
        let keeper = Some(std::process::id());
        // Before anything else: the rest of the hello means what this
        // keeper thinks only in a protocol both speak.
        if let Some(message) = hostpool_handoff::PROTOCOL.refusal(
            *protocol,
            &format!("the keeper of `{name}`"),
            "this engine",
        ) {
            return Answer::Refuse {
                usage: false,
                message,
                pid: keeper,
            };
        }
        if self.stopping {
            return Answer::Refuse {
                usage: false,
                message: self.stopping_message(),
                pid: keeper,
            };
        }
        if !matches!(self.state, State::Broken(_))
            && let Some(why) = truncated()
        {
            tracing::error!("kept pool `{name}` is unusable: {why}");
            self.state = State::Broken(why);
        }
        if let State::Broken(why) = &self.state {
            return Answer::Refuse {
                usage: false,
                message: format!(
                    "kept pool `{name}` is unusable: {why}; restart its keeper (pid {})",
                    std::process::id()
                ),
                pid: keeper,
            };
        }
        if let Some(message) = self.mismatch(*size, *page, *world, *rank) {
            return Answer::Refuse {
                usage: true,
                message,
                pid: None,
            };
        }
        if *companion {
            return self.companion_answer(engine);
        }
        self.failed.retain(|f| f.until > now);
        if let Some(f) = self
            .failed
            .iter()
            .find(|f| !engine.is_empty() && f.engine == *engine && !f.ranks.contains(rank))
        {
            return Answer::Refuse {
                usage: false,
                message: format!(
                    "the lease of engine `{engine}` failed before rank {rank} attached: {}",
                    f.message
                ),
                pid: f.pid,
            };
        }
        if let Some(lease) = &self.lease {
            let joins = !lease.live
                && !lease.failed
                && lease.engine == *engine
                && !engine.is_empty()
                && lease.world == *world
                && !lease.ranks.iter().any(|r| r.rank == *rank);
            if joins {
                return Answer::Grant;
            }
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
            return Answer::Refuse {
                usage: false,
                message,
                pid: (holder != 0).then_some(holder),
            };
        }
        if matches!(self.state, State::Zeroing { .. }) {
            return Answer::Wait {
                until: now + seconds(*attach_timeout_secs),
            };
        }
        // A new lease of this engine: its ranks start again.
        self.failed.retain(|f| f.engine != *engine);
        self.generation += 1;
        let attach = seconds(*attach_timeout_secs);
        let barrier = seconds(*barrier_timeout_secs);
        self.lease = Some(Lease {
            engine: engine.clone(),
            world: *world,
            since: SystemTime::now(),
            barrier: Barrier {
                pool: format!("kept pool `{}`", self.config.name),
                world: *world,
                attach: Deadline {
                    at: now + attach,
                    secs: *attach_timeout_secs,
                },
                barrier: Deadline {
                    at: now + attach + barrier,
                    secs: *barrier_timeout_secs,
                },
            },
            tag: None,
            ranks: Vec::new(),
            companions: Vec::new(),
            live: false,
            failed: false,
            died: None,
            generation: self.generation,
        });
        Answer::Grant
    }

    /// A companion of `engine` (a process of the engine that is none of its
    /// ranks) is granted the lease that engine's ranks hold, and refused
    /// when none is in force: it joins a lease, never starts one.
    fn companion_answer(&self, engine: &str) -> Answer {
        let name = &self.config.name;
        let refuse = |message: String, pid: Option<u32>| Answer::Refuse {
            usage: false,
            message,
            pid,
        };
        match &self.lease {
            Some(l) if l.engine == engine && !engine.is_empty() && !l.failed => Answer::Grant,
            Some(l) if l.engine == engine && !engine.is_empty() => refuse(
                format!(
                    "the lease of engine `{engine}` on kept pool `{name}` failed; its companion \
                     has nothing to map"
                ),
                l.ranks.first().map(|r| r.pid),
            ),
            Some(l) => {
                let holder = l.ranks.first().map(|r| r.pid);
                refuse(
                    format!(
                        "kept pool `{name}` is leased by engine `{}` (pid {}), not `{engine}`: a \
                         companion maps the lease of its own engine",
                        l.engine,
                        holder.unwrap_or(0)
                    ),
                    holder,
                )
            }
            None => refuse(
                format!(
                    "no lease of engine `{engine}` is in force on kept pool `{name}`: a companion \
                     maps the lease its engine's ranks hold, so start it once they attached"
                ),
                None,
            ),
        }
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

    /// Read what the lease's ranks say (arrivals, releases, deaths), settle
    /// the lease on it and tell its ranks: `Go` once all arrived, or why it
    /// failed.
    fn watch_lease(&mut self) {
        let Some(lease) = self.lease.as_ref() else {
            return;
        };
        let events = read_events(&lease.ranks);
        for (i, event) in read_events(&lease.companions) {
            self.on_companion(i, event);
        }
        let mut failure = None;
        for (i, event) in events {
            let failed = self.on_rank(i, event);
            failure = failure.or(failed);
        }
        let Some(verdict) = self.settle(failure, Instant::now()) else {
            return;
        };
        let Some(lease) = self.lease.as_ref() else {
            return;
        };
        let msg = match verdict {
            Verdict::Go => Message::Go,
            Verdict::Failed(f) => Message::from(f),
        };
        for r in &lease.ranks {
            if let Some(fd) = &r.fd {
                let _ = wire::send(fd, &msg, &[]);
            }
        }
    }

    /// What companion `index` of the lease said or did: released, or gone
    /// (without a release, it died, and the lease ends as `died`). It is
    /// in no barrier, so it fails nothing.
    fn on_companion(&mut self, index: usize, event: RankEvent) {
        let Some(lease) = self.lease.as_mut() else {
            return;
        };
        let Some(c) = lease.companions.get_mut(index) else {
            return;
        };
        match event {
            RankEvent::Arrived(_) => {}
            RankEvent::Released => c.released = true,
            RankEvent::Gone => {
                c.fd = None;
                if !c.released {
                    lease.died.get_or_insert(c.pid);
                }
            }
        }
    }

    /// What rank `index` of the lease said or did: arrived (with its
    /// error, if its setup failed), released, or gone (its connection
    /// ended: without a release, it died). The failure it causes a lease
    /// that is not live yet, naming it.
    fn on_rank(&mut self, index: usize, event: RankEvent) -> Option<Failure> {
        let lease = self.lease.as_mut()?;
        let settling = !lease.live && !lease.failed;
        let r = lease.ranks.get_mut(index)?;
        let mark = r.mark();
        let event = match event {
            RankEvent::Arrived(error) => {
                r.arrived = true;
                Event::Arrived(error)
            }
            RankEvent::Released => {
                r.released = true;
                return None;
            }
            RankEvent::Gone => {
                r.fd = None;
                if r.released {
                    return None;
                }
                lease.died.get_or_insert(r.pid);
                Event::Gone
            }
        };
        settling.then(|| lease.barrier.on(&mark, &event)).flatten()
    }

    /// Settle a lease that is not live yet, at `now`: it fails with
    /// `failure`, or when a rank never attached by the attach deadline, or
    /// one that attached did not arrive by the barrier deadline; it goes
    /// live once every rank attached and arrived. A failed lease of an
    /// engine of several ranks is remembered until its attach deadline, so
    /// that a late rank is told why.
    fn settle(&mut self, failure: Option<Failure>, now: Instant) -> Option<Verdict> {
        let lease = self.lease.as_mut()?;
        if lease.live || lease.failed {
            return None;
        }
        let verdict = match failure {
            Some(f) => Verdict::Failed(f),
            None => {
                let marks: Vec<Mark> = lease.ranks.iter().map(Rank::mark).collect();
                lease
                    .barrier
                    .settle(&marks, now, pool_core::host::process::why_late)?
            }
        };
        let Verdict::Failed(Failure { message, pid, .. }) = &verdict else {
            lease.live = true;
            return Some(verdict);
        };
        lease.failed = true;
        if lease.world > 1 {
            self.failed.push(FailedLease {
                engine: lease.engine.clone(),
                ranks: lease.ranks.iter().map(|r| r.rank).collect(),
                message: message.clone(),
                pid: *pid,
                until: lease.barrier.attach.at,
            });
        }
        Some(verdict)
    }

    /// Whether a rank of the lease in force has something unread (a
    /// message, or its hang-up).
    fn lease_unsettled(&self) -> bool {
        self.lease.as_ref().is_some_and(|l| {
            l.ranks
                .iter()
                .chain(&l.companions)
                .any(|r| r.fd.as_ref().is_some_and(wire::ready))
        })
    }

    /// Whether the lease in force has ended: every rank's connection is
    /// gone, and every companion's.
    fn lease_over(&self) -> bool {
        self.lease.as_ref().is_some_and(|l| {
            !l.ranks.is_empty() && l.ranks.iter().chain(&l.companions).all(|r| r.fd.is_none())
        })
    }

    /// Take the pool back from the lease that ended: how it ended becomes
    /// the previous lease, its tag goes to the next. `true` when the pool
    /// is to be cleared now (`content = "zero"` and not stopping), and the
    /// state says so from `now`.
    fn end_lease(&mut self, now: Instant) -> bool {
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
        let clear = self.config.content == Content::Zero && !self.stopping;
        if clear {
            self.state = State::Zeroing { since: now };
        }
        clear
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

    fn status(&self, memory: &Memory) -> Value {
        let pool = &memory.pool;
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
                "companions": l.companions.iter().filter(|r| r.fd.is_some()).map(|r| json!({"pid": r.pid, "uid": r.uid})).collect::<Vec<_>>(),
            })
        });
        json!({
            "name": self.config.name,
            "socket": socket_name(&self.config.name),
            "pid": std::process::id(),
            "uid": self.uid,
            "instance": self.instance,
            "protocol": hostpool_handoff::PROTOCOL,
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
            "index": index_status(&memory.files, self.mapped, self.page),
        })
    }
}

/// What the connections of a lease's ranks (or companions) said since:
/// arrived, released, or gone, by their place in `ranks`.
fn read_events(ranks: &[Rank]) -> Vec<(usize, RankEvent)> {
    let mut events = Vec::new();
    for (i, r) in ranks.iter().enumerate() {
        let Some(fd) = &r.fd else { continue };
        if !wire::ready(fd) {
            continue;
        }
        let event = match wire::recv::<Message>(fd, Instant::now() + TICK, &mut Vec::new(), None) {
            Ok(Received::Msg(Message::Arrived { error })) => RankEvent::Arrived(error),
            Ok(Received::Msg(Message::Release)) => RankEvent::Released,
            Ok(Received::Msg(_) | Received::TimedOut) => continue,
            Ok(Received::Gone) | Err(_) => RankEvent::Gone,
        };
        events.push((i, event));
    }
    events
}

/// The index an engine keeps at the pool's tail (`Pool.index`), read
/// without changing it: its slots, the records it holds, and the digest of
/// the fingerprint with the model it names; `null` when there is none.
///
/// Read from the files with `pread`, never through the mapping: a holder
/// may have truncated a file in a directory (tmpfs, hugetlbfs: they take
/// no seals), and a read past its end through the mapping is a SIGBUS,
/// where `pread` returns short and the index reads as none.
fn index_status(files: &[(OwnedFd, Extent)], mapped: u64, page: u64) -> Value {
    let trailer = read_range(files, mapped.saturating_sub(16), 16).map(|b| {
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        [word(0), word(1)]
    });
    let summary = trailer
        .and_then(|t| hostpool_index::extent_len(t, page))
        .filter(|len| *len <= mapped)
        .and_then(|len| read_range(files, mapped - len, len))
        .and_then(|bytes| {
            let words: Vec<std::sync::atomic::AtomicU64> = bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])).into())
                .collect();
            hostpool_index::summary(&words)
        });
    summary.map_or(Value::Null, |s| {
        json!({
            "slots": s.capacity,
            "records": s.records,
            "digest": s.fingerprint.digest(),
            "model": s.fingerprint.get("model"),
        })
    })
}

/// The pool's bytes `[offset, offset + len)`, read from the files that
/// tile it; `None` when a file is short (truncated) or a read fails.
fn read_range(files: &[(OwnedFd, Extent)], offset: u64, len: u64) -> Option<Vec<u8>> {
    let mut out = vec![0u8; usize::try_from(len).ok()?];
    let end = offset.checked_add(len)?;
    for (fd, e) in files {
        let (start, stop) = (offset.max(e.offset), end.min(e.end()));
        if start >= stop {
            continue;
        }
        let dst =
            &mut out[usize::try_from(start - offset).ok()?..usize::try_from(stop - offset).ok()?];
        let mut done = 0;
        while done < dst.len() {
            let at = start - e.offset + done as u64;
            match rustix::io::pread(fd, &mut dst[done..], at) {
                Ok(0) | Err(_) => return None,
                Ok(n) => done += n,
            }
        }
    }
    Some(out)
}

/// Send a lease: its info and the pool's figures, with the files'
/// descriptors in as many messages as they need.
fn send_lease(
    conn: &OwnedFd,
    memory: &Memory,
    info: LeaseInfo,
    s: &Serving,
) -> std::io::Result<()> {
    let files: Vec<(BorrowedFd<'_>, Extent)> = memory
        .files
        .iter()
        .map(|(fd, e)| (fd.as_fd(), *e))
        .collect();
    hostpool_handoff::hand_over(
        conn.as_fd(),
        |extents, files| Message::Lease {
            protocol: hostpool_handoff::PROTOCOL,
            info,
            logical: s.logical,
            mapped: s.mapped,
            page: s.page,
            backing: s.backing.clone(),
            extents,
            files,
        },
        &files,
    )
}

/// The keeper's transitions, driven by events without a socket or a pool:
/// hellos, ranks arriving, dying and releasing, the lease ending, clearing,
/// stop requests and the drain deadline. They run as an ordinary user, in
/// milliseconds, beside the root tests of `tests/keeper.rs`.
#[cfg(test)]
mod tests {
    use super::*;

    /// A keeper's serving state of an 8 MiB pool of 4 KiB pages, idle.
    fn serving(content: &str) -> Serving {
        let config = crate::parse_config(&format!(
            "[[pool]]\nname = \"unit\"\nsize = \"8MiB\"\ncontent = \"{content}\"\n"
        ))
        .unwrap()
        .remove(0);
        let (listener, _) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        Serving::new(
            config,
            listener,
            Figures {
                logical: 8 << 20,
                mapped: 8 << 20,
                page: 4096,
                backing: "shm-segmented".into(),
                numa_node: None,
            },
        )
    }

    /// One end of a socket pair: a rank's connection, as the keeper holds it.
    fn conn() -> OwnedFd {
        rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
        .0
    }

    fn hello(engine: &str, world: u32, rank: u32, size: Option<u64>) -> Message {
        Message::Hello {
            protocol: hostpool_handoff::PROTOCOL,
            world,
            rank,
            engine: engine.into(),
            companion: false,
            size,
            page: None,
            tag: None,
            attach_timeout_secs: 5.0,
            barrier_timeout_secs: 5.0,
        }
    }

    fn companion(engine: &str) -> Message {
        let mut h = hello(engine, 1, 0, None);
        if let Message::Hello { companion, .. } = &mut h {
            *companion = true;
        }
        h
    }

    /// A hello granted: the rank joins the lease with a connection of its
    /// own.
    fn granted(s: &mut Serving, h: &Message, pid: u32, now: Instant) {
        assert_eq!(s.answer(h, || None, now), Answer::Grant);
        let Message::Hello { rank, .. } = h else {
            unreachable!()
        };
        s.lease.as_mut().unwrap().ranks.push(Rank {
            rank: *rank,
            pid,
            uid: 0,
            fd: Some(conn()),
            arrived: false,
            released: false,
        });
        if s.lease.as_ref().unwrap().world == 1 {
            s.lease.as_mut().unwrap().live = true;
        }
    }

    fn refused(answer: Answer) -> (bool, String, Option<u32>) {
        match answer {
            Answer::Refuse {
                usage,
                message,
                pid,
            } => (usage, message, pid),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn an_idle_keeper_grants_one_lease_and_refuses_another_engine_naming_the_holder() {
        let mut s = serving("zero");
        let now = Instant::now();
        granted(&mut s, &hello("", 1, 0, None), 100, now);
        assert_eq!(s.generation, 1);
        let (usage, message, pid) = refused(s.answer(&hello("other", 1, 0, None), || None, now));
        assert!(!usage && pid == Some(100), "{message}");
        assert!(
            message.contains("kept pool `unit` is leased by pid 100")
                && message.contains("one lease at a time"),
            "{message}"
        );
        assert_eq!(s.generation, 1, "a refusal counts no generation");
    }

    /// An engine of another lease protocol: refused naming both versions
    /// and which side to upgrade, before anything of its hello is read; a
    /// newer engine that still speaks this keeper's version is served.
    #[test]
    fn an_engine_of_another_protocol_is_refused_naming_both_versions() {
        use hostpool_handoff::{PROTOCOL, Protocol};
        let now = Instant::now();
        let with = |protocol: Protocol| {
            let mut h = hello("eng", 1, 0, Some(1 << 40));
            if let Message::Hello { protocol: p, .. } = &mut h {
                *p = protocol;
            }
            h
        };
        for (theirs, says) in [
            (
                Protocol::unversioned(),
                "this engine is older: run it with hostpool",
            ),
            (
                Protocol {
                    version: PROTOCOL.version + 1,
                    oldest: PROTOCOL.version + 1,
                },
                "the keeper of `unit` is older: restart it",
            ),
        ] {
            let mut s = serving("zero");
            let (usage, message, pid) = refused(s.answer(&with(theirs), || None, now));
            assert!(!usage && pid == Some(std::process::id()), "{message}");
            let both = format!(
                "the keeper of `unit` speaks lease protocol {} (down to {}) and this engine \
                 speaks {} (down to {})",
                PROTOCOL.version, PROTOCOL.oldest, theirs.version, theirs.oldest
            );
            assert!(
                message.contains(&both) && message.contains(says),
                "{message}"
            );
            // Refused on the version, not on the absurd size it also asked.
            assert!(!message.contains("size"), "{message}");
            assert_eq!(s.generation, 0);
        }
        // Newer, and still speaking this version: served.
        let mut s = serving("zero");
        let newer = Protocol {
            version: PROTOCOL.version + 1,
            oldest: PROTOCOL.version,
        };
        let mut h = hello("eng", 1, 0, None);
        if let Message::Hello { protocol, .. } = &mut h {
            *protocol = newer;
        }
        granted(&mut s, &h, 100, now);
        // The message as an engine of protocol 1 sends it, without a
        // version, reads as protocol 1.
        let old: Message = serde_json::from_str(
            r#"{"Hello":{"world":1,"rank":0,"engine":"e","size":null,"page":null,"tag":null,"attach_timeout_secs":1.0,"barrier_timeout_secs":1.0}}"#,
        )
        .unwrap();
        let Message::Hello { protocol, .. } = old else {
            panic!("a hello")
        };
        assert_eq!(protocol, Protocol::unversioned());
    }

    #[test]
    fn a_companion_maps_its_engines_lease_alone_and_the_lease_ends_after_it() {
        let mut s = serving("zero");
        let now = Instant::now();
        // No lease yet: a companion starts none.
        let (usage, message, _) = refused(s.answer(&companion("eng"), || None, now));
        assert!(
            !usage && message.contains("no lease of engine `eng`"),
            "{message}"
        );
        assert!(s.lease.is_none() && s.generation == 0);
        granted(&mut s, &hello("eng", 2, 0, None), 600, now);
        granted(&mut s, &hello("eng", 2, 1, None), 601, now);
        // Another engine's companion is refused, naming the holder.
        let (_, message, pid) = refused(s.answer(&companion("other"), || None, now));
        assert!(message.contains("leased by engine `eng`"), "{message}");
        assert_eq!(pid, Some(600));
        // Its own engine's companion is granted, counting no generation,
        // and stands in no barrier: the ranks alone make it go.
        assert_eq!(s.answer(&companion("eng"), || None, now), Answer::Grant);
        assert_eq!(s.generation, 1);
        s.lease.as_mut().unwrap().companions.push(Rank {
            rank: 0,
            pid: 602,
            uid: 0,
            fd: Some(conn()),
            arrived: true,
            released: false,
        });
        s.on_rank(0, RankEvent::Arrived(None));
        s.on_rank(1, RankEvent::Arrived(None));
        assert_eq!(s.settle(None, now), Some(Verdict::Go));
        // The ranks release; the lease is not over while the companion maps it.
        for i in 0..2 {
            s.on_rank(i, RankEvent::Released);
            s.on_rank(i, RankEvent::Gone);
        }
        assert!(!s.lease_over(), "the companion still maps the pool");
        // A companion that dies ends the lease as died, naming it.
        s.on_companion(0, RankEvent::Gone);
        assert!(s.lease_over());
        assert!(
            s.end_lease(now),
            "content = zero clears after the companion went"
        );
        let previous = s.previous.clone().unwrap();
        assert_eq!((previous.pid, previous.how), (602, LeaseEnd::Died));
    }

    #[test]
    fn a_size_or_page_size_that_does_not_fit_is_a_usage_refusal() {
        let mut s = serving("zero");
        let now = Instant::now();
        let (usage, message, _) = refused(s.answer(&hello("", 1, 0, Some(16 << 20)), || None, now));
        assert!(usage && message.contains("is 8 MiB"), "{message}");
        let (usage, message, _) = refused(s.answer(&hello("", 4, 4, None), || None, now));
        assert!(usage && message.contains("rank 4 of world 4"), "{message}");
        assert!(s.lease.is_none() && s.generation == 0);
    }

    #[test]
    fn the_ranks_of_one_engine_share_a_lease_and_go_once_all_arrived() {
        let mut s = serving("zero");
        let now = Instant::now();
        granted(&mut s, &hello("eng", 2, 0, None), 200, now);
        // Another rank of the same engine joins; the same rank twice does not.
        let (_, message, _) = refused(s.answer(&hello("eng", 2, 0, None), || None, now));
        assert!(message.contains("rank 0 is already attached"), "{message}");
        granted(&mut s, &hello("eng", 2, 1, None), 201, now);
        assert_eq!(s.generation, 1, "one lease for both ranks");
        assert_eq!(s.on_rank(0, RankEvent::Arrived(None)), None);
        assert_eq!(s.settle(None, now), None, "rank 1 has not arrived");
        assert_eq!(s.on_rank(1, RankEvent::Arrived(None)), None);
        assert_eq!(s.settle(None, now), Some(Verdict::Go));
        assert!(s.lease.as_ref().unwrap().live);
        assert_eq!(s.settle(None, now), None, "told once");
    }

    #[test]
    fn a_rank_that_dies_or_fails_while_attaching_fails_the_lease_naming_it() {
        for died in [true, false] {
            let mut s = serving("zero");
            let now = Instant::now();
            granted(&mut s, &hello("eng", 2, 0, None), 300, now);
            granted(&mut s, &hello("eng", 2, 1, None), 301, now);
            let event = if died {
                RankEvent::Gone
            } else {
                RankEvent::Arrived(Some("mmap failed".into()))
            };
            let failure = s.on_rank(1, event).expect("a failure naming rank 1");
            assert_eq!((failure.ranks.clone(), failure.pid), (vec![1], Some(301)));
            let Some(Verdict::Failed(Failure { message, .. })) = s.settle(Some(failure), now)
            else {
                panic!("the lease fails");
            };
            let what = if died {
                "died before the barrier completed"
            } else {
                "failed: mmap failed"
            };
            assert!(
                message.contains(&format!("rank 1 (pid 301) {what}")),
                "{message}"
            );
            assert_eq!(s.lease.as_ref().unwrap().died, died.then_some(301));
            // A late rank of that engine is told why, not handed a lease.
            s.lease.as_mut().unwrap().ranks.clear();
            let _ = s.end_lease(now);
            s.state = State::Idle;
            let (_, late, _) = refused(s.answer(&hello("eng", 3, 2, None), || None, now));
            assert!(late.contains("failed before rank 2 attached"), "{late}");
        }
    }

    #[test]
    fn ranks_that_never_come_or_never_arrive_fail_the_lease_at_its_deadlines() {
        let mut s = serving("zero");
        let now = Instant::now();
        granted(&mut s, &hello("eng", 3, 0, None), 400, now);
        granted(&mut s, &hello("eng", 3, 2, None), 402, now);
        assert_eq!(s.settle(None, now), None);
        let later = now + Duration::from_secs(6);
        let Some(Verdict::Failed(Failure {
            message,
            ranks,
            pid,
        })) = s.settle(None, later)
        else {
            panic!("the attach deadline fails the lease");
        };
        assert_eq!((ranks, pid), (vec![1], None));
        assert!(message.contains("rank(s) 1 never attached"), "{message}");

        let mut s = serving("zero");
        granted(&mut s, &hello("eng", 2, 0, None), 500, now);
        granted(&mut s, &hello("eng", 2, 1, None), 501, now);
        s.on_rank(0, RankEvent::Arrived(None));
        let much_later = now + Duration::from_secs(11);
        let Some(Verdict::Failed(Failure {
            message,
            ranks,
            pid,
        })) = s.settle(None, much_later)
        else {
            panic!("the barrier deadline fails the lease");
        };
        assert_eq!((ranks, pid), (vec![1], Some(501)));
        assert!(
            message.contains("rank 1 (pid 501") && message.contains("attached but did not reach"),
            "{message}"
        );
    }

    #[test]
    fn a_lease_that_ends_becomes_the_previous_one_and_hands_its_tag_on() {
        for (released, content) in [(true, "zero"), (false, "keep")] {
            let mut s = serving(content);
            let now = Instant::now();
            granted(&mut s, &hello("", 1, 0, None), 600, now);
            s.lease.as_mut().unwrap().tag = Some("index-v1".into());
            if released {
                s.on_rank(0, RankEvent::Released);
            }
            assert!(!s.lease_over());
            assert_eq!(
                s.on_rank(0, RankEvent::Gone),
                None,
                "a live lease does not fail"
            );
            assert!(s.lease_over());
            let clears = s.end_lease(now);
            let previous = s.previous.clone().unwrap();
            assert_eq!(previous.pid, 600);
            assert_eq!(
                previous.how,
                if released {
                    LeaseEnd::Closed
                } else {
                    LeaseEnd::Died
                }
            );
            assert_eq!(s.tag.as_deref(), Some("index-v1"));
            // content = zero clears before the next lease; keep does not.
            assert_eq!(clears, content == "zero");
            assert_eq!(matches!(s.state, State::Zeroing { .. }), content == "zero");
        }
    }

    #[test]
    fn a_hello_while_clearing_waits_and_a_clearing_that_fails_breaks_the_pool() {
        let mut s = serving("zero");
        let now = Instant::now();
        s.state = State::Zeroing { since: now };
        assert_eq!(
            s.answer(&hello("", 1, 0, None), || None, now),
            Answer::Wait {
                until: now + Duration::from_secs(5)
            }
        );
        s.cleared(Some(Ok(Ok(0.25))));
        assert_eq!((&s.state, s.last_clear_seconds), (&State::Idle, Some(0.25)));
        s.state = State::Zeroing { since: now };
        s.cleared(Some(Ok(Err(Error::config("zeroing failed")))));
        assert!(matches!(&s.state, State::Broken(why) if why.contains("zeroing failed")));
        let (_, message, pid) = refused(s.answer(&hello("", 1, 0, None), || None, now));
        assert!(
            message.contains("kept pool `unit` is unusable"),
            "{message}"
        );
        assert_eq!(pid, Some(std::process::id()));
        s.state = State::Zeroing { since: now };
        s.cleared(None);
        assert!(matches!(&s.state, State::Broken(why) if why.contains("panicked")));
    }

    #[test]
    fn a_truncated_file_breaks_the_pool_for_good() {
        let mut s = serving("keep");
        let now = Instant::now();
        let (_, message, _) = refused(s.answer(
            &hello("", 1, 0, None),
            || Some("its file 0 was truncated to 0 B".into()),
            now,
        ));
        assert!(message.contains("was truncated to 0 B"), "{message}");
        // Broken stays broken, whatever the files say now.
        let (_, again, _) = refused(s.answer(&hello("", 1, 0, None), || None, now));
        assert!(again.contains("was truncated to 0 B"), "{again}");
        assert_eq!(s.generation, 0);
    }

    #[test]
    fn the_first_stop_drains_the_second_ends_and_the_drain_deadline_ends_too() {
        let drain = Duration::from_secs(60);
        let now = Instant::now();
        // Idle: the first stop ends the keeper at once (nothing to drain).
        let mut s = serving("zero");
        assert!(matches!(s.on_stops(0, drain, false, now), Stops::Serve));
        assert!(matches!(s.on_stops(1, drain, false, now), Stops::Exit));
        // With a lease in force and an attach waiting: drain, refusing it.
        let mut s = serving("zero");
        granted(&mut s, &hello("", 1, 0, None), 700, now);
        s.waiting.push(Waiting {
            conn: conn(),
            uid: 0,
            pid: 701,
            hello: hello("", 1, 0, None),
            until: now + drain,
        });
        let Stops::Drain(refused_waiting) = s.on_stops(1, drain, false, now) else {
            panic!("the first stop drains");
        };
        assert_eq!(refused_waiting.len(), 1);
        assert!(s.waiting.is_empty() && s.stopping);
        let (_, message, _) = refused(s.answer(&hello("x", 1, 0, None), || None, now));
        assert!(
            message.contains("is stopping and takes no new leases"),
            "{message}"
        );
        assert!(matches!(s.on_stops(1, drain, false, now), Stops::Serve));
        // A clearing in progress keeps a draining keeper, until the lease
        // and the clearing are both over.
        assert!(matches!(s.on_stops(1, drain, true, now), Stops::Serve));
        assert!(matches!(
            s.on_stops(1, drain, false, now + drain),
            Stops::DrainTimedOut
        ));
        // The second stop ends it at once, lease or not.
        assert!(matches!(s.on_stops(2, drain, true, now), Stops::Exit));
        // The lease ended: no clearing when stopping, and the keeper ends.
        s.on_rank(0, RankEvent::Released);
        s.on_rank(0, RankEvent::Gone);
        assert!(s.lease_over());
        assert!(!s.end_lease(now), "a stopping keeper does not clear");
        assert!(matches!(s.on_stops(1, drain, false, now), Stops::Exit));
    }
}
