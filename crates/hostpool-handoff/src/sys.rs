//! The only `unsafe` of the handoff: the control block of a shared pool
//! as every rank of the file rendezvous maps it, made of atomics only, so
//! that it may live in a file other processes write
//! ([`pool_core::file::SharedView`] maps it).

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64};

use pool_core::file::AtomicsOnly;
use pool_core::{MAX_FILES, MAX_WORLD};
/// Most ranks one recorded failure blames besides the rank that recorded it:
/// a rank that fails because of its peers records whom it blamed, the first
/// `MAX_BLAMED` of them when it blamed more.
pub(crate) const MAX_BLAMED: usize = 8;

/// The ranks a recorded failure blames, in the order its message names
/// them: the first `count` of `ranks` (`count` at most [`MAX_BLAMED`]).
#[repr(C)]
#[derive(Default)]
pub(crate) struct Blamed {
    pub(crate) count: AtomicU32,
    pub(crate) ranks: [AtomicU32; MAX_BLAMED],
}

#[repr(C)]
pub(crate) struct Header {
    pub(crate) magic: AtomicU64,
    pub(crate) version: AtomicU32,
    pub(crate) world: AtomicU32,
    pub(crate) state: AtomicU32,
    pub(crate) creator_rank: AtomicU32,
    pub(crate) logical: AtomicU64,
    pub(crate) mapped: AtomicU64,
    pub(crate) page_size: AtomicU64,
    pub(crate) nfiles: AtomicU32,
    pub(crate) arrived: AtomicU32,
    pub(crate) done: AtomicU32,
    pub(crate) fail_rank: AtomicU32,
    /// Whom the creator blamed when it failed before the pool was ready.
    pub(crate) fail_blamed: Blamed,
    pub(crate) fail_msg: [AtomicU8; 1024],
}

#[repr(C)]
pub(crate) struct Slot {
    pub(crate) state: AtomicU32,
    pub(crate) pid: AtomicU32,
    /// Whom this rank blamed when it failed (`state` is failed).
    pub(crate) blamed: Blamed,
    pub(crate) msg: [AtomicU8; 248],
}

/// The control block every rank maps.
#[repr(C)]
pub struct Ctl {
    pub(crate) header: Header,
    pub(crate) files: [[AtomicU64; 2]; MAX_FILES],
    pub(crate) slots: [Slot; MAX_WORLD as usize],
}

// SAFETY: Ctl is made only of atomics and arrays of atomics (repr(C), no
// padding-sensitive invariants, no Drop), valid for every bit pattern.
unsafe impl AtomicsOnly for Ctl {}
