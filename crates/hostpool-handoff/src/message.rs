//! The one message set of the handoff, whoever sends it: a rank joining its
//! shared pool's creator, an engine's rank leasing a keeper's pool, and the
//! answers. One conversation: a request ([`Message::Join`] or
//! [`Message::Hello`]), the hand-over ([`Message::Welcome`] or
//! [`Message::Lease`], then [`Message::Files`] with the descriptors in
//! chunks and their extents) or a refusal ([`Message::Refused`], why and
//! whom it blames), the barrier ([`Message::Arrived`], then [`Message::Go`]
//! or [`Message::Failed`], naming the ranks and the pid), and a lease's end
//! ([`Message::Release`]). JSON, one document a packet ([`crate::wire`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use pool_core::lease::{LeaseEnd, LeaseInfo, PreviousLease};

/// A message of the handoff.
#[derive(Debug, Serialize, Deserialize)]
pub enum Message {
    /// A rank asks its shared pool's creator to join: who it is and what it
    /// asks for, which must match the creator's exactly.
    Join {
        rank: u32,
        world: u32,
        logical: u64,
        mapped: u64,
        page: u64,
        extents: Vec<(u64, u64)>,
    },
    /// An engine's rank asks a keeper for a lease, as rank `rank` of
    /// `world` of the engine `engine`; or, with `companion`, a process of
    /// that engine that is none of its ranks (vLLM's scheduler) asks to map
    /// the lease its ranks hold: it joins no barrier, counts no
    /// generation, and the lease ends only once it went too.
    Hello {
        /// The protocol the engine speaks (absent: protocol 1, the one
        /// before versions were sent).
        #[serde(default = "Protocol::unversioned")]
        protocol: Protocol,
        world: u32,
        rank: u32,
        engine: String,
        #[serde(default)]
        companion: bool,
        size: Option<u64>,
        page: Option<u64>,
        tag: Option<String>,
        attach_timeout_secs: f64,
        barrier_timeout_secs: f64,
    },
    /// The creator hands the pool over: its files follow, `files` in all,
    /// in this and the following [`Message::Files`] messages, each with the
    /// extents of the descriptors it carries (which must be the joiner's
    /// own plan).
    Welcome {
        creator_rank: u32,
        files: usize,
        #[serde(default)]
        extents: Vec<(u64, u64)>,
    },
    /// The keeper hands the pool over: its files follow, `files` in all,
    /// in this and the following [`Message::Files`] messages, each with the
    /// extents of the descriptors it carries (so that a message stays small
    /// however many files the pool has).
    Lease {
        /// The protocol the keeper speaks (absent: protocol 1).
        #[serde(default = "Protocol::unversioned")]
        protocol: Protocol,
        info: LeaseInfo,
        logical: u64,
        mapped: u64,
        page: u64,
        backing: String,
        extents: Vec<(u64, u64)>,
        files: usize,
    },
    /// More descriptors of the pool's files, with their extents.
    Files {
        #[serde(default)]
        extents: Vec<(u64, u64)>,
    },
    /// Refused (`usage`: the asker's input is at fault). `ranks` and `pid`
    /// are whom `message` blames, as in [`Message::Failed`] (a failed
    /// pool's ranks, a lease's holder); `page` is the pool's page size,
    /// when a joiner asked for another.
    Refused {
        usage: bool,
        message: String,
        #[serde(default)]
        ranks: Vec<u32>,
        #[serde(default)]
        pid: Option<u32>,
        #[serde(default)]
        page: Option<u64>,
    },
    /// A rank's setup outcome, at the barrier: it mapped the pool (or failed
    /// to, with why).
    Arrived { error: Option<String> },
    /// Every rank arrived with success.
    Go,
    /// The pool (or the lease) failed: why, naming the rank, and the fields
    /// of the [`pool_core::Error::Peer`] it makes: the ranks it blames and
    /// the pid of the first.
    Failed {
        message: String,
        #[serde(default)]
        ranks: Vec<u32>,
        #[serde(default)]
        pid: Option<u32>,
    },
    /// A lease ends cleanly (an end of file without it is a death).
    Release,
    /// A tenant asks its keeper's CPU tier (one message a batch of
    /// blocks); `id` comes back in the [`Message::TierReply`], unless
    /// `quiet`: then the keeper answers nothing (a completion, an abort, a
    /// release or a touch, which the tenant need not wait for). A keeper
    /// that predates `quiet` answers anyway, and the tenant drops the
    /// answer.
    Tier {
        id: u64,
        op: TierOp,
        #[serde(default)]
        quiet: bool,
    },
    /// The keeper's answer to [`Message::Tier`].
    TierReply { id: u64, reply: TierReply },
    /// A tenant that lived through its keeper's death hands the pool's
    /// files back to a keeper that has none yet (`adopt_within_secs`):
    /// `count` descriptors of the pool's `extents`, in as many messages as
    /// they need ([`Message::Files`] after this one).
    HandBack {
        name: String,
        extents: Vec<(u64, u64)>,
        count: usize,
    },
    /// The keeper's answer to [`Message::HandBack`]: adopted, or why not.
    HandedBack { adopted: bool, message: String },
    /// How is the kept pool? (`hostpool keep status`)
    Status,
    /// The keeper's status.
    StatusOf(Value),
}

/// What a tenant asks of the tier its keeper writes (see
/// `hostpool_index::tier`): keys are a KV block's key, slots the pool's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TierOp {
    /// Open the tier for this tenant's identity: the keeper attaches the
    /// index of `slots` slots at the pool's tail for `fingerprint` (its
    /// fields in order), warm when it holds that identity, else formatted
    /// afresh. Refused, touching nothing, while another tenant opened it
    /// for another identity or another number of slots.
    Open {
        slots: u64,
        fingerprint: Vec<(String, String)>,
        /// A tenant that comes back after its keeper's restart: what it was
        /// writing and holding when the keeper before went.
        #[serde(default)]
        rejoin: Option<Rejoin>,
    },
    /// A slot to write each key into.
    Store { keys: Vec<Vec<u8>> },
    /// These granted slots are written completely: record them.
    Stored { slots: Vec<u64> },
    /// These granted slots will not be written.
    Abort { slots: Vec<u64> },
    /// Hold each key's slot for a load.
    Load { keys: Vec<Vec<u8>> },
    /// Hold `key`'s slot for a load, and up to `ahead` more: the blocks
    /// stored after it, each in the store batch of the one before (a
    /// request's next blocks), while they are recorded. One message holds
    /// a prefix that a lookup goes on to ask for block by block.
    Hold { key: Vec<u8>, ahead: u32 },
    /// These held slots were read (counted as the tenant's hits).
    Loaded { slots: Vec<u64> },
    /// These held slots were not read after all (a hold a step did not
    /// load): released, not counted as hits.
    Release { slots: Vec<u64> },
    /// These keys were used.
    Touch { keys: Vec<Vec<u8>> },
}

/// What the keeper answers a [`TierOp`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TierReply {
    /// For [`TierOp::Store`]: one answer per key.
    Puts(Vec<TierPut>),
    /// For [`TierOp::Load`]: the slot held for each key, `None` a miss.
    Loads(Vec<Option<u64>>),
    /// For [`TierOp::Hold`]: each block held, `(key, slot)`, the asked
    /// key first; empty for a miss.
    Held(Vec<(Vec<u8>, u64)>),
    /// For the others: how many of the slots or keys were this tenant's
    /// to complete, abort, release or touch.
    Done(u64),
    /// For [`TierOp::Open`]: the index is attached at the pool's tail.
    /// `warm` when it held this identity and its records are kept; else
    /// `reason` says why it started cold (formatted afresh), and `field`
    /// names the fingerprint field that differed, with its stored and its
    /// new value, when that was why.
    Opened {
        warm: bool,
        reason: Option<String>,
        field: Option<(String, Option<String>, Option<String>)>,
        /// For an open with [`Rejoin`]: what the tenant has again.
        #[serde(default)]
        rejoined: Option<Rejoined>,
    },
    /// No tier: why (the pool holds no index yet, say, or another
    /// tenant opened it for another identity).
    Refused { message: String },
}

/// What a tenant had in the tier when its keeper went away: its stores in
/// flight (the slot the keeper before granted, and the key) and the keys
/// it holds for loads. Told when it opens the tier of the restarted keeper,
/// which gives them back to it before any other tenant can be granted them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Rejoin {
    /// `(slot, key)` of each store in flight.
    pub writing: Vec<(u64, Vec<u8>)>,
    /// The keys held for loads.
    pub holding: Vec<Vec<u8>>,
}

/// What a tenant that rejoined has again: the slots it may go on writing
/// (complete or abort them as usual; a slot not here is not its to write
/// any more), and the holds taken again, `(key, slot)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Rejoined {
    /// Slots of its stores in flight, its again.
    pub claimed: Vec<u64>,
    /// Its holds, taken again.
    pub held: Vec<(Vec<u8>, u64)>,
}

/// One key's answer to [`TierOp::Store`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TierPut {
    /// Write it into `slot`; `evicted` is the key the slot held before.
    Granted { slot: u64, evicted: Option<Vec<u8>> },
    /// Stored already, in `slot`.
    Stored { slot: u64 },
    /// Another store of it is in flight.
    InFlight,
    /// Every slot is being written or held.
    NoRoom,
}

/// The version of the lease protocol one side speaks, and the oldest
/// version it still speaks: the first message of each side of a lease
/// carries it ([`Message::Hello`], [`Message::Lease`]). Two sides get on
/// when each speaks the other's version or newer down to its `oldest`
/// ([`Protocol::compatible`]; the rule is in `docs/design.md`): a change
/// that an older side could misread raises `version` and `oldest`, a change
/// it can ignore (a field with a default) raises `version` alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Protocol {
    /// The version this side speaks.
    pub version: u32,
    /// The oldest version this side still speaks.
    pub oldest: u32,
}

/// The protocol this build speaks.
pub const PROTOCOL: Protocol = Protocol {
    version: 3,
    oldest: 2,
};

impl Protocol {
    /// What a side that sends no version speaks: protocol 1, the lease of
    /// hostpool before versions were sent.
    pub fn unversioned() -> Protocol {
        Protocol {
            version: 1,
            oldest: 1,
        }
    }

    /// Whether `self` and `theirs` can hold a lease together: each speaks
    /// a version the other still speaks.
    pub fn compatible(self, theirs: Protocol) -> bool {
        self.version >= theirs.oldest && theirs.version >= self.oldest
    }

    /// The refusal `we` (this side, say "the keeper of `kv0`") give a peer
    /// (`they`, say "pid 42") that speaks `theirs`, when the two cannot
    /// hold a lease together: both versions named, and which side to
    /// upgrade.
    pub fn refusal(self, theirs: Protocol, we: &str, they: &str) -> Option<String> {
        if self.compatible(theirs) {
            return None;
        }
        let upgrade = if theirs.version < self.oldest {
            format!(
                "{they} is older: run it with hostpool {}",
                pool_core::VERSION
            )
        } else {
            format!(
                "{we} is older: restart it with the hostpool {they} runs (this is hostpool {})",
                pool_core::VERSION
            )
        };
        Some(format!(
            "{we} speaks lease protocol {} (down to {}) and {they} speaks {} (down to {}): \
             they have no version in common; {upgrade}",
            self.version, self.oldest, theirs.version, theirs.oldest
        ))
    }
}
