//! The one join: how a process takes memory another process holds, whoever
//! holds it. A rank joining its shared pool's creator and an engine's rank
//! leasing a keeper's pool run this one path, and every check runs here
//! once for both: the holder's credentials, the answer (handed over,
//! refused and why, or failed naming whom), the descriptors in chunks
//! paired with their extents ([`wire::receive_files`]), the extents against
//! the joiner's own plan, the sizes, and each file's identity and length
//! ([`file::map_files`]); then the joiner's side of the barrier
//! ([`arrive`]). The holder's side hands the files over with
//! [`hand_over`], whether it is a creator or a keeper: a keeper is a
//! creator that outlives its ranks.
//!
//! Only the wording differs, and [`Holder`] says it: a creator is named by
//! the shared pool and its rank, a keeper by its kept pool.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::barrier::{known, peer};
use crate::kept::{how_to_start, keeper_error, socket_name};
use crate::message::{LeaseInfo, Message, PROTOCOL, Protocol};
use crate::wire::{self, Handover, Received};
use pool_core::file::{self, FileMapping, MapContext};
use pool_core::interrupt::Cancel;
use pool_core::{Error, Extent, MappedSize, PageSize, Result};

/// The process a joiner takes memory from, as its errors name it.
#[derive(Debug, Clone)]
pub(crate) enum Holder {
    /// A shared pool's creator: the pool's name, and the creator's rank
    /// once its welcome said it.
    Creator {
        pool: String,
        rank: Option<u32>,
        attach_timeout_secs: f64,
        barrier_timeout_secs: f64,
    },
    /// The keeper of a kept pool, by the pool's name.
    Keeper {
        name: String,
        attach_timeout_secs: f64,
        barrier_timeout_secs: f64,
    },
}

impl Holder {
    fn keeper_error(name: &str, message: String, pid: Option<u32>) -> Error {
        keeper_error(name, message, pid, false)
    }

    /// Whose socket this is, for a refusal of its credentials.
    fn socket(&self) -> String {
        match self {
            Holder::Creator { pool, .. } => {
                let me = rustix::process::geteuid().as_raw();
                format!("@hostpool/{me}/{pool}")
            }
            Holder::Keeper { name, .. } => socket_name(name),
        }
    }

    /// The holder `pid` of uid `uid` is neither this user nor root.
    fn foreign(&self, uid: u32, pid: u32) -> Error {
        let me = rustix::process::geteuid().as_raw();
        let (what, remedy) = match self {
            Holder::Creator { pool, .. } => (
                format!("the socket name of shared pool `{pool}`"),
                "stop that process or pick another --shared name",
            ),
            Holder::Keeper { name, .. } => (
                format!("the socket {} of kept pool `{name}`", self.socket()),
                "stop that process",
            ),
        };
        Error::Conflict {
            path: self.socket().into(),
            message: format!(
                "{what} is held by pid {pid} of uid {uid}, neither this user (uid {me}) nor \
                 root; refusing to take memory from it: {remedy}"
            ),
        }
    }

    /// The holder refused (not the asker's fault) or failed, blaming
    /// `ranks` and `blamed`.
    fn failed(&self, pid: u32, message: String, ranks: Vec<u32>, blamed: Option<u32>) -> Error {
        match self {
            Holder::Creator { pool, .. } => {
                // When the creator blames nobody (its own failure), blame
                // it, by the pid it is known by.
                let (ranks, blamed) = if ranks.is_empty() && blamed.is_none() {
                    (Vec::new(), known(pid))
                } else {
                    (ranks, blamed)
                };
                peer(
                    format!("shared pool `{pool}`: its creator (pid {pid}) failed: {message}"),
                    ranks,
                    blamed,
                )
            }
            Holder::Keeper { name, .. } => Self::keeper_error(name, message, blamed),
        }
    }

    /// The error when the holder (`pid`) speaks a lease protocol this side
    /// does not: both versions named. A creator is of the same hostpool
    /// as its ranks and sends none.
    fn speaks(&self, pid: u32, theirs: Protocol) -> Option<Error> {
        let Holder::Keeper { name, .. } = self else {
            return None;
        };
        let why = PROTOCOL.refusal(
            theirs,
            "this engine",
            &format!("the keeper of `{name}` (pid {pid})"),
        )?;
        Some(Self::keeper_error(name, why, Some(pid)))
    }

    /// The holder hung up (or said something else) before the handover.
    fn gone_before(&self, pid: u32) -> Error {
        match self {
            Holder::Creator { pool, .. } => peer(
                format!(
                    "shared pool `{pool}`: its creator (pid {pid}) died before the pool was ready"
                ),
                Vec::new(),
                known(pid),
            ),
            Holder::Keeper { .. } => self.keeper_died(pid, "died before it handed over the pool"),
        }
    }

    fn keeper_died(&self, pid: u32, what: &str) -> Error {
        let name = self.name();
        Self::keeper_error(
            name,
            format!(
                "the keeper of `{name}` (pid {pid}) {what}; {}",
                how_to_start(name)
            ),
            Some(pid),
        )
    }

    fn name(&self) -> &str {
        match self {
            Holder::Creator { pool, .. } => pool,
            Holder::Keeper { name, .. } => name,
        }
    }

    /// The holder did not hand the pool over by the attach deadline.
    fn late(&self, pid: u32) -> Error {
        let why = pool_core::host::process::why_late(pid);
        match self {
            Holder::Creator {
                pool,
                attach_timeout_secs,
                ..
            } => peer(
                format!(
                    "shared pool `{pool}` was not ready after {attach_timeout_secs:.0} s: its \
                     creator (pid {pid}) is still creating it ({why}); raise --attach-timeout \
                     for very large pools"
                ),
                Vec::new(),
                known(pid),
            ),
            Holder::Keeper {
                name,
                attach_timeout_secs,
                ..
            } => Self::keeper_error(
                name,
                format!(
                    "the keeper of `{name}` (pid {pid}: {why}) did not hand over the pool within \
                     {attach_timeout_secs} s (it may be clearing it after the previous lease); \
                     check the keeper, or raise --attach-timeout (`keeper_attach_timeout_secs`)"
                ),
                Some(pid),
            ),
        }
    }

    /// The handover broke: the holder hung up, or said something else,
    /// before every file came.
    fn broken(&self, pid: u32) -> Error {
        match self {
            Holder::Creator { pool, rank, .. } => {
                let rank = rank.unwrap_or_default();
                peer(
                    format!(
                        "shared pool `{pool}`: its creator, rank {rank} (pid {pid}), died while \
                         handing over the pool"
                    ),
                    vec![rank],
                    known(pid),
                )
            }
            Holder::Keeper { .. } => self.keeper_died(pid, "died while handing over the pool"),
        }
    }

    /// What the holder handed over does not pair up, or is not what this
    /// process planned.
    fn mismatched(&self, pid: u32, what: String) -> Error {
        match self {
            Holder::Creator { pool, rank, .. } => peer(
                format!("shared pool `{pool}`: its creator {what}"),
                rank.iter().copied().collect(),
                known(pid),
            ),
            Holder::Keeper { .. } => self.keeper_died(pid, &what),
        }
    }

    /// A handed-over file that cannot be mapped as it is (truncated by
    /// another holder), in the holder's words.
    fn unmappable(&self, pid: u32, e: Error) -> Error {
        match (self, e) {
            (Holder::Keeper { name, .. }, Error::Conflict { message, .. }) => {
                Self::keeper_error(name, format!("kept pool `{name}`'s {message}"), Some(pid))
            }
            (_, e) => e,
        }
    }

    /// The holder hung up while this rank waited at the barrier.
    fn gone_at_barrier(&self, pid: u32) -> Error {
        match self {
            Holder::Creator { pool, rank, .. } => {
                let rank = rank.unwrap_or_default();
                peer(
                    format!(
                        "shared pool `{pool}`: its creator (rank {rank}, pid {pid}) died before \
                         the barrier completed"
                    ),
                    vec![rank],
                    known(pid),
                )
            }
            Holder::Keeper { .. } => self.keeper_died(pid, "died while the ranks attached"),
        }
    }

    /// Nobody said go by the barrier deadline.
    fn late_at_barrier(&self, pid: u32) -> Error {
        match self {
            Holder::Creator {
                pool,
                rank,
                barrier_timeout_secs,
                ..
            } => {
                let rank = rank.unwrap_or_default();
                peer(
                    format!(
                        "shared pool `{pool}`: rank {rank} (pid {pid}: {}), the pool's creator, \
                         did not reach the barrier within {barrier_timeout_secs:.0} s or did not \
                         answer; check the process, or raise --barrier-timeout for very large \
                         pools",
                        pool_core::host::process::why_late(pid),
                    ),
                    vec![rank],
                    known(pid),
                )
            }
            Holder::Keeper {
                name,
                barrier_timeout_secs,
                ..
            } => Self::keeper_error(
                name,
                format!(
                    "the other ranks of kept pool `{name}` did not attach within \
                     {barrier_timeout_secs:.0} s"
                ),
                None,
            ),
        }
    }

    fn barrier_timeout_secs(&self) -> f64 {
        match self {
            Holder::Creator {
                barrier_timeout_secs,
                ..
            }
            | Holder::Keeper {
                barrier_timeout_secs,
                ..
            } => *barrier_timeout_secs,
        }
    }
}

/// The holder of `conn`'s pid, once its credentials are this user's or
/// root's (memory from anyone else's process is refused).
///
/// # Errors
/// [`Error::Conflict`] naming the foreign process.
pub(crate) fn holder_pid(conn: &OwnedFd, holder: &Holder) -> Result<u32> {
    let (uid, pid) = wire::peer_cred(conn)?;
    let me = rustix::process::geteuid().as_raw();
    if uid != me && uid != 0 {
        return Err(holder.foreign(uid, pid));
    }
    Ok(pid)
}

/// What a holder offered with its files.
#[derive(Debug)]
pub(crate) enum Offer {
    /// A creator's welcome.
    Welcome,
    /// A keeper's lease: its identity and the pool's backing.
    Lease { info: LeaseInfo, backing: String },
}

/// A joined pool: mapped, and the connection the barrier and the end run
/// over.
#[derive(Debug)]
pub(crate) struct Joined {
    pub mapping: FileMapping,
    pub conn: OwnedFd,
    pub pid: u32,
    pub holder: Holder,
    pub offer: Offer,
    /// The pool's size, as this process planned it or the holder gave it.
    pub size: MappedSize,
}

/// A request to join: what to ask whom, until when, and what this process
/// planned itself (a shared pool's joiner plans its pool: the holder's files
/// must be exactly those extents; a lessee takes the keeper's).
#[derive(Debug)]
pub(crate) struct Joining<'a> {
    pub conn: OwnedFd,
    pub holder: Holder,
    pub request: Message,
    pub deadline: Instant,
    pub cancel: &'a Cancel,
    pub planned: Option<(MappedSize, Vec<Extent>)>,
    pub map: MapContext,
    /// The failpoint that stalls between the handover and the mapping.
    pub stall: &'static str,
}

fn extents(pairs: Vec<(u64, u64)>) -> Vec<Extent> {
    pairs
        .into_iter()
        .map(|(offset, len)| Extent { offset, len })
        .collect()
}

/// Join: check the holder, ask, receive the files, check and map them.
///
/// # Errors
/// [`Error::Conflict`] for a foreign holder; a usage error (or
/// [`Error::PageSizeMismatch`]) when the holder refused the request itself;
/// [`Error::Peer`] or [`Error::Keeper`] naming whom the holder's failure,
/// death or lateness blames; mapping errors (a truncated file among them).
pub(crate) fn join(j: Joining<'_>) -> Result<Joined> {
    let Joining {
        conn,
        mut holder,
        request,
        deadline,
        cancel,
        planned,
        map,
        stall,
    } = j;
    let pid = holder_pid(&conn, &holder)?;
    if let Err(e) = wire::send(&conn, &request, &[]) {
        // A holder that refuses every request (a creator that failed: see
        // [`crate::Refusal`]) answers at once and closes without reading
        // it, which then finds the socket closed: its answer is queued
        // here, and read below. Any other failure is ours.
        let closed = matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET));
        if !closed {
            return Err(wire::os("sendmsg", e, "asking for the pool failed"));
        }
    }
    let mut fds = Vec::new();
    let (offer, offered, handed, count) =
        match wire::recv::<Message>(&conn, deadline, &mut fds, Some(cancel))? {
            Received::Msg(Message::Welcome {
                creator_rank,
                files,
                extents: handed,
            }) => {
                if let Holder::Creator { rank, .. } = &mut holder {
                    *rank = Some(creator_rank);
                }
                (Offer::Welcome, None, handed, files)
            }
            Received::Msg(Message::Lease {
                protocol,
                info,
                logical,
                mapped,
                page,
                backing,
                extents: handed,
                files,
            }) => {
                if let Some(e) = holder.speaks(pid, protocol) {
                    // Nothing is mapped: the descriptors close with `fds`,
                    // and the keeper reads a clean end.
                    let _ = wire::send(&conn, &Message::Release, &[]);
                    return Err(e);
                }
                (
                    Offer::Lease { info, backing },
                    Some((logical, mapped, page)),
                    handed,
                    files,
                )
            }
            Received::Msg(Message::Refused {
                usage: true,
                message,
                page: Some(creator_page),
                ..
            }) => {
                return Err(Error::PageSizeMismatch {
                    message,
                    creator_page,
                });
            }
            Received::Msg(Message::Refused {
                usage: true,
                message,
                ..
            }) => return Err(Error::config(message)),
            Received::Msg(
                Message::Refused {
                    message,
                    ranks,
                    pid: blamed,
                    ..
                }
                | Message::Failed {
                    message,
                    ranks,
                    pid: blamed,
                },
            ) => return Err(holder.failed(pid, message, ranks, blamed)),
            Received::Msg(_) | Received::Gone => return Err(holder.gone_before(pid)),
            Received::TimedOut => return Err(holder.late(pid)),
        };
    let received = take_over(conn.as_fd(), deadline, cancel, fds, count, handed)?;
    pool_core::failpoint::stall(stall);
    let files = match received {
        Ok(files) => files,
        Err(Handover::Broken) => return Err(holder.broken(pid)),
        Err(Handover::Miscounted { files, extents }) => {
            return Err(holder.mismatched(
                pid,
                format!("handed over {files} file(s) for {extents} extent(s)"),
            ));
        }
    };
    let size = match (offered, planned) {
        (Some((logical, mapped, page)), None) => {
            let size = pool_core::round_to_page(logical, PageSize::new(page)?)?;
            if size.mapped() != mapped {
                return Err(holder.mismatched(pid, "sent sizes that do not agree".into()));
            }
            size
        }
        (None, Some((size, planned))) => {
            let got: Vec<Extent> = files.iter().map(|f| f.extent).collect();
            if got != planned {
                return Err(holder.mismatched(
                    pid,
                    format!(
                        "handed over {} file(s) whose extents are not the {} this rank planned",
                        got.len(),
                        planned.len()
                    ),
                ));
            }
            size
        }
        _ => {
            return Err(holder.mismatched(pid, "answered with an offer of another kind".into()));
        }
    };
    // A file shorter than its extent (truncated by another holder) would
    // make this process's accesses past its end a SIGBUS: `map_files` maps
    // none of it, and says so in the holder's words.
    let mapping = file::map_files(files, size, &map).map_err(|e| holder.unmappable(pid, e))?;
    Ok(Joined {
        mapping,
        conn,
        pid,
        holder,
        offer,
        size,
    })
}

/// A joiner's side of the barrier: say how this rank's setup went
/// (`outcome`), then wait for the holder's go, or why the pool failed.
///
/// # Errors
/// [`Error::Peer`] naming this rank when `outcome` is an error, or whom the
/// holder's failure blames; the holder's death or silence past the barrier
/// timeout, naming it.
pub(crate) fn arrive(
    conn: BorrowedFd<'_>,
    holder: &Holder,
    pid: u32,
    rank: u32,
    outcome: std::result::Result<(), String>,
    cancel: &Cancel,
) -> Result<()> {
    let mine = outcome.err();
    let _ = wire::send(
        conn,
        &Message::Arrived {
            error: mine.clone(),
        },
        &[],
    );
    if let Some(msg) = mine {
        return Err(peer(
            format!("rank {rank} failed: {msg}"),
            vec![rank],
            Some(std::process::id()),
        ));
    }
    let deadline = Instant::now()
        + Duration::from_secs_f64(holder.barrier_timeout_secs())
        + Duration::from_secs(2);
    match wire::recv::<Message>(conn, deadline, &mut Vec::new(), Some(cancel))? {
        Received::Msg(Message::Go) => Ok(()),
        Received::Msg(Message::Failed {
            message,
            ranks,
            pid,
        }) => Err(peer(message, ranks, pid)),
        Received::Msg(_) | Received::Gone => Err(holder.gone_at_barrier(pid)),
        Received::TimedOut => Err(holder.late_at_barrier(pid)),
    }
}

/// A holder's side of the handover: send `head` (made from the first
/// chunk's extents and the number of files in all) with the first chunk of
/// descriptors, then the rest in [`Message::Files`], each with its extents:
/// a creator's welcome and a keeper's lease alike.
///
/// # Errors
/// The failed `sendmsg` (the joiner left).
pub fn hand_over(
    conn: BorrowedFd<'_>,
    head: impl FnOnce(Vec<(u64, u64)>, usize) -> Message,
    files: &[(BorrowedFd<'_>, Extent)],
) -> std::io::Result<()> {
    let mut chunks = files.chunks(wire::FDS_PER_MSG).map(|c| {
        let fds: Vec<BorrowedFd<'_>> = c.iter().map(|(fd, _)| *fd).collect();
        let extents: Vec<(u64, u64)> = c.iter().map(|(_, e)| (e.offset, e.len)).collect();
        (fds, extents)
    });
    let (first, extents) = chunks.next().unwrap_or_default();
    wire::send(conn, &head(extents, files.len()), &first)?;
    chunks.try_for_each(|(fds, extents)| wire::send(conn, &Message::Files { extents }, &fds))
}

/// Receive what [`hand_over`] sends: `count` files of the extents `handed`
/// (with `fds`, the first message's descriptors), then those of each
/// [`Message::Files`] after it, paired with their extents.
///
/// # Errors
/// As [`wire::receive_files`].
pub fn take_over(
    conn: BorrowedFd<'_>,
    deadline: Instant,
    cancel: &Cancel,
    fds: Vec<OwnedFd>,
    count: usize,
    handed: Vec<(u64, u64)>,
) -> Result<std::result::Result<Vec<file::PoolFile>, Handover>> {
    wire::receive_files::<Message>(
        conn,
        deadline,
        cancel,
        fds,
        count,
        extents(handed),
        |m| match m {
            Message::Files { extents: more } => Some(extents(more)),
            _ => None,
        },
    )
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;
    use crate::message::LeaseInfo;

    const MIB: u64 = 1 << 20;

    fn pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    fn creator() -> Holder {
        Holder::Creator {
            pool: "unit".into(),
            rank: None,
            attach_timeout_secs: 10.0,
            barrier_timeout_secs: 1.0,
        }
    }

    fn keeper() -> Holder {
        Holder::Keeper {
            name: "unit".into(),
            attach_timeout_secs: 10.0,
            barrier_timeout_secs: 1.0,
        }
    }

    fn memfd(len: u64) -> OwnedFd {
        let fd = rustix::fs::memfd_create("hostpool-unit-join", rustix::fs::MemfdFlags::CLOEXEC)
            .unwrap();
        rustix::fs::ftruncate(&fd, len).unwrap();
        fd
    }

    /// What a holder of `kind` hands over: `files` with `extents` in
    /// the message of its kind, for an 8 MiB pool of 4 KiB pages.
    fn head(holder: &Holder, extents: Vec<(u64, u64)>, files: usize) -> Message {
        match holder {
            Holder::Creator { .. } => Message::Welcome {
                creator_rank: 0,
                files,
                extents,
            },
            Holder::Keeper { .. } => Message::Lease {
                protocol: PROTOCOL,
                info: LeaseInfo {
                    name: "unit".into(),
                    instance: "i".into(),
                    generation: 1,
                    content: "keep".into(),
                    previous: None,
                    tag: None,
                    keeper_pid: std::process::id(),
                    tenants: 1,
                },
                logical: 8 * MIB,
                mapped: 8 * MIB,
                page: 4096,
                backing: "anon".into(),
                extents,
                files,
            },
        }
    }

    /// Join `holder`, which hands over `files` (each with its extent) from
    /// another thread; a creator's joiner planned one 8 MiB file.
    fn join_with(holder: Holder, files: Vec<(OwnedFd, Extent)>) -> Result<Joined> {
        let (ours, theirs) = pair();
        let h = holder.clone();
        let serving = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            let asked = wire::recv::<Message>(&theirs, deadline, &mut Vec::new(), None);
            assert!(matches!(asked, Ok(Received::Msg(_))));
            let fds: Vec<(BorrowedFd<'_>, Extent)> =
                files.iter().map(|(fd, e)| (fd.as_fd(), *e)).collect();
            hand_over(theirs.as_fd(), |x, n| head(&h, x, n), &fds).unwrap();
            theirs
        });
        let planned = matches!(holder, Holder::Creator { .. }).then(|| {
            let size = pool_core::round_to_page(8 * MIB, PageSize::BASE_4K).unwrap();
            (
                size,
                vec![Extent {
                    offset: 0,
                    len: 8 * MIB,
                }],
            )
        });
        let joined = join(Joining {
            conn: ours,
            holder,
            request: Message::Status,
            deadline: Instant::now() + Duration::from_secs(10),
            cancel: &Cancel::new(),
            planned,
            map: MapContext::default(),
            stall: "unit",
        });
        drop(serving.join().unwrap());
        joined
    }

    /// The length check runs on the one join: a file shorter than its
    /// extent (another holder truncated it) is refused, naming it, whether
    /// a creator or a keeper handed it over; a whole one maps.
    #[test]
    fn a_short_file_is_refused_from_a_creator_and_a_keeper_alike() {
        let whole = Extent {
            offset: 0,
            len: 8 * MIB,
        };
        for holder in [creator(), keeper()] {
            let e = join_with(holder.clone(), vec![(memfd(4096), whole)])
                .expect_err("a short file is not mapped");
            let text = e.to_string();
            assert!(
                text.contains("file 0 is 4 KiB long, shorter than its 8 MiB extent"),
                "{holder:?}: {text}"
            );
            // A keeper's is the keeper's error, naming it.
            assert_eq!(
                matches!(e, Error::Keeper { .. }),
                matches!(holder, Holder::Keeper { .. }),
                "{holder:?}: {e:?}"
            );
            let joined = join_with(holder.clone(), vec![(memfd(8 * MIB), whole)]).unwrap();
            assert_eq!(joined.size.mapped(), 8 * MIB, "{holder:?}");
            assert_eq!(joined.mapping.region().mapped_len(), 8 * MIB);
            assert!(
                matches!(
                    (&holder, &joined.offer),
                    (Holder::Creator { .. }, Offer::Welcome)
                        | (Holder::Keeper { .. }, Offer::Lease { .. })
                ),
                "{holder:?}: {:?}",
                joined.offer
            );
        }
    }

    /// A keeper whose first message speaks a protocol this engine does not
    /// is refused before anything maps, naming both versions; it reads a
    /// clean release, not a death.
    #[test]
    fn a_keeper_of_another_protocol_is_refused_naming_both_versions() {
        let (ours, theirs) = pair();
        let serving = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            let asked = wire::recv::<Message>(&theirs, deadline, &mut Vec::new(), None);
            assert!(matches!(asked, Ok(Received::Msg(_))));
            let file = memfd(8 * MIB);
            let whole = Extent {
                offset: 0,
                len: 8 * MIB,
            };
            hand_over(
                theirs.as_fd(),
                |x, n| {
                    let mut m = head(&keeper(), x, n);
                    if let Message::Lease { protocol, .. } = &mut m {
                        *protocol = Protocol {
                            version: 9,
                            oldest: 9,
                        };
                    }
                    m
                },
                &[(file.as_fd(), whole)],
            )
            .unwrap();
            wire::recv::<Message>(&theirs, deadline, &mut Vec::new(), None)
        });
        let e = join(Joining {
            conn: ours,
            holder: keeper(),
            request: Message::Status,
            deadline: Instant::now() + Duration::from_secs(10),
            cancel: &Cancel::new(),
            planned: None,
            map: MapContext::default(),
            stall: "unit",
        })
        .expect_err("another protocol is refused");
        let text = e.to_string();
        assert!(matches!(e, Error::Keeper { absent: false, .. }), "{e:?}");
        assert!(
            text.contains(&format!(
                "this engine speaks lease protocol {} (down to {}) and the keeper of `unit` \
                 (pid {}) speaks 9 (down to 9)",
                PROTOCOL.version,
                PROTOCOL.oldest,
                std::process::id()
            )) && text.contains("this engine is older"),
            "{text}"
        );
        assert!(matches!(
            serving.join().unwrap(),
            Ok(Received::Msg(Message::Release))
        ));
    }

    /// A creator's files must be the joiner's own plan: two files where it
    /// planned one are refused, naming the creator, before anything maps.
    #[test]
    fn files_other_than_the_joiners_plan_are_refused() {
        let half = |offset| Extent {
            offset,
            len: 4 * MIB,
        };
        let e = join_with(
            creator(),
            vec![(memfd(4 * MIB), half(0)), (memfd(4 * MIB), half(4 * MIB))],
        )
        .expect_err("another plan is refused");
        let text = e.to_string();
        assert!(
            matches!(&e, Error::Peer { ranks, .. } if ranks == &[0])
                && text.contains("are not the 1 this rank planned"),
            "{text}"
        );
    }

    /// The joiner's side of the barrier, for both holders: a failure the
    /// holder relays keeps whom it blames; a holder that hangs up is named
    /// (a creator by its rank, a keeper by its pool); this rank's own
    /// failure names it.
    #[test]
    fn a_joiner_at_the_barrier_hears_go_failed_or_the_holders_death() {
        let pid = std::process::id();
        for holder in [creator(), keeper()] {
            let (ours, theirs) = pair();
            let failed = Message::Failed {
                message: "rank 3 (pid 42) failed: no memory".into(),
                ranks: vec![3],
                pid: Some(42),
            };
            wire::send(&theirs, &failed, &[]).unwrap();
            let e = arrive(ours.as_fd(), &holder, pid, 1, Ok(()), &Cancel::new()).unwrap_err();
            assert!(
                matches!(&e, Error::Peer { ranks, pid: Some(42), .. } if ranks == &[3]),
                "{e}"
            );
            wire::send(&theirs, &Message::Go, &[]).unwrap();
            arrive(ours.as_fd(), &holder, pid, 1, Ok(()), &Cancel::new()).unwrap();
            let e = arrive(
                ours.as_fd(),
                &holder,
                pid,
                1,
                Err("pinning failed".into()),
                &Cancel::new(),
            )
            .unwrap_err();
            assert!(
                matches!(&e, Error::Peer { ranks, .. } if ranks == &[1])
                    && e.to_string().contains("rank 1 failed: pinning failed"),
                "{e}"
            );
            drop(theirs);
            let e = arrive(ours.as_fd(), &holder, pid, 1, Ok(()), &Cancel::new()).unwrap_err();
            let text = e.to_string();
            match holder {
                Holder::Creator { .. } => assert!(
                    text.contains("its creator (rank 0")
                        && text.contains("died before the barrier"),
                    "{text}"
                ),
                Holder::Keeper { .. } => assert!(
                    matches!(e, Error::Keeper { .. })
                        && text.contains("died while the ranks attached"),
                    "{text}"
                ),
            }
        }
    }
}
