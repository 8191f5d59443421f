//! A kept pool's tenants: the engines that hold a lease of it at once, up
//! to its `tenants` (one by default: one lease at a time). Each is one
//! engine's lease as a keeper of one lease holds it (its ranks, their
//! barrier, its companions, its generation, `since` and tag), named by a
//! [`TenantId`]: found, joined by a rank or companion, listed, ended, and
//! shown in the status. Each tenant maps the whole pool.

use hostpool_handoff::Message;
use hostpool_handoff::lease::{CompanionStatus, LeaseStatus, RankStatus, TenantStatus};

use super::{ConnId, Lease, Rank, Serving};

/// A tenant of a keeper: the generation of its lease, which no other lease
/// of this keeper has (the generation counter counts every lease granted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(in crate::server) struct TenantId(pub(in crate::server) u64);

/// What one tenant did in the kept pool's CPU tier (counted by the tier,
/// `super::super::tier`, and shown in the status's `tenants`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::server) struct TierFigures {
    /// Blocks it stored (stores it completed).
    pub(in crate::server) stored: u64,
    /// Blocks it read: holds it released as read (`Loaded`; a hold taken
    /// ahead and released unread is not counted).
    pub(in crate::server) hits: u64,
    /// Of those, blocks it did not store itself: another tenant's (or an
    /// earlier lease's, found in the index).
    pub(in crate::server) hits_from_others: u64,
}

/// The attached ones of `ranks` (a rank or companion whose connection
/// ended is not listed).
fn attached(ranks: &[Rank]) -> impl Iterator<Item = &Rank> {
    ranks.iter().filter(|r| r.conn.is_some())
}

impl Lease {
    /// The tenant this lease is.
    pub(super) fn id(&self) -> TenantId {
        TenantId(self.info.generation)
    }

    /// The pid that names the lease: its first rank's.
    pub(super) fn holder(&self) -> Option<u32> {
        self.ranks.first().map(|r| r.pid)
    }

    /// Every process of it gone (ranks and companions, released or dead).
    fn over(&self) -> bool {
        !self.ranks.is_empty()
            && self
                .ranks
                .iter()
                .chain(&self.companions)
                .all(|r| r.conn.is_none())
    }

    /// How a refusal names it: `engine `a` (pid 100, since T)`.
    pub(super) fn named(&self) -> String {
        let what = if self.engine.is_empty() {
            "an engine without an id".to_string()
        } else {
            format!("engine `{}`", self.engine)
        };
        format!(
            "{what} (pid {}, since {})",
            self.holder().unwrap_or(0),
            pool_core::rfc3339(self.since)
        )
    }

    /// Its ranks attached now, as the status lists them.
    fn rank_status(&self) -> Vec<RankStatus> {
        attached(&self.ranks)
            .map(|r| RankStatus {
                rank: r.rank,
                pid: r.pid,
                uid: r.uid,
            })
            .collect()
    }

    /// Its companions attached now, as the status lists them.
    fn companion_status(&self) -> Vec<CompanionStatus> {
        attached(&self.companions)
            .map(|r| CompanionStatus {
                pid: r.pid,
                uid: r.uid,
            })
            .collect()
    }

    /// The status's `lease` object (the first tenant's, as before tenants).
    pub(super) fn status(&self) -> LeaseStatus {
        LeaseStatus {
            pid: self.ranks.first().map(|r| r.pid),
            uid: self.ranks.first().map(|r| r.uid),
            since: pool_core::rfc3339(self.since),
            engine: self.engine.clone(),
            world: self.world,
            generation: self.info.generation,
            live: self.live,
            ranks: self.rank_status(),
            companions: self.companion_status(),
        }
    }

    /// One entry of the status's `tenants`: the engine, the pids of its
    /// attached processes (ranks, then companions), its ranks and
    /// companions, since when, its generation, whether it is live, and
    /// what it did in the CPU tier (`stored`, `hits`, `hits_from_others`).
    pub(super) fn tenant_status(&self) -> TenantStatus {
        TenantStatus {
            engine: self.engine.clone(),
            pids: attached(&self.ranks)
                .chain(attached(&self.companions))
                .map(|r| r.pid)
                .collect(),
            ranks: self.rank_status(),
            companions: self.companion_status(),
            world: self.world,
            since: pool_core::rfc3339(self.since),
            generation: self.info.generation,
            live: self.live,
            tag: self.tag.clone(),
            stored: self.tier.stored,
            hits: self.tier.hits,
            hits_from_others: self.tier.hits_from_others,
        }
    }
}

impl Serving {
    /// The tenants, in the order their leases were granted.
    pub(in crate::server) fn tenant_ids(&self) -> Vec<TenantId> {
        self.tenants.iter().map(Lease::id).collect()
    }

    /// Where tenant `id` is among the tenants.
    pub(super) fn place(&self, id: TenantId) -> Option<usize> {
        self.tenants.iter().position(|l| l.id() == id)
    }

    /// Tenant `id`'s lease, while in force.
    pub(super) fn tenant(&self, id: TenantId) -> Option<&Lease> {
        self.tenants.iter().find(|l| l.id() == id)
    }

    /// Tenant `id`'s lease, to change it.
    pub(super) fn tenant_mut(&mut self, id: TenantId) -> Option<&mut Lease> {
        self.tenants.iter_mut().find(|l| l.id() == id)
    }

    /// The tenant of a named `engine` (an engine holds one lease; an
    /// engine without an id, "", is a tenant of its own each time).
    pub(super) fn tenant_of(&self, engine: &str) -> Option<&Lease> {
        (!engine.is_empty())
            .then(|| self.tenants.iter().find(|l| l.engine == engine))
            .flatten()
    }

    /// Whether the pool holds as many tenants as it may.
    pub(super) fn full(&self) -> bool {
        self.tenants.len() >= usize::try_from(self.config.tenants).unwrap_or(usize::MAX)
    }

    /// The tenants as a refusal names them.
    pub(super) fn holders(&self) -> String {
        let named: Vec<String> = self.tenants.iter().map(Lease::named).collect();
        named.join(", ")
    }

    /// Why an engine beyond the limit of a keeper of several tenants is
    /// refused: the limit and who holds the pool.
    pub(super) fn full_message(&self) -> String {
        let n = self.config.tenants;
        format!(
            "kept pool `{}` holds its limit of {n} tenants (`--tenants {n}`): {}; stop one, or \
             start its keeper with more --tenants",
            self.config.name,
            self.holders()
        )
    }

    /// A granted hello ([`Answer::Grant`](super::Answer::Grant)) on `conn`
    /// joins tenant `tenant`, once its lease was sent (`sent`) or failed to
    /// be: as a companion, or as a rank (the lease keeps the first rank's
    /// tag; a world of 1 is live at once; a rank the lease never reached has
    /// died). Whether the tenant keeps `conn` (else the I/O side closes it).
    pub(in crate::server) fn joined(
        &mut self,
        tenant: TenantId,
        conn: ConnId,
        pid: u32,
        uid: u32,
        hello: &Message,
        sent: bool,
    ) -> bool {
        let Message::Hello {
            rank,
            tag,
            companion,
            ..
        } = hello
        else {
            return false;
        };
        let name = self.config.name.clone();
        let Some(lease) = self.tenant_mut(tenant) else {
            return false;
        };
        let conn = sent.then_some(conn);
        if *companion {
            tracing::info!("kept pool `{name}`: pid {pid} maps the lease as a companion");
            lease.companions.push(Rank {
                rank: 0,
                pid,
                uid,
                conn,
                arrived: true,
                released: false,
            });
            return sent;
        }
        if lease.tag.is_none() {
            lease.tag.clone_from(tag);
        }
        lease.ranks.push(Rank {
            rank: *rank,
            pid,
            uid,
            conn,
            arrived: false,
            released: false,
        });
        if !sent {
            lease.died.get_or_insert(pid);
        }
        if lease.world == 1 && sent {
            lease.live = true;
        }
        sent
    }

    /// How a refusal names tenant `id` (`engine `a` (pid 100, since T)`),
    /// while its lease is in force.
    pub(in crate::server) fn tenant_named(&self, id: TenantId) -> Option<String> {
        self.tenant(id).map(Lease::named)
    }

    /// What tenant `id` did in the CPU tier so far, as the tier counts it
    /// (after each of its requests); nothing for a tenant no longer in
    /// force.
    pub(in crate::server) fn tier_figures(&mut self, id: TenantId, figures: TierFigures) {
        let Some(lease) = self.tenant_mut(id) else {
            return;
        };
        // The tier's counts of a tenant only grow: what they grew by is
        // the keeper's too.
        let was = std::mem::replace(&mut lease.tier, figures);
        let total = &mut self.totals.tier;
        total.stored += figures.stored.saturating_sub(was.stored);
        total.hits += figures.hits.saturating_sub(was.hits);
        total.hits_from_others += figures
            .hits_from_others
            .saturating_sub(was.hits_from_others);
    }

    /// A tenant opened the CPU tier: `warm`, its blocks found (a restore),
    /// or cold.
    pub(in crate::server) fn tier_opened(&mut self, warm: bool) {
        if warm {
            self.totals.opens_warm += 1;
        } else {
            self.totals.opens_cold += 1;
        }
    }

    /// The tenants whose processes are all gone (every rank's connection
    /// and every companion's): their leases are to end
    /// ([`Serving::end_lease`]), each on its own.
    pub(in crate::server) fn ended(&self) -> Vec<TenantId> {
        self.tenants
            .iter()
            .filter(|l| l.over())
            .map(Lease::id)
            .collect()
    }
}

/// Several engines on one kept pool, by the keeper's transitions: granted up
/// to the limit and refused beyond it, each ending alone, the pool cleared
/// once the last one ended.
#[cfg(test)]
mod tests {
    use std::time::Instant;

    use hostpool_handoff::lease::{KeeperState, LeaseEnd};
    use serde_json::Value;

    use super::super::testing::*;
    use super::super::{Answer, RankEvent, State, Stops};
    use super::*;

    const T2: TenantId = TenantId(2);

    #[test]
    fn two_tenants_are_granted_and_a_third_is_refused_naming_the_limit_and_both() {
        let mut s = serving_tenants("zero", 2);
        let now = Instant::now();
        let (_, a) = granted_to(&mut s, &hello("a", 1, 0, None), 100, now);
        // An engine without an id is a tenant of its own.
        let (_, b) = granted_to(&mut s, &hello("", 1, 0, None), 200, now);
        assert_eq!((a, b), (T1, T2), "each lease its own generation");
        assert_eq!(s.tenant_ids(), vec![T1, T2]);
        assert!(s.tenant(T1).unwrap().live && s.tenant(T2).unwrap().live);
        for third in [hello("c", 1, 0, None), hello("", 1, 0, None)] {
            let (usage, message, pid) = refused(s.answer(&third, || None, now));
            assert!(!usage && pid == Some(100), "{message}");
            let since = pool_core::rfc3339(s.tenant(T1).unwrap().since);
            assert!(
                message.starts_with(
                    "kept pool `unit` holds its limit of 2 tenants (`--tenants 2`): engine `a` \
                     (pid 100, since "
                ) && message.contains(&format!(
                    "engine `a` (pid 100, since {since}), an engine without an id (pid 200, since"
                )) && message.ends_with("; stop one, or start its keeper with more --tenants"),
                "{message}"
            );
        }
        assert_eq!(s.generation, 2, "a refusal counts no generation");
        let st = s.status(Value::Null, None);
        assert_eq!((st.state, st.max_tenants), (KeeperState::Leased, 2));
        assert_eq!(
            st.lease.as_ref().and_then(|l| l.pid),
            Some(100),
            "the first tenant, as before tenants"
        );
        let tenants = &st.tenants;
        assert_eq!(tenants.len(), 2, "{st:?}");
        assert_eq!(
            (
                tenants[0].engine.as_str(),
                &tenants[0].pids,
                tenants[0].generation
            ),
            ("a", &vec![100], 1)
        );
        assert_eq!(
            (
                tenants[1].engine.as_str(),
                &tenants[1].pids,
                tenants[1].generation
            ),
            ("", &vec![200], 2)
        );
        assert!(tenants[1].live);
        assert_eq!(
            tenants[1].ranks,
            vec![RankStatus {
                rank: 0,
                pid: 200,
                uid: 0
            }]
        );
    }

    #[test]
    fn a_rank_that_dies_ends_its_own_tenant_alone_and_the_others_go_on() {
        let mut s = serving_tenants("zero", 2);
        let now = Instant::now();
        let a0 = granted(&mut s, &hello("a", 2, 0, None), 100, now);
        granted(&mut s, &hello("b", 2, 0, None), 200, now);
        let a1 = granted(&mut s, &hello("a", 2, 1, None), 101, now);
        granted(&mut s, &hello("b", 2, 1, None), 201, now);
        assert_eq!(s.generation, 2, "two tenants of two ranks each");
        // Rank 1 of `b` dies mid-attach: `b`'s lease fails, naming it, and
        // only `b`'s ranks are told.
        let told = s
            .on_lease_events(T2, vec![(1, RankEvent::Gone)], Vec::new(), now)
            .expect("b's ranks are told");
        assert!(
            matches!(&told.message, Message::Failed { ranks, pid, .. } if *ranks == vec![1] && *pid == Some(201)),
            "{:?}",
            told.message
        );
        assert_eq!(told.to, vec![ConnId(200)]);
        // `a`'s lease, ranks and barrier are untouched: it goes once its
        // own ranks arrive.
        let a = s.tenant(T1).unwrap();
        assert!(!a.failed && !a.live && a.died.is_none());
        assert_eq!(
            a.ranks.iter().map(|r| r.conn).collect::<Vec<_>>(),
            vec![Some(a0), Some(a1)]
        );
        let arrived = vec![(0, RankEvent::Arrived(None)), (1, RankEvent::Arrived(None))];
        let go = s
            .on_lease_events(T1, arrived, Vec::new(), now)
            .expect("a goes");
        assert!(matches!(go.message, Message::Go));
        assert_eq!(go.to, vec![a0, a1]);
        // `b`'s last rank goes: `b` alone ended, as died, and with a tenant
        // left the pool is not cleared.
        assert!(s.ended().is_empty(), "b's rank 0 still maps the pool");
        s.on_lease_events(T2, vec![(0, RankEvent::Gone)], Vec::new(), now);
        assert_eq!(s.ended(), vec![T2]);
        assert!(!s.end_lease(T2, now), "no clearing under a live tenant");
        assert_eq!(s.state, State::Idle);
        let previous = s.previous.clone().unwrap();
        assert_eq!((previous.pid, previous.how), (201, LeaseEnd::Died));
        assert_eq!(s.tenant_ids(), vec![T1]);
        assert!(s.lease_live(T1) && s.ended().is_empty());
        // A new engine takes the freed place at once (no clearing to wait
        // for), generation 3, told how `b` ended.
        let Answer::Grant(c, info) = s.answer(&hello("c", 1, 0, None), || None, now) else {
            panic!("a tenant's place is free");
        };
        assert_eq!((c, info.previous.map(|p| p.pid)), (TenantId(3), Some(201)));
    }

    #[test]
    fn content_zero_clears_only_once_the_last_tenant_ended() {
        let mut s = serving_tenants("zero", 3);
        let now = Instant::now();
        for pid in [100, 200] {
            granted(&mut s, &hello("", 1, 0, None), pid, now);
        }
        s.on_lease_events(
            T1,
            vec![(0, RankEvent::Released), (0, RankEvent::Gone)],
            Vec::new(),
            now,
        );
        assert_eq!(s.ended(), vec![T1]);
        assert!(!s.end_lease(T1, now), "tenant 2 still maps the pool");
        assert_eq!(
            s.previous.as_ref().map(|p| (p.pid, p.how)),
            Some((100, LeaseEnd::Closed))
        );
        // While a tenant is left, a hello is granted, not told to wait.
        let (_, t3) = granted_to(&mut s, &hello("", 1, 0, None), 300, now);
        for (t, pid) in [(T2, 200), (t3, 300)] {
            s.on_rank(t, 0, RankEvent::Gone);
            assert_eq!(s.ended(), vec![t]);
            let last = t == t3;
            assert_eq!(s.end_lease(t, now), last, "cleared after the last one");
            assert_eq!(matches!(s.state, State::Zeroing { .. }), last);
            assert_eq!(
                s.previous.as_ref().map(|p| (p.pid, p.how)),
                Some((pid, LeaseEnd::Died))
            );
        }
        // While clearing, hellos wait as with one tenant.
        assert!(matches!(
            s.answer(&hello("", 1, 0, None), || None, now),
            Answer::Wait { .. }
        ));
        assert!(s.tenant_ids().is_empty());
    }

    #[test]
    fn a_rank_joins_its_own_engines_tenant_even_when_the_pool_is_full() {
        let mut s = serving_tenants("keep", 2);
        let now = Instant::now();
        granted(&mut s, &hello("a", 2, 0, None), 100, now);
        granted(&mut s, &hello("b", 1, 0, None), 200, now);
        let (_, joined) = granted_to(&mut s, &hello("a", 2, 1, None), 101, now);
        assert_eq!((joined, s.generation), (T1, 2), "rank 1 joins a's lease");
        assert_eq!(s.tenant(T1).unwrap().ranks.len(), 2);
        // The same rank again, or another world, is refused naming a's
        // lease: an engine holds one lease.
        for (h, says) in [
            (
                hello("a", 2, 0, None),
                "(rank 0 is already attached: give each rank its own --rank)",
            ),
            (
                hello("a", 3, 2, None),
                "an engine holds one lease of it: stop that engine first",
            ),
        ] {
            let (_, message, pid) = refused(s.answer(&h, || None, now));
            assert!(
                message.contains("kept pool `unit` is leased by engine `a` (pid 100 since")
                    && message.contains(says),
                "{message}"
            );
            assert_eq!(pid, Some(100));
        }
        // Joining by the keeper's dispatch: the tenant named, not another.
        let h = hello("a", 2, 1, None);
        assert!(
            !s.joined(TenantId(9), ConnId(7), 7, 0, &h, true),
            "no such tenant"
        );
        assert_eq!(s.tenant(T2).unwrap().ranks.len(), 1);
    }

    #[test]
    fn a_companion_joins_its_engines_tenant_and_keeps_only_that_one() {
        let mut s = serving_tenants("zero", 3);
        let now = Instant::now();
        granted(&mut s, &hello("a", 1, 0, None), 100, now);
        let b = granted(&mut s, &hello("b", 1, 0, None), 200, now);
        let (c, tenant) = granted_to(&mut s, &companion("b"), 202, now);
        assert_eq!((tenant, s.generation), (T2, 2), "b's tenant, no new lease");
        assert_eq!(s.tenant(T2).unwrap().companions.len(), 1);
        assert!(s.tenant(T1).unwrap().companions.is_empty());
        let (_, message, _) = refused(s.answer(&companion("z"), || None, now));
        assert!(
            message.contains("no lease of engine `z` is in force on kept pool `unit`")
                && message.contains("engine `a` (pid 100, since")
                && message.contains("engine `b` (pid 200, since"),
            "{message}"
        );
        let st = s.status(Value::Null, None);
        assert_eq!(st.tenants[1].pids, vec![200, 202], "{st:?}");
        assert_eq!(
            st.tenants[1].companions,
            vec![CompanionStatus { pid: 202, uid: 0 }]
        );
        // b's rank goes: b's tenant stays while its companion maps the pool.
        s.on_lease_events(
            T2,
            vec![(0, RankEvent::Released), (0, RankEvent::Gone)],
            Vec::new(),
            now,
        );
        assert!(s.ended().is_empty());
        s.on_lease_events(T2, Vec::new(), vec![(0, RankEvent::Gone)], now);
        assert_eq!(s.ended(), vec![T2]);
        assert!(!s.end_lease(T2, now));
        assert_eq!(
            s.previous.as_ref().map(|p| (p.pid, p.how)),
            Some((202, LeaseEnd::Died))
        );
        assert!(!s.watched().contains(&c) && !s.watched().contains(&b));
        assert_eq!(s.tenant_ids(), vec![T1]);
    }

    #[test]
    fn a_stop_drains_every_tenant_and_the_keeper_ends_after_the_last() {
        let mut s = serving_tenants("zero", 2);
        let (now, drain) = (Instant::now(), std::time::Duration::from_secs(60));
        let a = granted(&mut s, &hello("a", 1, 0, None), 100, now);
        let b = granted(&mut s, &hello("b", 1, 0, None), 200, now);
        assert!(matches!(s.on_stops(1, drain, false, now), Stops::Serve));
        assert_eq!(s.farewell().to, vec![a, b], "both are told if it ends");
        s.on_rank(T1, 0, RankEvent::Gone);
        assert!(!s.end_lease(T1, now), "a stopping keeper does not clear");
        assert!(
            matches!(s.on_stops(1, drain, false, now), Stops::Serve),
            "b's lease is still in force"
        );
        s.on_rank(T2, 0, RankEvent::Gone);
        assert!(!s.end_lease(T2, now));
        assert!(matches!(s.on_stops(1, drain, false, now), Stops::Exit));
    }

    #[test]
    fn one_tenant_keeps_the_one_lease_at_a_time_refusal_and_lists_itself() {
        let mut s = serving("zero");
        let now = Instant::now();
        granted(&mut s, &hello("a", 1, 0, None), 100, now);
        let (_, message, pid) = refused(s.answer(&hello("", 1, 0, None), || None, now));
        assert!(
            message.starts_with("kept pool `unit` is leased by pid 100 since ")
                && message.ends_with(
                    "(rank 0 pid 100, engine `a`); one lease at a time: stop that engine first"
                )
                && !message.contains("tenant"),
            "{message}"
        );
        assert_eq!(pid, Some(100));
        let (_, message, _) = refused(s.answer(&companion("z"), || None, now));
        assert!(
            message.contains("is leased by engine `a` (pid 100), not `z`"),
            "{message}"
        );
        let st = s.status(Value::Null, None);
        assert_eq!(st.max_tenants, 1);
        assert_eq!(st.tenants.len(), 1);
        let lease = st.lease.as_ref().expect("leased");
        assert_eq!(st.tenants[0].generation, lease.generation);
        assert_eq!(st.tenants[0].since, lease.since);
    }
}
