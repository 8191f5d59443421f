//! A crash-consistent index of what a kept pool holds: which slot of the
//! pool holds which key (a KV block's hash), in the order of its last use,
//! and the identity of what was stored (a [`Fingerprint`] of everything
//! that decides what a slot's bytes mean). An engine that restarts on a
//! kept pool reads it back and finds its CPU tier warm.
//!
//! The index is a run of eight-byte words in memory that outlives the
//! process writing it (a region of the kept pool itself: it lives and is
//! cleared with the pool, see `docs/design.md`), so it must stay readable
//! whenever that process dies, and it costs the writer no system call:
//! every operation is a few atomic loads and stores.
//!
//! - **A record is published last.** Each slot's record is its key, its
//!   last-use stamp and a check word, a hash of the record and its slot
//!   under the index's seed. Writing a record first clears its check
//!   (from then on the slot is empty to any reader), then writes the
//!   fields, then the check. A process killed anywhere in between leaves
//!   a record whose check is zero or does not match: it is ignored, never
//!   half-read.
//! - **Unrecorded before overwritten.** A slot about to be written for
//!   another key is unrecorded ([`Index::unrecord`]) before the write of
//!   its bytes starts, and recorded ([`Index::record`]) only after they
//!   were written completely: a slot the index names always holds the
//!   bytes of its key.
//! - **One writer.** One process writes an index at a time (the engine's
//!   scheduler, which owns the block-to-slot map); any may read it.
//! - **Another identity starts cold.** [`Index::attach`] compares the
//!   stored fingerprint with the engine's: another model, dtype, block
//!   size, layout or parallel rank (or no index at all, or a torn header)
//!   starts cold, names the field that differed, and formats the index
//!   afresh, empty, under a new seed, so no record of before can validate.
//! - **A key is found without reading the records.** After the records, a
//!   key table (open addressing, linear probing, a power of two of buckets,
//!   at least two per slot) maps a key's hash to its slot, so a restarted
//!   engine answers a lookup in a few loads however many slots the index
//!   has ([`Index::find`]). A bucket is one word: the slot plus one in its
//!   low half, a tag (the key's hash under the seed, never zero) in its high
//!   half; zero is empty. The table is a hint that every read validates: a
//!   bucket counts only when the record at its slot reads whole and holds
//!   the very key asked for. So it needs no crash consistency of its own: a
//!   writer killed between publishing a record and inserting its bucket
//!   leaves a record [`Index::find`] misses (a miss is always safe), and a
//!   bucket whose slot was unrecorded or recorded for another key is
//!   rejected, then reused by a later insert (stale). A bucket never goes
//!   back to empty (that would cut the probe runs through it) until the
//!   whole table is cleared; the header keeps the farthest any insert has
//!   placed a key from its home bucket, which bounds every probe, so a
//!   table whose buckets all went non-empty over a long churn still answers
//!   a missing key in a few probes.

use std::sync::atomic::{AtomicU64, Ordering, fence};

pub mod tier;

/// The first word of a formatted index.
pub const MAGIC: u64 = u64::from_le_bytes(*b"HPINDEX1");
/// The layout's version.
pub const VERSION: u64 = 2;
/// The longest key in bytes (vLLM's key is its block hash, 32 bytes for
/// sha256, and a 4-byte group index).
pub const MAX_KEY: usize = 64;
/// The longest fingerprint text in bytes.
pub const MAX_FINGERPRINT: usize = 4096;
/// The most records an index holds: a bucket of the key table names its
/// slot plus one in 32 bits.
pub const MAX_CAPACITY: u64 = u32::MAX as u64 - 1;

const KEY_WORDS: usize = MAX_KEY / 8;
const FP_WORDS: usize = MAX_FINGERPRINT / 8;

// The header, in words.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_CAPACITY: usize = 2;
const H_SEED: usize = 3;
const H_FP_LEN: usize = 4;
const H_FP_TEXT: usize = 5;
/// The header's check, over the words before it.
const H_CHECK: usize = H_FP_TEXT + FP_WORDS;
/// The last stamp given (outside the checked words: it moves).
const H_CLOCK: usize = H_CHECK + 1;
/// The farthest from its home bucket an insert has placed a key in the key
/// table (outside the checked words: it moves): no probe goes further.
const H_FARTHEST: usize = H_CLOCK + 1;
/// Words before the first record (the header, its check, the clock and the
/// farthest probe, rounded up to a 64-byte line).
const HEADER_WORDS: usize = (H_FARTHEST + 1).next_multiple_of(8);

// A record, in words.
const R_STAMP: usize = 0;
const R_LEN: usize = 1;
const R_KEY: usize = 2;
const R_CHECK: usize = R_KEY + KEY_WORDS;
const RECORD_WORDS: usize = R_CHECK + 1;

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The memory given is too small for the records asked for.
    #[error(
        "an index of {capacity} records needs {need} bytes, but {have} bytes were given; give \
         it more of the pool, or fewer records"
    )]
    TooSmall {
        /// Records asked for.
        capacity: u64,
        /// Bytes needed ([`bytes_for`]).
        need: u64,
        /// Bytes given.
        have: u64,
    },
    /// No records asked for.
    #[error("an index needs at least one record")]
    Empty,
    /// More records asked for than [`MAX_CAPACITY`].
    #[error("an index holds at most {MAX_CAPACITY} records, and {capacity} were asked for")]
    TooLarge {
        /// Records asked for.
        capacity: u64,
    },
    /// A slot past the index's capacity.
    #[error("slot {slot} is outside the index of {capacity} records")]
    NoSlot {
        /// The slot asked for.
        slot: u64,
        /// Records the index holds.
        capacity: u64,
    },
    /// A key longer than [`MAX_KEY`].
    #[error("a key of {len} bytes is longer than the index's {MAX_KEY}")]
    KeyTooLong {
        /// Its length.
        len: usize,
    },
    /// A fingerprint whose text is longer than [`MAX_FINGERPRINT`], or
    /// whose field or value holds a newline or (a field) an `=`.
    #[error("fingerprint: {0}")]
    Fingerprint(String),
}

/// The first word of an index's trailer: its last two words, this and its
/// capacity, by which a reader that knows only where the index ends (a
/// keeper reading its pool's tail) finds where it starts ([`locate`]).
pub const TRAILER_MAGIC: u64 = u64::from_le_bytes(*b"HPINDEXT");
const TRAILER_WORDS: usize = 2;

/// The words an index of `capacity` records takes (its header, records,
/// key table and trailer); `None` past [`MAX_CAPACITY`].
pub fn words_for(capacity: u64) -> Option<usize> {
    table_start(capacity)?
        .checked_add(buckets_for(capacity)?)?
        .checked_add(TRAILER_WORDS)
}

/// Where the key table starts: after the records, on a 64-byte line.
fn table_start(capacity: u64) -> Option<usize> {
    if capacity > MAX_CAPACITY {
        return None;
    }
    usize::try_from(capacity)
        .ok()?
        .checked_mul(RECORD_WORDS)?
        .checked_next_multiple_of(8)?
        .checked_add(HEADER_WORDS)
}

/// The key table's buckets: a power of two, at least two per record.
fn buckets_for(capacity: u64) -> Option<usize> {
    usize::try_from(capacity)
        .ok()?
        .checked_mul(2)?
        .checked_next_power_of_two()
}

/// The bytes an index of `capacity` records takes.
pub fn bytes_for(capacity: u64) -> Option<u64> {
    words_for(capacity).and_then(|w| u64::try_from(w).ok()?.checked_mul(8))
}

/// FNV-1a over words, never zero (zero is an empty record's check).
fn hash(words: impl IntoIterator<Item = u64>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h.max(1)
}

/// A key's hash under `seed` for the key table: the key's words (its
/// `len` bytes, zero-padded), each mixed in with splitmix64's finalizer.
/// Its low bits choose the home bucket, its high half is the tag.
fn key_hash(seed: u64, len: u64, key: &[u64; KEY_WORDS]) -> u64 {
    fn mix(mut x: u64) -> u64 {
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }
    let used = usize::try_from(len).map_or(KEY_WORDS, |l| l.div_ceil(8).min(KEY_WORDS));
    let mut h = mix(seed ^ len.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    for w in &key[..used] {
        h = mix(h ^ *w);
    }
    h
}

/// A hash's tag: its high half, never zero.
fn tag(hash: u64) -> u64 {
    (hash >> 32).max(1)
}

/// A bucket naming `slot` under `tag`.
fn bucket(slot: u64, tag: u64) -> u64 {
    (tag << 32) | (slot + 1)
}

/// A key packed into words, as a record holds it.
fn pack(key: &[u8]) -> [u64; KEY_WORDS] {
    let mut packed = [0u64; KEY_WORDS];
    for (w, c) in packed.iter_mut().zip(key.chunks(8)) {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        *w = u64::from_le_bytes(b);
    }
    packed
}

/// The identity of what a pool's slots hold: named fields in a fixed
/// order (the model and its revision, dtypes, block size, layout, the
/// parallel rank, the hash algorithm and seed, the versions), as the
/// engine gives them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fingerprint {
    fields: Vec<(String, String)>,
}

/// The first field in which two fingerprints differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The field.
    pub field: String,
    /// Its value in the stored index (`None`: the stored one lacks it).
    pub stored: Option<String>,
    /// Its value now (`None`: the engine no longer gives it).
    pub now: Option<String>,
}

impl Fingerprint {
    /// A fingerprint of `fields`, in their order.
    ///
    /// # Errors
    /// [`Error::Fingerprint`] for a field or value with a newline, a field
    /// with `=`, or a text longer than [`MAX_FINGERPRINT`].
    pub fn new<K: Into<String>, V: Into<String>>(
        fields: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Fingerprint, Error> {
        let fields: Vec<(String, String)> = fields
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        for (k, v) in &fields {
            if k.is_empty() || k.contains(['=', '\n']) || v.contains('\n') {
                return Err(Error::Fingerprint(format!(
                    "field {k:?} = {v:?}: a field is a non-empty name without `=` or a newline, \
                     and a value has no newline"
                )));
            }
        }
        let fp = Fingerprint { fields };
        let len = fp.text().len();
        if len > MAX_FINGERPRINT {
            return Err(Error::Fingerprint(format!(
                "{len} bytes of text, more than {MAX_FINGERPRINT}"
            )));
        }
        Ok(fp)
    }

    /// Its fields, in order.
    pub fn fields(&self) -> &[(String, String)] {
        &self.fields
    }

    /// The value of `field`.
    pub fn get(&self, field: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == field)
            .map(|(_, v)| v.as_str())
    }

    /// The text stored in the index: `field=value` lines.
    pub fn text(&self) -> String {
        self.fields
            .iter()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect()
    }

    fn parse(text: &str) -> Fingerprint {
        let fields = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Fingerprint { fields }
    }

    /// A digest of the text (32 hex digits), for a status line.
    pub fn digest(&self) -> String {
        let text = self.text();
        let words = |salt: u64| {
            std::iter::once(salt).chain(text.as_bytes().chunks(8).map(|c| {
                let mut w = [0u8; 8];
                w[..c.len()].copy_from_slice(c);
                u64::from_le_bytes(w)
            }))
        };
        format!("{:016x}{:016x}", hash(words(1)), hash(words(2)))
    }

    /// The first field, in `self`'s order then `now`'s, whose value
    /// differs; `None` when both say the same.
    pub fn differs(&self, now: &Fingerprint) -> Option<Difference> {
        let stored_first = self.fields.iter().find_map(|(k, v)| {
            (now.get(k) != Some(v.as_str())).then(|| Difference {
                field: k.clone(),
                stored: Some(v.clone()),
                now: now.get(k).map(str::to_string),
            })
        });
        stored_first.or_else(|| {
            now.fields.iter().find_map(|(k, v)| {
                self.get(k).is_none().then(|| Difference {
                    field: k.clone(),
                    stored: None,
                    now: Some(v.clone()),
                })
            })
        })
    }
}

/// One recorded slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The slot of the pool.
    pub slot: u64,
    /// The key its bytes were stored for.
    pub key: Vec<u8>,
    /// When it was last used: larger is later.
    pub stamp: u64,
}

/// Why an attach started cold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cold {
    /// The memory held no index (a new pool, or one cleared).
    NoIndex,
    /// The header was torn or of another version.
    Unreadable,
    /// The index was made for another number of slots.
    Capacity {
        /// Its records.
        stored: u64,
        /// The records asked for now.
        now: u64,
    },
    /// What was stored has another identity.
    Differs(Difference),
}

impl std::fmt::Display for Cold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cold::NoIndex => write!(f, "the kept pool holds no index (new, or cleared)"),
            Cold::Unreadable => write!(f, "the index's header is torn or of another version"),
            Cold::Capacity { stored, now } => write!(
                f,
                "the index was made for {stored} slots, this engine has {now}"
            ),
            Cold::Differs(d) => write!(
                f,
                "`{}` differs: stored {}, now {}",
                d.field,
                d.stored.as_deref().unwrap_or("(none)"),
                d.now.as_deref().unwrap_or("(none)")
            ),
        }
    }
}

/// The slots of an index, once over (see [`Index::survey`]): what a
/// restarted manager needs at its first store.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Survey {
    /// The slots with no record (or one torn), ascending: free to store
    /// into.
    pub free: Vec<u64>,
    /// The slots with a record, oldest use first: the order to evict in.
    pub recorded: Vec<u64>,
}

/// How an attach found the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// The same identity: its records are kept ([`Index::entries`] reads
    /// them; the attach itself reads only the header, so it costs the same
    /// whatever the index holds).
    Warm,
    /// Cold, and why; the index is now empty, with the new identity.
    Cold(Cold),
}

/// An index over a run of words (see the crate's documentation).
#[derive(Debug)]
pub struct Index<'a> {
    /// The header and the records.
    words: &'a [AtomicU64],
    /// The key table.
    table: &'a [AtomicU64],
    capacity: u64,
    seed: u64,
}

impl<'a> Index<'a> {
    /// Attach to the index in `words` for `capacity` slots and the identity
    /// `fingerprint`: warm when it holds the same identity and capacity (its
    /// header alone is read: the records are read when asked for), or cold
    /// (formatted afresh: empty, a new seed) saying why.
    ///
    /// # Errors
    /// [`Error::Empty`], [`Error::TooLarge`] or [`Error::TooSmall`].
    pub fn attach(
        words: &'a [AtomicU64],
        capacity: u64,
        fingerprint: &Fingerprint,
    ) -> Result<(Index<'a>, Start), Error> {
        if capacity == 0 {
            return Err(Error::Empty);
        }
        if capacity > MAX_CAPACITY {
            return Err(Error::TooLarge { capacity });
        }
        let need = words_for(capacity).ok_or(Error::TooSmall {
            capacity,
            need: u64::MAX,
            have: words.len() as u64 * 8,
        })?;
        if words.len() < need {
            return Err(Error::TooSmall {
                capacity,
                need: bytes_for(capacity).unwrap_or(u64::MAX),
                have: words.len() as u64 * 8,
            });
        }
        let trailer = &words[words.len() - TRAILER_WORDS..];
        let words = &words[..need - TRAILER_WORDS];
        let cold = match read_header(words) {
            Header::None => Some(Cold::NoIndex),
            Header::Torn => Some(Cold::Unreadable),
            Header::Valid { capacity: c, .. } if c != capacity => Some(Cold::Capacity {
                stored: c,
                now: capacity,
            }),
            Header::Valid { fingerprint: f, .. } => f.differs(fingerprint).map(Cold::Differs),
        };
        if let Some(why) = cold {
            let index = format(words, capacity, fingerprint);
            trailer[1].store(capacity, Ordering::Relaxed);
            trailer[0].store(TRAILER_MAGIC, Ordering::Release);
            return Ok((index, Start::Cold(why)));
        }
        let index = Index::over(words, capacity, words[H_SEED].load(Ordering::Acquire));
        Ok((index, Start::Warm))
    }

    /// The index over `words` (its header, records and key table, as
    /// [`words_for`] sizes them less the trailer) under `seed`.
    fn over(words: &'a [AtomicU64], capacity: u64, seed: u64) -> Index<'a> {
        let start = table_start(capacity).expect("a capacity words_for accepted");
        let (words, table) = words.split_at(start);
        Index {
            words,
            table,
            capacity,
            seed,
        }
    }

    /// The index already in `words`, attached before (by this process or
    /// another) for `capacity` slots: cheap (no check of the header), for
    /// a writer that attached once and comes back for each operation.
    /// `None` when `words` holds no index of this version and that capacity
    /// (or is short).
    pub fn resume(words: &'a [AtomicU64], capacity: u64) -> Option<Index<'a>> {
        let words = &words[..words_for(capacity).filter(|n| *n <= words.len())? - TRAILER_WORDS];
        (words[H_MAGIC].load(Ordering::Acquire) == MAGIC
            && words[H_VERSION].load(Ordering::Relaxed) == VERSION
            && words[H_CAPACITY].load(Ordering::Relaxed) == capacity)
            .then(|| Index::over(words, capacity, words[H_SEED].load(Ordering::Acquire)))
    }

    /// The records this index holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The seed it was formatted under: another seed, another index (an
    /// attach that started cold formats it afresh under a new one).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn record_words(&self, slot: u64) -> Result<&'a [AtomicU64], Error> {
        let no_slot = Error::NoSlot {
            slot,
            capacity: self.capacity,
        };
        if slot >= self.capacity {
            return Err(no_slot);
        }
        let start = usize::try_from(slot)
            .ok()
            .and_then(|s| s.checked_mul(RECORD_WORDS))
            .and_then(|s| s.checked_add(HEADER_WORDS))
            .ok_or(no_slot)?;
        Ok(&self.words[start..start + RECORD_WORDS])
    }

    fn check(&self, slot: u64, stamp: u64, len: u64, key: &[u64]) -> u64 {
        hash(
            [self.seed, slot, stamp, len]
                .into_iter()
                .chain(key.iter().copied()),
        )
    }

    /// Record that `slot` holds the bytes of `key`, written completely;
    /// its stamp is the index's next. Returns the stamp. The record is
    /// published first, then its key put in the key table ([`Index::find`]
    /// misses it in between).
    ///
    /// # Errors
    /// [`Error::NoSlot`], [`Error::KeyTooLong`].
    pub fn record(&self, slot: u64, key: &[u8]) -> Result<u64, Error> {
        if key.len() > MAX_KEY {
            return Err(Error::KeyTooLong { len: key.len() });
        }
        let r = self.record_words(slot)?;
        let packed = pack(key);
        self.publish(slot, r, key.len() as u64, &packed);
        let stamp = r[R_STAMP].load(Ordering::Relaxed);
        self.insert(slot, key.len() as u64, &packed);
        Ok(stamp)
    }

    /// The bucket `distance` past `hash`'s home bucket.
    fn bucket_at(&self, hash: u64, distance: usize) -> &AtomicU64 {
        // The table's length is a power of two: the mask wraps around it.
        &self.table[(hash as usize).wrapping_add(distance) & (self.table.len() - 1)]
    }

    /// How far a probe goes: past the farthest any key was placed from its
    /// home bucket, never round the table more than once.
    fn probes(&self) -> usize {
        let farthest = self.words[H_FARTHEST].load(Ordering::Acquire);
        usize::try_from(farthest)
            .map_or(usize::MAX, |f| f.saturating_add(1))
            .min(self.table.len())
    }

    /// Note that a key was placed `distance` from its home bucket, before
    /// its bucket is stored (a probe must reach it once it is there).
    fn reach(&self, distance: usize) {
        let distance = distance as u64;
        if self.words[H_FARTHEST].load(Ordering::Relaxed) < distance {
            self.words[H_FARTHEST].fetch_max(distance, Ordering::AcqRel);
        }
    }

    /// Whether the bucket `b` no longer finds anything: its slot is empty,
    /// or holds a key of another tag. Such a bucket may be reused (never
    /// emptied). Read by the one writer, whose records are all whole, so
    /// the record's check is not computed (the cost of a stored key): a
    /// record torn by a writer killed before only wastes a bucket when its
    /// words happen to give the tag, and a whole record is judged as
    /// [`Index::find`] would.
    fn stale(&self, b: u64) -> bool {
        let slot = (b & u64::from(u32::MAX)).wrapping_sub(1);
        let Ok(r) = self.record_words(slot) else {
            return true;
        };
        if r[R_CHECK].load(Ordering::Acquire) == 0 {
            return true;
        }
        let len = r[R_LEN].load(Ordering::Relaxed);
        if len > MAX_KEY as u64 {
            return true;
        }
        let mut key = [0u64; KEY_WORDS];
        for (v, w) in key.iter_mut().zip(&r[R_KEY..R_CHECK]) {
            *v = w.load(Ordering::Relaxed);
        }
        tag(key_hash(self.seed, len, &key)) != b >> 32
    }

    /// Put `key`, just recorded at `slot`, in the key table: probing from
    /// its home bucket, stop at a bucket that already names it; otherwise
    /// store it in the first bucket that is empty or stale, looking on
    /// (for one that names it) no further than an empty bucket and the
    /// farthest probe. A table with no such bucket (which cannot happen with
    /// two buckets per record, at most one live per record) leaves the key
    /// unfound: a miss.
    fn insert(&self, slot: u64, len: u64, key: &[u64; KEY_WORDS]) {
        let hash = key_hash(self.seed, len, key);
        let want = bucket(slot, tag(hash));
        let probes = self.probes();
        let mut reuse = None;
        for distance in 0..self.table.len() {
            let b = self.bucket_at(hash, distance).load(Ordering::Acquire);
            if b == want {
                // Placed there for this key, or (under the same tag) for
                // the slot's key before: either way found from here.
                self.reach(distance);
                return;
            }
            if b == 0 {
                reuse = Some(reuse.unwrap_or(distance));
                break;
            }
            if reuse.is_none() && self.stale(b) {
                reuse = Some(distance);
            }
            if reuse.is_some() && distance + 1 >= probes {
                break;
            }
        }
        if let Some(distance) = reuse {
            self.reach(distance);
            self.bucket_at(hash, distance)
                .store(want, Ordering::Release);
        }
    }

    /// The slot recorded for `key`, if any: a probe of the key table from
    /// the key's home bucket to an empty one (or the farthest any key was
    /// placed), each bucket of its tag checked against its slot's record,
    /// read and validated as [`Index::get`] reads it. A few loads, whatever
    /// the index holds; it allocates nothing. A key recorded in several
    /// slots gives one of them; a record whose writer was killed before its
    /// bucket was stored is not found (a miss).
    pub fn find(&self, key: &[u8]) -> Option<u64> {
        if key.len() > MAX_KEY {
            return None;
        }
        let packed = pack(key);
        let len = key.len() as u64;
        let hash = key_hash(self.seed, len, &packed);
        let tag = tag(hash);
        for distance in 0..self.probes() {
            let b = self.bucket_at(hash, distance).load(Ordering::Acquire);
            if b == 0 {
                return None;
            }
            if b >> 32 != tag {
                continue;
            }
            let slot = (b & u64::from(u32::MAX)).wrapping_sub(1);
            let Ok(r) = self.record_words(slot) else {
                continue;
            };
            if self
                .read(slot, r)
                .is_some_and(|(_, l, k)| l == len && k == packed)
            {
                return Some(slot);
            }
        }
        None
    }

    /// Write a record: its stores, in order ([`Index::stores`]), with a
    /// release fence after the first (the slot reads empty from there) and
    /// before the last (the check, which publishes it).
    fn publish(&self, slot: u64, r: &[AtomicU64], len: u64, key: &[u64; KEY_WORDS]) {
        let stamp = self.words[H_CLOCK].fetch_add(1, Ordering::AcqRel) + 1;
        let stores = self.stores(slot, stamp, len, key);
        let last = stores.len() - 1;
        for (i, (word, value)) in stores.into_iter().enumerate() {
            if i == last {
                fence(Ordering::Release);
            }
            r[word].store(value, Ordering::Release);
            if i == 0 {
                fence(Ordering::Release);
            }
        }
    }

    /// The stores that write a record, in the order they are made: the
    /// check cleared, the stamp, the length, the key, the check. A process
    /// killed after any prefix of them leaves the slot empty or, after the
    /// last, recorded: the tests replay every prefix.
    fn stores(&self, slot: u64, stamp: u64, len: u64, key: &[u64; KEY_WORDS]) -> Vec<(usize, u64)> {
        let mut stores = vec![(R_CHECK, 0), (R_STAMP, stamp), (R_LEN, len)];
        stores.extend(key.iter().enumerate().map(|(i, v)| (R_KEY + i, *v)));
        stores.push((R_CHECK, self.check(slot, stamp, len, key)));
        stores
    }

    /// Note a use of `slot`'s key (its stamp becomes the index's next);
    /// nothing for an empty slot. A process killed meanwhile loses the
    /// record (a miss), never tears it.
    ///
    /// # Errors
    /// [`Error::NoSlot`].
    pub fn touch(&self, slot: u64) -> Result<(), Error> {
        let r = self.record_words(slot)?;
        if let Some((len, key)) = self.read(slot, r).map(|(_, len, key)| (len, key)) {
            self.publish(slot, r, len, &key);
        }
        Ok(())
    }

    /// Unrecord `slot`: it holds no key from now on (before its bytes are
    /// overwritten, or when its key is evicted).
    ///
    /// # Errors
    /// [`Error::NoSlot`].
    pub fn unrecord(&self, slot: u64) -> Result<(), Error> {
        self.record_words(slot)?[R_CHECK].store(0, Ordering::Release);
        Ok(())
    }

    /// The record of `slot`, if its check holds: (stamp, length, key words).
    fn read(&self, slot: u64, r: &[AtomicU64]) -> Option<(u64, u64, [u64; KEY_WORDS])> {
        let check = r[R_CHECK].load(Ordering::Acquire);
        if check == 0 {
            return None;
        }
        fence(Ordering::Acquire);
        let stamp = r[R_STAMP].load(Ordering::Relaxed);
        let len = r[R_LEN].load(Ordering::Relaxed);
        let mut key = [0u64; KEY_WORDS];
        for (v, w) in key.iter_mut().zip(&r[R_KEY..R_CHECK]) {
            *v = w.load(Ordering::Relaxed);
        }
        (len <= MAX_KEY as u64 && self.check(slot, stamp, len, &key) == check)
            .then_some((stamp, len, key))
    }

    /// The key `slot` holds, if recorded.
    ///
    /// # Errors
    /// [`Error::NoSlot`].
    pub fn get(&self, slot: u64) -> Result<Option<Entry>, Error> {
        let r = self.record_words(slot)?;
        Ok(self.read(slot, r).map(|(stamp, len, key)| Entry {
            slot,
            key: unpack(len, &key),
            stamp,
        }))
    }

    /// Every slot once over: the free ones ascending, the recorded ones
    /// oldest use first (records whose check fails are free). One pass
    /// over the records, then a sort of the recorded ones by stamp.
    pub fn survey(&self) -> Survey {
        let mut free = Vec::new();
        let mut recorded = Vec::new();
        for slot in 0..self.capacity {
            let stamp = self
                .record_words(slot)
                .ok()
                .and_then(|r| self.read(slot, r))
                .map(|(stamp, _, _)| stamp);
            match stamp {
                Some(stamp) => recorded.push((stamp, slot)),
                None => free.push(slot),
            }
        }
        recorded.sort_unstable();
        Survey {
            free,
            recorded: recorded.into_iter().map(|(_, slot)| slot).collect(),
        }
    }

    /// Every recorded slot, oldest use first (records whose check fails,
    /// torn by a process killed while writing them, are left out).
    pub fn entries(&self) -> Vec<Entry> {
        let mut entries: Vec<Entry> = (0..self.capacity)
            .filter_map(|slot| self.get(slot).ok().flatten())
            .collect();
        entries.sort_by_key(|e| e.stamp);
        entries
    }

    /// How many slots are recorded.
    pub fn len(&self) -> usize {
        (0..self.capacity)
            .filter(|s| self.get(*s).ok().flatten().is_some())
            .count()
    }

    /// Whether no slot is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Unrecord every slot, and empty the key table.
    pub fn clear(&self) {
        for slot in 0..self.capacity {
            let _ = self.unrecord(slot);
        }
        for b in self.table {
            b.store(0, Ordering::Relaxed);
        }
        fence(Ordering::Release);
        self.words[H_FARTHEST].store(0, Ordering::Release);
    }
}

/// What an index holds, for a status line: its slots, how many are
/// recorded, and the identity of what was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Its slots.
    pub capacity: u64,
    /// Slots recorded (whole records only).
    pub records: usize,
    /// The stored fingerprint.
    pub fingerprint: Fingerprint,
}

/// The index that ends where `words` end (a pool's tail, as `Pool.index`
/// places it by default), its extent rounded up to `page` bytes as the
/// engine gave it: found by its trailer, `None` when there is none (no
/// index, a cleared pool, or one torn).
pub fn locate(words: &[AtomicU64], page: u64) -> Option<&[AtomicU64]> {
    let n = words.len();
    let tail = words.get(n.checked_sub(TRAILER_WORDS)?..)?;
    let trailer = [
        tail[0].load(Ordering::Acquire),
        tail[1].load(Ordering::Relaxed),
    ];
    let len = usize::try_from(extent_len(trailer, page)? / 8).ok()?;
    words.get(n.checked_sub(len)?..)
}

/// The bytes of the index whose last two words are `trailer`, rounded up
/// to `page` as its extent is: where it starts, counted back from where it
/// ends. `None` when `trailer` is no index's.
pub fn extent_len(trailer: [u64; 2], page: u64) -> Option<u64> {
    if trailer[0] != TRAILER_MAGIC {
        return None;
    }
    bytes_for(trailer[1])?.checked_next_multiple_of(page.max(8))
}

/// The capacity and fingerprint of the index in `words` (as [`locate`]
/// gives it), from its trailer and header alone: no record is read.
/// `None` when it holds no valid index.
fn stored(words: &[AtomicU64]) -> Option<(u64, Fingerprint)> {
    let n = words.len();
    let capacity = words.get(n.checked_sub(1)?)?.load(Ordering::Relaxed);
    match read_header(words.get(..words_for(capacity)?)?) {
        Header::Valid {
            capacity: stored,
            fingerprint,
        } if stored == capacity => Some((capacity, fingerprint)),
        _ => None,
    }
}

/// The summary of the index in `words` (as [`locate`] gives it), reading
/// it without changing it; `None` when it holds no valid index.
pub fn summary(words: &[AtomicU64]) -> Option<Summary> {
    let (capacity, fingerprint) = stored(words)?;
    let index = Index::resume(words, capacity)?;
    Some(Summary {
        capacity,
        records: index.len(),
        fingerprint,
    })
}

impl<'a> Index<'a> {
    /// The index that ends where `pool` ends (in a pool of `page`-byte
    /// pages), attached before by anyone for the capacity its trailer
    /// says: as [`Index::resume`], its header's magic, version and capacity
    /// checked, no record read. `None` when the pool's tail holds none.
    pub fn resume_tail(pool: &'a [AtomicU64], page: u64) -> Option<Index<'a>> {
        let words = locate(pool, page)?;
        let capacity = words.last()?.load(Ordering::Relaxed);
        Index::resume(words, capacity)
    }

    /// [`Index::attach`] to the index that ends where `pool` ends (a pool's
    /// tail, as `Pool.index` places it by default), in a pool of `page`-byte
    /// pages. An index made there before for another capacity started at
    /// another offset, so the attach alone would find no header at all: its
    /// fingerprint is read first (header only), and the cold start names the
    /// first field that differs, or the capacity, rather than no index.
    ///
    /// # Errors
    /// As [`Index::attach`]; [`Error::TooSmall`] when the pool cannot hold
    /// the index.
    pub fn attach_tail(
        pool: &'a [AtomicU64],
        capacity: u64,
        page: u64,
        fingerprint: &Fingerprint,
    ) -> Result<(Index<'a>, Start), Error> {
        let too_small = || Error::TooSmall {
            capacity,
            need: bytes_for(capacity).unwrap_or(u64::MAX),
            have: pool.len() as u64 * 8,
        };
        let len = bytes_for(capacity)
            .and_then(|b| b.checked_next_multiple_of(page.max(8)))
            .and_then(|b| usize::try_from(b / 8).ok())
            .ok_or_else(too_small)?;
        let words = pool
            .len()
            .checked_sub(len)
            .map(|start| &pool[start..])
            .ok_or_else(too_small)?;
        // Read before the attach formats over it.
        let before = locate(pool, page)
            .and_then(stored)
            .filter(|(c, _)| *c != capacity);
        let (index, start) = Index::attach(words, capacity, fingerprint)?;
        let start = match (start, before) {
            (Start::Cold(Cold::NoIndex | Cold::Unreadable), Some((stored, before))) => {
                Start::Cold(match before.differs(fingerprint) {
                    Some(d) => Cold::Differs(d),
                    None => Cold::Capacity {
                        stored,
                        now: capacity,
                    },
                })
            }
            (start, _) => start,
        };
        Ok((index, start))
    }
}

fn unpack(len: u64, key: &[u64; KEY_WORDS]) -> Vec<u8> {
    let mut bytes: Vec<u8> = key.iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes.truncate(usize::try_from(len).unwrap_or(MAX_KEY).min(MAX_KEY));
    bytes
}

/// A stored header, as read.
enum Header {
    /// Not an index (no magic).
    None,
    /// Magic, but another version or a check that fails.
    Torn,
    Valid {
        capacity: u64,
        fingerprint: Fingerprint,
    },
}

/// The header's check: over every header word before it.
fn header_check(words: &[AtomicU64]) -> u64 {
    hash(words[..H_CHECK].iter().map(|w| w.load(Ordering::Relaxed)))
}

fn read_header(words: &[AtomicU64]) -> Header {
    if words[H_MAGIC].load(Ordering::Acquire) != MAGIC {
        return Header::None;
    }
    let check = words[H_CHECK].load(Ordering::Acquire);
    if words[H_VERSION].load(Ordering::Relaxed) != VERSION || header_check(words) != check {
        return Header::Torn;
    }
    let len = usize::try_from(words[H_FP_LEN].load(Ordering::Relaxed)).unwrap_or(usize::MAX);
    if len > MAX_FINGERPRINT {
        return Header::Torn;
    }
    let bytes: Vec<u8> = words[H_FP_TEXT..H_FP_TEXT + FP_WORDS]
        .iter()
        .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
        .take(len)
        .collect();
    match String::from_utf8(bytes) {
        Ok(text) => Header::Valid {
            capacity: words[H_CAPACITY].load(Ordering::Relaxed),
            fingerprint: Fingerprint::parse(&text),
        },
        Err(_) => Header::Torn,
    }
}

/// A seed no earlier format of the same memory is likely to have had.
fn new_seed(previous: u64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    hash([previous, now, u64::from(std::process::id())])
}

/// Format `words` as an empty index for `capacity` slots and
/// `fingerprint`: the magic first cleared (a process killed while
/// formatting leaves no index), the records and the key table emptied, the
/// header written,
/// its check, then the magic.
fn format<'a>(words: &'a [AtomicU64], capacity: u64, fingerprint: &Fingerprint) -> Index<'a> {
    let previous = words[H_SEED].load(Ordering::Relaxed);
    words[H_MAGIC].store(0, Ordering::Release);
    fence(Ordering::Release);
    let seed = new_seed(previous);
    let index = Index::over(words, capacity, seed);
    index.clear();
    let text = fingerprint.text();
    words[H_VERSION].store(VERSION, Ordering::Relaxed);
    words[H_CAPACITY].store(capacity, Ordering::Relaxed);
    words[H_SEED].store(seed, Ordering::Relaxed);
    words[H_CLOCK].store(0, Ordering::Relaxed);
    words[H_FP_LEN].store(text.len() as u64, Ordering::Relaxed);
    let mut chunks = text.as_bytes().chunks(8);
    for w in &words[H_FP_TEXT..H_FP_TEXT + FP_WORDS] {
        let mut b = [0u8; 8];
        if let Some(c) = chunks.next() {
            b[..c.len()].copy_from_slice(c);
        }
        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
    // The magic is part of the check: stored as it will be.
    words[H_MAGIC].store(MAGIC, Ordering::Relaxed);
    let check = header_check(words);
    words[H_MAGIC].store(0, Ordering::Relaxed);
    words[H_CHECK].store(check, Ordering::Relaxed);
    fence(Ordering::Release);
    words[H_MAGIC].store(MAGIC, Ordering::Release);
    index
}

#[cfg(test)]
mod tests;
