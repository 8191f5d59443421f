//! The CPU tier the keeper writes for its tenants ([`hostpool_index::tier`]):
//! over the index an engine formatted at the pool's tail, made when a
//! tenant first asks, answered one message a batch, a tenant's state
//! reaped when its lease ends, and forgotten when the pool is cleared (or
//! its index formatted afresh).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use hostpool_handoff::{TierOp, TierPut, TierReply};
use hostpool_index::tier::{MAX_TENANTS, Put, Tenant, Tier};
use hostpool_index::{Index, locate, summary};

use super::state::TenantId;

/// The tier of one kept pool, and which of its places each lease holds.
#[derive(Debug)]
pub(super) struct TierServer<'a> {
    /// The pool's words.
    words: &'a [AtomicU64],
    page: u64,
    /// The tier, and the seed of the index it was made over.
    tier: Option<(u64, Tier<'a>)>,
    places: HashMap<TenantId, Tenant>,
}

impl<'a> TierServer<'a> {
    /// No tier yet, over the pool `words` of `page` pages.
    pub(super) fn new(words: &'a [AtomicU64], page: u64) -> TierServer<'a> {
        TierServer {
            words,
            page,
            tier: None,
            places: HashMap::new(),
        }
    }

    /// The index at the pool's tail, as it is now.
    fn index(&self) -> Option<Index<'a>> {
        let words = locate(self.words, self.page)?;
        let capacity = summary(words)?.capacity;
        Index::resume(words, capacity)
    }

    /// The tier over the index as it is now: made on first use, made
    /// again (every tenant's state dropped) when the index was formatted
    /// afresh since.
    fn tier(&mut self) -> Result<&mut Tier<'a>, String> {
        let Some(index) = self.index() else {
            self.tier = None;
            return Err(
                "the kept pool holds no index: an engine formats one at the pool's tail before \
                 the tier serves (hostpool.index_bytes says its size)"
                    .into(),
            );
        };
        let seed = index.seed();
        if self.tier.as_ref().is_none_or(|(s, _)| *s != seed) {
            self.tier = Some((seed, Tier::new(index)));
        }
        Ok(&mut self.tier.as_mut().expect("made above").1)
    }

    /// The place in the tier of lease `tenant`: given on first use.
    fn place(&mut self, tenant: TenantId) -> Result<Tenant, String> {
        if let Some(p) = self.places.get(&tenant) {
            return Ok(*p);
        }
        let free = (0..MAX_TENANTS)
            .filter_map(|p| Tenant::try_from(p).ok())
            .find(|p| !self.places.values().any(|q| q == p))
            .ok_or("the tier serves at most 64 tenants at once")?;
        self.places.insert(tenant, free);
        Ok(free)
    }

    /// Answer lease `tenant`'s request.
    pub(super) fn serve(&mut self, tenant: TenantId, op: TierOp) -> TierReply {
        let refused = |message: String| TierReply::Refused { message };
        let place = match self.place(tenant) {
            Ok(p) => p,
            Err(m) => return refused(m),
        };
        let tier = match self.tier() {
            Ok(t) => t,
            Err(m) => return refused(m),
        };
        let count =
            |done: Vec<bool>| TierReply::Done(done.into_iter().filter(|d| *d).count() as u64);
        match op {
            TierOp::Store { keys } => {
                let mut puts = Vec::with_capacity(keys.len());
                for key in keys {
                    puts.push(match tier.prepare_store(place, &key) {
                        Ok(Put::Granted { slot, evicted }) => TierPut::Granted { slot, evicted },
                        Ok(Put::Stored(slot)) => TierPut::Stored { slot },
                        Ok(Put::InFlight) => TierPut::InFlight,
                        Ok(Put::NoRoom) => TierPut::NoRoom,
                        Err(e) => return refused(e.to_string()),
                    });
                }
                TierReply::Puts(puts)
            }
            TierOp::Stored { slots } => count(
                slots
                    .into_iter()
                    .map(|s| tier.complete_store(place, s).unwrap_or(false))
                    .collect(),
            ),
            TierOp::Abort { slots } => count(
                slots
                    .into_iter()
                    .map(|s| tier.abort_store(place, s).unwrap_or(false))
                    .collect(),
            ),
            TierOp::Load { keys } => {
                TierReply::Loads(keys.iter().map(|k| tier.prepare_load(place, k)).collect())
            }
            TierOp::Loaded { slots } => count(
                slots
                    .into_iter()
                    .map(|s| tier.complete_load(place, s).unwrap_or(false))
                    .collect(),
            ),
            TierOp::Touch { keys } => {
                for k in &keys {
                    tier.touch(k);
                }
                TierReply::Done(keys.len() as u64)
            }
        }
    }

    /// Lease `tenant` ended (released, or died anywhere): its writes in
    /// flight are dropped and its holds released, and its place is free.
    pub(super) fn reap(&mut self, tenant: TenantId) {
        let Some(place) = self.places.remove(&tenant) else {
            return;
        };
        if let Some((_, tier)) = self.tier.as_mut() {
            let r = tier.reap(place);
            if r.writes + r.holds > 0 {
                tracing::info!(
                    "the tier dropped {} write(s) in flight and released {} hold(s) of a lease \
                     that ended",
                    r.writes,
                    r.holds
                );
            }
        }
    }

    /// The pool is being cleared: no tier until an engine formats an
    /// index again.
    pub(super) fn forget(&mut self) {
        self.tier = None;
        self.places.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostpool_index::Fingerprint;

    /// A pool of `pages` 4 KiB pages with an index of `capacity` at its
    /// tail when `indexed`.
    fn pool(pages: usize, capacity: u64, indexed: bool) -> Vec<AtomicU64> {
        let words: Vec<AtomicU64> = (0..pages * 512).map(|_| AtomicU64::new(0)).collect();
        if indexed {
            let fp = Fingerprint::new([("model", "m")]).unwrap();
            Index::attach_tail(&words, capacity, 4096, &fp).unwrap();
        }
        words
    }

    fn granted(reply: TierReply) -> Vec<u64> {
        let TierReply::Puts(puts) = reply else {
            panic!("{reply:?}");
        };
        puts.into_iter()
            .map(|p| match p {
                TierPut::Granted { slot, .. } => slot,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    /// Two leases share one tier by message: what one stores the other
    /// loads from the same slot; a store of a key in flight is told so; a
    /// lease that ends leaves no write in flight and no hold.
    #[test]
    fn two_leases_share_one_tier_and_an_ended_one_leaves_nothing() {
        let words = pool(64, 8, true);
        let mut t = TierServer::new(&words, 4096);
        let (a, b) = (TenantId(1), TenantId(2));
        let slots = granted(t.serve(
            a,
            TierOp::Store {
                keys: vec![b"x".to_vec()],
            },
        ));
        assert_eq!(
            t.serve(
                b,
                TierOp::Store {
                    keys: vec![b"x".to_vec()]
                }
            ),
            TierReply::Puts(vec![TierPut::InFlight])
        );
        assert_eq!(
            t.serve(
                a,
                TierOp::Stored {
                    slots: slots.clone()
                }
            ),
            TierReply::Done(1)
        );
        assert_eq!(
            t.serve(
                b,
                TierOp::Load {
                    keys: vec![b"x".to_vec(), b"y".to_vec()]
                }
            ),
            TierReply::Loads(vec![Some(slots[0]), None])
        );
        // b dies holding x, with a write in flight.
        granted(t.serve(
            b,
            TierOp::Store {
                keys: vec![b"y".to_vec()],
            },
        ));
        t.reap(b);
        let tier = &t.tier.as_ref().unwrap().1;
        let c = tier.counts();
        assert_eq!((c.writing, c.held, c.recorded), (0, 0, 1), "{c:?}");
        assert_eq!(tier.figures(1).hits_others, 1);
    }

    /// Without an index there is no tier, said; an index formatted afresh
    /// (another seed) makes a new one.
    #[test]
    fn no_index_is_refused_and_a_new_index_makes_a_new_tier() {
        let words = pool(64, 8, false);
        let mut t = TierServer::new(&words, 4096);
        let reply = t.serve(
            TenantId(1),
            TierOp::Load {
                keys: vec![b"x".to_vec()],
            },
        );
        assert!(
            matches!(&reply, TierReply::Refused { message } if message.contains("holds no index")),
            "{reply:?}"
        );
        let fp = Fingerprint::new([("model", "m")]).unwrap();
        Index::attach_tail(&words, 8, 4096, &fp).unwrap();
        granted(t.serve(
            TenantId(1),
            TierOp::Store {
                keys: vec![b"x".to_vec()],
            },
        ));
        let seed = t.tier.as_ref().unwrap().0;
        // Another identity formats it afresh: the in-flight state goes.
        let other = Fingerprint::new([("model", "n")]).unwrap();
        Index::attach_tail(&words, 8, 4096, &other).unwrap();
        assert_eq!(
            t.serve(
                TenantId(1),
                TierOp::Load {
                    keys: vec![b"x".to_vec()]
                }
            ),
            TierReply::Loads(vec![None])
        );
        assert_ne!(t.tier.as_ref().unwrap().0, seed);
        assert_eq!(t.tier.as_ref().unwrap().1.counts().writing, 0);
    }
}
