//! An engine's side of a lease: attach to a keeper, map what it hands over,
//! meet the other ranks at its barrier, release at teardown.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{LeaseInfo, address, how_to_start, keeper_error, socket_name};
use crate::message::Message;
use crate::wire::{self, Received};
use pool_core::Region;
use pool_core::file::Attachment;
use pool_core::file::{self, FileMapping, MapContext};
use pool_core::interrupt::Cancel;
use pool_core::plugin::RankBarrier;
use pool_core::{Error, Result, TeardownIssue};
use pool_core::{Extent, PageSize};

/// Connect to the keeper of `name`, checking that it runs as this user or
/// root (memory from anyone else's process is refused).
fn connect(name: &str) -> Result<(OwnedFd, u32)> {
    let addr = address(name)?;
    let sock = wire::seqpacket()?;
    pool_core::failpoint::stall("keeper-before-connect");
    if let Err(e) = rustix::net::connect(&sock, &addr) {
        return Err(keeper_error(
            name,
            format!(
                "no keeper answers for kept pool `{name}` on {} ({}); {}",
                socket_name(name),
                std::io::Error::from(e),
                how_to_start(name)
            ),
            None,
            true,
        ));
    }
    let (uid, pid) = wire::peer_cred(&sock)?;
    let me = rustix::process::geteuid().as_raw();
    if uid != me && uid != 0 {
        return Err(Error::Conflict {
            path: socket_name(name).into(),
            message: format!(
                "the socket {} of kept pool `{name}` is held by pid {pid} of uid {uid}, neither \
                 this user (uid {me}) nor root; refusing to take memory from it: stop that \
                 process",
                socket_name(name)
            ),
        });
    }
    Ok((sock, pid))
}

/// The status of the keeper of `name`.
pub(super) fn status(name: &str) -> Result<Value> {
    let (sock, pid) = connect(name)?;
    wire::send(&sock, &Message::Status, &[])
        .map_err(|e| wire::os("sendmsg", e, "asking the keeper failed"))?;
    match wire::recv::<Message>(
        &sock,
        Instant::now() + Duration::from_secs(5),
        &mut Vec::new(),
        None,
    )? {
        Received::Msg(Message::StatusOf(v)) => Ok(v),
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

/// Lease the pool `config.keeper` names and map it.
///
/// # Errors
/// [`Error::Keeper`] (with `absent` when no keeper answers), a usage error
/// when the keeper's pool is not the one asked for, mapping errors.
pub fn attach(config: &pool_core::PoolConfig, cancel: &Cancel) -> Result<Box<dyn Attachment>> {
    let Some(name) = config.keeper.as_deref() else {
        return Err(Error::config("no keeper named"));
    };
    let started = Instant::now();
    let sharing = config.sharing.clone();
    let (world, rank, engine) = sharing
        .as_ref()
        .map_or((1, 0, String::new()), |s| (s.world, s.rank, s.name.clone()));
    let attach_timeout = config.keeper_attach_timeout();
    let barrier_timeout = sharing
        .as_ref()
        .map_or(pool_core::DEFAULT_BARRIER_TIMEOUT_SECS, |s| {
            s.barrier_timeout_secs
        });
    let (sock, pid) = connect(name)?;
    let hello = Message::Hello {
        world,
        rank,
        engine,
        size: config.size_given.then_some(config.size.get()),
        page: config.page_size.map(|p| p.get()),
        tag: config.keeper_tag.clone(),
        attach_timeout_secs: attach_timeout,
        barrier_timeout_secs: barrier_timeout,
    };
    wire::send(&sock, &hello, &[])
        .map_err(|e| wire::os("sendmsg", e, "asking the keeper for a lease failed"))?;
    let deadline = started + Duration::from_secs_f64(attach_timeout) + Duration::from_secs(1);
    let died = |what: &str| {
        keeper_error(
            name,
            format!(
                "the keeper of `{name}` (pid {pid}) {what}; {}",
                how_to_start(name)
            ),
            Some(pid),
            false,
        )
    };
    let mut fds = Vec::new();
    let (info, logical, mapped, page, backing, extents, count) =
        match wire::recv::<Message>(&sock, deadline, &mut fds, Some(cancel))? {
            Received::Msg(Message::Lease {
                info,
                logical,
                mapped,
                page,
                backing,
                extents,
                files,
            }) => (info, logical, mapped, page, backing, extents, files),
            Received::Msg(Message::Refused {
                usage: true,
                message,
                ..
            }) => return Err(Error::config(message)),
            Received::Msg(Message::Refused { message, pid, .. }) => {
                return Err(keeper_error(name, message, pid, false));
            }
            Received::Msg(_) | Received::Gone => {
                return Err(died("died before it handed over the pool"));
            }
            Received::TimedOut => {
                return Err(keeper_error(
                    name,
                    format!(
                        "the keeper of `{name}` (pid {pid}: {}) did not hand over the pool \
                         within {attach_timeout} s (it may be clearing it after the previous \
                         lease); check the keeper, or raise --attach-timeout \
                         (`keeper_attach_timeout_secs`)",
                        pool_core::host::process::why_late(pid)
                    ),
                    Some(pid),
                    false,
                ));
            }
        };
    let extents = extents
        .into_iter()
        .map(|(offset, len)| Extent { offset, len })
        .collect();
    let handed =
        wire::receive_files::<Message>(sock.as_fd(), deadline, cancel, fds, count, extents, |m| {
            match m {
                Message::Files { extents } => Some(
                    extents
                        .into_iter()
                        .map(|(offset, len)| Extent { offset, len })
                        .collect(),
                ),
                _ => None,
            }
        })?;
    pool_core::failpoint::stall("keeper-passing-fds");
    let files = match handed {
        Ok(files) => files,
        Err(wire::Handover::Broken) => return Err(died("died while handing over the pool")),
        Err(wire::Handover::Miscounted { files, extents }) => {
            return Err(died(&format!(
                "handed over {files} file(s) for {extents} extent(s)"
            )));
        }
    };
    let page = PageSize::new(page)?;
    let size = pool_core::round_to_page(logical, page)?;
    if size.mapped() != mapped {
        return Err(died("sent sizes that do not agree"));
    }
    // A file shorter than its extent (truncated by another holder) would
    // make this process's accesses past its end a SIGBUS: `map_files` maps
    // none of it, and says so in the keeper's words.
    let inner = file::map_files(
        files,
        size,
        &MapContext {
            enomem_remedy: "mapping the kept pool failed: raise the address-space limit \
                            (ulimit -v)"
                .into(),
            truncated_remedy: format!("restart the keeper (pid {pid})"),
        },
    )
    .map_err(|e| match e {
        Error::Conflict { message, .. } => keeper_error(
            name,
            format!("kept pool `{name}`'s {message}"),
            Some(pid),
            false,
        ),
        e => e,
    })?;
    pool_core::failpoint::stall("keeper-attached");
    let shard = match &sharing {
        Some(s) => pool_core::shared::shard(size, s)?,
        None => Extent {
            offset: 0,
            len: size.mapped(),
        },
    };
    Ok(Box::new(LeasedMapping {
        inner,
        conn: Some(sock),
        info,
        backing,
        attach_seconds: started.elapsed().as_secs_f64(),
        keeper_pid: pid,
        sharing,
        shard,
        cancel: cancel.clone(),
    }))
}

/// The mapping of a leased pool.
#[derive(Debug)]
struct LeasedMapping {
    inner: FileMapping,
    /// The lease: its end is this connection's end.
    conn: Option<OwnedFd>,
    info: LeaseInfo,
    backing: String,
    attach_seconds: f64,
    keeper_pid: u32,
    sharing: Option<pool_core::SharingConfig>,
    shard: Extent,
    /// The build's token, which the barrier's wait checks.
    cancel: Cancel,
}

impl LeasedMapping {
    fn barrier(&mut self, outcome: std::result::Result<(), String>) -> Result<()> {
        let name = &self.info.name;
        let Some(conn) = &self.conn else {
            return outcome.map_err(Error::config);
        };
        let timeout = self
            .sharing
            .as_ref()
            .map_or(pool_core::DEFAULT_BARRIER_TIMEOUT_SECS, |s| {
                s.barrier_timeout_secs
            });
        let mine = outcome.as_ref().err().cloned();
        let _ = wire::send(
            conn,
            &Message::Arrived {
                error: mine.clone(),
            },
            &[],
        );
        let rank = self.sharing.as_ref().map_or(0, |s| s.rank);
        if let Some(msg) = mine {
            return Err(Error::Peer {
                message: format!("rank {rank} failed: {msg}"),
                ranks: vec![rank],
                pid: Some(std::process::id()),
            });
        }
        let deadline = Instant::now() + Duration::from_secs_f64(timeout) + Duration::from_secs(2);
        match wire::recv::<Message>(conn, deadline, &mut Vec::new(), Some(&self.cancel))? {
            Received::Msg(Message::Go) => Ok(()),
            Received::Msg(Message::Failed {
                message,
                ranks,
                pid,
            }) => Err(Error::Peer {
                message,
                ranks,
                pid,
            }),
            Received::Msg(_) | Received::Gone => Err(keeper_error(
                name,
                format!(
                    "the keeper of `{name}` (pid {}) died while the ranks attached; {}",
                    self.keeper_pid,
                    how_to_start(name)
                ),
                Some(self.keeper_pid),
                false,
            )),
            Received::TimedOut => Err(keeper_error(
                name,
                format!(
                    "the other ranks of kept pool `{name}` did not attach within {timeout:.0} s"
                ),
                None,
                false,
            )),
        }
    }
}

impl Attachment for LeasedMapping {
    fn region(&self) -> Region<'_> {
        self.inner.region()
    }

    fn checked_capacity(&self) -> bool {
        false
    }

    fn sharing(&self) -> Option<Value> {
        let s = self.sharing.as_ref()?;
        pool_core::shared::SharingReport::of_lease(s, self.shard)
    }

    fn leased(&self) -> Option<Value> {
        let mut v = serde_json::to_value(&self.info).ok()?;
        if let Value::Object(m) = &mut v {
            m.insert("attach_seconds".into(), self.attach_seconds.into());
            m.insert("backing".into(), self.backing.clone().into());
        }
        Some(v)
    }

    fn reserve_for_touch(&self, _extent: Extent) -> Result<()> {
        Ok(())
    }

    fn rendezvous(
        &mut self,
        outcome: std::result::Result<(), String>,
        _barrier: Option<&dyn RankBarrier>,
    ) -> Result<()> {
        if self.sharing.as_ref().is_none_or(|s| s.world == 1) {
            return outcome.map_err(Error::config);
        }
        self.barrier(outcome)
    }

    fn teardown(self: Box<Self>) -> Vec<TeardownIssue> {
        let LeasedMapping { inner, conn, .. } = *self;
        let issues = Box::new(inner).teardown();
        pool_core::failpoint::stall("keeper-release");
        if let Some(conn) = conn {
            // Unmapped first: the keeper may clear the pool once it reads this.
            let _ = wire::send(&conn, &Message::Release, &[]);
        }
        issues
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    /// A keeper that hands over a file shorter than its extent (another
    /// holder truncated it): the engine maps nothing and says why, rather
    /// than die of SIGBUS at its first access past the file's end.
    #[test]
    fn a_file_shorter_than_its_extent_is_not_mapped() {
        let name = format!("unit-short-{}", std::process::id());
        let listener = wire::seqpacket().unwrap();
        rustix::net::bind(&listener, &address(&name).unwrap()).unwrap();
        rustix::net::listen(&listener, 4).unwrap();
        let keeper = std::thread::spawn(move || {
            let conn = rustix::net::accept(&listener).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            let hello = wire::recv::<Message>(&conn, deadline, &mut Vec::new(), None);
            assert!(matches!(hello, Ok(Received::Msg(Message::Hello { .. }))));
            let fd = rustix::fs::memfd_create("hostpool-short", rustix::fs::MemfdFlags::CLOEXEC)
                .unwrap();
            rustix::fs::ftruncate(&fd, 4096).unwrap();
            let lease = Message::Lease {
                info: LeaseInfo {
                    name: "short".into(),
                    instance: "i".into(),
                    generation: 1,
                    content: "keep".into(),
                    previous: None,
                    tag: None,
                    keeper_pid: std::process::id(),
                },
                logical: 8 << 20,
                mapped: 8 << 20,
                page: 4096,
                backing: "shm-segmented".into(),
                extents: vec![(0, 8 << 20)],
                files: 1,
            };
            wire::send(&conn, &lease, &[fd.as_fd()]).unwrap();
            // Hold the connection until the engine hangs up.
            let _ = wire::recv::<Message>(&conn, deadline, &mut Vec::new(), None);
        });
        let config = pool_core::PoolConfig {
            keeper: Some(name.clone()),
            ..pool_core::PoolConfig::default()
        };
        let e = attach(&config, &Cancel::new()).expect_err("a short file is not mapped");
        let text = e.to_string();
        assert!(
            matches!(e, Error::Keeper { .. })
                && text.contains("file 0 is 4 KiB long, shorter than its 8 MiB extent"),
            "{text}"
        );
        keeper.join().unwrap();
    }
}
