//! Messages over a unix `SOCK_SEQPACKET` socket in the abstract namespace:
//! one JSON document per packet, with file descriptors passed alongside
//! (`SCM_RIGHTS`). The keeper's protocol speaks it; a peer's death is an
//! EOF, seen at once.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use pool_core::{Context, Error, Result};

/// Largest message (JSON) in bytes.
pub const MSG_BYTES: usize = 64 << 10;
/// File descriptors per message (the kernel takes at most 253).
pub const FDS_PER_MSG: usize = 200;
/// The longest one `poll` waits, so deadlines and stop requests are seen.
pub const TICK: Duration = Duration::from_millis(20);

/// A failed call on the socket, with what to do about it.
pub fn os(op: &'static str, e: impl Into<std::io::Error>, remedy: &str) -> Error {
    Error::os(
        op,
        e,
        Context::new(0, pool_core::PageSize::BASE_4K).remedy(remedy),
    )
}

/// A new `SOCK_SEQPACKET` unix socket, close-on-exec.
pub fn seqpacket() -> Result<OwnedFd> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| {
        os(
            "socket(AF_UNIX, SOCK_SEQPACKET)",
            e,
            "the kernel refused a unix socket",
        )
    })
}

/// Send `msg`, with `files` (at most [`FDS_PER_MSG`]).
pub fn send<M: Serialize>(fd: impl AsFd, msg: &M, files: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MSG))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !files.is_empty() && !control.push(SendAncillaryMessage::ScmRights(files)) {
        return Err(std::io::Error::from_raw_os_error(libc::E2BIG));
    }
    rustix::net::sendmsg(
        fd,
        &[IoSlice::new(&bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Send `msg` without waiting: [`std::io::ErrorKind::WouldBlock`] when the
/// peer's socket is full (a peer that does not read: stopped, or stuck).
pub fn send_now<M: Serialize>(fd: impl AsFd, msg: &M) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    rustix::net::send(fd, &bytes, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)?;
    Ok(())
}

/// What [`recv`] got.
#[derive(Debug)]
pub enum Received<M> {
    /// A message.
    Msg(M),
    /// End of file: the peer is gone (closed, or died).
    Gone,
    /// Nothing before the deadline.
    TimedOut,
}

/// Wait for a message until `deadline`. Received descriptors are appended
/// to `files`. With `cancel`, its request ends the wait with
/// [`Error::Interrupted`].
///
/// # Errors
/// [`Error::Interrupted`]; [`Error::Os`] for a failed call;
/// [`Error::Plugin`] for a message this version cannot read.
pub fn recv<M: DeserializeOwned>(
    fd: impl AsFd,
    deadline: Instant,
    files: &mut Vec<OwnedFd>,
    cancel: Option<&pool_core::interrupt::Cancel>,
) -> Result<Received<M>> {
    let fd = fd.as_fd();
    loop {
        if let Some(cancel) = cancel {
            cancel.check()?;
        }
        if readable(fd, deadline)? {
            break;
        }
        if Instant::now() >= deadline {
            return Ok(Received::TimedOut);
        }
    }
    let mut buf = vec![0u8; MSG_BYTES];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MSG))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut flags = RecvFlags::CMSG_CLOEXEC;
    let got = loop {
        match rustix::net::recvmsg(fd, &mut [IoSliceMut::new(&mut buf)], &mut control, flags) {
            Ok(g) => break g,
            // A peer that closed its socket with our message unread in it
            // makes the kernel report ECONNRESET once, before the messages
            // it had sent us and that are still queued: read those first.
            Err(e) if e == rustix::io::Errno::CONNRESET && !flags.contains(RecvFlags::DONTWAIT) => {
                flags |= RecvFlags::DONTWAIT;
            }
            Err(e) if e == rustix::io::Errno::CONNRESET || e == rustix::io::Errno::AGAIN => {
                return Ok(Received::Gone);
            }
            Err(e) => return Err(os("recvmsg", e, "the socket failed")),
        }
    };
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            files.extend(fds);
        }
    }
    if got.bytes == 0 {
        return Ok(Received::Gone);
    }
    if got.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        // The kernel could not install every descriptor the peer sent
        // (they are closed): the open-file limit is the usual cause.
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .map_or_else(|| "unlimited".to_string(), |n| n.to_string());
        return Err(os(
            "recvmsg(SCM_RIGHTS)",
            std::io::Error::from_raw_os_error(libc::EMFILE),
            &format!(
                "the peer's file descriptors did not fit: this process may open {limit} files \
                 (RLIMIT_NOFILE), fewer than the pool's files need; raise it (`ulimit -n`, \
                 LimitNOFILE= in a systemd unit) or give the pool fewer, larger segments"
            ),
        ));
    }
    if got.flags.contains(rustix::net::ReturnFlags::TRUNC) {
        return Err(Error::Plugin {
            what: "hostpool socket".into(),
            message: format!(
                "the peer sent a message longer than {} KiB, the most this hostpool version reads",
                MSG_BYTES >> 10
            ),
            source: None,
        });
    }
    serde_json::from_slice(&buf[..got.bytes])
        .map(Received::Msg)
        .map_err(|e| Error::Plugin {
            what: "hostpool socket".into(),
            message: "the peer sent a message that is not of this hostpool version".into(),
            source: Some(Box::new(e)),
        })
}

/// How a handover of files went wrong, apart from a failed call: the
/// peer stopped sending them (it died, or said something else), or sent as
/// many descriptors as it said but not one per extent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handover {
    /// The peer hung up, or sent another message, before every file came.
    Broken,
    /// The descriptors and the extents do not pair up.
    Miscounted {
        /// Descriptors received.
        files: usize,
        /// Extents they should map.
        extents: usize,
    },
}

/// Receive a pool's files, handed over in chunks (a message carries at most
/// [`FDS_PER_MSG`] descriptors): `fds` came with the first message, and
/// each following message `chunk` recognises (giving the extents it
/// carries, if any) adds its own, until `count` have come. Each descriptor
/// is paired with its extent (those in `extents`, from the first message or
/// the receiver's own plan, then the chunks'), as a [`pool_core::file::PoolFile`] with its
/// identity. The one path by which a rank joining its creator and an engine
/// leasing a kept pool receive memory; what they then map goes through
/// [`pool_core::file::map_files`], which checks every file's length.
///
/// # Errors
/// `Ok(Err(_))` for a [`Handover`] that went wrong; `Err` for a failed
/// call (or a cancelled wait).
pub fn receive_files<M: DeserializeOwned>(
    sock: BorrowedFd<'_>,
    deadline: Instant,
    cancel: &pool_core::interrupt::Cancel,
    mut fds: Vec<OwnedFd>,
    count: usize,
    mut extents: Vec<pool_core::Extent>,
    chunk: impl Fn(M) -> Option<Vec<pool_core::Extent>>,
) -> Result<std::result::Result<Vec<pool_core::file::PoolFile>, Handover>> {
    while fds.len() < count {
        match recv::<M>(sock, deadline, &mut fds, Some(cancel))? {
            Received::Msg(m) => match chunk(m) {
                Some(more) => extents.extend(more),
                None => return Ok(Err(Handover::Broken)),
            },
            Received::Gone | Received::TimedOut => return Ok(Err(Handover::Broken)),
        }
    }
    if fds.len() != extents.len() {
        return Ok(Err(Handover::Miscounted {
            files: fds.len(),
            extents: extents.len(),
        }));
    }
    let files = fds
        .into_iter()
        .zip(extents)
        .map(|(fd, extent)| {
            let id = pool_core::file::file_id(&fd)
                .map_err(|e| os("fstat", e, "a pool file handed over"))?;
            Ok(pool_core::file::PoolFile {
                fd,
                path: None,
                id,
                extent,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Ok(files))
}

/// Whether `fd` has something to read (or hung up) within one tick.
pub fn readable(fd: BorrowedFd<'_>, deadline: Instant) -> Result<bool> {
    let wait = deadline.saturating_duration_since(Instant::now()).min(TICK);
    let timeout = Timespec {
        tv_sec: 0,
        tv_nsec: i64::from(wait.subsec_nanos()),
    };
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    match poll(&mut fds, Some(&timeout)) {
        Ok(n) => Ok(n > 0),
        Err(e) if e == rustix::io::Errno::INTR => Ok(false),
        Err(e) => Err(os("poll", e, "waiting on a unix socket failed")),
    }
}

/// Whether `fd` has something to read (or hung up) right now.
pub fn ready(fd: impl AsFd) -> bool {
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    poll(
        &mut fds,
        Some(&Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        }),
    )
    .unwrap_or(0)
        > 0
}

/// Whether the peer of `fd` has hung up (closed its end, or died).
pub fn hung_up(fd: impl AsFd) -> bool {
    let mut fds = [PollFd::new(&fd, PollFlags::IN | PollFlags::RDHUP)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    poll(&mut fds, Some(&zero)).unwrap_or(0) > 0
        && fds[0]
            .revents()
            .intersects(PollFlags::HUP | PollFlags::RDHUP)
}

/// Wait up to `wait` (below a second) until any of `fds` has something to
/// read or hung up.
pub fn wait_any(fds: &[BorrowedFd<'_>], wait: Duration) {
    let mut polled: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::new(fd, PollFlags::IN))
        .collect();
    let timeout = Timespec {
        tv_sec: 0,
        tv_nsec: i64::from(wait.subsec_nanos()),
    };
    let _ = poll(&mut polled, Some(&timeout));
}

/// The peer's uid and pid (`SO_PEERCRED`; pid 0 when unknown).
pub fn peer_cred(fd: impl AsFd) -> Result<(u32, u32)> {
    let cred = rustix::net::sockopt::socket_peercred(fd)
        .map_err(|e| os("getsockopt(SO_PEERCRED)", e, "the unix socket failed"))?;
    Ok((
        cred.uid.as_raw(),
        u32::try_from(cred.pid.as_raw_nonzero().get()).unwrap_or(0),
    ))
}
