//! The attaches that wait for the pool to be cleared: kept in arrival
//! order, served once the clearing is over (while no lease is live),
//! dropped when they hang up, refused past their attach timeout.

use std::time::Instant;

use super::{ConnId, Refusal, Serving, State, Waiting};

impl Serving {
    /// An attach told to wait ([`Answer::Wait`](super::Answer::Wait)) waits, in arrival order.
    pub(in crate::server) fn waits(&mut self, waiting: Waiting) {
        self.waiting.push(waiting);
    }

    /// The next attach that waited for the pool to be cleared, once it is.
    /// With one tenant, while its lease is live, they wait on (for that
    /// lease to end and the pool to be cleared); with several, each is
    /// answered in turn (a tenant of its own, its engine's, or refused at
    /// the limit).
    pub(in crate::server) fn next_waiting(&mut self) -> Option<Waiting> {
        let held = matches!(self.state, State::Zeroing { .. })
            || (self.config.tenants == 1 && self.tenants.iter().any(|l| l.live));
        (!held && !self.waiting.is_empty()).then(|| self.waiting.remove(0))
    }

    /// The connections of the waiting attaches.
    pub(in crate::server) fn waiting_conns(&self) -> Vec<ConnId> {
        self.waiting.iter().map(|w| w.conn).collect()
    }

    /// Waiting attaches that hung up are dropped.
    pub(in crate::server) fn waiting_gone(&mut self, gone: &[ConnId]) {
        self.waiting.retain(|w| !gone.contains(&w.conn));
    }

    /// Waiting attaches past their timeout, at `now`: told why.
    pub(in crate::server) fn expire_waiting(&mut self, now: Instant) -> Vec<Refusal> {
        let (late, keep): (Vec<Waiting>, Vec<Waiting>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| now >= w.until);
        self.waiting = keep;
        let since = match self.state {
            State::Zeroing { since } => now.saturating_duration_since(since).as_secs_f64(),
            _ => 0.0,
        };
        late.into_iter()
            .map(|w| Refusal {
                conn: w.conn,
                usage: false,
                message: format!(
                    "kept pool `{}` was still being cleared after the previous lease \
                     ({since:.1} s so far); raise --attach-timeout, or use content = \"keep\"",
                    self.config.name
                ),
                pid: None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Answer;
    use super::super::testing::*;
    use super::*;

    /// An anonymous engine's hello (pid and connection `pid`) told to wait
    /// while the pool is cleared, and kept waiting until its own deadline or
    /// `until`, whichever is sooner.
    fn waits_while_clearing(s: &mut Serving, pid: u64, now: Instant, until: Option<Instant>) {
        let h = hello("", 1, 0, None);
        let Answer::Wait { until: theirs } = s.answer(&h, || None, now) else {
            panic!("a hello while clearing waits");
        };
        s.waits(Waiting {
            conn: ConnId(pid),
            uid: 0,
            pid: u32::try_from(pid).unwrap(),
            hello: h,
            until: until.map_or(theirs, |u| theirs.min(u)),
        });
    }

    #[test]
    fn attaches_wait_in_order_until_a_lease_is_live_and_are_refused_past_their_timeout() {
        let mut s = serving("zero");
        let now = Instant::now();
        s.state = State::Zeroing { since: now };
        for (pid, secs) in [(800, 1), (801, 2), (802, 3)] {
            waits_while_clearing(&mut s, pid, now, Some(now + Duration::from_secs(secs)));
        }
        // One hung up; one is late and told why, naming how long so far.
        s.waiting_gone(&[ConnId(802)]);
        let late = s.expire_waiting(now + Duration::from_millis(1500));
        assert_eq!(late.len(), 1);
        assert_eq!((late[0].conn, late[0].usage), (ConnId(800), false));
        assert!(
            late[0]
                .message
                .contains("was still being cleared after the previous lease (1.5 s so far)"),
            "{}",
            late[0].message
        );
        assert_eq!(s.waiting_conns(), vec![ConnId(801)]);
        // Cleared: the one left is served, and a live lease serves no more.
        s.cleared(Some(Ok(Ok(0.5))));
        let w = s.next_waiting().expect("the waiting attach");
        assert_eq!(w.conn, ConnId(801));
        granted(&mut s, &w.hello, w.pid, now);
        s.waits(w);
        assert!(s.next_waiting().is_none(), "a live lease serves no more");
    }

    #[test]
    fn with_several_tenants_the_attaches_that_waited_are_each_answered_once_cleared() {
        let mut s = serving_tenants("zero", 2);
        let now = Instant::now();
        s.state = State::Zeroing { since: now };
        for pid in [810, 811, 812] {
            waits_while_clearing(&mut s, pid, now, None);
        }
        assert!(s.next_waiting().is_none(), "not while clearing");
        s.cleared(Some(Ok(Ok(0.1))));
        // Two become tenants (both live at once); the third is answered at
        // once too, refused at the limit rather than left waiting.
        for pid in [810, 811] {
            let w = s.next_waiting().expect("served in order");
            assert_eq!(w.pid, pid);
            granted(&mut s, &w.hello, w.pid, now);
        }
        let w = s
            .next_waiting()
            .expect("answered, though two tenants are live");
        let (_, message, _) = refused(s.answer(&w.hello, || None, now));
        assert!(
            message.contains("holds its limit of 2 tenants"),
            "{message}"
        );
        assert!(s.next_waiting().is_none() && s.waiting_conns().is_empty());
    }
}
