//! The life of each tenant's lease once granted: what its ranks and
//! companions say or do (arrived, released, gone), its barrier settled on
//! that and on the clock, its end (the pool taken back from it alone, the
//! previous lease and the tag recorded) and the clearing that follows the
//! last tenant's end. Every transition names its tenant and touches no
//! other.

use std::time::{Instant, SystemTime};

use hostpool_handoff::Message;
use hostpool_handoff::barrier::{Event, Failure, Mark, Verdict};
use hostpool_handoff::lease::{LeaseEnd, PreviousLease};
use pool_core::Result;

use super::super::super::Content;
use super::{ConnId, FailedLease, Rank, RankEvent, Serving, State, Tell, TenantId};

/// Connections by place: `None` for one that ended.
type Conns = Vec<Option<ConnId>>;

impl Serving {
    /// The connections of tenant `tenant`'s ranks and of its companions, by
    /// their place (`None`: that one's connection ended); `None` without
    /// that tenant.
    pub(in crate::server) fn lease_conns(&self, tenant: TenantId) -> Option<(Conns, Conns)> {
        let l = self.tenant(tenant)?;
        let conns = |ranks: &[Rank]| ranks.iter().map(|r| r.conn).collect();
        Some((conns(&l.ranks), conns(&l.companions)))
    }

    /// Whether tenant `tenant`'s lease is in force and live (every rank
    /// attached and arrived).
    #[cfg(test)]
    pub(in crate::server) fn lease_live(&self, tenant: TenantId) -> bool {
        self.tenant(tenant).is_some_and(|l| l.live)
    }

    /// What tenant `tenant`'s ranks and companions said or did since (by
    /// their place), at `now`: recorded, and a lease that is not live yet
    /// settled on it and on the clock. What its ranks are to be told: `Go`
    /// once all arrived, or why it failed. No other tenant is touched.
    pub(in crate::server) fn on_lease_events(
        &mut self,
        tenant: TenantId,
        ranks: Vec<(usize, RankEvent)>,
        companions: Vec<(usize, RankEvent)>,
        now: Instant,
    ) -> Option<Tell> {
        for (i, event) in companions {
            self.on_companion(tenant, i, event);
        }
        let mut failure = None;
        for (i, event) in ranks {
            let failed = self.on_rank(tenant, i, event);
            failure = failure.or(failed);
        }
        let verdict = self.settle(tenant, failure, now)?;
        let lease = self.tenant(tenant)?;
        Some(Tell {
            to: lease.ranks.iter().filter_map(|r| r.conn).collect(),
            message: match verdict {
                Verdict::Go => Message::Go,
                Verdict::Failed(f) => Message::from(f),
            },
        })
    }

    /// What companion `index` of tenant `tenant` said or did: released, or
    /// gone (without a release, it died, and the lease ends as `died`). It
    /// is in no barrier, so it fails nothing.
    fn on_companion(&mut self, tenant: TenantId, index: usize, event: RankEvent) {
        let Some(lease) = self.tenant_mut(tenant) else {
            return;
        };
        let Some(c) = lease.companions.get_mut(index) else {
            return;
        };
        match event {
            RankEvent::Arrived(_) => {}
            RankEvent::Released => c.released = true,
            RankEvent::Gone => {
                c.conn = None;
                if !c.released {
                    lease.died.get_or_insert(c.pid);
                }
            }
        }
    }

    /// What rank `index` of tenant `tenant` said or did: arrived (with its
    /// error, if its setup failed), released, or gone (its connection
    /// ended: without a release, it died). The failure it causes a lease
    /// that is not live yet, naming it.
    pub(super) fn on_rank(
        &mut self,
        tenant: TenantId,
        index: usize,
        event: RankEvent,
    ) -> Option<Failure> {
        let lease = self.tenant_mut(tenant)?;
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
                r.conn = None;
                if r.released {
                    return None;
                }
                lease.died.get_or_insert(r.pid);
                Event::Gone
            }
        };
        settling.then(|| lease.barrier.on(&mark, &event)).flatten()
    }

    /// Settle tenant `tenant`'s lease, if not live yet, at `now`: it fails
    /// with `failure`, or when a rank never attached by the attach
    /// deadline, or one that attached did not arrive by the barrier
    /// deadline; it goes live once every rank attached and arrived. A
    /// failed lease of an engine of several ranks is remembered until its
    /// attach deadline, so that a late rank is told why.
    fn settle(
        &mut self,
        tenant: TenantId,
        failure: Option<Failure>,
        now: Instant,
    ) -> Option<Verdict> {
        let i = self.place(tenant)?;
        let lease = &mut self.tenants[i];
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

    /// Take the pool back from tenant `tenant`, whose processes are all
    /// gone ([`Serving::ended`]): how it ended becomes the previous lease,
    /// its tag goes to the next; the other tenants go on. `true` when the
    /// pool is to be cleared now (it was the last tenant, `content =
    /// "zero"` and not stopping), and the state says so from `now`.
    pub(in crate::server) fn end_lease(&mut self, tenant: TenantId, now: Instant) -> bool {
        let Some(i) = self.place(tenant) else {
            return false;
        };
        let lease = self.tenants.remove(i);
        let how = if lease.died.is_some() {
            LeaseEnd::Died
        } else {
            LeaseEnd::Closed
        };
        let pid = lease.died.or(lease.holder()).unwrap_or(0);
        match how {
            LeaseEnd::Died => self.totals.died += 1,
            LeaseEnd::Closed => self.totals.closed += 1,
        }
        tracing::info!(
            "kept pool `{}`: lease {} of pid {pid} ended ({}){}",
            self.config.name,
            lease.info.generation,
            if how == LeaseEnd::Died {
                "died"
            } else {
                "closed"
            },
            match self.tenants.len() {
                0 => String::new(),
                n => format!("; {n} tenant(s) go on"),
            }
        );
        self.previous = Some(PreviousLease {
            pid,
            how,
            ended_at: pool_core::rfc3339(SystemTime::now()),
        });
        self.tag = lease.tag;
        let clear =
            self.tenants.is_empty() && self.config.content == Content::Zero && !self.stopping;
        if clear {
            self.state = State::Zeroing { since: now };
        }
        clear
    }

    /// The clearing ended: its seconds, or why it failed (`None`: the
    /// clearing thread panicked), which breaks the pool.
    pub(in crate::server) fn cleared(&mut self, done: Option<std::thread::Result<Result<f64>>>) {
        match done {
            Some(Ok(Ok(secs))) => {
                self.last_clear_seconds = Some(secs);
                self.totals.clears += 1;
                self.totals.clear_seconds += secs;
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
}

/// A lease's ranks arriving, failing, dying, releasing, and the lease's
/// end, by the keeper's transitions.
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Answer;
    use super::super::testing::*;
    use super::*;

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
        assert_eq!(s.on_rank(T1, 0, RankEvent::Arrived(None)), None);
        assert_eq!(s.settle(T1, None, now), None, "rank 1 has not arrived");
        assert_eq!(s.on_rank(T1, 1, RankEvent::Arrived(None)), None);
        assert_eq!(s.settle(T1, None, now), Some(Verdict::Go));
        assert!(s.lease_live(T1));
        assert_eq!(s.settle(T1, None, now), None, "told once");
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
            let told = s
                .on_lease_events(T1, vec![(1, event)], Vec::new(), now)
                .expect("the ranks are told the lease failed");
            let Message::Failed {
                message,
                ranks,
                pid,
            } = told.message
            else {
                panic!("the lease fails: {:?}", told.message);
            };
            assert_eq!((ranks, pid), (vec![1], Some(301)));
            let what = if died {
                "died before the barrier completed"
            } else {
                "failed: mmap failed"
            };
            assert!(
                message.contains(&format!("rank 1 (pid 301) {what}")),
                "{message}"
            );
            let to = if died {
                vec![ConnId(300)]
            } else {
                vec![ConnId(300), ConnId(301)]
            };
            assert_eq!(told.to, to, "the ranks still attached are told");
            assert_eq!(s.tenant(T1).unwrap().died, died.then_some(301));
            // A late rank of that engine is told why, not handed a lease.
            s.tenant_mut(T1).unwrap().ranks.clear();
            let _ = s.end_lease(T1, now);
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
        assert_eq!(s.settle(T1, None, now), None);
        let later = now + Duration::from_secs(6);
        let Some(Verdict::Failed(Failure {
            message,
            ranks,
            pid,
        })) = s.settle(T1, None, later)
        else {
            panic!("the attach deadline fails the lease");
        };
        assert_eq!((ranks, pid), (vec![1], None));
        assert!(message.contains("rank(s) 1 never attached"), "{message}");

        let mut s = serving("zero");
        granted(&mut s, &hello("eng", 2, 0, None), 500, now);
        granted(&mut s, &hello("eng", 2, 1, None), 501, now);
        s.on_rank(T1, 0, RankEvent::Arrived(None));
        let much_later = now + Duration::from_secs(11);
        let Some(Verdict::Failed(Failure {
            message,
            ranks,
            pid,
        })) = s.settle(T1, None, much_later)
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
            let mut h = hello("", 1, 0, None);
            if let Message::Hello { tag, .. } = &mut h {
                *tag = Some("index-v1".into());
            }
            granted(&mut s, &h, 600, now);
            assert!(
                s.lease_live(T1),
                "a world of 1 is live once its lease is sent"
            );
            if released {
                s.on_rank(T1, 0, RankEvent::Released);
            }
            assert!(s.ended().is_empty());
            assert_eq!(
                s.on_rank(T1, 0, RankEvent::Gone),
                None,
                "a live lease does not fail"
            );
            assert_eq!(s.ended(), vec![T1]);
            let clears = s.end_lease(T1, now);
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
            // The next lease is told how the previous one ended, and its tag.
            if content == "keep" {
                let Answer::Grant(_, info) = s.answer(&hello("", 1, 0, None), || None, now) else {
                    panic!("the next lease is granted");
                };
                assert_eq!(info.generation, 2);
                assert_eq!(info.tag.as_deref(), Some("index-v1"));
                assert_eq!(
                    info.previous.map(|p| (p.pid, p.how)),
                    Some((600, LeaseEnd::Died))
                );
            }
        }
    }
}
