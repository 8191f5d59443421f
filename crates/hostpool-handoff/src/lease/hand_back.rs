//! A tenant hands its pool's files back to a restarted keeper that has no
//! pool yet (one started with `adopt_within_secs`, with neither systemd's
//! file descriptor store nor a persist directory): one survivor is enough
//! for the keeper to get its memory, bytes and index, back.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use pool_core::{Extent, Result};

use super::client::connect;
use crate::message::Message;
use crate::wire::{self, Received};

/// Hand `files` (the pool's, in pool order, each with its extent) to the
/// keeper of `name`: `Ok(true)` when it adopted them, `Ok(false)` when it
/// did not (it has its pool already, or they are not the pool it plans:
/// its message is logged at debug).
///
/// # Errors
/// No keeper answers, or the connection failed.
pub fn hand_back(name: &str, files: &[(BorrowedFd<'_>, Extent)]) -> Result<bool> {
    let sock = connect(name)?;
    crate::join::hand_over(
        std::os::fd::AsFd::as_fd(&sock),
        |extents, count| Message::HandBack {
            name: name.to_string(),
            extents,
            count,
        },
        files,
    )
    .map_err(|e| wire::os("sendmsg", e, "handing the pool back to its keeper failed"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    match wire::recv::<Message>(&sock, deadline, &mut Vec::new(), None)? {
        Received::Msg(Message::HandedBack { adopted, message }) => {
            if !adopted {
                tracing::debug!(
                    "kept pool `{name}`: the keeper did not take the pool back: {message}"
                );
            }
            Ok(adopted)
        }
        _ => Ok(false),
    }
}
