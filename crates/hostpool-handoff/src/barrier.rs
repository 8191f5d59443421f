//! The one barrier of a pool's ranks held by one process for all of them:
//! a shared pool's creator over the socket rendezvous, and a keeper for the
//! ranks of a lease (a creator that outlives its ranks). Sans-I/O: the
//! holder reads its sockets and turns what each rank said or did into an
//! [`Event`], keeps a [`Mark`] per rank, and asks [`Barrier::settle`]
//! what to tell them; the decisions (who failed, who died, who never came,
//! who is late, and when everyone may go) are made here, once, and are
//! unit-tested without a socket. The joiner's side is
//! `join::arrive`.
//!
//! The file rendezvous has no holder: each rank reads the others' slots in
//! the control file and judges for itself, with the same wording.

use std::time::Instant;

/// A deadline, and the timeout it came from (for messages).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deadline {
    pub at: Instant,
    pub secs: f64,
}

/// One rank, as the barrier's holder knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub rank: u32,
    pub pid: u32,
    /// It said it arrived (mapped the pool, or failed to).
    pub arrived: bool,
    /// Its connection is still there.
    pub present: bool,
}

/// What a rank said or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// It arrived: its setup succeeded, or failed with why.
    Arrived(Option<String>),
    /// Its connection ended.
    Gone,
}

/// Why the barrier failed, and whom it blames: the ranks, and the pid of
/// the first (the fields of a [`pool_core::Error::Peer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    pub ranks: Vec<u32>,
    pub pid: Option<u32>,
}

impl From<Failure> for pool_core::Error {
    /// The peer error this rank fails with.
    fn from(f: Failure) -> pool_core::Error {
        peer(f.message, f.ranks, f.pid)
    }
}

impl From<Failure> for crate::Message {
    /// What the holder tells its ranks.
    fn from(f: Failure) -> crate::Message {
        crate::Message::Failed {
            message: f.message,
            ranks: f.ranks,
            pid: f.pid,
        }
    }
}

/// What the ranks are told once the barrier settles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every rank is here and arrived: go.
    Go,
    /// The pool (or the lease) failed.
    Failed(Failure),
}

/// The barrier of `world` ranks of one pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Barrier {
    /// The pool, as messages name it (``shared pool `x` ``, ``kept pool `x` ``).
    pub pool: String,
    pub world: u32,
    /// By when every rank must have attached.
    pub attach: Deadline,
    /// By when every rank that attached must have arrived.
    pub barrier: Deadline,
}

impl Barrier {
    /// The barrier of a shared pool's ranks: its world and timeouts, with
    /// the deadlines they give.
    pub fn shared(
        sharing: &pool_core::SharingConfig,
        attach_at: Instant,
        barrier_at: Instant,
    ) -> Barrier {
        Barrier {
            pool: format!("shared pool `{}`", sharing.name),
            world: sharing.world,
            attach: Deadline {
                at: attach_at,
                secs: sharing.attach_timeout_secs,
            },
            barrier: Deadline {
                at: barrier_at,
                secs: sharing.barrier_timeout_secs,
            },
        }
    }

    /// The failure `event` of the rank `mark` causes (none for an arrival
    /// without error).
    pub fn on(&self, mark: &Mark, event: &Event) -> Option<Failure> {
        let what = match event {
            Event::Arrived(None) => return None,
            Event::Arrived(Some(e)) => format!("failed: {e}"),
            Event::Gone => "died before the barrier completed".to_string(),
        };
        Some(Failure {
            message: format!(
                "{}: rank {} (pid {}) {what}",
                self.pool, mark.rank, mark.pid
            ),
            ranks: vec![mark.rank],
            pid: known(mark.pid),
        })
    }

    /// Settle at `now`, given every rank that attached so far: go once
    /// every rank of the world attached, arrived and is still there; fail
    /// at the attach deadline naming every rank that never attached, or at
    /// the barrier deadline every rank that attached but did not arrive
    /// (with `why_late` of its pid: what the process is doing); otherwise
    /// wait.
    pub fn settle(
        &self,
        marks: &[Mark],
        now: Instant,
        why_late: impl Fn(u32) -> String,
    ) -> Option<Verdict> {
        let all_here = (0..self.world).all(|k| marks.iter().any(|m| m.rank == k));
        if all_here && marks.iter().all(|m| m.arrived && m.present) {
            return Some(Verdict::Go);
        }
        if !all_here && now >= self.attach.at {
            let missing: Vec<u32> = (0..self.world)
                .filter(|k| !marks.iter().any(|m| m.rank == *k))
                .collect();
            let list: Vec<String> = missing.iter().map(u32::to_string).collect();
            return Some(Verdict::Failed(Failure {
                message: format!(
                    "{}: rank(s) {} never attached within {:.0} s; start all {} ranks, or raise \
                     --attach-timeout",
                    self.pool,
                    list.join(", "),
                    self.attach.secs,
                    self.world
                ),
                ranks: missing,
                pid: None,
            }));
        }
        if now < self.barrier.at {
            return None;
        }
        let late: Vec<&Mark> = marks.iter().filter(|m| !m.arrived).collect();
        if late.is_empty() {
            return None;
        }
        let named: Vec<String> = late
            .iter()
            .map(|m| format!("rank {} (pid {}: {})", m.rank, m.pid, why_late(m.pid)))
            .collect();
        Some(Verdict::Failed(Failure {
            message: format!(
                "{}: {} attached but did not reach the barrier within {:.0} s; check the \
                 process, or raise --barrier-timeout for very large pools (a rank prefaulting a \
                 very large shard)",
                self.pool,
                named.join(", "),
                self.barrier.secs
            ),
            ranks: late.iter().map(|m| m.rank).collect(),
            pid: late.first().and_then(|m| known(m.pid)),
        }))
    }
}

/// A pid as `SO_PEERCRED` and the control file give it: 0 means unknown.
pub(crate) fn known(pid: u32) -> Option<u32> {
    (pid != 0).then_some(pid)
}

/// A [`pool_core::Error::Peer`]: `message` blames `ranks` (in the order it
/// names them), the first of them, or the one peer it names only by pid,
/// being process `pid`.
pub(crate) fn peer(message: String, ranks: Vec<u32>, pid: Option<u32>) -> pool_core::Error {
    pool_core::Error::Peer {
        message,
        ranks,
        pid,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn barrier(world: u32, now: Instant) -> Barrier {
        Barrier {
            pool: "shared pool `unit`".into(),
            world,
            attach: Deadline {
                at: now + Duration::from_secs(5),
                secs: 5.0,
            },
            barrier: Deadline {
                at: now + Duration::from_secs(10),
                secs: 10.0,
            },
        }
    }

    fn mark(rank: u32, arrived: bool) -> Mark {
        Mark {
            rank,
            pid: 100 + rank,
            arrived,
            present: true,
        }
    }

    fn late(_: u32) -> String {
        "sleeping".into()
    }

    #[test]
    fn every_rank_here_and_arrived_goes_and_nothing_less_does() {
        let now = Instant::now();
        let b = barrier(3, now);
        let all = [mark(0, true), mark(1, true), mark(2, true)];
        assert_eq!(b.settle(&all, now, late), Some(Verdict::Go));
        assert_eq!(b.settle(&all[..2], now, late), None, "rank 2 is not here");
        let mut one_gone = all;
        one_gone[1].present = false;
        assert_eq!(b.settle(&one_gone, now, late), None, "rank 1 is gone");
        let waiting = [mark(0, true), mark(1, false), mark(2, true)];
        assert_eq!(b.settle(&waiting, now, late), None);
    }

    #[test]
    fn a_rank_that_fails_or_dies_is_named_with_its_pid() {
        let b = barrier(2, Instant::now());
        assert_eq!(b.on(&mark(1, false), &Event::Arrived(None)), None);
        let f = b
            .on(&mark(1, false), &Event::Arrived(Some("mmap failed".into())))
            .unwrap();
        assert_eq!((f.ranks, f.pid), (vec![1], Some(101)));
        assert!(
            f.message
                .contains("shared pool `unit`: rank 1 (pid 101) failed: mmap failed"),
            "{}",
            f.message
        );
        let f = b.on(&mark(0, true), &Event::Gone).unwrap();
        assert!(
            f.message
                .contains("rank 0 (pid 100) died before the barrier"),
            "{}",
            f.message
        );
    }

    #[test]
    fn the_deadlines_name_who_never_came_and_who_is_late() {
        let now = Instant::now();
        let b = barrier(4, now);
        let marks = [mark(0, true), mark(2, false)];
        assert_eq!(b.settle(&marks, now + Duration::from_secs(4), late), None);
        let Some(Verdict::Failed(Failure {
            message,
            ranks,
            pid,
        })) = b.settle(&marks, now + Duration::from_secs(5), late)
        else {
            panic!("the attach deadline fails the barrier");
        };
        assert_eq!((ranks, pid), (vec![1, 3], None));
        assert!(
            message.contains("rank(s) 1, 3 never attached within 5 s"),
            "{message}"
        );

        let b = barrier(2, now);
        let marks = [mark(0, true), mark(1, false)];
        assert_eq!(b.settle(&marks, now + Duration::from_secs(9), late), None);
        let Some(Verdict::Failed(Failure {
            message,
            ranks,
            pid,
        })) = b.settle(&marks, now + Duration::from_secs(10), late)
        else {
            panic!("the barrier deadline fails the barrier");
        };
        assert_eq!((ranks, pid), (vec![1], Some(101)));
        assert!(
            message.contains(
                "rank 1 (pid 101: sleeping) attached but did not reach the barrier within 10 s"
            ),
            "{message}"
        );
    }
}
