//! Memory handed from one process to another, for hostpool: the rendezvous
//! of a shared pool's ranks ([`rendezvous`]: over an abstract unix socket,
//! or a control file) and the lease of a keeper's pool ([`lease`]: an
//! engine's side of it, and the keeper's messages), both over the one
//! `SOCK_SEQPACKET` wire ([`wire`]: JSON messages, descriptors with
//! `SCM_RIGHTS` in chunks, credentials with `SO_PEERCRED`).
//!
//! `pool-core` names none of this: it builds a shared or leased pool through
//! the [`pool_core::shared::Handoff`] this crate submits, so a
//! program links it to share or lease (the `hostpool` library, its CLI and
//! its Python package do). The keeper itself, a daemon, is `hostpool-keeper`,
//! which only the CLI links.
//!
//! Every file handed over is mapped through [`pool_core::file::map_files`],
//! which refuses one shorter than its extent; memfds come sealed against
//! shrinking and growing ([`pool_core::file::create_memfd`]).

use pool_core::file::Attachment;
use pool_core::interrupt::Cancel;
use pool_core::shared::{Handoff, HandoffPlugin, SharedPoolSpec};
use pool_core::{PoolConfig, Result};

pub mod barrier;
mod join;
mod kept;
pub mod lease;
mod message;
pub mod rendezvous;
mod sys;
pub mod wire;

pub use join::hand_over;
pub use message::{Message, PROTOCOL, Protocol};
pub use pool_core::shared::RefusalTerms;
pub use rendezvous::Refusal;

/// This crate's [`Handoff`].
#[derive(Debug)]
struct Handoffs;

impl Handoff for Handoffs {
    fn share(&self, spec: SharedPoolSpec<'_>) -> Result<Box<dyn Attachment>> {
        rendezvous::map_shared(spec)
    }

    fn lease(&self, config: &PoolConfig, cancel: &Cancel) -> Result<Box<dyn Attachment>> {
        lease::attach(config, cancel)
    }

    fn keeper_socket(&self, name: &str) -> String {
        lease::socket_name(name)
    }
}

pool_core::inventory::submit! {
    HandoffPlugin::new(
        "seqpacket",
        "shared pools over a socket or a control file, and leases of kept pools",
        env!("CARGO_PKG_NAME"),
        &Handoffs,
    )
}
