//! systemd's file descriptor store (`sd_pid_notify_with_fds(3)`,
//! `FDSTORE=1`): a keeper run as a service with `FileDescriptorStoreMax=`
//! hands systemd a descriptor of each of its pools' files once they are
//! built, and a keeper that systemd starts again (after a crash, a
//! `systemctl restart`, an upgrade) gets them back at exec
//! (`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`: `sd_listen_fds(3)`) and
//! adopts them instead of building: the same memory, its bytes and its
//! index, which the engines may still map.
//!
//! Each file is stored under its own name, `hostpool.<pool>.<i>` of `n`
//! (`FDNAME=hostpool.<pool>.<i>.<n>`), so several pools of one keeper and
//! their files in pool order are told apart whatever order systemd hands
//! them back in. Without `$NOTIFY_SOCKET` nothing is stored; descriptors
//! passed that are not named so are left alone (closed at exit).

use std::collections::BTreeMap;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix,
    SocketFlags, SocketType,
};

/// The name of file `i` of `n` of pool `pool` in the store.
pub fn fd_name(pool: &str, i: usize, n: usize) -> String {
    format!("hostpool.{pool}.{i}.{n}")
}

/// What systemd handed this process at exec, by pool: each pool's files in
/// pool order, complete (every `i` of its `n`), or why they cannot be used.
#[derive(Debug, Default)]
pub struct Passed {
    pools: BTreeMap<String, Result<Vec<OwnedFd>, String>>,
}

impl Passed {
    /// Read `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` and take the
    /// descriptors named as this module names them; nothing when the
    /// variables are not set or are another process's (`LISTEN_PID`).
    pub fn take() -> Passed {
        let var = |k: &str| std::env::var(k).ok();
        let (Some(pid), Some(count)) = (var("LISTEN_PID"), var("LISTEN_FDS")) else {
            return Passed::default();
        };
        if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
            return Passed::default();
        }
        let Ok(count) = count.trim().parse::<u32>() else {
            return Passed::default();
        };
        let names = var("LISTEN_FDNAMES").unwrap_or_default();
        let fds = crate::sys::take_passed(3, count.min(4096)).unwrap_or_default();
        Passed::from_named(names.split(':').map(str::to_string).zip(fds).collect())
    }

    /// Sort `named` descriptors into pools by their names.
    fn from_named(named: Vec<(String, OwnedFd)>) -> Passed {
        let mut by_pool: BTreeMap<String, (usize, BTreeMap<usize, OwnedFd>)> = BTreeMap::new();
        let mut bad: BTreeMap<String, String> = BTreeMap::new();
        for (name, fd) in named {
            let Some(rest) = name.strip_prefix("hostpool.") else {
                continue;
            };
            let mut parts = rest.rsplitn(3, '.');
            let (Some(n), Some(i), Some(pool)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            let (Ok(i), Ok(n)) = (i.parse::<usize>(), n.parse::<usize>()) else {
                continue;
            };
            let entry = by_pool
                .entry(pool.to_string())
                .or_insert((n, BTreeMap::new()));
            if entry.0 != n || i >= n || entry.1.insert(i, fd).is_some() {
                bad.insert(
                    pool.to_string(),
                    format!(
                        "its files are named for {} and {n} files, or twice",
                        entry.0
                    ),
                );
            }
        }
        let mut pools = BTreeMap::new();
        for (pool, (n, files)) in by_pool {
            let got = if let Some(why) = bad.remove(&pool) {
                Err(why)
            } else if files.len() != n {
                Err(format!("{} of its {n} files were handed back", files.len()))
            } else {
                Ok(files.into_values().collect())
            };
            pools.insert(pool, got);
        }
        Passed { pools }
    }

    /// Pool `name`'s files, taken out: `None` when none were passed.
    pub fn files(&mut self, name: &str) -> Option<Result<Vec<OwnedFd>, String>> {
        self.pools.remove(name)
    }

    /// The pools whose files were passed and not taken (no pool of that
    /// name in the config): left alone.
    pub fn names(&self) -> Vec<String> {
        self.pools.keys().cloned().collect()
    }
}

/// Store pool `pool`'s `files` with systemd (`FDSTORE=1`, one message a
/// file, named by [`fd_name`]). `Ok(false)` without `$NOTIFY_SOCKET`.
///
/// # Errors
/// The socket's address is not usable, or a send failed (systemd refuses
/// descriptors beyond `FileDescriptorStoreMax=`, which it logs).
pub fn store(pool: &str, files: &[BorrowedFd<'_>]) -> std::io::Result<bool> {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let target = target.to_string_lossy();
    let addr = crate::notify::address(&target)?;
    let sock = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    for (i, fd) in files.iter().enumerate() {
        let state = format!("FDSTORE=1\nFDNAME={}", fd_name(pool, i, files.len()));
        send_with_fd(&sock, &addr, &state, *fd)?;
    }
    Ok(true)
}

/// One notify datagram carrying one descriptor.
fn send_with_fd(
    sock: &OwnedFd,
    addr: &SocketAddrUnix,
    state: &str,
    fd: BorrowedFd<'_>,
) -> std::io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(std::io::Error::from_raw_os_error(libc::E2BIG));
    }
    rustix::net::sendmsg_addr(
        sock.as_fd(),
        addr,
        &[IoSlice::new(state.as_bytes())],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd() -> OwnedFd {
        rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap()
    }

    #[test]
    fn passed_files_are_sorted_into_pools_in_order_and_incomplete_ones_refused() {
        let named = vec![
            ("hostpool.kv.1.2".to_string(), memfd()),
            ("other".to_string(), memfd()),
            ("hostpool.kv.0.2".to_string(), memfd()),
            ("hostpool.a.b.0.3".to_string(), memfd()),
        ];
        let ids: Vec<_> = named
            .iter()
            .map(|(n, fd)| (n.clone(), pool_core::file::file_id(fd).unwrap()))
            .collect();
        let mut passed = Passed::from_named(named);
        assert_eq!(passed.names(), vec!["a.b".to_string(), "kv".to_string()]);
        let kv = passed.files("kv").unwrap().unwrap();
        let got: Vec<_> = kv
            .iter()
            .map(|f| pool_core::file::file_id(f).unwrap())
            .collect();
        assert_eq!(got, vec![ids[2].1, ids[0].1], "in pool order");
        let why = passed.files("a.b").unwrap().unwrap_err();
        assert!(why.contains("1 of its 3 files"), "{why}");
        assert!(passed.files("kv").is_none());
    }

    /// A datagram socket stands in for systemd: each file arrives in its
    /// own message, named, with its descriptor.
    #[test]
    fn stored_files_reach_the_notify_socket_named() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("hostpool-fdstore-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = std::os::unix::net::UnixDatagram::bind_addr(&addr).unwrap();
        let target = crate::notify::address(&format!("@{name}")).unwrap();
        let raw = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let f = memfd();
        send_with_fd(
            &raw,
            &target,
            "FDSTORE=1\nFDNAME=hostpool.kv.0.1",
            f.as_fd(),
        )
        .unwrap();
        let mut buf = [0u8; 256];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            &sock,
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &mut control,
            rustix::net::RecvFlags::CMSG_CLOEXEC,
        )
        .unwrap();
        assert_eq!(&buf[..got.bytes], b"FDSTORE=1\nFDNAME=hostpool.kv.0.1");
        let fds: Vec<OwnedFd> = control
            .drain()
            .flat_map(|m| match m {
                rustix::net::RecvAncillaryMessage::ScmRights(fds) => fds.collect::<Vec<_>>(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(fds.len(), 1);
        assert_eq!(
            pool_core::file::file_id(&fds[0]).unwrap(),
            pool_core::file::file_id(&f).unwrap()
        );
    }
}
