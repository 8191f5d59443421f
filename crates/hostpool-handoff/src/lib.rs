//! Memory handed from one process to another, for hostpool: the rendezvous
//! of a shared pool's ranks ([`rendezvous`]: over an abstract unix socket,
//! or a control file) and the lease of a keeper's pool ([`lease`]: an
//! engine's side of it, and the keeper's messages), both over the one
//! `SOCK_SEQPACKET` wire ([`wire`]: JSON messages, descriptors with
//! `SCM_RIGHTS` in chunks, credentials with `SO_PEERCRED`).
//!
//! `pool-core` names none of this: it builds a shared or leased pool through
//! the [`pool_core::Handoff`] it is given ([`HANDOFF`], passed in
//! the build's options), so a program links it to share or lease (the `hostpool` library, its CLI and
//! its Python package do). The keeper itself, a daemon, is `hostpool-keeper`,
//! which only the CLI links.
//!
//! Every file handed over is mapped through [`pool_core::file::map_files`],
//! which refuses one shorter than its extent; memfds come sealed against
//! shrinking and growing ([`pool_core::file::create_memfd`]).

use pool_core::Handoff;
use pool_core::interrupt::Cancel;
use pool_core::shared::Attachment;
use pool_core::shared::SharedPoolSpec;
use pool_core::{LeasePlan, Result};

pub mod barrier;
mod join;
mod kept;
pub mod lease;
mod message;
pub mod rendezvous;
mod sys;
pub mod wire;

pub use join::{hand_over, take_over};
pub use message::{Message, PROTOCOL, Protocol, Rejoin, Rejoined, TierOp, TierPut, TierReply};
pub use pool_core::shared::RefusalTerms;
pub use rendezvous::Refusal;

/// This crate's [`Handoff`]: what a build that shares or leases a pool is
/// given (`BuildOptions::handoff(hostpool_handoff::HANDOFF)`).
pub const HANDOFF: &dyn Handoff = &Handoffs;

/// The [`Handoff`] of this crate.
#[derive(Debug)]
struct Handoffs;

impl Handoff for Handoffs {
    fn share(&self, spec: SharedPoolSpec<'_>) -> Result<Box<dyn Attachment>> {
        rendezvous::map_shared(spec)
    }

    fn lease(&self, lease: &LeasePlan, cancel: &Cancel) -> Result<Box<dyn Attachment>> {
        lease::attach(lease, cancel)
    }
}
