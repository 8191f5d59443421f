use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;

use proptest::prelude::*;

use super::*;
use crate::{Fingerprint, words_for};

fn memory(capacity: u64) -> Vec<AtomicU64> {
    (0..words_for(capacity).unwrap())
        .map(|_| AtomicU64::new(0))
        .collect()
}

fn fp() -> Fingerprint {
    Fingerprint::new([("model", "m"), ("block_size", "16")]).unwrap()
}

fn tier(mem: &[AtomicU64], capacity: u64) -> Tier<'_> {
    Tier::new(Index::attach(mem, capacity, &fp()).unwrap().0)
}

fn granted(put: Put) -> u64 {
    match put {
        Put::Granted { slot, .. } => slot,
        other => panic!("not granted: {other:?}"),
    }
}

/// Every slot is free, written, or recorded (held or not), once; the
/// order of last use holds exactly the recorded slots no tenant holds.
fn consistent(t: &Tier<'_>) {
    let c = t.counts();
    assert_eq!(
        c.free + c.writing + c.recorded,
        t.index().capacity(),
        "{c:?}"
    );
    assert_eq!(t.order().len() as u64, c.recorded - c.held, "{c:?}");
    assert_eq!(t.index().len() as u64, c.recorded, "{c:?}");
}

/// A block one engine stored is a hit for another, from the same slot;
/// each tenant's figures say who stored what and who was served.
#[test]
fn a_block_stored_by_one_tenant_is_a_hit_for_another() {
    let mem = memory(4);
    let mut t = tier(&mem, 4);
    let slot = granted(t.prepare_store(0, b"a").unwrap());
    assert_eq!(t.index().find(b"a"), None, "not a hit while written");
    assert_eq!(t.prepare_load(1, b"a"), None);
    assert!(t.complete_store(0, slot).unwrap());
    assert_eq!(t.index().find(b"a"), Some(slot));
    assert_eq!(t.prepare_load(1, b"a"), Some(slot));
    assert!(t.complete_load(1, slot).unwrap());
    assert_eq!(t.figures(0).stored, 1);
    assert_eq!((t.figures(1).hits_others, t.figures(1).hits_own), (1, 0));
    consistent(&t);
}

/// Two tenants storing one key: the second is told it is in flight, then
/// stored; one record.
#[test]
fn two_tenants_storing_one_key_end_with_one_record() {
    let mem = memory(4);
    let mut t = tier(&mem, 4);
    let slot = granted(t.prepare_store(0, b"k").unwrap());
    assert_eq!(t.prepare_store(1, b"k").unwrap(), Put::InFlight);
    assert!(!t.complete_store(1, slot).unwrap(), "not its grant");
    assert!(t.complete_store(0, slot).unwrap());
    assert_eq!(t.prepare_store(1, b"k").unwrap(), Put::Stored(slot));
    assert_eq!(t.index().entries().len(), 1);
    consistent(&t);
}

/// A slot held for a load survives another tenant flooding the tier; with
/// every other slot taken, a store finds no room rather than the held one.
#[test]
fn a_held_slot_survives_a_flood_of_stores() {
    let mem = memory(3);
    let mut t = tier(&mem, 3);
    let held = granted(t.prepare_store(1, b"held").unwrap());
    t.complete_store(1, held).unwrap();
    assert_eq!(t.prepare_load(1, b"held"), Some(held));
    for i in 0..50u32 {
        let key = i.to_le_bytes();
        match t.prepare_store(0, &key).unwrap() {
            Put::Granted { slot, .. } => {
                assert_ne!(slot, held, "a held slot is never granted");
                t.complete_store(0, slot).unwrap();
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(t.index().find(b"held"), Some(held));
    // Both other slots being written: no room, never the held one.
    let a = granted(t.prepare_store(0, b"x").unwrap());
    let b = granted(t.prepare_store(0, b"y").unwrap());
    assert!(a != held && b != held);
    assert_eq!(t.prepare_store(0, b"z").unwrap(), Put::NoRoom);
    assert!(t.complete_load(1, held).unwrap());
    // Released: the oldest recorded and unheld is evicted first.
    assert!(t.abort_store(0, a).unwrap());
    assert!(t.abort_store(0, b).unwrap());
    consistent(&t);
}

/// Eviction follows one order of last use across tenants.
#[test]
fn eviction_follows_one_order_of_last_use_across_tenants() {
    let mem = memory(3);
    let mut t = tier(&mem, 3);
    for (tenant, key) in [(0, b"a"), (1, b"b"), (0, b"c")] {
        let s = granted(t.prepare_store(tenant, key).unwrap());
        t.complete_store(tenant, s).unwrap();
    }
    // Tenant 1 uses a: b is now the oldest.
    t.touch(b"a");
    match t.prepare_store(1, b"d").unwrap() {
        Put::Granted { evicted, .. } => assert_eq!(evicted.as_deref(), Some(&b"b"[..])),
        other => panic!("{other:?}"),
    }
    consistent(&t);
}

/// A tenant that dies mid-store and holding loads leaves nothing: its
/// slots being written are free (never recorded), its holds released.
#[test]
fn a_tenant_that_dies_leaves_no_write_and_no_hold() {
    let mem = memory(4);
    let mut t = tier(&mem, 4);
    let s = granted(t.prepare_store(0, b"kept").unwrap());
    t.complete_store(0, s).unwrap();
    let w = granted(t.prepare_store(1, b"torn").unwrap());
    assert_eq!(t.prepare_load(1, b"kept"), Some(s));
    assert_eq!(t.prepare_load(1, b"kept"), Some(s));
    assert_eq!(
        t.reap(1),
        Reaped {
            writes: 1,
            holds: 2
        }
    );
    assert_eq!(t.index().find(b"torn"), None);
    assert!(
        !t.complete_store(1, w).unwrap(),
        "a dead tenant's grant is gone"
    );
    assert_eq!(
        t.counts(),
        Counts {
            free: 3,
            writing: 0,
            recorded: 1,
            held: 0
        }
    );
    // Its key can be stored again.
    granted(t.prepare_store(0, b"torn").unwrap());
    consistent(&t);
}

/// A new writer (a keeper that restarted on its pool, say) finds the
/// records in their order of use and every other slot free.
#[test]
fn a_new_tier_rebuilds_from_the_index() {
    let mem = memory(4);
    {
        let mut t = tier(&mem, 4);
        for key in [b"a", b"b"] {
            let s = granted(t.prepare_store(0, key).unwrap());
            t.complete_store(0, s).unwrap();
        }
        t.touch(b"a");
        granted(t.prepare_store(0, b"in flight").unwrap());
    }
    let t = tier(&mem, 4);
    let order: Vec<Vec<u8>> = t
        .order()
        .iter()
        .map(|s| t.index().get(*s).unwrap().unwrap().key)
        .collect();
    assert_eq!(order, [b"b".to_vec(), b"a".to_vec()]);
    assert_eq!(t.counts().free, 2);
    consistent(&t);
}

#[derive(Debug, Clone)]
enum Op {
    Store(Tenant, u8),
    Complete(Tenant, usize),
    Abort(Tenant, usize),
    Load(Tenant, u8),
    Release(Tenant, usize),
    Touch(u8),
    Reap(Tenant),
}

fn op() -> impl Strategy<Value = Op> {
    let t = 0u8..3;
    prop_oneof![
        (t.clone(), 0u8..12).prop_map(|(t, k)| Op::Store(t, k)),
        (t.clone(), 0usize..8).prop_map(|(t, i)| Op::Complete(t, i)),
        (t.clone(), 0usize..8).prop_map(|(t, i)| Op::Abort(t, i)),
        (t.clone(), 0u8..12).prop_map(|(t, k)| Op::Load(t, k)),
        (t.clone(), 0usize..8).prop_map(|(t, i)| Op::Release(t, i)),
        (0u8..12).prop_map(Op::Touch),
        t.prop_map(Op::Reap),
    ]
}

proptest! {
    /// Any interleaving of three tenants' stores, loads, touches and
    /// deaths: no key recorded twice, no held slot granted or evicted, a
    /// slot is recorded for the key its tenant was granted, and the free,
    /// written and recorded slots add up to the capacity; once every
    /// tenant is reaped, nothing is written or held.
    #[test]
    fn any_interleaving_keeps_the_tier_whole(ops in proptest::collection::vec(op(), 1..200)) {
        let mem = memory(5);
        let mut t = tier(&mem, 5);
        // What each tenant was granted and holds, in the test's own books.
        let mut grants: HashMap<Tenant, Vec<(u64, Vec<u8>)>> = HashMap::new();
        let mut holds: HashMap<Tenant, Vec<u64>> = HashMap::new();
        for op in ops {
            match op {
                Op::Store(tenant, k) => {
                    let key = vec![k];
                    if let Put::Granted { slot, .. } = t.prepare_store(tenant, &key).unwrap() {
                        let held: HashSet<u64> = holds.values().flatten().copied().collect();
                        prop_assert!(!held.contains(&slot), "a held slot was granted");
                        grants.entry(tenant).or_default().push((slot, key));
                    }
                }
                Op::Complete(tenant, i) => {
                    let mine = grants.entry(tenant).or_default();
                    if i < mine.len() {
                        let (slot, key) = mine.swap_remove(i);
                        prop_assert!(t.complete_store(tenant, slot).unwrap());
                        prop_assert_eq!(t.index().find(&key), Some(slot));
                    }
                }
                Op::Abort(tenant, i) => {
                    let mine = grants.entry(tenant).or_default();
                    if i < mine.len() {
                        let (slot, _) = mine.swap_remove(i);
                        prop_assert!(t.abort_store(tenant, slot).unwrap());
                    }
                }
                Op::Load(tenant, k) => {
                    if let Some(slot) = t.prepare_load(tenant, &[k]) {
                        let entry = t.index().get(slot).unwrap().unwrap();
                        prop_assert_eq!(entry.key, vec![k]);
                        holds.entry(tenant).or_default().push(slot);
                    }
                }
                Op::Release(tenant, i) => {
                    let mine = holds.entry(tenant).or_default();
                    if i < mine.len() {
                        let slot = mine.swap_remove(i);
                        prop_assert!(t.complete_load(tenant, slot).unwrap());
                    }
                }
                Op::Touch(k) => t.touch(&[k]),
                Op::Reap(tenant) => {
                    let written = grants.remove(&tenant).map_or(0, |g| g.len() as u64);
                    let held = holds.remove(&tenant).map_or(0, |h| h.len() as u64);
                    prop_assert_eq!(t.reap(tenant), Reaped { writes: written, holds: held });
                }
            }
            // Held slots stay recorded, with the key they were held for.
            for slot in holds.values().flatten() {
                prop_assert!(t.index().get(*slot).unwrap().is_some());
            }
            let keys: Vec<Vec<u8>> = t.index().entries().into_iter().map(|e| e.key).collect();
            let unique: HashSet<&Vec<u8>> = keys.iter().collect();
            prop_assert_eq!(unique.len(), keys.len(), "a key recorded twice");
            consistent(&t);
        }
        for tenant in 0..3 {
            t.reap(tenant);
        }
        let c = t.counts();
        prop_assert_eq!((c.writing, c.held), (0, 0));
        prop_assert_eq!(c.free + c.recorded, 5);
    }
}
