//! How the keeper answers a hello, from its state alone: refused, told to
//! wait, or granted (a new lease, a tenant of its own, or a rank or
//! companion joining its engine's tenant), with the lease's identity to
//! send.

use std::time::{Instant, SystemTime};

use hostpool_handoff::Message;
use hostpool_handoff::barrier::{Barrier, Deadline};
use pool_core::{format_bytes, round_to_page};

use super::{Answer, Lease, Serving, State, TenantId, TierFigures, seconds};

impl Serving {
    /// What a hello is answered with, from the keeper's state alone, and
    /// the state it leaves: refused (another lease protocol, stopping,
    /// broken, a size or page size that does not fit, a failed lease of the
    /// same engine, another engine's lease in force with one tenant, this
    /// engine's own lease that it cannot join, as many tenants as the pool
    /// may have: never told to wait for a place), told to wait (the pool is
    /// being cleared), or granted (a new tenant, generation + 1, or a rank
    /// joining its engine's tenant) with the [`LeaseInfo`] its lease is
    /// told. `truncated` says whether a holder truncated the pool's files,
    /// which breaks it for good.
    ///
    /// [`LeaseInfo`]: hostpool_handoff::lease::LeaseInfo
    pub(in crate::server) fn answer(
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
        let joins = |l: &&Lease| {
            !l.live
                && !l.failed
                && l.engine == *engine
                && !engine.is_empty()
                && l.world == *world
                && !l.ranks.iter().any(|r| r.rank == *rank)
        };
        if let Some(l) = self.tenants.iter().find(joins) {
            return Answer::Grant(l.id(), l.info.clone());
        }
        // One tenant: the lease in force refuses every other (as before
        // tenants); several: an engine's own lease refuses its rank that
        // cannot join, and a full pool every new engine.
        let holder = match (self.config.tenants, self.tenants.first()) {
            (1, Some(lease)) => Some(lease),
            _ => self.tenant_of(engine),
        };
        if let Some(lease) = holder {
            return Answer::Refuse {
                usage: false,
                message: self.leased_message(lease, engine, *rank),
                pid: lease.holder(),
            };
        }
        if self.full() {
            return Answer::Refuse {
                usage: false,
                message: self.full_message(),
                pid: self.tenants.first().and_then(Lease::holder),
            };
        }
        if matches!(self.state, State::Zeroing { .. }) {
            return Answer::Wait {
                until: now + seconds(*attach_timeout_secs),
            };
        }
        // A new lease of this engine, a tenant of its own: its ranks start
        // again.
        self.failed.retain(|f| f.engine != *engine);
        self.generation += 1;
        let info = self.lease_info(self.generation);
        let attach = seconds(*attach_timeout_secs);
        let barrier = seconds(*barrier_timeout_secs);
        self.tenants.push(Lease {
            info: info.clone(),
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
            tier: TierFigures::default(),
        });
        Answer::Grant(TenantId(self.generation), info)
    }

    /// Why a rank of `engine` is refused by `lease`, in force: another
    /// engine's (one tenant), or its own engine's, which it cannot join
    /// (live, failed, another world, or its rank already attached).
    fn leased_message(&self, lease: &Lease, engine: &str, rank: u32) -> String {
        let name = &self.config.name;
        let ranks: Vec<String> = lease
            .ranks
            .iter()
            .map(|r| format!("rank {} pid {}", r.rank, r.pid))
            .collect();
        let attached = if !engine.is_empty()
            && lease.engine == engine
            && lease.ranks.iter().any(|r| r.rank == rank)
        {
            format!(" (rank {rank} is already attached: give each rank its own --rank)")
        } else {
            String::new()
        };
        let holder = lease.holder().unwrap_or(0);
        let since = pool_core::rfc3339(lease.since);
        if self.config.tenants > 1 {
            return format!(
                "kept pool `{name}` is leased by engine `{engine}` (pid {holder} since {since}: \
                 {}); an engine holds one lease of it: stop that engine first{attached}",
                ranks.join(", "),
            );
        }
        format!(
            "kept pool `{name}` is leased by pid {holder} since {since} ({}{}); one lease at a \
             time: stop that engine first{attached}",
            ranks.join(", "),
            if lease.engine.is_empty() {
                String::new()
            } else {
                format!(", engine `{}`", lease.engine)
            },
        )
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
        match (self.tenant_of(engine), self.tenants.first()) {
            (Some(l), _) if !l.failed => Answer::Grant(l.id(), l.info.clone()),
            (Some(l), _) => refuse(
                format!(
                    "the lease of engine `{engine}` on kept pool `{name}` failed; its companion \
                     has nothing to map"
                ),
                l.holder(),
            ),
            (None, Some(l)) if self.config.tenants == 1 => {
                let holder = l.holder();
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
            (None, first) => refuse(
                format!(
                    "no lease of engine `{engine}` is in force on kept pool `{name}`{}: a \
                     companion maps the lease its engine's ranks hold, so start it once they \
                     attached",
                    if first.is_some() {
                        format!(" (its tenants: {})", self.holders())
                    } else {
                        String::new()
                    }
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
        let f = &self.figures;
        if world == 0 || world > pool_core::MAX_WORLD || rank >= world {
            return Some(format!(
                "rank {rank} of world {world} cannot lease kept pool `{name}`: world must be 1 to \
                 {} and rank below it",
                pool_core::MAX_WORLD
            ));
        }
        if let Some(p) = page
            && p != f.page
        {
            return Some(format!(
                "the engine asks for {} pages, but kept pool `{name}` has {} pages; ask for \
                 page_size = \"{}\" or none",
                format_bytes(p),
                format_bytes(f.page),
                format_bytes(f.page)
            ));
        }
        if let Some(s) = size {
            let fits = pool_core::PageSize::new(f.page)
                .ok()
                .and_then(|pg| round_to_page(s, pg).ok())
                .is_some_and(|m| m.mapped() == f.mapped);
            if !fits {
                return Some(format!(
                    "the engine asks for {}, but kept pool `{name}` is {} ({} mapped); ask for \
                     size = \"{}\", or give no size to take the pool as it is",
                    format_bytes(s),
                    format_bytes(f.logical),
                    format_bytes(f.mapped),
                    format_bytes(f.logical)
                ));
            }
        }
        None
    }
}

/// Hellos answered from the state alone: grants, refusals naming why and
/// whom, waits.
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::testing::*;
    use super::super::{ConnId, RankEvent};
    use super::*;
    use hostpool_handoff::lease::LeaseEnd;
    use pool_core::Error;

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
        assert!(s.tenants.is_empty() && s.generation == 0);
        granted(&mut s, &hello("eng", 2, 0, None), 600, now);
        granted(&mut s, &hello("eng", 2, 1, None), 601, now);
        // Another engine's companion is refused, naming the holder.
        let (_, message, pid) = refused(s.answer(&companion("other"), || None, now));
        assert!(message.contains("leased by engine `eng`"), "{message}");
        assert_eq!(pid, Some(600));
        // Its own engine's companion is granted, counting no generation,
        // and stands in no barrier: the ranks alone make it go.
        let c = granted(&mut s, &companion("eng"), 602, now);
        assert_eq!(s.generation, 1);
        // It is watched (its tier requests wake the keeper at once), though
        // in no barrier.
        assert!(
            s.watched().contains(&c),
            "a companion's requests wake the keeper"
        );
        let told = s.on_lease_events(
            T1,
            vec![(0, RankEvent::Arrived(None)), (1, RankEvent::Arrived(None))],
            Vec::new(),
            now,
        );
        let told = told.expect("the ranks are told to go");
        assert!(matches!(told.message, Message::Go));
        assert_eq!(told.to, vec![ConnId(600), ConnId(601)], "not the companion");
        // The ranks release; the lease is not over while the companion maps it.
        let gone = |i| [(i, RankEvent::Released), (i, RankEvent::Gone)];
        let events = [gone(0), gone(1)].concat();
        assert!(s.on_lease_events(T1, events, Vec::new(), now).is_none());
        assert!(s.ended().is_empty(), "the companion still maps the pool");
        // A companion that dies ends the lease as died, naming it.
        s.on_lease_events(T1, Vec::new(), vec![(0, RankEvent::Gone)], now);
        assert_eq!(s.ended(), vec![T1]);
        assert!(
            s.end_lease(T1, now),
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
        assert!(s.tenants.is_empty() && s.generation == 0);
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
}
