//! A tenant's link to its keeper's CPU tier ([`TierLink`]): what an engine
//! asks on its lease's connection, bounded so that an engine never waits
//! on its keeper longer than it chose, and never fails because of it.
//!
//! Two kinds of request:
//!
//! - **asks** ([`TierLink::ask`]: a store's slots, a hold, a load, an open)
//!   wait for the keeper's answer up to the bound the caller gives. An
//!   answer that comes later is not lost: what it granted (slots to write,
//!   holds) is given back to the keeper at once, quietly, so nothing stays
//!   granted to a tenant that never heard of it;
//! - **tells** ([`TierLink::tell`]: a completion, an abort, a release, a
//!   touch) are sent `quiet` and never waited for. While the keeper's socket
//!   is full (a keeper stopped or stuck) they wait here, in order, and go
//!   before anything else once it reads again.
//!
//! The link is [`LinkState::Up`], [`LinkState::Away`] (the keeper did not
//! answer within the bound, or its socket is full: asks fail at once, and
//! one is tried again every [`PROBE_EVERY`]; an answer that comes brings it
//! back) or [`LinkState::Lost`] (the keeper ended: its connection hung up,
//! or it said it stops). A lost link stays lost: the engine leases again.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use crate::message::{Message, TierOp, TierPut, TierReply};
use crate::wire::{self, Received};

/// While the keeper is away, how often an ask is sent to see whether it is
/// back (every other ask fails at once, costing nothing).
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The most tells kept while the keeper does not read (each is a few
/// slots); past it the link is lost rather than grow without bound.
pub const MOST_QUEUED: usize = 1 << 16;

/// How the link to the keeper's tier is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// The keeper answers.
    Up,
    /// The keeper did not answer in time, or does not read: since when.
    Away {
        /// When it was first seen away.
        since: Instant,
        /// Why: the bound it did not answer within, or its full socket.
        why: String,
    },
    /// The keeper is gone (its connection hung up, or it said it stops):
    /// why.
    Lost(String),
}

/// Why a request could not be answered now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unanswered {
    /// The link is lost (not merely away).
    pub lost: bool,
    /// Why, in words: the keeper's own message when it gave one.
    pub message: String,
}

/// What an answer that came too late grants, to be given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Late {
    /// A store: abort the slots it granted.
    Store,
    /// A hold or a load: release what it held.
    Hold,
    /// Nothing to give back.
    Nothing,
}

/// A tenant's link to its keeper's tier over its lease's connection (a
/// duplicate of it, so that the link may be used without the pool's lock;
/// dropped when the pool closes, or the keeper would see the tenant live on).
#[derive(Debug)]
pub struct TierLink {
    conn: OwnedFd,
    next: u64,
    state: LinkState,
    /// When an ask last went out while away.
    probed: Option<Instant>,
    /// Asks whose answer did not come in time.
    late: HashMap<u64, Late>,
    /// Tells the keeper's socket had no room for, in order.
    queued: VecDeque<TierOp>,
}

impl TierLink {
    /// A link over `conn`, a duplicate of a lease's connection
    /// ([`pool_core::Pool::keeper_conn`]).
    pub fn new(conn: OwnedFd) -> TierLink {
        TierLink {
            conn,
            next: 1,
            state: LinkState::Up,
            probed: None,
            late: HashMap::new(),
            queued: VecDeque::new(),
        }
    }

    /// How the link is now.
    pub fn state(&self) -> &LinkState {
        &self.state
    }

    /// Ask the tier `op` and wait up to `wait` for its answer (a refusal is
    /// an answer). Fails at once while the link is lost, or away and not
    /// due a probe.
    ///
    /// # Errors
    /// [`Unanswered`]: lost, or away (no answer within `wait`, or the
    /// keeper's socket is full).
    pub fn ask(&mut self, op: TierOp, wait: Duration) -> Result<TierReply, Unanswered> {
        self.take_answers();
        self.unless_down()?;
        self.flush();
        self.unless_down()?;
        let id = self.next;
        self.next += 1;
        let late = match &op {
            TierOp::Store { .. } => Late::Store,
            TierOp::Hold { .. } | TierOp::Load { .. } => Late::Hold,
            _ => Late::Nothing,
        };
        let msg = Message::Tier {
            id,
            op,
            quiet: false,
        };
        if let Err(e) = wire::send_now(&self.conn, &msg) {
            self.failed_send(&e);
            return Err(self.unanswered());
        }
        let deadline = Instant::now() + wait;
        loop {
            match wire::recv::<Message>(&self.conn, deadline, &mut Vec::new(), None) {
                Ok(Received::Msg(Message::TierReply { id: got, reply })) if got == id => {
                    self.state = LinkState::Up;
                    self.probed = None;
                    return Ok(reply);
                }
                Ok(Received::Msg(m)) => self.other(m),
                Ok(Received::Gone) => self.lose("its connection hung up (the keeper ended)".into()),
                Ok(Received::TimedOut) => {
                    self.late.insert(id, late);
                    self.away(format!(
                        "it did not answer within {:.1} ms",
                        wait.as_secs_f64() * 1e3
                    ));
                }
                Err(e) => self.lose(format!("its connection failed: {e}")),
            }
            if self.state != LinkState::Up {
                return Err(self.unanswered());
            }
        }
    }

    /// Tell the tier `op` without waiting for an answer (none comes): sent
    /// now, or once the keeper reads again.
    ///
    /// # Errors
    /// [`Unanswered`] when the link is lost (then `op` is dropped: the
    /// keeper that ended dropped what the tenant held in it).
    pub fn tell(&mut self, op: TierOp) -> Result<(), Unanswered> {
        if let LinkState::Lost(_) = self.state {
            return Err(self.unanswered());
        }
        if self.queued.len() >= MOST_QUEUED {
            self.lose(format!(
                "it has not read {MOST_QUEUED} requests: it is stopped or stuck"
            ));
            return Err(self.unanswered());
        }
        self.queued.push_back(op);
        self.take_answers();
        self.flush();
        match self.state {
            LinkState::Lost(_) => Err(self.unanswered()),
            _ => Ok(()),
        }
    }

    /// Read what the keeper sent since without waiting: late answers (what
    /// they granted given back, and the keeper is back), or its hang-up.
    pub fn take_answers(&mut self) {
        if let LinkState::Lost(_) = self.state {
            return;
        }
        while wire::ready(&self.conn) {
            match wire::recv::<Message>(&self.conn, Instant::now(), &mut Vec::new(), None) {
                Ok(Received::Msg(m)) => self.other(m),
                Ok(Received::Gone) => {
                    self.lose("its connection hung up (the keeper ended)".into());
                    return;
                }
                Ok(Received::TimedOut) => return,
                Err(e) => {
                    self.lose(format!("its connection failed: {e}"));
                    return;
                }
            }
        }
    }

    /// Send the queued tells, in order, while the keeper's socket takes
    /// them.
    fn flush(&mut self) {
        while let Some(op) = self.queued.front() {
            if let LinkState::Lost(_) = self.state {
                return;
            }
            let id = self.next;
            let msg = Message::Tier {
                id,
                op: op.clone(),
                quiet: true,
            };
            match wire::send_now(&self.conn, &msg) {
                Ok(()) => {
                    self.next += 1;
                    self.queued.pop_front();
                }
                Err(e) => {
                    self.failed_send(&e);
                    return;
                }
            }
        }
    }

    /// A message that is not the answer waited for: a late answer (given
    /// back), the keeper's farewell, or anything else (dropped).
    fn other(&mut self, m: Message) {
        match m {
            Message::TierReply { id, reply } => {
                // The keeper answers: it is back.
                if matches!(self.state, LinkState::Away { .. }) {
                    self.state = LinkState::Up;
                    self.probed = None;
                }
                let Some(late) = self.late.remove(&id) else {
                    return; // a quiet request answered by an older keeper
                };
                let give_back = match (late, reply) {
                    (Late::Store, TierReply::Puts(puts)) => Some(TierOp::Abort {
                        slots: puts
                            .iter()
                            .filter_map(|p| match p {
                                TierPut::Granted { slot, .. } => Some(*slot),
                                _ => None,
                            })
                            .collect(),
                    }),
                    (Late::Hold, TierReply::Held(held)) => Some(TierOp::Release {
                        slots: held.iter().map(|(_, s)| *s).collect(),
                    }),
                    (Late::Hold, TierReply::Loads(slots)) => Some(TierOp::Release {
                        slots: slots.into_iter().flatten().collect(),
                    }),
                    _ => None,
                };
                if let Some(op) = give_back {
                    self.queued.push_back(op);
                }
            }
            Message::Failed { message, .. } => self.lose(message),
            _ => {}
        }
    }

    fn failed_send(&mut self, e: &std::io::Error) {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            self.away("its socket is full: it does not read".into());
        } else {
            self.lose(format!("it could not be asked: {e}"));
        }
    }

    fn away(&mut self, why: String) {
        if self.state == LinkState::Up {
            self.state = LinkState::Away {
                since: Instant::now(),
                why,
            };
        }
        self.probed = Some(Instant::now());
    }

    fn lose(&mut self, why: String) {
        if !matches!(self.state, LinkState::Lost(_)) {
            self.state = LinkState::Lost(why);
            self.queued.clear();
            self.late.clear();
        }
    }

    /// An error while lost, or while away with no probe due.
    fn unless_down(&self) -> Result<(), Unanswered> {
        match &self.state {
            LinkState::Up => Ok(()),
            LinkState::Away { .. } if self.probed.is_none_or(|p| p.elapsed() >= PROBE_EVERY) => {
                Ok(())
            }
            _ => Err(self.unanswered()),
        }
    }

    fn unanswered(&self) -> Unanswered {
        match &self.state {
            LinkState::Lost(why) => Unanswered {
                lost: true,
                message: format!("the keeper's tier is lost: {why}"),
            },
            LinkState::Away { since, why } => Unanswered {
                lost: false,
                message: format!(
                    "the keeper's tier is away for {:.1} s: {why}",
                    since.elapsed().as_secs_f64()
                ),
            },
            LinkState::Up => Unanswered {
                lost: false,
                message: "the keeper's tier did not answer".into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    /// What the keeper's end reads next.
    fn read(keeper: &OwnedFd) -> Message {
        let deadline = Instant::now() + Duration::from_secs(5);
        match wire::recv::<Message>(keeper, deadline, &mut Vec::new(), None).unwrap() {
            Received::Msg(m) => m,
            other => panic!("{other:?}"),
        }
    }

    const WAIT: Duration = Duration::from_millis(5);

    #[test]
    fn an_answer_in_time_is_returned_and_a_tell_is_sent_quiet() {
        let (mine, keeper) = pair();
        let mut link = TierLink::new(mine);
        let answering = std::thread::spawn(move || {
            let Message::Tier { id, quiet, .. } = read(&keeper) else {
                panic!()
            };
            assert!(!quiet);
            let reply = TierReply::Done(3);
            wire::send(&keeper, &Message::TierReply { id, reply }, &[]).unwrap();
            keeper
        });
        let reply = link.ask(TierOp::Touch { keys: vec![] }, Duration::from_secs(5));
        assert_eq!(reply, Ok(TierReply::Done(3)));
        let keeper = answering.join().unwrap();
        link.tell(TierOp::Stored { slots: vec![4] }).unwrap();
        assert!(matches!(read(&keeper),
            Message::Tier { quiet: true, op: TierOp::Stored { slots }, .. } if slots == [4]));
        assert_eq!(link.state(), &LinkState::Up);
    }

    /// A keeper that does not answer in time: the ask fails within its
    /// bound, the next fails at once; its late grant is aborted, quietly,
    /// when it comes, and the keeper is back.
    #[test]
    fn a_late_answer_gives_back_what_it_granted() {
        let (mine, keeper) = pair();
        let mut link = TierLink::new(mine);
        let t = Instant::now();
        let err = link
            .ask(
                TierOp::Store {
                    keys: vec![b"k".to_vec()],
                },
                WAIT,
            )
            .unwrap_err();
        assert!(t.elapsed() >= WAIT && !err.lost, "{err:?}");
        assert!(
            err.message.contains("did not answer within 5.0 ms"),
            "{err:?}"
        );
        let Message::Tier { id, .. } = read(&keeper) else {
            panic!()
        };
        // Away, not due a probe: nothing sent, no wait.
        let t = Instant::now();
        assert!(
            link.ask(TierOp::Touch { keys: vec![] }, Duration::from_secs(5))
                .is_err()
        );
        assert!(t.elapsed() < Duration::from_secs(1));
        assert!(!wire::ready(&keeper), "nothing was sent while away");
        // A tell waits here, and goes first once the keeper reads.
        link.tell(TierOp::Loaded { slots: vec![9] }).unwrap();
        let granted = TierPut::Granted {
            slot: 7,
            evicted: None,
        };
        let reply = TierReply::Puts(vec![granted, TierPut::NoRoom]);
        wire::send(&keeper, &Message::TierReply { id, reply }, &[]).unwrap();
        link.take_answers();
        assert_eq!(link.state(), &LinkState::Up);
        link.tell(TierOp::Touch { keys: vec![] }).unwrap();
        let ops: Vec<TierOp> = (0..3)
            .map(|_| match read(&keeper) {
                Message::Tier {
                    op, quiet: true, ..
                } => op,
                other => panic!("{other:?}"),
            })
            .collect();
        // What was sent while away goes in the order it was told, then the
        // store's grant given back.
        assert!(ops.contains(&TierOp::Abort { slots: vec![7] }), "{ops:?}");
        assert_eq!(ops[0], TierOp::Loaded { slots: vec![9] });
    }

    #[test]
    fn a_keeper_that_ends_loses_the_link_at_once() {
        let (mine, keeper) = pair();
        let mut link = TierLink::new(mine);
        drop(keeper);
        let t = Instant::now();
        let err = link
            .ask(
                TierOp::Hold {
                    key: b"k".to_vec(),
                    ahead: 3,
                },
                Duration::from_secs(5),
            )
            .unwrap_err();
        assert!(err.lost && t.elapsed() < Duration::from_secs(1), "{err:?}");
        assert!(link.tell(TierOp::Release { slots: vec![1] }).is_err());
        assert!(matches!(link.state(), LinkState::Lost(_)));
    }

    #[test]
    fn a_keeper_that_says_it_stops_loses_the_link() {
        let (mine, keeper) = pair();
        let mut link = TierLink::new(mine);
        let failed = Message::Failed {
            message: "the keeper of `kv` stopped".into(),
            ranks: Vec::new(),
            pid: None,
        };
        wire::send(&keeper, &failed, &[]).unwrap();
        link.take_answers();
        assert_eq!(
            link.state(),
            &LinkState::Lost("the keeper of `kv` stopped".into())
        );
    }

    /// A keeper that never reads: its socket fills, tells wait here, and
    /// asks fail at once rather than block.
    #[test]
    fn a_keeper_that_does_not_read_never_blocks_the_tenant() {
        let (mine, _keeper) = pair();
        let mut link = TierLink::new(mine);
        let t = Instant::now();
        for i in 0..10_000 {
            link.tell(TierOp::Stored { slots: vec![i] }).unwrap();
        }
        assert!(matches!(link.state(), LinkState::Away { .. }));
        assert!(!link.queued.is_empty());
        assert!(link.ask(TierOp::Touch { keys: vec![] }, WAIT).is_err());
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
