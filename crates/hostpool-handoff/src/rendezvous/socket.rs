//! The socket rendezvous (`rendezvous = "socket"`, the default): nothing in
//! any directory.
//!
//! The ranks meet on a unix `SOCK_SEQPACKET` socket in the abstract
//! namespace, named from the pool's name and the user id
//! (`@hostpool/<uid>/<name>`): the first rank to `bind` it is the creator.
//! The creator makes the pool's memory unlinked from birth (`O_TMPFILE` in
//! the pool's directory, so the mount's page size and the pod's hugetlbfs
//! accounting apply, or a memfd where there is none) and passes the file
//! descriptors to each joiner with `SCM_RIGHTS`, after checking the joiner's
//! credentials (`SO_PEERCRED`: same uid) and that it asks for the same pool.
//! The barrier runs over the same sockets. A peer's death is an EOF, seen at
//! once; a rank that fails tells the others and exits at once. The kernel
//! frees the memory when the last rank is gone, whatever killed them: there
//! is never a file to leak or to collect.
//!
//! A creator that fails before every rank was told keeps answering on its
//! socket with the cause until the untold ranks have heard it or the attach
//! timeout passes ([`Refusal`]): from a thread, in a process that lives on
//! after the error (an engine), or from wherever the build's
//! [`Refusals`] hands it, in one that exits (the `hostpool` CLI hands the
//! socket to a helper process). So a rank that comes after the failure fails at once,
//! naming the creator's cause, instead of becoming a creator itself.
//!
//! Abstract socket names are per network namespace: ranks that share only
//! a directory (separate pods on one node) use `rendezvous = "file"`.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::net::{SocketAddrUnix, SocketFlags, SocketType};

use super::{Role, SharedPoolSpec, SharingReport, peer, shard};
use crate::barrier::{Barrier, Event, Mark, Verdict};
use crate::join::{self, Holder, Joining};
use crate::message::Message;
use crate::wire::{self, TICK, os, readable, send, seqpacket};
use pool_core::file::{self, FileMapping, PoolFile};
use pool_core::interrupt::Cancel;
use pool_core::plugin::Mapping;
use pool_core::plugin::RankBarrier;
use pool_core::shared::{Attached, Attachment};
use pool_core::shared::{RefusalTerms, Refusals};
use pool_core::{Error, Result, TeardownIssue};
use pool_core::{Extent, format_bytes};
use pool_core::{Placeholder, Region};

/// What a rank tells its peers about `e`: the message with its causes (the
/// errno of a failed call), and whom it blames when `e` is an
/// [`Error::Peer`] (nobody otherwise).
fn blame(e: &Error) -> (String, Vec<u32>, Option<u32>) {
    match e {
        Error::Peer {
            message,
            ranks,
            pid,
        } => (message.clone(), ranks.clone(), *pid),
        other => (other.chain_message(), Vec::new(), None),
    }
}

fn address(name: &str) -> Result<SocketAddrUnix> {
    let uid = rustix::process::geteuid().as_raw();
    SocketAddrUnix::new_abstract_name(format!("hostpool/{uid}/{name}").as_bytes()).map_err(|e| {
        os(
            "socket address",
            e,
            "the pool name is too long for a socket name",
        )
    })
}

/// What [`recv`] got.
type Received = wire::Received<Message>;

/// Wait for a rank's message until `deadline` (`cancel`'s request ends the
/// wait); received descriptors are appended to `files`.
fn recv(
    fd: impl AsFd,
    deadline: Instant,
    files: &mut Vec<OwnedFd>,
    cancel: &Cancel,
) -> Result<Received> {
    wire::recv(fd, deadline, files, Some(cancel))
}

/// A connected peer: the creator's view of a joiner, or a joiner's of the
/// creator.
#[derive(Debug)]
struct Link {
    rank: u32,
    pid: u32,
    fd: OwnedFd,
    /// A joiner arrived at the barrier.
    arrived: bool,
}

impl Link {
    /// The joiner as the barrier sees it (a linked joiner is there: its
    /// hang-up fails the pool at once).
    fn mark(&self) -> Mark {
        Mark {
            rank: self.rank,
            pid: self.pid,
            arrived: self.arrived,
            present: true,
        }
    }
}

fn peer_pid(fd: impl AsFd) -> Result<(u32, u32)> {
    wire::peer_cred(fd)
}

/// Create or join the pool `spec` describes over the socket rendezvous.
///
/// # Errors
/// Capacity, mapping, mismatch and peer errors; an [`Error::Conflict`] when
/// another user's process holds the pool's socket name.
pub(super) fn map(spec: SharedPoolSpec<'_>) -> Result<Box<dyn Attachment>> {
    let sharing = spec.sharing;
    let started = Instant::now();
    let attach_deadline = started + Duration::from_secs_f64(sharing.attach_timeout_secs);
    let addr = address(&sharing.name)?;
    pool_core::failpoint::stall("shared-before-connect");
    loop {
        spec.cancel.check()?;
        let sock = seqpacket()?;
        match rustix::net::bind(&sock, &addr) {
            Ok(()) => {
                let world = i32::try_from(sharing.world).unwrap_or(i32::MAX);
                rustix::net::listen(&sock, world)
                    .map_err(|e| os("listen", e, "the rendezvous socket failed"))?;
                return create(spec, sock, attach_deadline);
            }
            Err(e) if e == rustix::io::Errno::ADDRINUSE => {}
            Err(e) => return Err(os("bind", e, "the rendezvous socket failed")),
        }
        match rustix::net::connect(&sock, &addr) {
            Ok(()) => return join(spec, sock, attach_deadline),
            // The creator's socket is closing: its name is about to be free.
            Err(e) if e == rustix::io::Errno::CONNREFUSED && Instant::now() < attach_deadline => {
                std::thread::sleep(TICK);
            }
            Err(e) => return Err(os("connect", e, "joining the pool's creator failed")),
        }
    }
}

fn create(
    spec: SharedPoolSpec<'_>,
    listener: OwnedFd,
    attach_deadline: Instant,
) -> Result<Box<dyn Attachment>> {
    let sharing = spec.sharing;
    let mut links: Vec<Link> = Vec::new();
    let built = (|| -> Result<FileMapping> {
        pool_core::host::capacity::require(spec.capacity)?;
        if let Some(e) = pool_core::failpoint::check("shared-creator-map") {
            return Err(os("mmap", e, "mapping the pool's files failed"));
        }
        let mut files = Vec::with_capacity(spec.files.len());
        for (_, extent) in &spec.files {
            let fd = (spec.create)(*extent)?;
            let id = file::file_id(&fd).map_err(|e| os("fstat", e, "a new pool file"))?;
            files.push(PoolFile {
                fd,
                path: None,
                id,
                extent: *extent,
            });
        }
        file::map_files(files, spec.size, &spec.map)
    })();
    let mapping = match built {
        Ok(m) => m,
        Err(e) => {
            keep_refusing(
                &sharing.name,
                listener,
                &e,
                sharing.world - 1,
                attach_deadline,
                &spec.cancel,
                spec.refusals,
            );
            return Err(e);
        }
    };
    let fds: Vec<(std::os::fd::BorrowedFd<'_>, Extent)> = mapping
        .pool_files()
        .iter()
        .map(|f| (f.fd.as_fd(), f.extent))
        .collect();
    let expect = hello_of(&spec);
    // Whatever ends the wait for the joiners, those already welcomed hear why.
    let barrier = Barrier::shared(
        sharing,
        attach_deadline,
        attach_deadline + Duration::from_secs_f64(sharing.barrier_timeout_secs),
    );
    if let Err(e) = accept_joiners(&spec, &expect, &listener, &fds, &mut links, &barrier) {
        // A peer error is relayed as it is; any other is the creator's own.
        let own = match &e {
            Error::Peer { .. } => None,
            other => Some(peer(
                format!(
                    "shared pool `{}`: rank {} (the creator) failed: {other}",
                    sharing.name, sharing.rank
                ),
                vec![sharing.rank],
                Some(std::process::id()),
            )),
        };
        fail_creation(
            listener,
            &mut links,
            own.as_ref().unwrap_or(&e),
            sharing,
            attach_deadline,
            &spec.cancel,
            spec.refusals,
        );
        return Err(e);
    }
    drop(fds);
    Ok(Box::new(SocketMapping {
        inner: mapping,
        role: Role::Creator,
        links,
        side: Side::Creator(barrier),
        shard: shard(spec.size, sharing)?,
        sharing: sharing.clone(),
        cancel: spec.cancel.clone(),
    }))
}

/// Welcome joiners until every rank has attached, or fail naming those that
/// did not, or the one that died meanwhile.
fn accept_joiners(
    spec: &SharedPoolSpec<'_>,
    expect: &Message,
    listener: &OwnedFd,
    fds: &[(std::os::fd::BorrowedFd<'_>, Extent)],
    links: &mut Vec<Link>,
    barrier: &Barrier,
) -> Result<()> {
    let sharing = spec.sharing;
    while links.len() + 1 < sharing.world as usize {
        let marks = marks(sharing, links, false);
        if let Some(Verdict::Failed(f)) =
            barrier.settle(&marks, Instant::now(), pool_core::host::process::why_late)
        {
            return Err(f.into());
        }
        spec.cancel.check()?;
        // A joiner that is already attached may die, or arrive, meanwhile.
        if let Some(e) = watch(links, barrier, &spec.cancel) {
            return Err(e);
        }
        if !readable(listener.as_fd(), barrier.attach.at)? {
            continue;
        }
        // A peer that died between its connect and our accept is
        // ECONNABORTED: it never attached, and the wait goes on.
        let Ok(conn) = rustix::net::accept_with(listener, SocketFlags::CLOEXEC) else {
            continue;
        };
        if let Some(link) = welcome(spec, expect, conn, links, fds)? {
            links.push(link);
        }
    }
    Ok(())
}

/// What a joiner must ask for.
fn hello_of(spec: &SharedPoolSpec<'_>) -> Message {
    Message::Join {
        rank: spec.sharing.rank,
        world: spec.sharing.world,
        logical: spec.size.logical(),
        mapped: spec.size.mapped(),
        page: spec.size.page().get(),
        extents: spec.files.iter().map(|(_, e)| (e.offset, e.len)).collect(),
    }
}

/// Check a new connection and send it the pool, or refuse it. `None` when
/// it was refused (or gone); an error only for our own failures.
fn welcome(
    spec: &SharedPoolSpec<'_>,
    expect: &Message,
    conn: OwnedFd,
    links: &[Link],
    fds: &[(std::os::fd::BorrowedFd<'_>, Extent)],
) -> Result<Option<Link>> {
    let sharing = spec.sharing;
    // A peer gone already is one that never attached.
    let Ok((uid, pid)) = peer_pid(&conn) else {
        return Ok(None);
    };
    let me = rustix::process::geteuid().as_raw();
    let refuse = |usage: bool, message: String| {
        let refused = Message::Refused {
            usage,
            message,
            ranks: Vec::new(),
            pid: None,
            page: None,
        };
        let _ = send(&conn, &refused, &[]);
    };
    if uid != me {
        refuse(
            false,
            format!(
                "the creator of `{}` runs as uid {me}, not {uid}",
                sharing.name
            ),
        );
        return Ok(None);
    }
    let hello = recv(
        &conn,
        Instant::now() + Duration::from_secs(10),
        &mut Vec::new(),
        &spec.cancel,
    );
    let Ok(Received::Msg(Message::Join {
        rank,
        world,
        logical,
        mapped,
        page,
        extents,
    })) = hello
    else {
        return Ok(None);
    };
    let Message::Join {
        world: w,
        logical: l,
        mapped: m,
        page: p,
        extents: x,
        ..
    } = expect
    else {
        return Ok(None);
    };
    if (world, logical, mapped, page) != (*w, *l, *m, *p) || extents != *x {
        let message = format!(
            "rank {rank} (pid {pid}) asks for a pool of {} ({} mapped, {} pages, world \
                 {world}), but shared pool `{}` is {} ({} mapped, {} pages, world {w}); every rank \
                 must use the same size, page size and world",
            format_bytes(logical),
            format_bytes(mapped),
            format_bytes(page),
            sharing.name,
            format_bytes(*l),
            format_bytes(*m),
            format_bytes(*p)
        );
        // The pool's page size goes with it: a joiner whose `huge_pages =
        // "prefer"` chose otherwise takes the creator's choice.
        let _ = send(
            &conn,
            &Message::Refused {
                usage: true,
                message,
                ranks: Vec::new(),
                pid: None,
                page: (page != *p).then_some(*p),
            },
            &[],
        );
        return Ok(None);
    }
    if rank >= world || rank == sharing.rank || links.iter().any(|l| l.rank == rank) {
        let holder = links
            .iter()
            .find(|l| l.rank == rank)
            .map_or(std::process::id(), |l| l.pid);
        refuse(
            true,
            format!(
                "rank {rank} of shared pool `{}` is already attached by pid {holder} (or is not \
                 below world {world}); give each process its own --rank",
                sharing.name
            ),
        );
        return Ok(None);
    }
    pool_core::failpoint::stall("shared-passing-fds");
    let sent = join::hand_over(
        conn.as_fd(),
        |extents, files| Message::Welcome {
            creator_rank: sharing.rank,
            files,
            extents,
        },
        fds,
    );
    if sent.is_err() {
        // It left: it will not be counted as attached.
        return Ok(None);
    }
    Ok(Some(Link {
        rank,
        pid,
        fd: conn,
        arrived: false,
    }))
}

/// Tell connections waiting in the backlog why the pool failed (`why`, with
/// whom it blames). The listener is shut down first, so no connection slips
/// in between the last `accept` and the close to see a bare EOF (reported
/// as the creator's death): a rank that connects later is refused by the
/// kernel and retries, as it does against any creator that is closing.
fn refuse_pending(listener: &OwnedFd, why: &Error) {
    answer_backlog(listener, &refusal(why));
}

/// [`refuse_pending`] with the refusal made.
fn answer_backlog(listener: &OwnedFd, refused: &Message) {
    let _ = rustix::net::shutdown(listener, rustix::net::Shutdown::Read);
    let _ = rustix::io::ioctl_fionbio(listener, true);
    while let Ok(conn) = rustix::net::accept_with(listener, SocketFlags::CLOEXEC) {
        let _ = send(&conn, refused, &[]);
    }
}

/// The refusal a failed creator answers a connecting rank with: `why`'s
/// message and whom it blames.
fn refusal(why: &Error) -> Message {
    let (message, ranks, pid) = blame(why);
    Message::Refused {
        usage: false,
        message,
        ranks,
        pid,
        page: None,
    }
}

/// The creator failed before every rank could be told: go on answering on
/// the pool's socket with why (`why`'s message and whom it blames), until
/// `untold` more ranks have connected and heard it or `deadline` (the attach
/// timeout) passes. So a rank that comes after the failure fails at once
/// with the creator's cause instead of becoming a creator itself and
/// waiting out its attach timeout.
///
/// Who answers is the build's [`Refusals`]: a thread of this process,
/// while it lives (an engine, which outlives the error `Pool()` raised at
/// once), or the function it names (the CLI, which exits on the error,
/// hands the socket to a helper process of its own). With nobody left to
/// tell, or when the build was asked to stop (`cancel` was cancelled:
/// whoever stopped the creator stops the run, and leaves nothing answering
/// for it behind), or with [`Refusals::Close`], the backlog is answered at
/// once and the socket closed ([`refuse_pending`]).
fn keep_refusing(
    pool: &str,
    listener: OwnedFd,
    why: &Error,
    untold: u32,
    deadline: Instant,
    cancel: &Cancel,
    refusals: Refusals,
) {
    if untold == 0
        || Instant::now() >= deadline
        || cancel.requested().is_some()
        || matches!(refusals, Refusals::Close)
    {
        refuse_pending(&listener, why);
        return;
    }
    let refusal = Refusal {
        pool: pool.to_string(),
        listener,
        refused: refusal(why),
        untold,
        deadline,
    };
    if let Refusals::Hand(hand) = refusals {
        let terms = refusal.terms();
        hand(refusal.listener, terms);
        return;
    }
    // The listener goes to the thread; if no thread can start, answer the
    // backlog now (a second descriptor of the same socket, for that).
    let spare = refusal.listener.try_clone();
    if let Err(e) = std::thread::Builder::new()
        .name("hostpool-refuse".into())
        .spawn(move || refusal.serve())
    {
        tracing::warn!("cannot keep answering on the failed pool's socket: {e}");
        if let Ok(spare) = spare {
            refuse_pending(&spare, why);
        }
    }
}

/// A failed creator's answer to the ranks that have not heard yet why the
/// pool failed: the pool's listening socket, the refusal it answers every
/// connecting rank with (the cause, its errno included, and whom it
/// blames), how many ranks are still to be told, and until when (the attach
/// deadline).
///
/// A connecting rank names the creator by the pid `SO_PEERCRED` gives it:
/// the process that called `listen`, whichever process holds the socket
/// since. So the refusal can be served from another process
/// ([`Refusal::terms`], [`Refusal::listener`], [`Refusal::resume`]).
#[derive(Debug)]
pub struct Refusal {
    pool: String,
    listener: OwnedFd,
    refused: Message,
    untold: u32,
    deadline: Instant,
}

impl Refusal {
    /// The pool's listening socket (`@hostpool/<uid>/<name>`), to pass on
    /// to another process, e.g. as a `dup` of it that the process inherits.
    pub fn listener(&self) -> std::os::fd::BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// What the refusal says and for how long, to pass on with
    /// [`Refusal::listener`].
    pub fn terms(&self) -> RefusalTerms {
        RefusalTerms {
            pool: self.pool.clone(),
            // Our own message: serializing it cannot fail.
            message: serde_json::to_string(&self.refused).unwrap_or_default(),
            untold: self.untold,
            remaining: self.deadline.saturating_duration_since(Instant::now()),
        }
    }

    /// The refusal again, in the process `listener` was passed to: the
    /// deadline is `terms.remaining` from now.
    ///
    /// # Errors
    /// [`Error::Config`] when `listener` is not a listening `SOCK_SEQPACKET`
    /// socket, `terms.message` is not a refusal of this hostpool version
    /// (give back what [`Refusal::terms`] gave, from the same binary), or
    /// `terms.remaining` is longer than any attach timeout
    /// ([`pool_core::MAX_ATTACH_TIMEOUT_SECS`]).
    pub fn resume(listener: OwnedFd, terms: RefusalTerms) -> Result<Refusal> {
        if terms.remaining.as_secs_f64() > pool_core::MAX_ATTACH_TIMEOUT_SECS {
            return Err(Error::config(format!(
                "the refusal of shared pool `{}` would hold for {:.0} s, longer than any attach \
                 timeout ({:.0} s at most)",
                terms.pool,
                terms.remaining.as_secs_f64(),
                pool_core::MAX_ATTACH_TIMEOUT_SECS
            )));
        }
        let listening = rustix::net::sockopt::socket_acceptconn(&listener).unwrap_or(false);
        let kind = rustix::net::sockopt::socket_type(&listener).ok();
        if !listening || kind != Some(SocketType::SEQPACKET) {
            return Err(Error::config(format!(
                "the refusal of shared pool `{}` came without its listening socket; only a \
                 failed creator of the pool hands it on",
                terms.pool
            )));
        }
        let refused = match serde_json::from_str(&terms.message) {
            Ok(m @ Message::Refused { .. }) => m,
            _ => {
                return Err(Error::config(format!(
                    "the refusal of shared pool `{}` is not one this hostpool version sends; \
                     the creator and the process serving its refusal must be the same binary",
                    terms.pool
                )));
            }
        };
        Ok(Refusal {
            pool: terms.pool,
            listener,
            refused,
            untold: terms.untold,
            deadline: Instant::now() + terms.remaining,
        })
    }

    /// Answer every rank that connects with the refusal until the untold
    /// ranks have heard it or the deadline passes; then the ranks still
    /// waiting in the backlog are told too, and the socket is closed (a rank
    /// that connects after that is refused by the kernel and becomes a
    /// creator itself). Blocks until then, polling the socket every 20 ms.
    pub fn serve(self) {
        let Refusal {
            listener,
            refused,
            untold,
            deadline,
            ..
        } = self;
        let _ = rustix::io::ioctl_fionbio(&listener, true);
        let mut told = 0;
        while told < untold && Instant::now() < deadline {
            if !readable(listener.as_fd(), deadline).unwrap_or(false) {
                continue;
            }
            if let Ok(conn) = rustix::net::accept_with(&listener, SocketFlags::CLOEXEC) {
                let _ = send(&conn, &refused, &[]);
                told += 1;
            }
        }
        answer_backlog(&listener, &refused);
    }

    /// Answer the ranks already waiting in the backlog, and close the
    /// socket: what a creator does when nobody can serve the refusal
    /// longer.
    pub fn refuse_pending(self) {
        answer_backlog(&self.listener, &self.refused);
    }
}

/// Read what attached joiners said without waiting: an arrival is noted, an
/// EOF is a death. The peer error naming the joiner, if one died or failed
/// (as `barrier` words it).
fn watch(links: &mut [Link], barrier: &Barrier, cancel: &Cancel) -> Option<Error> {
    for l in links.iter_mut() {
        if !wire::ready(&l.fd) {
            continue;
        }
        let event = match recv(&l.fd, Instant::now() + TICK, &mut Vec::new(), cancel) {
            Ok(Received::Msg(Message::Arrived { error })) => Event::Arrived(error),
            Ok(Received::Msg(_) | Received::TimedOut) => continue,
            Ok(Received::Gone) | Err(_) => Event::Gone,
        };
        if let Some(f) = barrier.on(&l.mark(), &event) {
            return Some(f.into());
        }
        l.arrived = true;
    }
    None
}

/// Every rank attached so far, as the barrier sees it: the joiners linked,
/// and the creator itself (`arrived` once it is at the barrier).
fn marks(sharing: &pool_core::SharingConfig, links: &[Link], arrived: bool) -> Vec<Mark> {
    let mut marks: Vec<Mark> = links.iter().map(Link::mark).collect();
    marks.push(Mark {
        rank: sharing.rank,
        pid: std::process::id(),
        arrived,
        present: true,
    });
    marks
}

/// The creator failed while joiners attach: tell the welcomed ones, and
/// those still waiting in the backlog (who would otherwise see only the
/// listener close, and blame the creator's death), why: `why`'s message,
/// and whom it blames.
fn fail_creation(
    listener: OwnedFd,
    links: &mut [Link],
    why: &Error,
    sharing: &pool_core::SharingConfig,
    deadline: Instant,
    cancel: &Cancel,
    refusals: Refusals,
) {
    fail_all(links, why);
    let told = u32::try_from(links.len()).unwrap_or(u32::MAX);
    keep_refusing(
        &sharing.name,
        listener,
        why,
        (sharing.world - 1).saturating_sub(told),
        deadline,
        cancel,
        refusals,
    );
}

/// Tell every linked peer that the pool failed: `why`'s message, and whom
/// it blames, which the peers' own [`Error::Peer`] keeps.
fn fail_all(links: &mut [Link], why: &Error) {
    let (message, ranks, pid) = blame(why);
    for l in links.iter() {
        let _ = send(
            &l.fd,
            &Message::Failed {
                message: message.clone(),
                ranks: ranks.clone(),
                pid,
            },
            &[],
        );
    }
}

/// Join the pool's creator over `conn`: the one join of
/// [`crate::join`], this rank's own plan being what the creator must hand
/// over.
fn join(
    spec: SharedPoolSpec<'_>,
    conn: OwnedFd,
    attach_deadline: Instant,
) -> Result<Box<dyn Attachment>> {
    let sharing = spec.sharing;
    let joined = join::join(Joining {
        conn,
        holder: Holder::Creator {
            pool: sharing.name.clone(),
            rank: None,
            attach_timeout_secs: sharing.attach_timeout_secs,
            barrier_timeout_secs: sharing.barrier_timeout_secs,
        },
        request: hello_of(&spec),
        deadline: attach_deadline,
        cancel: &spec.cancel,
        planned: Some((spec.size, spec.files.iter().map(|(_, e)| *e).collect())),
        map: spec.map.clone(),
        stall: "shared-passing-fds",
    })?;
    let rank = match &joined.holder {
        Holder::Creator { rank, .. } => rank.unwrap_or_default(),
        Holder::Keeper { .. } => 0,
    };
    Ok(Box::new(SocketMapping {
        inner: joined.mapping,
        role: Role::Joiner,
        links: vec![Link {
            rank,
            pid: joined.pid,
            fd: joined.conn,
            arrived: false,
        }],
        side: Side::Joiner(joined.holder),
        shard: shard(spec.size, sharing)?,
        sharing: sharing.clone(),
        cancel: spec.cancel.clone(),
    }))
}

/// A creator holds the barrier of the ranks; a joiner meets it at its
/// creator ([`join::arrive`]), which its errors name.
#[derive(Debug)]
enum Side {
    Creator(Barrier),
    Joiner(Holder),
}

/// A rank's mapping of a pool shared over the socket rendezvous.
#[derive(Debug)]
struct SocketMapping {
    inner: FileMapping,
    role: Role,
    /// The joiners (creator), or the creator (joiner).
    links: Vec<Link>,
    /// A creator's barrier, or whom a joiner joined.
    side: Side,
    shard: Extent,
    sharing: pool_core::SharingConfig,
    /// The build's token, which the barrier's waits check.
    cancel: Cancel,
}

impl SocketMapping {
    fn barrier(&mut self, outcome: std::result::Result<(), String>) -> Result<()> {
        let s = &self.sharing;
        let barrier = match (&self.side, &self.links[..]) {
            (Side::Joiner(holder), [link]) => {
                return join::arrive(
                    link.fd.as_fd(),
                    holder,
                    link.pid,
                    s.rank,
                    outcome,
                    &self.cancel,
                );
            }
            (Side::Joiner(_), _) => return outcome.map_err(Error::config),
            (Side::Creator(b), _) => b,
        };
        if let Err(msg) = outcome {
            let e = peer(
                format!("shared pool `{}`: rank {} failed: {msg}", s.name, s.rank),
                vec![s.rank],
                Some(std::process::id()),
            );
            fail_all(&mut self.links, &e);
            return Err(e);
        }
        // The barrier's deadline counts from the creator's own arrival.
        let barrier = Barrier::shared(
            s,
            barrier.attach.at,
            Instant::now() + Duration::from_secs_f64(s.barrier_timeout_secs),
        );
        loop {
            if let Err(e) = self.cancel.check() {
                let why = peer(
                    format!("rank {} was interrupted: {e}", s.rank),
                    vec![s.rank],
                    Some(std::process::id()),
                );
                fail_all(&mut self.links, &why);
                return Err(e);
            }
            if let Some(e) = watch(&mut self.links, &barrier, &self.cancel) {
                fail_all(&mut self.links, &e);
                return Err(e);
            }
            let marks = marks(s, &self.links, true);
            match barrier.settle(&marks, Instant::now(), pool_core::host::process::why_late) {
                Some(Verdict::Go) => break,
                Some(Verdict::Failed(f)) => {
                    let e = Error::from(f);
                    fail_all(&mut self.links, &e);
                    return Err(e);
                }
                None => std::thread::sleep(TICK.min(Duration::from_millis(2))),
            }
        }
        for l in &self.links {
            let _ = send(&l.fd, &Message::Go, &[]);
        }
        Ok(())
    }
}

impl Mapping for SocketMapping {
    fn region(&self) -> Region<'_> {
        self.inner.region()
    }

    fn reserve_for_touch(&self, extent: Extent) -> Result<()> {
        self.inner.reserve_for_touch(extent)
    }

    fn teardown(self: Box<Self>) -> Vec<TeardownIssue> {
        self.inner.release()
    }

    fn teardown_keeping_range(self: Box<Self>) -> (Vec<TeardownIssue>, Option<Placeholder>) {
        self.inner.release_with(true)
    }
}

impl Attachment for SocketMapping {
    fn pool_files(&self) -> &[pool_core::file::PoolFile] {
        self.inner.pool_files()
    }

    fn attached(&self) -> Attached {
        Attached::Shared(SharingReport::of(
            &self.sharing,
            self.role,
            self.shard,
            String::new(),
        ))
    }

    fn rendezvous(
        &mut self,
        outcome: std::result::Result<(), String>,
        barrier: Option<&dyn RankBarrier>,
    ) -> Result<()> {
        match barrier {
            Some(b) => {
                let r = b.wait(self.sharing.rank, self.sharing.world, outcome);
                if let Err(e) = &r {
                    fail_all(&mut self.links, e);
                }
                r
            }
            None => {
                pool_core::failpoint::stall("shared-before-barrier");
                let r = self.barrier(outcome);
                if r.is_ok() {
                    pool_core::failpoint::stall("shared-after-barrier");
                }
                r
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::AddressFamily;

    fn listener(tag: &str) -> (OwnedFd, SocketAddrUnix) {
        let addr = address(&format!("unit-{}-{tag}", std::process::id())).unwrap();
        let sock = seqpacket().unwrap();
        rustix::net::bind(&sock, &addr).unwrap();
        rustix::net::listen(&sock, 4).unwrap();
        (sock, addr)
    }

    fn connected(addr: &SocketAddrUnix) -> OwnedFd {
        let c = seqpacket().unwrap();
        rustix::net::connect(&c, addr).unwrap();
        c
    }

    fn message_of(fd: &OwnedFd) -> Message {
        match recv(
            fd,
            Instant::now() + Duration::from_secs(5),
            &mut Vec::new(),
            &Cancel::new(),
        )
        .unwrap()
        {
            Received::Msg(m) => m,
            other => panic!("expected a message, got {other:?}"),
        }
    }

    /// A rank that connected while the creator was failing (a welcomed peer
    /// died) is told why, naming the dead rank, instead of seeing the
    /// listener close and blaming the creator; a welcomed rank hears it
    /// too, both with the rank and pid it blames; a rank that connects
    /// after the failure hears the same cause at once (issue 19: it once
    /// became a creator itself and waited out its attach timeout); and once
    /// every rank was told, the socket is gone.
    #[test]
    fn a_failing_creator_tells_welcomed_and_waiting_ranks_why() {
        let (l, addr) = listener("fail");
        let waiting = connected(&addr);
        send(
            &waiting,
            &Message::Files {
                extents: Vec::new(),
            },
            &[],
        )
        .unwrap();
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let mut links = vec![Link {
            rank: 1,
            pid: 1,
            fd: ours,
            arrived: false,
        }];
        let why = "shared pool `unit`: rank 2 (pid 7) died before the barrier completed";
        let sharing = pool_core::SharingConfig {
            name: "unit".into(),
            world: 4,
            rank: 0,
            attach_timeout_secs: 20.0,
            barrier_timeout_secs: 600.0,
            rendezvous: pool_core::Rendezvous::Socket,
            control_dir: None,
        };
        let started = Instant::now();
        fail_creation(
            l,
            &mut links,
            &peer(why.into(), vec![2], Some(7)),
            &sharing,
            started + Duration::from_secs(20),
            &Cancel::new(),
            Refusals::Thread,
        );
        match message_of(&waiting) {
            Message::Refused {
                usage,
                message,
                ranks,
                pid,
                ..
            } => {
                assert!(!usage, "not the joiner's input");
                assert_eq!(message, why);
                assert_eq!((ranks, pid), (vec![2], Some(7)));
            }
            other => panic!("the waiting rank got {other:?}"),
        }
        match message_of(&theirs) {
            Message::Failed {
                message,
                ranks,
                pid,
            } => {
                assert_eq!(message, why);
                assert_eq!((ranks, pid), (vec![2], Some(7)));
            }
            other => panic!("the welcomed rank got {other:?}"),
        }
        // World 4: one welcomed, two to tell (the waiting one and a late one).
        std::thread::sleep(Duration::from_millis(50));
        let late = connected(&addr);
        match message_of(&late) {
            Message::Refused { message, ranks, .. } => {
                assert_eq!(message, why);
                assert_eq!(ranks, vec![2]);
            }
            other => panic!("the late rank got {other:?}"),
        }
        // Every rank heard it: the answering thread ends, long before the
        // attach deadline, and the failed pool's socket goes with it.
        let gone = loop {
            let again = seqpacket().unwrap();
            match rustix::net::connect(&again, &addr) {
                Err(rustix::io::Errno::CONNREFUSED) => break true,
                _ if started.elapsed() > Duration::from_secs(5) => break false,
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        assert!(gone, "the socket outlived the last rank it had to tell");
    }

    /// What a failed creator does with its refusal is its build's policy,
    /// not the process's: `Hand` gives the socket and the terms to the
    /// build's function (the CLI's helper), and the socket it gets answers
    /// as the creator would; `Close` answers the rank waiting now and closes
    /// the socket, so a later rank is refused by the kernel.
    #[test]
    fn a_failed_creator_hands_or_closes_its_refusal_as_its_build_says() {
        static HANDED: std::sync::Mutex<Option<(OwnedFd, RefusalTerms)>> =
            std::sync::Mutex::new(None);
        fn hand(listener: OwnedFd, terms: RefusalTerms) {
            *HANDED.lock().unwrap() = Some((listener, terms));
        }
        let why = peer(
            "shared pool `unit`: rank 1 (pid 9) failed: out of pages".into(),
            vec![1],
            Some(9),
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        let (l, addr) = listener("hand");
        keep_refusing(
            "unit",
            l,
            &why,
            3,
            deadline,
            &Cancel::new(),
            Refusals::Hand(hand),
        );
        let (handed, terms) = HANDED
            .lock()
            .unwrap()
            .take()
            .expect("the socket was handed");
        assert_eq!((terms.pool.as_str(), terms.untold), ("unit", 3));
        assert!(terms.remaining > Duration::from_secs(15), "{terms:?}");
        let late = connected(&addr);
        let refusal = Refusal::resume(handed, terms).unwrap();
        std::thread::spawn(move || refusal.serve());
        match message_of(&late) {
            Message::Refused { message, ranks, .. } => {
                assert!(message.contains("out of pages"), "{message}");
                assert_eq!(ranks, vec![1]);
            }
            other => panic!("the late rank got {other:?}"),
        }

        let (l, addr) = listener("close");
        let waiting = connected(&addr);
        keep_refusing(
            "unit",
            l,
            &why,
            3,
            deadline,
            &Cancel::new(),
            Refusals::Close,
        );
        assert!(
            matches!(message_of(&waiting), Message::Refused { .. }),
            "the waiting rank is told"
        );
        let again = seqpacket().unwrap();
        assert_eq!(
            rustix::net::connect(&again, &addr),
            Err(rustix::io::Errno::CONNREFUSED),
            "nothing answers on the closed socket"
        );
    }

    /// A refusal passed on, as the CLI hands it to its helper process (its
    /// terms, and another descriptor of its socket), answers as the creator
    /// would: a late rank hears the cause, errno included, and once the
    /// untold ranks heard it the serving ends and the socket is gone; it
    /// ends at its deadline too. What is not a refusal's socket or message
    /// is refused.
    #[test]
    fn a_refusal_handed_on_answers_as_its_creator_would() {
        let (l, addr) = listener("handed");
        let why = os(
            "mmap",
            std::io::Error::from_raw_os_error(libc::ENOMEM),
            "mapping the pool's files failed",
        );
        let refusal = Refusal {
            pool: "unit".into(),
            listener: l,
            refused: refusal(&why),
            untold: 1,
            deadline: Instant::now() + Duration::from_secs(20),
        };
        let terms = refusal.terms();
        assert!(
            terms.remaining > Duration::from_secs(19) && terms.remaining <= Duration::from_secs(20),
            "{terms:?}"
        );
        assert_eq!((terms.pool.as_str(), terms.untold), ("unit", 1));
        let passed = rustix::io::dup(refusal.listener()).unwrap();
        drop(refusal);
        let resumed = Refusal::resume(passed, terms.clone()).unwrap();
        let started = Instant::now();
        let server = std::thread::spawn(move || resumed.serve());
        let late = connected(&addr);
        match message_of(&late) {
            Message::Refused {
                usage,
                message,
                ranks,
                pid,
                ..
            } => {
                assert!(!usage, "not the joiner's input");
                assert!(message.contains("Cannot allocate memory"), "{message}");
                assert_eq!((ranks, pid), (Vec::new(), None));
            }
            other => panic!("the late rank got {other:?}"),
        }
        server.join().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "served past the last untold rank"
        );
        let again = seqpacket().unwrap();
        assert_eq!(
            rustix::net::connect(&again, &addr),
            Err(rustix::io::Errno::CONNREFUSED),
            "the socket outlived the last rank it had to tell"
        );

        // Nobody comes: the serving ends at the deadline.
        let (l, _) = listener("handed-deadline");
        let short = RefusalTerms {
            untold: 3,
            remaining: Duration::from_millis(200),
            ..terms.clone()
        };
        let started = Instant::now();
        Refusal::resume(l, short).unwrap().serve();
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(2),
            "{took:?}"
        );

        // Not a listening socket; not a refusal; longer than any attach
        // timeout.
        let (l, _) = listener("handed-long");
        let long = RefusalTerms {
            remaining: Duration::from_secs(1 << 40),
            ..terms.clone()
        };
        let e = Refusal::resume(l, long).unwrap_err();
        assert!(
            matches!(&e, Error::Config { .. }) && e.to_string().contains("longer than any"),
            "{e}"
        );
        let (connected_end, _other) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let e = Refusal::resume(connected_end, terms.clone()).unwrap_err();
        assert!(
            matches!(&e, Error::Config { .. }) && e.to_string().contains("listening socket"),
            "{e}"
        );
        let (l, _) = listener("handed-bad");
        let go = RefusalTerms {
            message: serde_json::to_string(&Message::Go).unwrap(),
            ..terms
        };
        let e = Refusal::resume(l, go).unwrap_err();
        assert!(
            matches!(&e, Error::Config { .. }) && e.to_string().contains("not one this hostpool"),
            "{e}"
        );
    }

    /// A `Failed` or `Refused` of a peer that sends no `ranks` or `pid`
    /// still reads, blaming nobody.
    #[test]
    fn a_failure_without_ranks_or_pid_still_reads() {
        let failed: Message = serde_json::from_str(r#"{"Failed":{"message":"x"}}"#).unwrap();
        assert!(
            matches!(&failed, Message::Failed { message, ranks, pid: None } if message == "x" && ranks.is_empty()),
            "{failed:?}"
        );
        let refused: Message =
            serde_json::from_str(r#"{"Refused":{"usage":false,"message":"x"}}"#).unwrap();
        assert!(
            matches!(&refused, Message::Refused { ranks, pid: None, .. } if ranks.is_empty()),
            "{refused:?}"
        );
    }

    /// A joiner whose creator goes after the joiner's hello, before any
    /// welcome, never learned the creator's rank: its error names the
    /// creator by pid alone, and blames no rank.
    #[test]
    fn a_joiner_whose_creator_dies_before_the_welcome_blames_its_pid_alone() {
        use super::super::tests::{Dirs, attach, blamed, socket_sharing};
        let d = Dirs::new("no-welcome");
        let sharing = socket_sharing("no-welcome", 2, 1, 10.0);
        // The test is the creator: it holds the pool's name, reads the
        // joiner's hello, and closes the connection without a welcome.
        let creator = seqpacket().unwrap();
        rustix::net::bind(&creator, &address(&sharing.name).unwrap()).unwrap();
        rustix::net::listen(&creator, 4).unwrap();
        let e = std::thread::scope(|sc| {
            let joiner = sc.spawn(|| attach(&d, &sharing, 4, &[]));
            let conn = rustix::net::accept_with(&creator, SocketFlags::CLOEXEC).unwrap();
            assert!(matches!(message_of(&conn), Message::Join { rank: 1, .. }));
            drop(conn);
            joiner.join().unwrap().unwrap_err()
        });
        let pid = std::process::id();
        assert!(
            e.to_string().contains(&format!(
                "its creator (pid {pid}) died before the pool was ready"
            )),
            "{e}"
        );
        assert_eq!(blamed(&e), (Vec::new(), Some(pid)), "{e}");
    }

    /// Over the socket, the creator names every rank that never attached,
    /// in order, and no pid (none of them ever connected).
    #[test]
    fn ranks_that_never_come_over_the_socket_are_all_named() {
        use super::super::tests::{Dirs, attach, blamed, socket_sharing};
        let d = Dirs::new("absent-socket");
        let e = attach(&d, &socket_sharing("absent", 4, 0, 0.3), 4, &[]).unwrap_err();
        assert!(
            e.to_string().contains("rank(s) 1, 2, 3 never attached"),
            "{e}"
        );
        assert_eq!(blamed(&e), (vec![1, 2, 3], None), "{e}");
        assert!(d.left().is_empty(), "{:?}", d.left());
    }
}
