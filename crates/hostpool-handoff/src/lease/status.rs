//! `hostpool keep status`: asking a keeper how its pool is, and the
//! answer typed ([`typed`]).

use std::time::{Duration, Instant};

use serde_json::Value;

use super::client::{connect, keeper};
use super::{how_to_start, keeper_error};
use crate::join;
use crate::message::Message;
use crate::wire::{self, Received};
use pool_core::Result;

mod typed;

pub use typed::{
    CameBack, CompanionStatus, IndexStatus, KeeperState, KeeperStatus, LeaseEnds, LeaseStatus,
    RankStatus, TenantStatus, TierOpens, TierStatus,
};

/// [`status`], parsed once: an error naming the keeper when it is not a
/// keeper's status.
pub(super) fn status_typed(name: &str) -> Result<(KeeperStatus, u32)> {
    let (value, pid) = status(name)?;
    Ok((KeeperStatus::from_value(name, value, Some(pid))?, pid))
}

/// The status of the keeper of `name`, and the keeper's pid as this
/// process sees it (`SO_PEERCRED`).
pub(super) fn status(name: &str) -> Result<(Value, u32)> {
    let sock = connect(name)?;
    let pid = join::holder_pid(&sock, &keeper(name, 0.0, 0.0))?;
    wire::send(&sock, &Message::Status, &[])
        .map_err(|e| wire::os("sendmsg", e, "asking the keeper failed"))?;
    match wire::recv::<Message>(
        &sock,
        Instant::now() + Duration::from_secs(5),
        &mut Vec::new(),
        None,
    )? {
        Received::Msg(Message::StatusOf(v)) => Ok((v, pid)),
        Received::Msg(Message::Refused { message, .. }) => {
            Err(keeper_error(name, message, Some(pid), false))
        }
        Received::TimedOut => Err(keeper_error(
            name,
            format!(
                "the keeper of `{name}` (pid {pid}: {}) did not answer a status request within 5 s",
                pool_core::host::process::why_late(pid)
            ),
            Some(pid),
            false,
        )),
        Received::Msg(_) | Received::Gone => Err(keeper_error(
            name,
            format!(
                "the keeper of `{name}` (pid {pid}) closed the connection without answering a \
                 status request; {}",
                how_to_start(name)
            ),
            Some(pid),
            false,
        )),
    }
}
