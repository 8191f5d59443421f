//! One CPU tier for several engines (tenants) on one kept pool: which slot
//! each store goes to, which slots a load holds, the one order of last use
//! that eviction follows across tenants, and what a tenant that dies leaves
//! (nothing: its writes in flight are dropped, its holds released).
//!
//! A [`Tier`] is the tier's only writer: the keeper holds it, over the
//! index in its pool, and the tenants ask it by message, one message a
//! batch (see `docs/design.md`, "One CPU tier for the engines of a node").
//! A tenant reads the index itself to look a key up ([`Index::find`], a few
//! loads, no system call) and writes a slot's bytes only between the
//! [`Tier::prepare_store`] that granted the slot and its
//! [`Tier::complete_store`]; it reads a slot's bytes only between the
//! [`Tier::prepare_load`] that held it and its [`Tier::complete_load`].
//! So:
//!
//! - a slot being written is no tenant's hit: it is recorded in the index
//!   only at its `complete_store`;
//! - a slot held for a load is never handed to a store or evicted: it
//!   leaves the order of last use while held;
//! - two tenants storing one key end with one record: the second is told
//!   the key is in flight, or stored;
//! - a tenant gone ([`Tier::reap`]) leaves no slot half written (its
//!   grants go back to the free slots, never recorded) and no hold.
//!
//! The tier's state besides the index (who writes what, who holds what,
//! the order of last use) lives in the writer's memory: a new writer
//! rebuilds it from the index ([`Tier::new`]), whose records are all
//! complete by construction.

use std::collections::HashMap;

use crate::{Error, Index};

/// A tenant of the tier, by its place among the tenants (below
/// [`MAX_TENANTS`]).
pub type Tenant = u8;

/// The most tenants one tier serves.
pub const MAX_TENANTS: usize = 64;

/// No slot, in the order of last use.
const NONE: u32 = u32::MAX;

/// A slot's state.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    /// No key: free to store into.
    Free,
    /// Granted to `tenant` to write `key`'s bytes; recorded once it says
    /// they are complete.
    Writing { tenant: Tenant, key: Vec<u8> },
    /// Holds `key`'s bytes, stored by `by`.
    Recorded { by: Tenant },
}

/// What [`Tier::prepare_store`] answers for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Put {
    /// Write the key's bytes into `slot`, then [`Tier::complete_store`];
    /// `evicted` is the key the slot held before, if it held one.
    Granted {
        /// The slot to write.
        slot: u64,
        /// The key evicted to make room.
        evicted: Option<Vec<u8>>,
    },
    /// The key is stored already, in this slot.
    Stored(u64),
    /// Another store of the key is in flight (this tenant's or another's).
    InFlight,
    /// Every slot is being written or held: no room now.
    NoRoom,
}

/// What [`Tier::reap`] dropped of a tenant that went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reaped {
    /// Slots it was writing, free again.
    pub writes: u64,
    /// Holds it had, released.
    pub holds: u64,
}

/// How the tier's slots stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Free slots.
    pub free: u64,
    /// Slots being written.
    pub writing: u64,
    /// Recorded slots (held or not).
    pub recorded: u64,
    /// Recorded slots that some tenant holds for a load.
    pub held: u64,
}

/// What one tenant did in the tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Figures {
    /// Blocks it stored.
    pub stored: u64,
    /// Loads of blocks it stored itself.
    pub hits_own: u64,
    /// Loads of blocks another tenant stored: what sharing the tier gave it.
    pub hits_others: u64,
}

/// The tier over an index: its only writer.
#[derive(Debug)]
pub struct Tier<'a> {
    index: Index<'a>,
    slots: Vec<Slot>,
    /// Per slot, the tenants holding it for a load, and how many times.
    holds: Vec<Vec<(Tenant, u32)>>,
    /// Free slots (a stack).
    free: Vec<u32>,
    /// Keys being written, and their slots.
    writing: HashMap<Vec<u8>, u32>,
    /// The order of last use of the recorded slots no tenant holds: a
    /// doubly linked list, oldest at `oldest`.
    prev: Vec<u32>,
    next: Vec<u32>,
    oldest: u32,
    newest: u32,
    figures: Vec<Figures>,
}

impl<'a> Tier<'a> {
    /// The tier over `index`, as it stands: its records in their order of
    /// last use, every other slot free. A record's storer is not kept in
    /// the index: records found at the start count as stored by tenant 0.
    pub fn new(index: Index<'a>) -> Tier<'a> {
        let capacity = usize::try_from(index.capacity()).unwrap_or(usize::MAX);
        let survey = index.survey();
        let mut tier = Tier {
            slots: vec![Slot::Free; capacity],
            holds: vec![Vec::new(); capacity],
            free: Vec::with_capacity(capacity),
            writing: HashMap::new(),
            prev: vec![NONE; capacity],
            next: vec![NONE; capacity],
            oldest: NONE,
            newest: NONE,
            figures: vec![Figures::default(); MAX_TENANTS],
            index,
        };
        // Lowest slots first off the stack.
        tier.free
            .extend(survey.free.iter().rev().map(|s| slot32(*s)));
        for slot in survey.recorded {
            tier.slots[slot as usize] = Slot::Recorded { by: 0 };
            tier.push_newest(slot32(slot));
        }
        tier
    }

    /// The index the tier writes.
    pub fn index(&self) -> &Index<'a> {
        &self.index
    }

    /// Ask to store `key`: a slot to write it into, or why not.
    ///
    /// # Errors
    /// [`Error::KeyTooLong`].
    pub fn prepare_store(&mut self, tenant: Tenant, key: &[u8]) -> Result<Put, Error> {
        if key.len() > crate::MAX_KEY {
            return Err(Error::KeyTooLong { len: key.len() });
        }
        if self.writing.contains_key(key) {
            return Ok(Put::InFlight);
        }
        if let Some(slot) = self.recorded(key) {
            return Ok(Put::Stored(slot));
        }
        let (slot, evicted) = match self.free.pop() {
            Some(slot) => (slot, None),
            None => {
                let slot = self.oldest;
                if slot == NONE {
                    return Ok(Put::NoRoom);
                }
                self.unlink(slot);
                let evicted = self.index.get(u64::from(slot))?.map(|e| e.key);
                self.index.unrecord(u64::from(slot))?;
                (slot, evicted)
            }
        };
        self.slots[slot as usize] = Slot::Writing {
            tenant,
            key: key.to_vec(),
        };
        self.writing.insert(key.to_vec(), slot);
        Ok(Put::Granted {
            slot: u64::from(slot),
            evicted,
        })
    }

    /// `tenant` was granted `slot` to write `key` by a keeper before this
    /// tier's (it said so when it came back, after its keeper's restart):
    /// the slot is its to write again, as if granted now, when it is free
    /// and `key` is neither stored nor being written; `false` (and nothing
    /// done) otherwise.
    ///
    /// # Errors
    /// [`Error::NoSlot`], [`Error::KeyTooLong`].
    pub fn claim_write(&mut self, tenant: Tenant, slot: u64, key: &[u8]) -> Result<bool, Error> {
        let i = self.place(slot)?;
        if key.len() > crate::MAX_KEY {
            return Err(Error::KeyTooLong { len: key.len() });
        }
        if self.slots[i] != Slot::Free
            || self.writing.contains_key(key)
            || self.recorded(key).is_some()
        {
            return Ok(false);
        }
        let slot32 = slot32(slot);
        self.free.retain(|s| *s != slot32);
        self.slots[i] = Slot::Writing {
            tenant,
            key: key.to_vec(),
        };
        self.writing.insert(key.to_vec(), slot32);
        Ok(true)
    }

    /// `tenant` wrote the bytes of the key granted it at `slot`
    /// completely: the slot is recorded, the newest in the order of last
    /// use. `false` (and nothing done) when the slot is not one this
    /// tenant is writing.
    ///
    /// # Errors
    /// [`Error::NoSlot`].
    pub fn complete_store(&mut self, tenant: Tenant, slot: u64) -> Result<bool, Error> {
        let i = self.place(slot)?;
        let Slot::Writing { tenant: t, key } = &self.slots[i] else {
            return Ok(false);
        };
        if *t != tenant {
            return Ok(false);
        }
        let key = key.clone();
        self.index.record(slot, &key)?;
        self.writing.remove(&key);
        self.slots[i] = Slot::Recorded { by: tenant };
        self.push_newest(slot32(slot));
        self.figures_mut(tenant).stored += 1;
        Ok(true)
    }

    /// `tenant` gives up writing `slot`: it is free again, never recorded.
    /// `false` when the slot is not one this tenant is writing.
    ///
    /// # Errors
    /// [`Error::NoSlot`].
    pub fn abort_store(&mut self, tenant: Tenant, slot: u64) -> Result<bool, Error> {
        let i = self.place(slot)?;
        match &self.slots[i] {
            Slot::Writing { tenant: t, .. } if *t == tenant => {
                self.drop_write(i);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Hold `key`'s slot for a load by `tenant`: it is neither evicted nor
    /// overwritten until [`Tier::complete_load`]. `None` when the key is not
    /// recorded (a miss).
    pub fn prepare_load(&mut self, tenant: Tenant, key: &[u8]) -> Option<u64> {
        let slot = self.recorded(key)?;
        let i = slot as usize;
        let Slot::Recorded { by } = self.slots[i] else {
            return None;
        };
        if self.holds[i].is_empty() {
            self.unlink(slot32(slot));
        }
        match self.holds[i].iter_mut().find(|(t, _)| *t == tenant) {
            Some((_, n)) => *n += 1,
            None => self.holds[i].push((tenant, 1)),
        }
        let _ = self.index.touch(slot);
        let f = self.figures_mut(tenant);
        if by == tenant {
            f.hits_own += 1;
        } else {
            f.hits_others += 1;
        }
        Some(slot)
    }

    /// `tenant` read `slot`'s bytes: one hold of its released (the slot
    /// goes back to the order of last use, newest, once no tenant holds
    /// it). `false` when `tenant` held no such slot.
    ///
    /// # Errors
    /// [`Error::NoSlot`].
    pub fn complete_load(&mut self, tenant: Tenant, slot: u64) -> Result<bool, Error> {
        let i = self.place(slot)?;
        let Some(at) = self.holds[i].iter().position(|(t, _)| *t == tenant) else {
            return Ok(false);
        };
        self.holds[i][at].1 -= 1;
        if self.holds[i][at].1 == 0 {
            self.holds[i].swap_remove(at);
        }
        if self.holds[i].is_empty() {
            self.push_newest(slot32(slot));
        }
        Ok(true)
    }

    /// Note a use of `key` (the newest in the order of last use); nothing
    /// for a key not recorded.
    pub fn touch(&mut self, key: &[u8]) {
        let Some(slot) = self.recorded(key) else {
            return;
        };
        if self.holds[slot as usize].is_empty() {
            self.unlink(slot32(slot));
            self.push_newest(slot32(slot));
        }
        let _ = self.index.touch(slot);
    }

    /// `tenant` went (released, or died anywhere): its writes in flight
    /// are dropped (their slots free, never recorded) and its holds
    /// released.
    pub fn reap(&mut self, tenant: Tenant) -> Reaped {
        let mut reaped = Reaped::default();
        for i in 0..self.slots.len() {
            if matches!(&self.slots[i], Slot::Writing { tenant: t, .. } if *t == tenant) {
                self.drop_write(i);
                reaped.writes += 1;
            }
            if let Some(at) = self.holds[i].iter().position(|(t, _)| *t == tenant) {
                reaped.holds += u64::from(self.holds[i][at].1);
                self.holds[i].swap_remove(at);
                if self.holds[i].is_empty() {
                    self.push_newest(slot32(i as u64));
                }
            }
        }
        reaped
    }

    /// How the slots stand.
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for (i, s) in self.slots.iter().enumerate() {
            match s {
                Slot::Free => c.free += 1,
                Slot::Writing { .. } => c.writing += 1,
                Slot::Recorded { .. } => {
                    c.recorded += 1;
                    if !self.holds[i].is_empty() {
                        c.held += 1;
                    }
                }
            }
        }
        c
    }

    /// What `tenant` did.
    pub fn figures(&self, tenant: Tenant) -> Figures {
        self.figures
            .get(usize::from(tenant))
            .copied()
            .unwrap_or_default()
    }

    /// The recorded slots no tenant holds, oldest use first: the order
    /// eviction takes them in.
    pub fn order(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut at = self.oldest;
        while at != NONE {
            out.push(u64::from(at));
            at = self.next[at as usize];
        }
        out
    }

    fn figures_mut(&mut self, tenant: Tenant) -> &mut Figures {
        let i = usize::from(tenant).min(MAX_TENANTS - 1);
        &mut self.figures[i]
    }

    /// The slot recorded for `key`, as the tier knows it.
    fn recorded(&self, key: &[u8]) -> Option<u64> {
        let slot = self.index.find(key)?;
        matches!(self.slots.get(slot as usize), Some(Slot::Recorded { .. })).then_some(slot)
    }

    fn place(&self, slot: u64) -> Result<usize, Error> {
        usize::try_from(slot)
            .ok()
            .filter(|i| *i < self.slots.len())
            .ok_or(Error::NoSlot {
                slot,
                capacity: self.index.capacity(),
            })
    }

    /// A write in flight at `i` dropped: the slot free again.
    fn drop_write(&mut self, i: usize) {
        if let Slot::Writing { key, .. } = std::mem::replace(&mut self.slots[i], Slot::Free) {
            self.writing.remove(&key);
        }
        self.free.push(slot32(i as u64));
    }

    fn unlink(&mut self, slot: u32) {
        let i = slot as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NONE && n == NONE && self.oldest != slot {
            return;
        }
        match p {
            NONE => self.oldest = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NONE => self.newest = p,
            n => self.prev[n as usize] = p,
        }
        self.prev[i] = NONE;
        self.next[i] = NONE;
    }

    fn push_newest(&mut self, slot: u32) {
        let i = slot as usize;
        self.prev[i] = self.newest;
        self.next[i] = NONE;
        match self.newest {
            NONE => self.oldest = slot,
            n => self.next[n as usize] = slot,
        }
        self.newest = slot;
    }
}

/// A slot number as the tier's lists keep it (an index has at most
/// [`crate::MAX_CAPACITY`] slots, below `u32::MAX`).
fn slot32(slot: u64) -> u32 {
    u32::try_from(slot).unwrap_or(NONE - 1)
}

#[cfg(test)]
mod tests;
