//! The CPU tier the keeper writes for its tenants ([`hostpool_index::tier`]):
//! over the index at the pool's tail, which the keeper attaches itself when
//! a tenant opens the tier for its identity ([`TierOp::Open`]; an engine
//! may also have formatted it there with `Pool.index`), made when a tenant
//! first asks, answered one message a batch, a tenant's state reaped when
//! its lease ends, and forgotten when the pool is cleared (or its index
//! formatted afresh).
//!
//! **One identity at a time.** Each tenant that opened the tier did so for
//! one identity: its number of slots and its fingerprint (model, dtypes,
//! block size, layout, ...). While a tenant that opened it is still in the
//! tier (its lease in force), an open for another identity is refused,
//! naming the field that differs, both values and the engines that hold
//! the tier, and the index is left as it is: an engine of another model
//! never formats the tier afresh under the engines that use it. Once they
//! are gone, it opens cold, as a restart of another identity does.
//!
//! **Figures.** Per tenant: the blocks it stored, the blocks it read (a hold
//! released as read, [`TierOp::Loaded`]), and how many of those it did not
//! store itself (what sharing the tier gave
//! it), counted here and handed to the state for `keep status`.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use hostpool_handoff::{TierOp, TierPut, TierReply};
use hostpool_index::tier::{MAX_TENANTS, Put, Tenant, Tier};
use hostpool_index::{Cold, Fingerprint, Index, Start};

use super::state::{TenantId, TierFigures};

/// How the tier names a tenant in a refusal: `engine `a` (pid 100, since
/// T)`, from the state; `None` for a tenant whose lease is no longer in
/// force.
pub(super) type Named<'n> = &'n dyn Fn(TenantId) -> Option<String>;

/// The tier of one kept pool, which of its places each lease holds, the
/// identity each opened it for, and what each did in it.
#[derive(Debug)]
pub(super) struct TierServer<'a> {
    /// The kept pool's name, for refusals.
    name: String,
    /// The pool's words.
    words: &'a [AtomicU64],
    page: u64,
    /// The tier, and the seed of the index it was made over.
    tier: Option<(u64, Tier<'a>)>,
    places: HashMap<TenantId, Tenant>,
    /// The identity each tenant opened the tier for ([`TierOp::Open`]):
    /// its slots and its fingerprint. A tenant that never opened (it
    /// formatted the index itself) has none.
    opened: HashMap<TenantId, (u64, Fingerprint)>,
    /// The tenant that completed each recorded slot's store, until the
    /// slot is granted to another store (evicted) or the tier is made
    /// again. Kept past the tenant's lease: its blocks stay others' hits.
    storers: HashMap<u64, TenantId>,
    /// What each tenant in the tier did in it.
    figures: HashMap<TenantId, TierFigures>,
    /// For a slot, the slot whose key came after it in the last store
    /// batch that went through it (a request's next block): what
    /// [`TierOp::Hold`] follows to hold a prefix in one message. A hint:
    /// the slot it names may hold another key since, which is held as
    /// found.
    after: HashMap<u64, u64>,
    /// The tenants that came back after the keeper's restart.
    rejoined: std::collections::HashSet<TenantId>,
    /// Why no chunk is granted to a writer now (the processes that mapped
    /// an adopted pool before the keeper's restart, which may still write
    /// chunks the keeper before granted them): stores are told `NoRoom`.
    closed: Option<String>,
}

impl<'a> TierServer<'a> {
    /// No tier yet, over the words of kept pool `name` of `page` pages.
    pub(super) fn new(name: String, words: &'a [AtomicU64], page: u64) -> TierServer<'a> {
        TierServer {
            name,
            words,
            page,
            tier: None,
            places: HashMap::new(),
            opened: HashMap::new(),
            storers: HashMap::new(),
            figures: HashMap::new(),
            after: HashMap::new(),
            rejoined: std::collections::HashSet::new(),
            closed: None,
        }
    }

    /// Grant no chunk to a writer while `why` holds (`None`: grant again).
    pub(super) fn close_grants(&mut self, why: Option<String>) {
        if why.is_some() != self.closed.is_some() {
            match &why {
                Some(why) => tracing::warn!(
                    "kept pool `{}`: its CPU tier grants no chunk to a writer: {why}",
                    self.name
                ),
                None => tracing::info!(
                    "kept pool `{}`: its CPU tier grants chunks again",
                    self.name
                ),
            }
        }
        self.closed = why;
    }

    /// The tier over the index at the pool's tail as it is now: made on
    /// first use, made again (every tenant's state dropped) when the index
    /// was formatted afresh since.
    fn ensure_tier(&mut self) -> Result<(), String> {
        let Some(index) = Index::resume_tail(self.words, self.page) else {
            self.tier = None;
            self.storers.clear();
            self.after.clear();
            return Err(
                "the kept pool holds no index: an engine opens the tier (`Pool.tier_open`) or \
                 formats an index at the pool's tail (`Pool.index`) before the tier serves \
                 (hostpool.index_bytes says its size)"
                    .into(),
            );
        };
        let seed = index.seed();
        if self.tier.as_ref().is_none_or(|(s, _)| *s != seed) {
            self.storers.clear();
            self.after.clear();
            self.tier = Some((seed, Tier::new(index)));
        }
        Ok(())
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

    /// What lease `tenant` did in the tier so far.
    pub(super) fn figures(&self, tenant: TenantId) -> TierFigures {
        self.figures.get(&tenant).copied().unwrap_or_default()
    }

    /// Answer lease `tenant`'s request; a refusal names other tenants by
    /// `named`.
    pub(super) fn serve(&mut self, tenant: TenantId, op: TierOp, named: Named<'_>) -> TierReply {
        let refused = |message: String| TierReply::Refused { message };
        if let TierOp::Open {
            slots,
            fingerprint,
            rejoin,
        } = op
        {
            let reply = self.open(tenant, slots, fingerprint, named);
            return match (reply, rejoin) {
                (
                    TierReply::Opened {
                        warm,
                        reason,
                        field,
                        ..
                    },
                    Some(r),
                ) => TierReply::Opened {
                    warm,
                    reason,
                    field,
                    rejoined: Some(self.rejoin(tenant, r)),
                },
                (reply, _) => reply,
            };
        }
        let place = match self.place(tenant) {
            Ok(p) => p,
            Err(m) => return refused(m),
        };
        if let Err(m) = self.ensure_tier() {
            return refused(m);
        }
        let TierServer {
            tier: Some((_, tier)),
            storers,
            figures,
            after,
            ..
        } = self
        else {
            return refused("the kept pool's tier could not be made".into());
        };
        let figures = figures.entry(tenant).or_default();
        // How many of a batch were this tenant's to complete, abort or
        // release; a slot the tier could not take (out of range, or its
        // index record not written) is a refusal the tenant sees, naming it.
        let name = &self.name;
        let count = |done: &mut dyn Iterator<Item = Result<bool, hostpool_index::Error>>| {
            let (mut n, mut failed) = (0u64, None);
            for d in done {
                match d {
                    Ok(true) => n += 1,
                    Ok(false) => {}
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
            match failed {
                None => TierReply::Done(n),
                Some(e) => TierReply::Refused {
                    message: format!(
                        "kept pool `{name}`'s CPU tier could not take a slot of the batch: {e} \
                         ({n} of the batch taken)"
                    ),
                },
            }
        };
        match op {
            TierOp::Open { .. } => refused("the tier was opened above".into()),
            TierOp::Store { keys } if self.closed.is_some() => {
                // Stored already is still said, so no engine writes it again.
                TierReply::Puts(
                    keys.iter()
                        .map(|k| match tier.index().find(k) {
                            Some(slot) => TierPut::Stored { slot },
                            None => TierPut::NoRoom,
                        })
                        .collect(),
                )
            }
            TierOp::Store { keys } => {
                let mut puts = Vec::with_capacity(keys.len());
                // The slot of the batch's key before, to chain the next to.
                let mut before: Option<u64> = None;
                for key in keys {
                    let put = match tier.prepare_store(place, &key) {
                        Ok(Put::Granted { slot, evicted }) => {
                            // Whoever stored what the slot held, it is
                            // theirs no more, nor what came after it.
                            storers.remove(&slot);
                            after.remove(&slot);
                            TierPut::Granted { slot, evicted }
                        }
                        Ok(Put::Stored(slot)) => TierPut::Stored { slot },
                        Ok(Put::InFlight) => TierPut::InFlight,
                        Ok(Put::NoRoom) => TierPut::NoRoom,
                        Err(e) => return refused(e.to_string()),
                    };
                    let slot = match put {
                        TierPut::Granted { slot, .. } | TierPut::Stored { slot } => Some(slot),
                        TierPut::InFlight | TierPut::NoRoom => None,
                    };
                    if let (Some(b), Some(s)) = (before, slot) {
                        after.insert(b, s);
                    }
                    before = slot;
                    puts.push(put);
                }
                TierReply::Puts(puts)
            }
            TierOp::Stored { slots } => count(&mut slots.into_iter().map(|s| {
                let done = tier.complete_store(place, s);
                if let Ok(true) = done {
                    storers.insert(s, tenant);
                    figures.stored += 1;
                }
                done
            })),
            TierOp::Abort { slots } => {
                count(&mut slots.into_iter().map(|s| tier.abort_store(place, s)))
            }
            TierOp::Load { keys } => {
                TierReply::Loads(keys.iter().map(|k| tier.prepare_load(place, k)).collect())
            }
            TierOp::Hold { key, ahead } => {
                let Some(mut slot) = tier.prepare_load(place, &key) else {
                    return TierReply::Held(Vec::new());
                };
                let mut held = vec![(key, slot)];
                for _ in 0..ahead {
                    let Some(next) = after.get(&slot).copied() else {
                        break;
                    };
                    let Ok(Some(entry)) = tier.index().get(next) else {
                        break;
                    };
                    // Recorded (not being written), and held as found.
                    match tier.prepare_load(place, &entry.key) {
                        Some(s) if s == next => held.push((entry.key, s)),
                        Some(s) => {
                            let _ = tier.complete_load(place, s);
                            break;
                        }
                        None => break,
                    }
                    slot = next;
                }
                TierReply::Held(held)
            }
            // A hold released after its read is a hit, counted here: a hold
            // taken ahead and never read is not.
            TierOp::Loaded { slots } => count(&mut slots.into_iter().map(|s| {
                let done = tier.complete_load(place, s);
                if let Ok(true) = done {
                    figures.hits += 1;
                    if storers.get(&s) != Some(&tenant) {
                        figures.hits_from_others += 1;
                    }
                }
                done
            })),
            TierOp::Release { slots } => {
                count(&mut slots.into_iter().map(|s| tier.complete_load(place, s)))
            }
            TierOp::Touch { keys } => {
                for k in &keys {
                    tier.touch(k);
                }
                TierReply::Done(keys.len() as u64)
            }
        }
    }

    /// Lease `tenant` opens the tier for its identity: `slots` slots and
    /// `fields`. Refused, the index untouched, while another tenant in the
    /// tier opened it for another identity; else the index at the pool's
    /// tail is attached (warm when it holds this identity, formatted
    /// afresh otherwise) and the tier made over it.
    fn open(
        &mut self,
        tenant: TenantId,
        slots: u64,
        fields: Vec<(String, String)>,
        named: Named<'_>,
    ) -> TierReply {
        let refused = |message: String| TierReply::Refused { message };
        let fp = match Fingerprint::new(fields) {
            Ok(fp) => fp,
            Err(e) => {
                return refused(format!(
                    "kept pool `{}`'s CPU tier cannot be opened for this identity: {e}",
                    self.name
                ));
            }
        };
        if let Some(message) = self.conflict(tenant, slots, &fp, named) {
            return refused(message);
        }
        if let Err(m) = self.place(tenant) {
            return refused(m);
        }
        let start = match Index::attach_tail(self.words, slots, self.page, &fp) {
            Ok((_, start)) => start,
            Err(e) => {
                return refused(format!(
                    "kept pool `{}` cannot hold the CPU tier's index of {slots} slots: {e}; its \
                     pool must end with hostpool.index_bytes({slots}, page_size) bytes for the \
                     index, after the blocks: restart the keeper with a larger --size, or open \
                     the tier for fewer slots",
                    self.name
                ));
            }
        };
        self.opened.insert(tenant, (slots, fp));
        if let Err(m) = self.ensure_tier() {
            return refused(m);
        }
        match start {
            Start::Warm => TierReply::Opened {
                warm: true,
                reason: None,
                field: None,
                rejoined: None,
            },
            Start::Cold(why) => TierReply::Opened {
                warm: false,
                reason: Some(why.to_string()),
                field: match why {
                    Cold::Differs(d) => Some((d.field, d.stored, d.now)),
                    _ => None,
                },
                rejoined: None,
            },
        }
    }

    /// Tenant `tenant`, which opened the tier just now, comes back after
    /// the keeper's restart: its stores in flight are its to write again
    /// and its holds are taken again, before any other tenant can be granted
    /// those slots. What it has again.
    fn rejoin(
        &mut self,
        tenant: TenantId,
        r: hostpool_handoff::Rejoin,
    ) -> hostpool_handoff::Rejoined {
        let mut out = hostpool_handoff::Rejoined::default();
        let Ok(place) = self.place(tenant) else {
            return out;
        };
        let Some((_, tier)) = self.tier.as_mut() else {
            return out;
        };
        for (slot, key) in r.writing {
            if let Ok(true) = tier.claim_write(place, slot, &key) {
                out.claimed.push(slot);
            }
        }
        for key in r.holding {
            if let Some(slot) = tier.prepare_load(place, &key) {
                out.held.push((key, slot));
            }
        }
        self.rejoined.insert(tenant);
        tracing::info!(
            "kept pool `{}`: a tenant came back after the keeper's restart: {} store(s) in flight \
             and {} hold(s) are its again",
            self.name,
            out.claimed.len(),
            out.held.len()
        );
        out
    }

    /// The tenants that came back after the keeper's restart
    /// ([`TierOp::Open`] with a rejoin), while their leases are in force.
    pub(super) fn rejoined(&self) -> Vec<TenantId> {
        let mut t: Vec<TenantId> = self.rejoined.iter().copied().collect();
        t.sort();
        t
    }

    /// Why lease `tenant` may not open the tier for `slots` and `fp`: the
    /// tenants in the tier that opened it for another identity, the first
    /// field that differs (or the slots) and both values. `None` when no
    /// other tenant holds another identity (none opened it, or only this
    /// one did: a tenant may open again alone).
    fn conflict(
        &self,
        tenant: TenantId,
        slots: u64,
        fp: &Fingerprint,
        named: Named<'_>,
    ) -> Option<String> {
        let quoted = |v: Option<String>| v.map_or_else(|| "not given".into(), |v| format!("{v:?}"));
        let mut others: Vec<(TenantId, (String, String, String))> = self
            .opened
            .iter()
            .filter(|(t, _)| **t != tenant)
            .filter_map(|(t, (s, f))| {
                let why = match f.differs(fp) {
                    Some(d) => (d.field, quoted(d.stored), quoted(d.now)),
                    None if *s != slots => ("slots".into(), s.to_string(), slots.to_string()),
                    None => return None,
                };
                Some((*t, why))
            })
            .collect();
        others.sort_by_key(|(t, _)| *t);
        let (_, (field, there, here)) = others.first()?;
        let holders: Vec<String> = others
            .iter()
            .map(|(t, _)| named(*t).unwrap_or_else(|| format!("the lease of generation {}", t.0)))
            .collect();
        Some(format!(
            "kept pool `{}`'s CPU tier is shared by {} for another identity: `{field}` is {there} \
             there, {here} here; tenants share a tier when every field but the engine id and DP \
             index matches: start this engine with the same config, or on another keeper",
            self.name,
            holders.join(", ")
        ))
    }

    /// Lease `tenant` ended (released, or died anywhere): its writes in
    /// flight are dropped and its holds released, its place is free, and
    /// its identity no longer holds the tier.
    pub(super) fn reap(&mut self, tenant: TenantId) {
        self.opened.remove(&tenant);
        self.rejoined.remove(&tenant);
        self.figures.remove(&tenant);
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

    /// The pool is being cleared: no tier until an engine opens it or
    /// formats an index again.
    pub(super) fn forget(&mut self) {
        self.tier = None;
        self.places.clear();
        self.opened.clear();
        self.rejoined.clear();
        self.storers.clear();
        self.figures.clear();
        self.after.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FP: [(&str, &str); 2] = [("model", "m"), ("block_size", "16")];

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

    /// A tier of kept pool `kv0` over `words`.
    fn server(words: &[AtomicU64]) -> TierServer<'_> {
        TierServer::new("kv0".into(), words, 4096)
    }

    /// Tenants named as the state names them: `engine `eN` (pid N)`.
    fn names(t: TenantId) -> Option<String> {
        Some(format!("engine `e{0}` (pid {0})", t.0))
    }

    fn ask(t: &mut TierServer<'_>, tenant: TenantId, op: TierOp) -> TierReply {
        t.serve(tenant, op, &names)
    }

    /// An open for `slots` and `fields`.
    fn open(slots: u64, fields: &[(&str, &str)]) -> TierOp {
        TierOp::Open {
            slots,
            fingerprint: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            rejoin: None,
        }
    }

    fn store(keys: &[&[u8]]) -> TierOp {
        TierOp::Store {
            keys: keys.iter().map(|k| k.to_vec()).collect(),
        }
    }

    fn load(keys: &[&[u8]]) -> TierOp {
        TierOp::Load {
            keys: keys.iter().map(|k| k.to_vec()).collect(),
        }
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

    fn refusal(reply: TierReply) -> String {
        match reply {
            TierReply::Refused { message } => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// Two leases share one tier by message: what one stores the other
    /// loads from the same slot; a store of a key in flight is told so; a
    /// lease that ends leaves no write in flight and no hold.
    #[test]
    fn two_leases_share_one_tier_and_an_ended_one_leaves_nothing() {
        let words = pool(64, 8, true);
        let mut t = server(&words);
        let (a, b) = (TenantId(1), TenantId(2));
        let slots = granted(ask(&mut t, a, store(&[b"x"])));
        assert_eq!(
            ask(&mut t, b, store(&[b"x"])),
            TierReply::Puts(vec![TierPut::InFlight])
        );
        assert_eq!(
            ask(
                &mut t,
                a,
                TierOp::Stored {
                    slots: slots.clone()
                }
            ),
            TierReply::Done(1)
        );
        assert_eq!(
            ask(&mut t, b, load(&[b"x", b"y"])),
            TierReply::Loads(vec![Some(slots[0]), None])
        );
        // b dies holding x, with a write in flight.
        granted(ask(&mut t, b, store(&[b"y"])));
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
        let mut t = server(&words);
        let message = refusal(ask(&mut t, TenantId(1), load(&[b"x"])));
        assert!(message.contains("holds no index"), "{message}");
        let fp = Fingerprint::new([("model", "m")]).unwrap();
        Index::attach_tail(&words, 8, 4096, &fp).unwrap();
        granted(ask(&mut t, TenantId(1), store(&[b"x"])));
        let seed = t.tier.as_ref().unwrap().0;
        // Another identity formats it afresh: the in-flight state goes.
        let other = Fingerprint::new([("model", "n")]).unwrap();
        Index::attach_tail(&words, 8, 4096, &other).unwrap();
        assert_eq!(
            ask(&mut t, TenantId(1), load(&[b"x"])),
            TierReply::Loads(vec![None])
        );
        assert_ne!(t.tier.as_ref().unwrap().0, seed);
        assert_eq!(t.tier.as_ref().unwrap().1.counts().writing, 0);
    }

    /// The keeper formats the index for the first tenant that opens the
    /// tier (cold), and a second of the same identity finds it warm with
    /// its records. Another identity, or another number of slots, is
    /// refused while a tenant of the first is in the tier, naming the field,
    /// both values and every tenant holding it, and the index is untouched;
    /// once they are gone it opens cold, naming the field.
    #[test]
    fn another_identity_is_refused_while_a_tenant_holds_the_tier_and_opens_cold_after() {
        let words = pool(64, 0, false);
        let mut t = server(&words);
        let (a, b, c) = (TenantId(1), TenantId(2), TenantId(3));
        assert_eq!(
            ask(&mut t, a, open(8, &FP)),
            TierReply::Opened {
                warm: false,
                reason: Some("the kept pool holds no index (new, or cleared)".into()),
                field: None,
                rejoined: None,
            }
        );
        let [slot] = granted(ask(&mut t, a, store(&[b"x"])))[..] else {
            panic!("one slot");
        };
        assert_eq!(
            ask(&mut t, a, TierOp::Stored { slots: vec![slot] }),
            TierReply::Done(1)
        );
        let seed = t.tier.as_ref().unwrap().0;
        assert_eq!(
            ask(&mut t, b, open(8, &FP)),
            TierReply::Opened {
                warm: true,
                reason: None,
                field: None,
                rejoined: None,
            }
        );
        // Another model: refused, naming both tenants that hold the tier.
        let message = refusal(ask(
            &mut t,
            c,
            open(8, &[("model", "n"), ("block_size", "16")]),
        ));
        assert_eq!(
            message,
            "kept pool `kv0`'s CPU tier is shared by engine `e1` (pid 1), engine `e2` (pid 2) for \
             another identity: `model` is \"m\" there, \"n\" here; tenants share a tier when every \
             field but the engine id and DP index matches: start this engine with the same \
             config, or on another keeper"
        );
        // A field the holders do not give, and another number of slots.
        let message = refusal(ask(
            &mut t,
            c,
            open(8, &[("model", "m"), ("block_size", "16"), ("tp", "2")]),
        ));
        assert!(
            message.contains("`tp` is not given there, \"2\" here"),
            "{message}"
        );
        let message = refusal(ask(&mut t, c, open(16, &FP)));
        assert!(message.contains("`slots` is 8 there, 16 here"), "{message}");
        // Nothing was touched: the same index, its record, a's tier.
        let index = Index::resume_tail(&words, 4096).unwrap();
        assert_eq!((index.seed(), index.find(b"x")), (seed, Some(slot)));
        assert_eq!(t.tier.as_ref().unwrap().0, seed);
        assert!(!t.places.contains_key(&c), "a refused open takes no place");
        // One holder gone: the other still holds it, and alone is named.
        t.reap(a);
        let message = refusal(ask(&mut t, c, open(8, &[("model", "n")])));
        assert!(
            message.contains("shared by engine `e2` (pid 2) for another identity"),
            "{message}"
        );
        // Both gone: the other identity opens cold, naming the field.
        t.reap(b);
        assert_eq!(
            ask(&mut t, c, open(8, &[("model", "n"), ("block_size", "16")])),
            TierReply::Opened {
                warm: false,
                reason: Some("`model` differs: stored m, now n".into()),
                field: Some(("model".into(), Some("m".into()), Some("n".into()))),
                rejoined: None,
            }
        );
        assert_ne!(t.tier.as_ref().unwrap().0, seed, "the tier is made again");
        assert_eq!(ask(&mut t, c, load(&[b"x"])), TierReply::Loads(vec![None]));
        // A tenant alone may open again for another identity; a tenant that
        // never opened holds no identity.
        assert!(matches!(
            ask(&mut t, c, open(8, &FP)),
            TierReply::Opened { warm: false, .. }
        ));
        granted(ask(&mut t, TenantId(4), store(&[b"y"])));
        assert!(matches!(
            ask(&mut t, c, open(8, &FP)),
            TierReply::Opened { warm: true, .. }
        ));
    }

    /// An open the pool cannot hold, or with a fingerprint an index cannot
    /// take, is refused saying why.
    #[test]
    fn an_open_the_pool_cannot_hold_is_refused_saying_why() {
        let words = pool(4, 0, false);
        let mut t = server(&words);
        let message = refusal(ask(&mut t, TenantId(1), open(1 << 20, &FP)));
        assert!(
            message.starts_with(
                "kept pool `kv0` cannot hold the CPU tier's index of 1048576 slots: an index of"
            ) && message.contains("restart the keeper with a larger --size"),
            "{message}"
        );
        let message = refusal(ask(&mut t, TenantId(1), open(8, &[("a=b", "1")])));
        assert!(
            message.starts_with("kept pool `kv0`'s CPU tier cannot be opened for this identity"),
            "{message}"
        );
        assert!(t.opened.is_empty());
    }

    /// A hold follows the chain of a store batch: a prefix stored in one
    /// batch by one tenant is held by another in one message, as far as
    /// the asked-for count, stopping at a block being written; the chain a
    /// later batch stores through a slot replaces the earlier; a held
    /// block is never granted; holds released unread are no hits.
    #[test]
    fn a_hold_takes_the_blocks_stored_after_the_key_in_one_message() {
        let words = pool(64, 0, false);
        let mut t = server(&words);
        let (a, b) = (TenantId(1), TenantId(2));
        for x in [a, b] {
            assert!(matches!(
                ask(&mut t, x, open(16, &FP)),
                TierReply::Opened { .. }
            ));
        }
        let hold = |t: &mut TierServer<'_>, x, key: &[u8], ahead| match ask(
            t,
            x,
            TierOp::Hold {
                key: key.to_vec(),
                ahead,
            },
        ) {
            TierReply::Held(held) => held,
            other => panic!("{other:?}"),
        };
        let held_keys = |held: &[(Vec<u8>, u64)]| -> Vec<Vec<u8>> {
            held.iter().map(|(k, _)| k.clone()).collect()
        };
        let release = |t: &mut TierServer<'_>, x, held: &[(Vec<u8>, u64)]| {
            let slots = held.iter().map(|(_, s)| *s).collect();
            ask(t, x, TierOp::Release { slots })
        };
        let p = granted(ask(&mut t, a, store(&[b"p0", b"p1", b"p2", b"p3"])));
        let stored = |s: &[u64]| TierOp::Stored { slots: s.to_vec() };
        ask(&mut t, a, stored(&p[..3]));
        // p3 is still being written: the chain stops before it.
        let held = hold(&mut t, b, b"p0", 8);
        assert_eq!(held_keys(&held), [b"p0", b"p1", b"p2"].map(|k| k.to_vec()));
        assert_eq!(held.iter().map(|(_, s)| *s).collect::<Vec<_>>(), p[..3]);
        assert_eq!(release(&mut t, b, &held), TierReply::Done(3));
        ask(&mut t, a, stored(&p[3..]));
        // As far as asked, from any key of the chain; a miss holds nothing.
        let held = hold(&mut t, b, b"p2", 1);
        assert_eq!(held_keys(&held), [b"p2", b"p3"].map(|k| k.to_vec()));
        release(&mut t, b, &held);
        assert!(hold(&mut t, b, b"none", 8).is_empty());
        // A later batch through p1 goes on to q2: the chain follows it.
        let puts = ask(&mut t, b, store(&[b"p1", b"q2"]));
        let TierReply::Puts(puts) = puts else {
            panic!("{puts:?}")
        };
        let TierPut::Granted { slot: q2, .. } = puts[1] else {
            panic!("{puts:?}")
        };
        assert_eq!(puts[0], TierPut::Stored { slot: p[1] });
        ask(&mut t, b, stored(&[q2]));
        let held = hold(&mut t, a, b"p0", 8);
        assert_eq!(held_keys(&held), [b"p0", b"p1", b"q2"].map(|k| k.to_vec()));
        // Held blocks are never granted, whoever floods.
        for i in 0..40u8 {
            let TierReply::Puts(puts) = ask(&mut t, b, store(&[&[b'f', i]])) else {
                panic!("puts")
            };
            if let TierPut::Granted { slot, .. } = puts[0] {
                assert!(
                    held.iter().all(|(_, s)| *s != slot),
                    "a held slot was granted"
                );
                ask(&mut t, b, stored(&[slot]));
            }
        }
        // Read p0 and p1 (a's own), q2 (b's) released unread: two hits,
        // none another's.
        let slots: Vec<u64> = held.iter().map(|(_, s)| *s).collect();
        assert_eq!(
            ask(
                &mut t,
                a,
                TierOp::Loaded {
                    slots: slots[..2].to_vec()
                }
            ),
            TierReply::Done(2)
        );
        assert_eq!(
            ask(
                &mut t,
                a,
                TierOp::Release {
                    slots: slots[2..].to_vec()
                }
            ),
            TierReply::Done(1)
        );
        let f = t.figures(a);
        assert_eq!((f.hits, f.hits_from_others), (2, 0));
        assert_eq!(t.figures(b).hits, 0, "b released every hold unread");
    }

    /// Each tenant's figures: blocks it stored, keys its loads found, and
    /// of those the blocks it did not store; a slot granted again is no
    /// longer its storer's; a reaped tenant's figures go.
    #[test]
    fn each_tenant_counts_its_stores_its_hits_and_the_hits_others_stored() {
        let words = pool(64, 0, false);
        let mut t = server(&words);
        let (a, b) = (TenantId(1), TenantId(2));
        for x in [a, b] {
            assert!(matches!(
                ask(&mut t, x, open(2, &FP)),
                TierReply::Opened { .. }
            ));
        }
        let slots = granted(ask(&mut t, a, store(&[b"x", b"y"])));
        assert_eq!(
            ask(
                &mut t,
                a,
                TierOp::Stored {
                    slots: slots.clone()
                }
            ),
            TierReply::Done(2)
        );
        // b loads both (and a miss), a loads y: b's hits are a's blocks.
        ask(&mut t, b, load(&[b"x", b"y", b"z"]));
        ask(&mut t, a, load(&[b"y"]));
        ask(
            &mut t,
            b,
            TierOp::Loaded {
                slots: slots.clone(),
            },
        );
        ask(
            &mut t,
            a,
            TierOp::Loaded {
                slots: vec![slots[1]],
            },
        );
        let f = |stored, hits, hits_from_others| TierFigures {
            stored,
            hits,
            hits_from_others,
        };
        assert_eq!(t.figures(a), f(2, 1, 0));
        assert_eq!(t.figures(b), f(0, 2, 2));
        // b stores z over the oldest (x): x's slot is b's now, and a's
        // load of z is another's block.
        let [z] = granted(ask(&mut t, b, store(&[b"z"])))[..] else {
            panic!("one slot");
        };
        assert_eq!(z, slots[0], "x was the oldest use");
        ask(&mut t, b, TierOp::Stored { slots: vec![z] });
        ask(&mut t, a, load(&[b"z"]));
        ask(&mut t, b, load(&[b"z"]));
        // A hold counts once read (released as read), not before.
        assert_eq!(t.figures(a), f(2, 1, 0));
        ask(&mut t, a, TierOp::Loaded { slots: vec![z] });
        ask(&mut t, b, TierOp::Loaded { slots: vec![z] });
        assert_eq!(t.figures(a), f(2, 2, 1));
        assert_eq!(t.figures(b), f(1, 3, 2));
        // An aborted store counts nothing.
        let [w] = granted(ask(&mut t, a, store(&[b"w"])))[..] else {
            panic!("one slot");
        };
        ask(&mut t, a, TierOp::Abort { slots: vec![w] });
        assert_eq!(t.figures(a), f(2, 2, 1));
        t.reap(a);
        assert_eq!(t.figures(a), TierFigures::default());
        assert_eq!(t.figures(b), f(1, 3, 2));
    }

    /// A tenant that comes back after its keeper's restart gets its stores
    /// in flight and its holds again before any other tenant can be granted
    /// them; what it no longer can have is left out.
    #[test]
    fn a_tenant_that_rejoins_has_its_stores_in_flight_and_holds_again() {
        let words = pool(64, 8, true);
        // The keeper before: a stored, b storing `w` at a slot.
        let mut before = server(&words);
        let (a, b) = (TenantId(1), TenantId(2));
        assert!(matches!(
            ask(&mut before, a, open(8, &[("model", "m")])),
            TierReply::Opened { .. }
        ));
        let [kept] = granted(ask(&mut before, a, store(&[b"kept"])))[..] else {
            panic!()
        };
        ask(&mut before, a, TierOp::Stored { slots: vec![kept] });
        let [w] = granted(ask(&mut before, b, store(&[b"w"])))[..] else {
            panic!()
        };
        drop(before);
        // The restarted keeper: a new tier over the same index.
        let mut t = server(&words);
        let rejoin = hostpool_handoff::Rejoin {
            writing: vec![(w, b"w".to_vec()), (kept, b"stolen".to_vec())],
            holding: vec![b"kept".to_vec(), b"missing".to_vec()],
        };
        let mut op = open(8, &[("model", "m")]);
        if let TierOp::Open { rejoin: r, .. } = &mut op {
            *r = Some(rejoin);
        }
        let TierReply::Opened {
            warm: true,
            rejoined: Some(back),
            ..
        } = ask(&mut t, b, op)
        else {
            panic!("a warm open with what b has again");
        };
        // Its store in flight is its again; a recorded slot is not.
        assert_eq!(back.claimed, vec![w]);
        assert_eq!(back.held, vec![(b"kept".to_vec(), kept)]);
        assert_eq!(t.rejoined(), vec![b]);
        // Another tenant is granted neither: `w` is in flight, `kept` held.
        let c = TenantId(3);
        assert!(matches!(
            ask(&mut t, c, open(8, &[("model", "m")])),
            TierReply::Opened { .. }
        ));
        assert_eq!(
            ask(&mut t, c, store(&[b"w"])),
            TierReply::Puts(vec![TierPut::InFlight])
        );
        for i in 0..16u8 {
            if let TierReply::Puts(p) = ask(&mut t, c, store(&[&[i, 0xee][..]])) {
                for put in p {
                    if let TierPut::Granted { slot, .. } = put {
                        assert!(slot != w && slot != kept, "{slot} granted to another");
                        ask(&mut t, c, TierOp::Stored { slots: vec![slot] });
                    }
                }
            }
        }
        // b completes its store: recorded, a hit for c.
        assert_eq!(
            ask(&mut t, b, TierOp::Stored { slots: vec![w] }),
            TierReply::Done(1)
        );
        assert_eq!(
            ask(&mut t, c, load(&[b"w"])),
            TierReply::Loads(vec![Some(w)])
        );
        t.reap(b);
        assert!(t.rejoined().is_empty());
    }
}
