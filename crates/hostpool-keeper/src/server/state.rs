//! The keeper's state machine, [`Serving`]: the leases in force (its
//! tenants, each one engine's lease, named by [`TenantId`]) and their ranks
//! and companions, the attaches that wait, the failed leases it remembers,
//! what it is doing besides (idle, clearing, broken) and whether it stops.
//! It holds no socket, no file and no pool: connections are named by
//! [`ConnId`], and the I/O side (`super::io`) feeds it what happened and
//! does what it returns:
//!
//! - a hello read: [`Serving::answer`] (in `answer`) refuses it, makes it
//!   wait, or grants it, to a new tenant or to its engine's, with the
//!   [`LeaseInfo`] to send; once sent (or not), [`Serving::joined`] (in
//!   `tenants`) records the rank or companion in that tenant, and an attach
//!   told to wait is kept with [`Serving::waits`];
//! - what a tenant's connections said (arrived, released, gone) and the
//!   clock: [`Serving::on_lease_events`] (in `lease`) settles that tenant's
//!   lease and says whom to tell `Go` or why it failed;
//!   [`Serving::end_lease`] takes the pool back from a tenant whose
//!   processes are all gone, without touching the others, and once the last
//!   one ended clears it, until [`Serving::cleared`];
//! - waiting attaches (in `waiting`): [`Serving::next_waiting`],
//!   [`Serving::waiting_gone`], [`Serving::expire_waiting`];
//! - stop requests: [`Serving::on_stops`], then [`Serving::farewell`].
//!
//! Its unit tests (here, in `answer`, `lease`, `tenants` and `waiting`)
//! drive it by those transitions alone, as an ordinary user, in
//! milliseconds.

use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use super::super::KeptPoolConfig;
use hostpool_handoff::Message;
use hostpool_handoff::barrier::{Barrier, Mark};
use hostpool_handoff::lease::{
    IndexStatus, KeeperState, KeeperStatus, LeaseEnds, LeaseInfo, PreviousLease, TierOpens,
    TierStatus, socket_name,
};
use pool_core::Choice;
use pool_core::Error;

mod answer;
mod lease;
mod tenants;
mod waiting;

pub(super) use tenants::{TenantId, TierFigures};

/// A connection, as the state names it: the I/O side holds its socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct ConnId(pub(super) u64);

/// One rank of a lease (or one of its companions).
#[derive(Debug)]
struct Rank {
    rank: u32,
    pid: u32,
    uid: u32,
    /// Its connection, until it ends (or `None` from the start: the lease
    /// never reached it).
    conn: Option<ConnId>,
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
            present: self.conn.is_some(),
        }
    }
}

/// A lease in force: one tenant's, one engine's (its ranks and its
/// companions).
#[derive(Debug)]
struct Lease {
    /// What each of its ranks and companions is told (the generation, the
    /// previous lease and tag as they were when it was granted).
    info: LeaseInfo,
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
    /// What it did in the kept pool's CPU tier, as the tier last said
    /// ([`Serving::tier_figures`]).
    tier: TierFigures,
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
pub(super) struct Waiting {
    pub(super) conn: ConnId,
    pub(super) uid: u32,
    pub(super) pid: u32,
    pub(super) hello: Message,
    pub(super) until: Instant,
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
pub(super) enum Answer {
    /// Refused, saying why (`usage`: the request itself was wrong).
    Refuse {
        usage: bool,
        message: String,
        pid: Option<u32>,
    },
    /// Served once the pool is cleared, or refused at `until`.
    Wait { until: Instant },
    /// Handed the pool, as a rank or companion of tenant `TenantId` (new,
    /// or its engine's): the identity its lease is told. Once sent (or
    /// not), the connection joins that tenant ([`Serving::joined`]).
    Grant(TenantId, LeaseInfo),
}

/// A connection to refuse, and close: what it is told.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Refusal {
    pub(super) conn: ConnId,
    pub(super) usage: bool,
    pub(super) message: String,
    pub(super) pid: Option<u32>,
}

/// A message for each of some connections, which stay open.
#[derive(Debug)]
pub(super) struct Tell {
    pub(super) to: Vec<ConnId>,
    pub(super) message: Message,
}

/// What the stop requests so far tell a keeper to do ([`Serving::on_stops`]).
#[derive(Debug)]
pub(super) enum Stops {
    /// Go on serving.
    Serve,
    /// The first request: go on draining; refuse these waiting attaches.
    Drain(Vec<Refusal>),
    /// End now: a second request, or nothing left to drain.
    Exit,
    /// The drain timeout passed with a lease still in force.
    DrainTimedOut,
}

/// What a rank of the lease said or did ([`Serving::on_lease_events`]).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RankEvent {
    /// It mapped the pool (with its error, if its setup failed).
    Arrived(Option<String>),
    /// It released the lease (a clean end).
    Released,
    /// Its connection ended.
    Gone,
}

/// A kept pool's figures, for its leases and its status.
#[derive(Debug)]
pub(super) struct Figures {
    pub(super) logical: u64,
    pub(super) mapped: u64,
    pub(super) page: u64,
    pub(super) backing: String,
    pub(super) numa_node: Option<u32>,
    /// How the pool came to this keeper.
    pub(super) came_back: CameBack,
}

/// How a keeper's pool came to it (its status's `came_back`).
pub use hostpool_handoff::lease::CameBack;

/// Everything of a keeper but its memory and its sockets.
#[derive(Debug)]
pub(super) struct Serving {
    config: KeptPoolConfig,
    instance: String,
    started_at: SystemTime,
    generation: u64,
    previous: Option<PreviousLease>,
    tag: Option<String>,
    /// The leases in force, one per tenant, in the order they were granted.
    tenants: Vec<Lease>,
    waiting: Vec<Waiting>,
    /// Leases of a world > 1 that failed, until their attach timeout: a rank
    /// of that engine that comes late is told why, rather than starting a
    /// lease that waits for ranks that are gone.
    failed: Vec<FailedLease>,
    state: State,
    last_clear_seconds: Option<f64>,
    /// What happened since the keeper started, for its metrics: counters
    /// that only grow.
    totals: Totals,
    stopping: bool,
    /// When a draining keeper stops anyway, lease or not.
    drain_until: Option<Instant>,
    uid: u32,
    /// The kept pool's figures, for leases and status.
    figures: Figures,
    /// The blocks the index recorded when the pool was adopted
    /// ([`Serving::set_came_back_blocks`]); the status's
    /// `came_back_blocks` for a pool that came back.
    came_back_blocks: Option<u64>,
}

/// A keeper's counters since it started (`keep status`'s `lease_ends`,
/// `clears`, `clear_seconds_total` and `tier`; the metrics' `_total`s).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(in crate::server) struct Totals {
    /// Leases that ended with every process released.
    pub(in crate::server) closed: u64,
    /// Leases that ended with a process dead.
    pub(in crate::server) died: u64,
    /// Clearings between leases that finished.
    pub(in crate::server) clears: u64,
    /// Their seconds, summed.
    pub(in crate::server) clear_seconds: f64,
    /// What every tenant did in the CPU tier, those gone included.
    pub(in crate::server) tier: TierFigures,
    /// Opens of the CPU tier that found its blocks (its identity's index:
    /// a restore) and that started it cold.
    pub(in crate::server) opens_warm: u64,
    pub(in crate::server) opens_cold: u64,
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

impl Serving {
    /// An idle keeper of the pool `figures` describes.
    pub(super) fn new(config: KeptPoolConfig, figures: Figures) -> Serving {
        Serving {
            instance: instance_id(),
            started_at: SystemTime::now(),
            generation: 0,
            previous: None,
            tag: None,
            tenants: Vec::new(),
            waiting: Vec::new(),
            failed: Vec::new(),
            state: State::Idle,
            last_clear_seconds: None,
            totals: Totals::default(),
            stopping: false,
            drain_until: None,
            uid: rustix::process::geteuid().as_raw(),
            figures,
            config,
            came_back_blocks: None,
        }
    }

    /// Say the blocks the index at the pool's tail recorded when the pool
    /// was adopted (read once, at the start, before any lease: the
    /// status's `came_back_blocks` while `came_back` is not built).
    #[allow(
        dead_code,
        reason = "called by the keeper's start once it reads the adopted index"
    )]
    pub(super) fn set_came_back_blocks(&mut self, blocks: Option<u64>) {
        self.came_back_blocks = blocks;
    }

    /// The kept pool's name.
    pub(super) fn name(&self) -> &str {
        &self.config.name
    }

    /// The kept pool's figures.
    pub(super) fn figures(&self) -> &Figures {
        &self.figures
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

    /// Why a client of `uid` may not use the pool: neither the keeper's
    /// user, nor root, nor one of `allow_uids`.
    pub(super) fn forbidden(&self, uid: u32) -> Option<String> {
        if uid == self.uid || uid == 0 || self.config.allow_uids.contains(&uid) {
            return None;
        }
        let allowed: Vec<String> = self.config.allow_uids.iter().map(u32::to_string).collect();
        Some(format!(
            "uid {uid} may not use kept pool `{}`: its keeper runs as uid {} and allows [{}]; add \
             {uid} to the pool's allow_uids, or run the engine as an allowed user",
            self.config.name,
            self.uid,
            allowed.join(", ")
        ))
    }

    /// What a client (pid `pid`) whose request could not be read is told:
    /// too long, or not one of ours (rather than leave it to guess that the
    /// keeper died).
    pub(super) fn unreadable(&self, pid: u32, e: &Error) -> String {
        format!(
            "the keeper of `{}` could not read the request of pid {pid}: {}; a client of the \
             same hostpool version sends what it reads (a keeper_tag of at most {} bytes)",
            self.config.name,
            e.chain_message(),
            pool_core::MAX_KEEPER_TAG_BYTES
        )
    }

    /// The stop requests so far (`asked`): the first drains (no new lease,
    /// the waiting attaches are refused, the leases in force may end within
    /// `drain`), the second ends the keeper at once; a draining keeper ends
    /// once no tenant's lease and no clearing is left, or at its drain
    /// deadline.
    pub(super) fn on_stops(
        &mut self,
        asked: u32,
        drain: Duration,
        clearing: bool,
        now: Instant,
    ) -> Stops {
        if asked >= 2 {
            return Stops::Exit;
        }
        let mut refused = Vec::new();
        if asked == 1 && !self.stopping {
            self.stopping = true;
            self.drain_until = Some(now + drain);
            refused = std::mem::take(&mut self.waiting)
                .into_iter()
                .map(|w| Refusal {
                    conn: w.conn,
                    usage: false,
                    message: self.stopping_message(),
                    pid: None,
                })
                .collect();
        }
        if self.stopping && self.tenants.is_empty() && !clearing {
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

    /// The identity a lease of generation `generation` granted now is told.
    fn lease_info(&self, generation: u64) -> LeaseInfo {
        LeaseInfo {
            name: self.config.name.clone(),
            instance: self.instance.clone(),
            generation,
            content: self.config.content.name().to_string(),
            previous: self.previous.clone(),
            tag: self.tag.clone(),
            keeper_pid: std::process::id(),
            tenants: self.config.tenants,
        }
    }

    /// The next time the state has something to do without a message: a
    /// waiting attach's timeout, a failed lease forgotten, the drain's end.
    /// (A lease's barrier deadline is seen within the loop's idle wait.)
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let waiting = self.waiting.iter().map(|w| w.until);
        let failed = self.failed.iter().map(|f| f.until);
        waiting.chain(failed).chain(self.drain_until).min()
    }

    /// The pids of tenant `tenant`'s ranks and companions still attached.
    pub(super) fn tenant_pids(&self, tenant: TenantId) -> Vec<u32> {
        let Some(l) = self.tenants.iter().find(|l| l.id() == tenant) else {
            return Vec::new();
        };
        let all = l.ranks.iter().chain(&l.companions);
        all.filter(|r| r.conn.is_some()).map(|r| r.pid).collect()
    }

    /// The connections to wait on for a message or a hang-up: every
    /// tenant's ranks and companions (a companion asks the tier), and the
    /// waiting attaches.
    pub(super) fn watched(&self) -> Vec<ConnId> {
        let ranks = self
            .tenants
            .iter()
            .flat_map(|l| l.ranks.iter().chain(&l.companions));
        ranks
            .filter_map(|r| r.conn)
            .chain(self.waiting.iter().map(|w| w.conn))
            .collect()
    }

    /// What the keeper tells whoever is still attached when it stops.
    pub(super) fn farewell(&self) -> Tell {
        let attached = self
            .tenants
            .iter()
            .flat_map(|l| l.ranks.iter().chain(&l.companions));
        Tell {
            to: attached.filter_map(|r| r.conn).collect(),
            message: Message::Failed {
                message: format!(
                    "the keeper of `{}` stopped; the engine keeps its mapping",
                    self.config.name
                ),
                ranks: Vec::new(),
                pid: Some(std::process::id()),
            },
        }
    }

    /// The keeper's status (`hostpool keep status --json`): its state, and
    /// the memory's figures given (`numa`: the build's NUMA report; `index`:
    /// the index at the pool's tail, `super::status`). `lease` is the first
    /// tenant's (as before tenants), `tenants` lists them all.
    pub(super) fn status(&self, numa: Value, index: Option<IndexStatus>) -> KeeperStatus {
        let state = match (&self.state, self.tenants.is_empty(), self.stopping) {
            (_, _, true) => KeeperState::Stopping,
            (State::Broken(_), _, _) => KeeperState::Broken,
            (State::Zeroing { .. }, _, _) => KeeperState::Clearing,
            (_, false, _) => KeeperState::Leased,
            _ => KeeperState::Idle,
        };
        let f = &self.figures;
        KeeperStatus {
            name: self.config.name.clone(),
            socket: socket_name(&self.config.name),
            pid: std::process::id(),
            uid: self.uid,
            instance: self.instance.clone(),
            protocol: hostpool_handoff::PROTOCOL,
            started_at: pool_core::rfc3339(self.started_at),
            state,
            broken: match &self.state {
                State::Broken(why) => Some(why.clone()),
                _ => None,
            },
            backing: f.backing.clone(),
            size: f.logical,
            mapped: f.mapped,
            page_size: f.page,
            numa_node: f.numa_node,
            numa,
            content: self.config.content.name().to_string(),
            came_back: f.came_back,
            came_back_blocks: self
                .came_back_blocks
                .filter(|_| f.came_back != CameBack::Built),
            // A keeper never pins: each engine pins its own mapping.
            pinned: false,
            allow_uids: self.config.allow_uids.clone(),
            generation: self.generation,
            lease: self.tenants.first().map(Lease::status),
            tenants: self.tenants.iter().map(Lease::tenant_status).collect(),
            max_tenants: self.config.tenants,
            waiting: self.waiting.len() as u64,
            previous: self.previous.clone(),
            tag: self.tag.clone(),
            last_clear_seconds: self.last_clear_seconds,
            lease_ends: LeaseEnds {
                closed: self.totals.closed,
                died: self.totals.died,
            },
            clears: self.totals.clears,
            clear_seconds_total: self.totals.clear_seconds,
            tier: TierStatus {
                stored: self.totals.tier.stored,
                hits: self.totals.tier.hits,
                hits_from_others: self.totals.tier.hits_from_others,
                opens: TierOpens {
                    warm: self.totals.opens_warm,
                    cold: self.totals.opens_cold,
                },
            },
            index,
        }
    }
}

/// What the state's unit tests share: a keeper's state without a socket,
/// hellos, and a hello granted by the keeper's own transitions.
#[cfg(test)]
pub(super) mod testing {
    use super::*;

    /// The first tenant of a keeper: the lease of generation 1.
    pub(in crate::server) const T1: TenantId = TenantId(1);

    /// A keeper's serving state of an 8 MiB pool of 4 KiB pages, idle.
    pub(in crate::server) fn serving(content: &str) -> Serving {
        serving_tenants(content, 1)
    }

    /// [`serving`], leased to up to `tenants` engines at once.
    pub(in crate::server) fn serving_tenants(content: &str, tenants: u32) -> Serving {
        let config = crate::parse_config(&format!(
            "[[pool]]\nname = \"unit\"\nsize = \"8MiB\"\ncontent = \"{content}\"\ntenants = \
             {tenants}\n"
        ))
        .unwrap()
        .remove(0);
        Serving::new(
            config,
            Figures {
                logical: 8 << 20,
                mapped: 8 << 20,
                page: 4096,
                backing: "shm-segmented".into(),
                numa_node: None,
                came_back: CameBack::Built,
            },
        )
    }

    pub(in crate::server) fn hello(
        engine: &str,
        world: u32,
        rank: u32,
        size: Option<u64>,
    ) -> Message {
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

    pub(in crate::server) fn companion(engine: &str) -> Message {
        let mut h = hello(engine, 1, 0, None);
        if let Message::Hello { companion, .. } = &mut h {
            *companion = true;
        }
        h
    }

    /// A hello of pid `pid` granted, and its lease sent: it joins the lease
    /// on a connection of its own (named by its pid), as the keeper's
    /// transitions record it.
    pub(in crate::server) fn granted(
        s: &mut Serving,
        h: &Message,
        pid: u32,
        now: Instant,
    ) -> ConnId {
        granted_to(s, h, pid, now).0
    }

    /// [`granted`], and the tenant it joined.
    pub(in crate::server) fn granted_to(
        s: &mut Serving,
        h: &Message,
        pid: u32,
        now: Instant,
    ) -> (ConnId, TenantId) {
        let Answer::Grant(tenant, info) = s.answer(h, || None, now) else {
            panic!("expected a grant of {h:?}");
        };
        assert_eq!((info.generation, info.name.as_str()), (tenant.0, "unit"));
        assert_eq!(info.tenants, s.config.tenants, "the lease says the limit");
        let conn = ConnId(u64::from(pid));
        assert!(
            s.joined(tenant, conn, pid, 0, h, true),
            "the lease keeps its conn"
        );
        (conn, tenant)
    }

    pub(in crate::server) fn refused(answer: Answer) -> (bool, String, Option<u32>) {
        match answer {
            Answer::Refuse {
                usage,
                message,
                pid,
            } => (usage, message, pid),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

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
        let conn = granted(&mut s, &hello("", 1, 0, None), 700, now);
        s.waits(Waiting {
            conn: ConnId(701),
            uid: 0,
            pid: 701,
            hello: hello("", 1, 0, None),
            until: now + drain,
        });
        assert_eq!(s.watched(), vec![conn, ConnId(701)]);
        let Stops::Drain(refused_waiting) = s.on_stops(1, drain, false, now) else {
            panic!("the first stop drains");
        };
        assert_eq!(refused_waiting.len(), 1);
        assert_eq!(refused_waiting[0].conn, ConnId(701));
        assert!(
            refused_waiting[0]
                .message
                .contains("is stopping and takes no new leases"),
            "{:?}",
            refused_waiting[0]
        );
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
        // Whoever is still attached is told the keeper stopped.
        let farewell = s.farewell();
        assert_eq!(farewell.to, vec![conn]);
        assert!(
            matches!(&farewell.message, Message::Failed { message, .. } if message.contains("the keeper of `unit` stopped")),
            "{:?}",
            farewell.message
        );
        // The lease ended: no clearing when stopping, and the keeper ends.
        s.on_rank(T1, 0, RankEvent::Released);
        s.on_rank(T1, 0, RankEvent::Gone);
        assert_eq!(s.ended(), vec![T1]);
        assert!(!s.end_lease(T1, now), "a stopping keeper does not clear");
        assert!(matches!(s.on_stops(1, drain, false, now), Stops::Exit));
        assert!(s.farewell().to.is_empty());
    }

    #[test]
    fn a_rank_the_lease_never_reached_died_and_a_user_not_allowed_is_refused() {
        let mut s = serving("zero");
        let now = Instant::now();
        let h = hello("eng", 2, 0, None);
        assert!(matches!(s.answer(&h, || None, now), Answer::Grant(T1, _)));
        assert!(
            !s.joined(T1, ConnId(1), 900, 0, &h, false),
            "closed at once"
        );
        let lease = s.tenant(T1).unwrap();
        assert_eq!((lease.died, lease.ranks[0].conn), (Some(900), None));
        assert!(s.watched().is_empty());
        assert_eq!(s.forbidden(0), None, "root may");
        assert_eq!(s.forbidden(s.uid), None, "the keeper's user may");
        let other = s.uid.wrapping_add(1).max(1);
        let why = s.forbidden(other).expect("another user may not");
        assert!(
            why.contains(&format!("uid {other} may not use kept pool `unit`")),
            "{why}"
        );
    }

    #[test]
    fn the_status_says_the_state_the_lease_and_its_attached_ranks() {
        let mut s = serving("keep");
        let now = Instant::now();
        let idle = s.status(Value::Null, None);
        assert_eq!((idle.state, &idle.lease), (KeeperState::Idle, &None));
        assert_eq!(idle.mapped, 8 << 20);
        assert_eq!(
            (idle.came_back, idle.came_back_blocks, idle.pinned),
            (CameBack::Built, None, false),
            "built, and a keeper never pins"
        );
        granted(&mut s, &hello("eng", 2, 0, None), 1000, now);
        granted(&mut s, &hello("eng", 2, 1, None), 1001, now);
        s.on_rank(T1, 1, RankEvent::Gone);
        let index = IndexStatus {
            slots: 1,
            ..IndexStatus::default()
        };
        let leased = s.status(Value::Null, Some(index));
        assert_eq!(leased.state, KeeperState::Leased);
        let lease = leased.lease.as_ref().expect("leased");
        assert_eq!((lease.pid, lease.generation), (Some(1000), 1));
        assert_eq!(
            lease.ranks,
            vec![hostpool_handoff::lease::RankStatus {
                rank: 0,
                pid: 1000,
                uid: 0
            }],
            "a rank whose connection ended is not listed"
        );
        assert_eq!(leased.index.as_ref().map(|i| i.slots), Some(1));
        // Its JSON is today's shape, key for key.
        let json = serde_json::to_value(&leased).unwrap();
        assert_eq!(json["state"], "leased");
        assert_eq!(
            json["lease"]["ranks"],
            serde_json::json!([{"rank": 0, "pid": 1000, "uid": 0}])
        );
        assert_eq!(json["index"]["slots"], 1);
        assert_eq!(
            (&json["came_back"], &json["pinned"]),
            (&"built".into(), &false.into())
        );
    }

    #[test]
    fn the_blocks_a_pool_came_back_with_are_said_only_for_a_pool_that_came_back() {
        let mut s = serving("keep");
        s.set_came_back_blocks(Some(7));
        assert_eq!(s.status(Value::Null, None).came_back_blocks, None, "built");
        s.figures.came_back = CameBack::FdStore;
        let st = s.status(Value::Null, None);
        assert_eq!(
            (st.came_back, st.came_back_blocks),
            (CameBack::FdStore, Some(7))
        );
        s.set_came_back_blocks(None);
        assert_eq!(s.status(Value::Null, None).came_back_blocks, None);
    }
}
