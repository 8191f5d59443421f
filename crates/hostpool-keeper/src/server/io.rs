//! The keeper's I/O: its socket and its connections ([`Sockets`]). It
//! binds the pool's name, accepts connections (each named by a
//! [`ConnId`]), reads hellos and what each tenant's ranks say, and feeds all
//! of it to the state machine (`super::state`), then sends what that
//! returns (a lease with the pool's descriptors, a refusal, `Go`, a
//! failure) and closes what it lets go. It decides nothing itself.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::net::SocketFlags;

use super::Memory;
use super::state::{Answer, ConnId, Figures, RankEvent, Refusal, Serving, Tell, Waiting};
use super::tier::TierServer;
use hostpool_handoff::lease::{LeaseInfo, address, socket_name};
use hostpool_handoff::wire::{self, Received, TICK};
use hostpool_handoff::{Message, TierOp, TierReply};
use pool_core::Extent;
use pool_core::{Error, Result};

/// How long a new connection has to say what it wants.
const HELLO_WITHIN: Duration = Duration::from_secs(5);

/// The most messages read from one connection in one turn of the loop
/// (the loop turns again at once while any connection has more).
const READ_AT_ONCE: usize = 64;

/// The longest the loop sleeps with nothing to read: what it watches
/// without a descriptor (the stop requests, counted by the signal thread,
/// and the clearing thread's end) is seen within it. Every connection the
/// keeper serves wakes it at once.
pub(super) const IDLE: Duration = TICK;

/// A keeper's socket and connections.
#[derive(Debug)]
pub(super) struct Sockets {
    listener: OwnedFd,
    /// New connections, until they say what they want (or
    /// [`HELLO_WITHIN`] passed).
    hellos: Vec<(ConnId, OwnedFd, Instant)>,
    /// The connections the state names: the tenants' ranks and companions,
    /// and the attaches that wait.
    conns: HashMap<ConnId, OwnedFd>,
    /// The id of the next connection.
    next: u64,
}

impl Sockets {
    /// A keeper's connections on `listener` (from [`bind`]): none yet.
    pub(super) fn new(listener: OwnedFd) -> Sockets {
        Sockets {
            listener,
            hellos: Vec::new(),
            conns: HashMap::new(),
            next: 0,
        }
    }

    /// A new connection's id.
    fn id(&mut self) -> ConnId {
        self.next += 1;
        ConnId(self.next)
    }

    /// The socket of connection `conn`, while it is open.
    fn fd(&self, conn: ConnId) -> Option<&OwnedFd> {
        self.conns.get(&conn)
    }

    /// Wait until anything comes on any connection the keeper serves (a
    /// connection, a hello, a rank's or a companion's message or hang-up,
    /// a tier request, a waiting attach's hang-up), or the next deadline
    /// (a hello's or a waiting attach's, at most [`IDLE`] away). Then take
    /// new connections: each has [`HELLO_WITHIN`] to say what it wants.
    pub(super) fn accept(&mut self, s: &Serving) {
        let mut fds = vec![self.listener.as_fd()];
        fds.extend(self.hellos.iter().map(|(_, fd, _)| fd.as_fd()));
        let watched = s.watched();
        fds.extend(watched.iter().filter_map(|c| self.fd(*c)).map(AsFd::as_fd));
        let now = Instant::now();
        let next = self.hellos.iter().map(|(_, _, until)| *until);
        let wait = next
            .chain(s.next_deadline())
            .map(|d| d.saturating_duration_since(now))
            .fold(IDLE, Duration::min);
        wire::wait_any(&fds, wait);
        while let Ok(fd) = rustix::net::accept_with(&self.listener, SocketFlags::CLOEXEC) {
            let conn = self.id();
            self.hellos.push((conn, fd, Instant::now() + HELLO_WITHIN));
        }
    }

    /// Read what new connections want: a status, or a lease (refusing
    /// users that are not allowed).
    pub(super) fn read_hellos(&mut self, s: &mut Serving, memory: &Memory) {
        let now = Instant::now();
        for (conn, fd, until) in std::mem::take(&mut self.hellos) {
            if !wire::ready(&fd) {
                if now < until {
                    self.hellos.push((conn, fd, until));
                }
                continue;
            }
            let Ok((uid, pid)) = wire::peer_cred(&fd) else {
                continue;
            };
            let msg = match wire::recv::<Message>(&fd, now + TICK, &mut Vec::new(), None) {
                Ok(Received::Msg(msg)) => msg,
                Ok(Received::Gone | Received::TimedOut) => continue,
                Err(e) => {
                    refuse(&fd, false, s.unreadable(pid, &e), None);
                    continue;
                }
            };
            if let Some(message) = s.forbidden(uid) {
                refuse(&fd, false, message, None);
                continue;
            }
            match msg {
                Message::Status => {
                    let status = super::status::status(s, memory);
                    let _ = wire::send(
                        &fd,
                        &Message::StatusOf(serde_json::to_value(status).unwrap_or_default()),
                        &[],
                    );
                }
                hello @ Message::Hello { .. } => self.hello(s, memory, conn, fd, uid, pid, hello),
                _ => {}
            }
        }
    }

    /// An engine's rank (or companion) asks for a lease on `fd`: the state
    /// answers; a grant is sent, and the connection joins the tenant the
    /// state named; an attach told to wait waits.
    #[allow(clippy::too_many_arguments)]
    fn hello(
        &mut self,
        s: &mut Serving,
        memory: &Memory,
        conn: ConnId,
        fd: OwnedFd,
        uid: u32,
        pid: u32,
        hello: Message,
    ) {
        pool_core::failpoint::stall("keeper-hello");
        // A client that gave up before it was served (its attach timeout
        // passed while the keeper was stopped or busy) gets no lease: it
        // would count a generation and end as `died` without ever holding it.
        if wire::hung_up(&fd) {
            tracing::debug!(
                "kept pool `{}`: pid {pid} hung up before it was served",
                s.name()
            );
            return;
        }
        match s.answer(&hello, || memory.truncated(), Instant::now()) {
            Answer::Refuse {
                usage,
                message,
                pid,
            } => refuse(&fd, usage, message, pid),
            Answer::Wait { until } => {
                self.conns.insert(conn, fd);
                s.waits(Waiting {
                    conn,
                    uid,
                    pid,
                    hello,
                    until,
                });
            }
            Answer::Grant(tenant, info) => {
                let rank = !matches!(
                    &hello,
                    Message::Hello {
                        companion: true,
                        ..
                    }
                );
                pool_core::failpoint::stall("keeper-passing-fds");
                let sent = send_lease(&fd, memory, info, s.figures()).is_ok();
                if s.joined(tenant, conn, pid, uid, &hello, sent) {
                    self.conns.insert(conn, fd);
                }
                if rank {
                    pool_core::failpoint::stall("keeper-leased");
                }
            }
        }
    }

    /// What the connections `conns` (by place; `None`: ended) said since:
    /// arrived, released, or gone (closed here).
    fn read_events(
        &mut self,
        conns: &[Option<ConnId>],
        asks: &mut Vec<(ConnId, u64, TierOp, bool)>,
    ) -> Vec<(usize, RankEvent)> {
        let mut events = Vec::new();
        for (i, conn) in conns.iter().enumerate() {
            let Some(conn) = *conn else {
                continue;
            };
            // What came since, a few at a time: a tenant's quiet tells and
            // its next ask may wait together.
            for _ in 0..READ_AT_ONCE {
                let Some(fd) = self.fd(conn) else {
                    break;
                };
                if !wire::ready(fd) {
                    break;
                }
                let event =
                    match wire::recv::<Message>(fd, Instant::now() + TICK, &mut Vec::new(), None) {
                        Ok(Received::Msg(Message::Arrived { error })) => RankEvent::Arrived(error),
                        Ok(Received::Msg(Message::Release)) => RankEvent::Released,
                        Ok(Received::Msg(Message::Tier { id, op, quiet })) => {
                            asks.push((conn, id, op, quiet));
                            continue;
                        }
                        Ok(Received::Msg(_)) => continue,
                        Ok(Received::TimedOut) => break,
                        Ok(Received::Gone) | Err(_) => RankEvent::Gone,
                    };
                let gone = event == RankEvent::Gone;
                events.push((i, event));
                if gone {
                    self.conns.remove(&conn);
                    break;
                }
            }
        }
        events
    }

    /// Read what each tenant's ranks and companions say (arrivals,
    /// releases, deaths), hand it to the state with the time, tenant by
    /// tenant, and tell that tenant's ranks what it says: `Go` once all
    /// arrived, or why its lease failed.
    pub(super) fn watch_lease(&mut self, s: &mut Serving, mut tier: Option<&mut TierServer<'_>>) {
        for tenant in s.tenant_ids() {
            let Some((ranks, companions)) = s.lease_conns(tenant) else {
                continue;
            };
            let mut asks = Vec::new();
            let ranks = self.read_events(&ranks, &mut asks);
            let companions = self.read_events(&companions, &mut asks);
            // The tier's requests, answered on the connection they came by;
            // the tenant's figures handed to the state after each.
            for (conn, id, op, quiet) in asks {
                let reply = match tier.as_deref_mut() {
                    Some(t) => {
                        let reply = t.serve(tenant, op, &|other| s.tenant_named(other));
                        s.tier_figures(tenant, t.figures(tenant));
                        if let TierReply::Opened { warm, .. } = reply {
                            s.tier_opened(warm);
                        }
                        reply
                    }
                    None => TierReply::Refused {
                        message: "the keeper cannot read its pool's words".into(),
                    },
                };
                if quiet {
                    if let TierReply::Refused { message } = &reply {
                        tracing::warn!(
                            "kept pool `{}`: a tenant's quiet tier request was refused: {message}",
                            s.name()
                        );
                    }
                    continue;
                }
                // Never blocks: a tenant that does not read its answers
                // (its socket full) is not waited for; it sees its ask
                // unanswered and gives back what a late answer would grant.
                let sent = self
                    .fd(conn)
                    .map(|fd| wire::send_now(fd, &Message::TierReply { id, reply }));
                if let Some(Err(e)) = sent {
                    tracing::warn!(
                        "kept pool `{}`: a tier answer could not be sent ({e}); the tenant that \
                         asked does not read its connection",
                        s.name()
                    );
                }
            }
            if let Some(tell) = s.on_lease_events(tenant, ranks, companions, Instant::now()) {
                self.tell(&tell);
            }
        }
    }

    /// Whether a rank or companion of a lease in force has something
    /// unread (a message, or its hang-up).
    pub(super) fn lease_unsettled(&self, s: &Serving) -> bool {
        let conns = s.tenant_ids().into_iter().filter_map(|t| s.lease_conns(t));
        conns
            .flat_map(|(ranks, companions)| ranks.into_iter().chain(companions))
            .filter_map(|c| self.fd(c?))
            .any(wire::ready)
    }

    /// Serve the attaches that waited for the pool to be cleared, in
    /// arrival order, while the state lets them in.
    pub(super) fn serve_waiting(&mut self, s: &mut Serving, memory: &Memory) {
        while let Some(w) = s.next_waiting() {
            let Some(fd) = self.conns.remove(&w.conn) else {
                continue;
            };
            if wire::ready(&fd) {
                // It hung up while waiting.
                continue;
            }
            self.hello(s, memory, w.conn, fd, w.uid, w.pid, w.hello);
        }
    }

    /// Waiting attaches that hung up are dropped; those past their timeout
    /// at `now` are told why.
    pub(super) fn expire_waiting(&mut self, s: &mut Serving, now: Instant) {
        let gone: Vec<ConnId> = s
            .waiting_conns()
            .into_iter()
            .filter(|c| self.fd(*c).is_none_or(wire::ready))
            .collect();
        s.waiting_gone(&gone);
        for c in gone {
            self.conns.remove(&c);
        }
        for r in s.expire_waiting(now) {
            self.refuse(r);
        }
    }

    /// Refuse a connection the state names, and close it.
    pub(super) fn refuse(&mut self, r: Refusal) {
        if let Some(fd) = self.conns.remove(&r.conn) {
            refuse(&fd, r.usage, r.message, r.pid);
        }
    }

    /// Send a message to connections the state names (an error is a
    /// connection that ended, which its next read tells).
    pub(super) fn tell(&self, tell: &Tell) {
        for fd in tell.to.iter().filter_map(|c| self.fd(*c)) {
            let _ = wire::send(fd, &tell.message, &[]);
        }
    }
}

/// A keeper that got no pool back from systemd or a persist directory:
/// wait up to `within` on its socket for a tenant that lived through the
/// keeper before to hand the pool's files back ([`Message::HandBack`]),
/// and adopt them ([`Pool::adopt_kept`]: checked against `plan`). Any other
/// request meanwhile is told the keeper is starting. `None` when none came
/// (or none was the pool planned): the keeper builds.
pub(super) fn wait_hand_back(
    listener: &OwnedFd,
    name: &str,
    plan: &pool_core::PoolPlan,
    within: Duration,
    observer: &dyn pool_core::Observer,
) -> Option<(pool_core::Pool, Vec<(OwnedFd, Extent)>)> {
    let deadline = Instant::now() + within;
    tracing::info!(
        "kept pool `{name}`: waiting up to {:.1} s for an engine that lived through the keeper \
         before to hand its pool back",
        within.as_secs_f64()
    );
    let answer = |conn: &OwnedFd, adopted: bool, message: String| {
        let _ = wire::send(conn, &Message::HandedBack { adopted, message }, &[]);
    };
    while Instant::now() < deadline {
        wire::wait_any(
            &[listener.as_fd()],
            deadline.saturating_duration_since(Instant::now()).min(IDLE),
        );
        while let Ok(conn) = rustix::net::accept_with(listener, SocketFlags::CLOEXEC) {
            let mut fds = Vec::new();
            let soon = Instant::now() + Duration::from_secs(5);
            let msg = match wire::recv::<Message>(&conn, soon, &mut fds, None) {
                Ok(Received::Msg(m)) => m,
                _ => continue,
            };
            let Message::HandBack {
                name: theirs,
                extents,
                count,
            } = msg
            else {
                refuse(
                    &conn,
                    false,
                    format!(
                        "the keeper of `{name}` is starting: it waits for an engine to hand its \
                         pool back (adopt_within_secs), then serves; try again"
                    ),
                    None,
                );
                continue;
            };
            if theirs != name {
                answer(
                    &conn,
                    false,
                    format!("this is the keeper of `{name}`, not `{theirs}`"),
                );
                continue;
            }
            let cancel = pool_core::interrupt::Cancel::new();
            let received =
                hostpool_handoff::take_over(conn.as_fd(), soon, &cancel, fds, count, extents);
            let files = match received {
                Ok(Ok(files)) => files.into_iter().map(|f| f.fd).collect(),
                Ok(Err(h)) => {
                    answer(&conn, false, format!("the files did not all come: {h:?}"));
                    continue;
                }
                Err(e) => {
                    answer(&conn, false, e.to_string());
                    continue;
                }
            };
            match pool_core::Pool::adopt_kept(plan, files, observer) {
                Ok(adopted) => {
                    answer(&conn, true, String::new());
                    tracing::info!("kept pool `{name}`: an engine handed its pool back");
                    return Some(adopted);
                }
                Err(e) => {
                    tracing::warn!("kept pool `{name}`: an engine's pool was not taken back: {e}");
                    answer(&conn, false, e.to_string());
                }
            }
        }
    }
    None
}

/// Bind the kept pool's socket, or say who holds its name.
pub(super) fn bind(name: &str) -> Result<OwnedFd> {
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

/// Tell a client why it is refused (the caller closes the connection).
fn refuse(conn: &OwnedFd, usage: bool, message: String, pid: Option<u32>) {
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

/// Send a lease: its info and the pool's figures, with the files'
/// descriptors in as many messages as they need.
fn send_lease(
    conn: &OwnedFd,
    memory: &Memory,
    info: LeaseInfo,
    f: &Figures,
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
            logical: f.logical,
            mapped: f.mapped,
            page: f.page,
            backing: f.backing.clone(),
            extents,
            files,
        },
        &files,
    )
}

/// The I/O side over socket pairs, with the state's transitions: what a
/// rank's connection says reaches the state, what the state says reaches
/// the ranks, and a connection that ends is closed. As an ordinary user.
#[cfg(test)]
mod tests {
    use super::super::state::testing::{T1, hello, serving};
    use super::*;

    fn pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    fn recv(fd: &OwnedFd) -> Message {
        let deadline = Instant::now() + Duration::from_secs(5);
        match wire::recv::<Message>(fd, deadline, &mut Vec::new(), None).unwrap() {
            Received::Msg(m) => m,
            other => panic!("expected a message, got {other:?}"),
        }
    }

    #[test]
    fn the_ranks_connections_reach_the_state_and_the_state_reaches_the_ranks() {
        let mut io = Sockets::new(pair().0);
        let mut s = serving("zero");
        let now = Instant::now();
        let mut peers = Vec::new();
        for rank in 0..2 {
            let (fd, peer) = pair();
            let conn = io.id();
            io.conns.insert(conn, fd);
            let h = hello("eng", 2, rank, None);
            assert!(matches!(s.answer(&h, || None, now), Answer::Grant(T1, _)));
            assert!(s.joined(T1, conn, 10 + rank, 0, &h, true));
            peers.push(peer);
        }
        assert!(!io.lease_unsettled(&s));
        io.watch_lease(&mut s, None);
        assert!(!s.lease_live(T1));
        for peer in &peers {
            wire::send(peer, &Message::Arrived { error: None }, &[]).unwrap();
        }
        assert!(io.lease_unsettled(&s));
        io.watch_lease(&mut s, None);
        assert!(s.lease_live(T1) && !io.lease_unsettled(&s));
        for peer in &peers {
            assert!(matches!(recv(peer), Message::Go));
        }
        // Rank 1 releases and hangs up: its connection is closed, and the
        // lease goes on with rank 0, which hears that the keeper stops.
        wire::send(&peers[1], &Message::Release, &[]).unwrap();
        drop(peers.remove(1));
        io.watch_lease(&mut s, None);
        io.watch_lease(&mut s, None);
        assert_eq!(io.conns.len(), 1);
        assert!(s.ended().is_empty());
        io.tell(&s.farewell());
        assert!(matches!(recv(&peers[0]), Message::Failed { message, .. }
            if message.contains("the keeper of `unit` stopped")));
        drop(peers.remove(0));
        io.watch_lease(&mut s, None);
        assert!(io.conns.is_empty() && s.ended() == vec![T1]);
        assert!(s.end_lease(T1, now));
    }

    /// A tier request on a rank's connection is answered on it, by the
    /// tier of that rank's lease; the lease's barrier goes on beside it.
    #[test]
    fn a_tier_request_is_answered_on_the_connection_it_came_by() {
        use hostpool_handoff::TierPut;
        let words: Vec<std::sync::atomic::AtomicU64> = (0..64 * 512)
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect();
        let fp = hostpool_index::Fingerprint::new([("model", "m")]).unwrap();
        hostpool_index::Index::attach_tail(&words, 8, 4096, &fp).unwrap();
        let mut tier = TierServer::new("unit".into(), &words, 4096);
        let mut io = Sockets::new(pair().0);
        let mut s = serving("zero");
        let (fd, peer) = pair();
        let conn = io.id();
        io.conns.insert(conn, fd);
        let h = hello("eng", 1, 0, None);
        assert!(matches!(
            s.answer(&h, || None, Instant::now()),
            Answer::Grant(T1, _)
        ));
        assert!(s.joined(T1, conn, 10, 0, &h, true));
        let op = TierOp::Store {
            keys: vec![b"k".to_vec()],
        };
        wire::send(
            &peer,
            &Message::Tier {
                id: 7,
                op,
                quiet: false,
            },
            &[],
        )
        .unwrap();
        io.watch_lease(&mut s, Some(&mut tier));
        let slot = match recv(&peer) {
            Message::TierReply {
                id: 7,
                reply: TierReply::Puts(puts),
            } => match puts[..] {
                [TierPut::Granted { slot, .. }] => slot,
                _ => panic!("{puts:?}"),
            },
            other => panic!("{other:?}"),
        };
        assert!(s.ended().is_empty(), "the lease goes on");
        // What the tenant did reaches the state, for the status.
        let op = TierOp::Stored { slots: vec![slot] };
        wire::send(
            &peer,
            &Message::Tier {
                id: 8,
                op,
                quiet: false,
            },
            &[],
        )
        .unwrap();
        io.watch_lease(&mut s, Some(&mut tier));
        assert!(matches!(
            recv(&peer),
            Message::TierReply {
                id: 8,
                reply: TierReply::Done(1)
            }
        ));
        let st = serde_json::to_value(s.status(serde_json::Value::Null, None)).unwrap();
        let t = &st["tenants"][0];
        assert_eq!(
            (&t["stored"], &t["hits"], &t["hits_from_others"]),
            (
                &serde_json::json!(1),
                &serde_json::json!(0),
                &serde_json::json!(0)
            ),
            "{st}"
        );
    }

    #[test]
    fn a_waiting_attach_that_hangs_up_is_dropped_and_a_refusal_closes_its_connection() {
        let mut io = Sockets::new(pair().0);
        let mut s = serving("zero");
        let now = Instant::now();
        let mut peers = Vec::new();
        for pid in [20, 21] {
            let (fd, peer) = pair();
            let conn = io.id();
            io.conns.insert(conn, fd);
            s.waits(Waiting {
                conn,
                uid: 0,
                pid,
                hello: hello("", 1, 0, None),
                until: now + Duration::from_secs(1),
            });
            peers.push(peer);
        }
        drop(peers.remove(0));
        io.expire_waiting(&mut s, now);
        assert_eq!((io.conns.len(), s.waiting_conns().len()), (1, 1));
        io.expire_waiting(&mut s, now + Duration::from_secs(1));
        assert!(io.conns.is_empty() && s.waiting_conns().is_empty());
        let Message::Refused { message, .. } = recv(&peers[0]) else {
            panic!("the late attach is refused");
        };
        assert!(message.contains("was still being cleared"), "{message}");
        let deadline = Instant::now() + Duration::from_secs(5);
        assert!(matches!(
            wire::recv::<Message>(&peers[0], deadline, &mut Vec::new(), None),
            Ok(Received::Gone)
        ));
    }
}
