//! The two rendezvous of a shared pool's ranks, behind
//! [`pool_core::shared`]'s API ([`SharedPoolSpec`], [`shard`],
//! [`SharingReport`]). The default, `socket` (`socket.rs`): the ranks meet on
//! an abstract unix socket and the creator passes its unlinked files'
//! descriptors, so nothing is ever in a directory; a creator that fails goes
//! on refusing the ranks that come later with its cause ([`Refusal`], as
//! the build's [`pool_core::shared::Refusals`] says). The other, `file` (`file.rs`), for ranks that
//! share only a directory: they meet in a control file beside the data files
//! (`<control_dir>/hostpool-<name>.ctl`, default `/dev/shm`, and
//! `<dir>/hostpool-<name>.pool` or `.pool.<NNNN>` per segment, all `0600`),
//! which every rank unlinks after the barrier.

use pool_core::MAX_FILES;
use pool_core::shared::Attachment;
use pool_core::shared::{Role, SharedPoolSpec, SharingReport, shard};
use pool_core::{Error, Result};

use crate::barrier::{known, peer};

mod file;
mod socket;

pub use socket::Refusal;

/// Create or join a shared pool and map all of it, over the rendezvous
/// `spec.sharing` names. The creator checks capacity, creates and sizes the
/// files and maps them before letting the joiners in; joiners verify they
/// attach to exactly those files.
///
/// # Errors
/// Capacity, mapping, mismatch or peer errors. On error the peers are told
/// and no file is left behind.
pub fn map_shared(spec: SharedPoolSpec<'_>) -> Result<Box<dyn Attachment>> {
    let sharing = spec.sharing;
    sharing.validate()?;
    if spec.files.len() > MAX_FILES {
        return Err(Error::config(format!(
            "a shared pool has at most {MAX_FILES} files; use fewer segments"
        )));
    }
    if sharing.rendezvous == pool_core::Rendezvous::Socket {
        return socket::map(spec);
    }
    file::map(spec)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Barrier;
    use std::time::Instant;

    use super::*;
    use pool_core::file::MapContext;
    use pool_core::gc::data_path;
    use pool_core::host::capacity::CapacityCheck;
    use pool_core::{Extent, PageSize, SharingConfig, round_to_page};

    /// A scratch control dir on /dev/shm and data dir, removed on drop.
    pub(super) struct Dirs {
        pub(super) ctl: PathBuf,
        pub(super) data: PathBuf,
    }

    impl Dirs {
        pub(super) fn new(tag: &str) -> Dirs {
            let id = format!("{}-{tag}-{:?}", std::process::id(), Instant::now());
            let id: String = id
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            let ctl = PathBuf::from(format!("/dev/shm/hostpool-unit-ctl-{id}"));
            let data = std::env::temp_dir().join(format!("hostpool-unit-data-{id}"));
            std::fs::create_dir_all(&ctl).unwrap();
            std::fs::create_dir_all(&data).unwrap();
            Dirs { ctl, data }
        }

        pub(super) fn left(&self) -> Vec<String> {
            let mut v = Vec::new();
            for d in [&self.ctl, &self.data] {
                for e in std::fs::read_dir(d).unwrap() {
                    v.push(e.unwrap().path().display().to_string());
                }
            }
            v
        }
    }

    impl Drop for Dirs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.ctl);
            let _ = std::fs::remove_dir_all(&self.data);
        }
    }

    pub(super) fn sharing(d: &Dirs, world: u32, rank: u32, timeout: f64) -> SharingConfig {
        SharingConfig {
            name: "unit".into(),
            world,
            rank,
            attach_timeout_secs: timeout,
            barrier_timeout_secs: 600.0,
            rendezvous: pool_core::Rendezvous::File,
            control_dir: Some(d.ctl.clone()),
        }
    }

    /// As [`sharing`], over the socket rendezvous: the socket's name is
    /// per user and name, so each test names its pool `unit-<tag>-<pid>`.
    pub(super) fn socket_sharing(tag: &str, world: u32, rank: u32, timeout: f64) -> SharingConfig {
        SharingConfig {
            name: format!("unit-{tag}-{}", std::process::id()),
            world,
            rank,
            attach_timeout_secs: timeout,
            barrier_timeout_secs: 600.0,
            rendezvous: pool_core::Rendezvous::Socket,
            control_dir: None,
        }
    }

    /// The fields of a peer error; panics, saying what it got, for any
    /// other error.
    pub(super) fn blamed(e: &Error) -> (Vec<u32>, Option<u32>) {
        match e {
            Error::Peer { ranks, pid, .. } => (ranks.clone(), *pid),
            other => panic!("expected a peer error, got {other:?}"),
        }
    }

    pub(super) fn attach(
        d: &Dirs,
        s: &SharingConfig,
        mib: u64,
        capacity: &[CapacityCheck],
    ) -> Result<Box<dyn Attachment>> {
        let size = round_to_page(mib << 20, PageSize::BASE_4K).unwrap();
        map_shared(SharedPoolSpec {
            sharing: s,
            size,
            files: vec![(
                data_path(&d.data, &s.name, None),
                Extent {
                    offset: 0,
                    len: size.mapped(),
                },
            )],
            capacity,
            recheck: &|| capacity.to_vec(),
            create: &|e| pool_core::file::create_private(&d.data, e.len, PageSize::BASE_4K),
            map: MapContext {
                enomem_remedy: "x".into(),
                ..MapContext::default()
            },
            cancel: pool_core::interrupt::Cancel::new(),
            refusals: pool_core::shared::Refusals::Thread,
        })
    }

    /// `f(rank)` for ranks `0..n`, each on a thread of its own, all started
    /// together behind a barrier; the results in rank order.
    pub(super) fn on_ranks<T: Send>(n: u32, f: impl Fn(u32) -> T + Sync) -> Vec<T> {
        let start = Barrier::new(n as usize);
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    let (f, start) = (&f, &start);
                    sc.spawn(move || {
                        start.wait();
                        f(r)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    pub(super) fn role(m: &dyn Attachment) -> String {
        match m.attached() {
            pool_core::shared::Attached::Shared(s) => serde_json::to_value(s.role)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string(),
            other => panic!("a shared pool's attachment: {other:?}"),
        }
    }

    /// A rank that vanishes after attaching (its mapping dropped: its
    /// locks, or its socket, go as when it is killed) is named by its
    /// peers with its rank and pid. Over the socket the creator sees it go
    /// and relays that to the other joiner, fields and all.
    #[test]
    fn a_rank_that_dies_is_named_by_its_peers_with_its_rank_and_pid() {
        for socket in [false, true] {
            let d = Dirs::new(if socket { "died-socket" } else { "died" });
            // Two ranks over the file rendezvous: with a third, it could
            // read the other survivor's slot first, which blames that one
            // before the victim.
            let world = if socket { 3 } else { 2 };
            let config = |r| {
                if socket {
                    socket_sharing("died", world, r, 10.0)
                } else {
                    sharing(&d, world, r, 10.0)
                }
            };
            let roles = std::sync::Mutex::new(Vec::new());
            let (attached, gone) = (Barrier::new(world as usize), Barrier::new(world as usize));
            let errs: Vec<Option<(u32, Error)>> = on_ranks(world, |r| {
                let mut m = attach(&d, &config(r), 4, &[]).unwrap();
                roles.lock().unwrap().push((r, role(&*m)));
                attached.wait();
                // The victim: the lowest joiner, so that over the socket the
                // creator relays its death to the other joiner.
                let victim = roles
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(_, role)| role == "joiner")
                    .map(|(r, _)| *r)
                    .min()
                    .unwrap();
                if r == victim {
                    drop(m);
                    gone.wait();
                    return None;
                }
                gone.wait();
                let e = m.rendezvous(Ok(()), None).unwrap_err();
                m.teardown();
                Some((victim, e))
            });
            let mut named = 0;
            for (victim, e) in errs.iter().flatten() {
                let text = e.to_string();
                assert!(
                    text.contains(&format!("rank {victim} (pid {})", std::process::id()))
                        && text.contains("died before the barrier completed"),
                    "socket {socket}: {text}"
                );
                assert_eq!(
                    blamed(e),
                    (vec![*victim], Some(std::process::id())),
                    "socket {socket}: {text}"
                );
                named += 1;
            }
            assert_eq!(named, world - 1, "every survivor fails");
            assert!(d.left().is_empty(), "{:?}", d.left());
        }
    }
}
