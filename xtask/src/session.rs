//! A huge page session: reserve pages, mount hugetlbfs, and restore it all.
//!
//! [`Session`] is an RAII guard. It is created (armed) right after the
//! original sysfs counters have been recorded and before anything is changed,
//! so every later failure, early return or panic unwinds through its `Drop`,
//! which
//!
//! 1. unmounts every mount under the session dir (`umount`, retried while
//!    busy, then `umount -l`), warning about files the tests left there,
//! 2. removes the session dir `/tmp/hostpool-xtask-<pid>`,
//! 3. writes back the recorded `nr_hugepages` / `nr_overcommit_hugepages`,
//! 4. checks that no more huge pages are in use than before (a leak), and
//! 5. checks `/dev/shm` for leftover `hostpool*` files,
//!
//! and prints a footer saying what it did. Termination signals cannot bypass
//! this: see [`crate::signals`]. Restoring lives in [`restore`], the state
//! file in [`state`]. `hugepages up` disarms the guard with
//! [`Session::keep`] after persisting the recorded state to [`STATE_FILE`];
//! `hugepages down` rebuilds an armed guard from that file.

mod restore;
mod state;

use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::hugepages::{self, Counters, PageSize};
use crate::mounts;
use crate::signals;

pub use state::{hugepages_down, hugepages_up};

/// Where `hugepages up` records what `hugepages down` restores.
pub const STATE_FILE: &str = "/tmp/hostpool-xtask-state";
/// Prefix of session directories (`.ci/run` relies on it too).
const DIR_PREFIX: &str = "/tmp/hostpool-xtask-";
/// Shared-memory directory checked for leaks.
const SHM_DIR: &str = "/dev/shm";
/// Prefix of the project's shared-memory files.
const SHM_PREFIX: &str = "hostpool";
/// Tells tests that need huge pages to fail instead of skipping.
pub const REQUIRE_VAR: &str = "HOSTPOOL_REQUIRE_HUGEPAGES";
/// Every variable a session may export (removed from children otherwise).
pub const ENV_VARS: [&str; 5] = [
    "HOSTPOOL_TEST_HUGETLBFS_2M",
    "HOSTPOOL_TEST_HUGETLBFS_1G",
    "HOSTPOOL_TEST_HUGEPAGES_2M",
    "HOSTPOOL_TEST_HUGEPAGES_1G",
    REQUIRE_VAR,
];

/// One huge page size's pool within a session.
#[derive(Debug)]
struct Pool {
    size: PageSize,
    /// Counters before the session changed anything.
    original: Counters,
    /// `nr_hugepages` after reserving.
    obtained: u64,
    /// `free_hugepages` after reserving: what the tests can use.
    free: u64,
    /// Where hugetlbfs with this page size is mounted, if it is.
    mount: Option<PathBuf>,
}

/// Result of trying to set up huge pages.
pub enum Setup {
    /// Pages reserved and hugetlbfs mounted; restored when dropped.
    Ready(Session),
    /// This process may not reserve huge pages (the reason says why and
    /// how to fix it); nothing was changed.
    Unavailable(String),
}

/// The RAII guard of a huge page setup (see the module docs).
#[derive(Debug)]
pub struct Session {
    pools: Vec<Pool>,
    dir: PathBuf,
    /// Whether `dir` is ours to unmount and remove (never someone else's
    /// leftover that happens to have the same name).
    dir_owned: bool,
    shm_before: Vec<String>,
    /// State file to delete when restoring (`hugepages up`/`down`).
    state_file: Option<PathBuf>,
    armed: bool,
}

impl Session {
    /// Reserves huge pages and mounts hugetlbfs. With `state_file`, the
    /// original state is persisted there before anything is changed.
    pub fn start(state_file: Option<&Path>) -> Result<Setup, String> {
        if let Err(reason) = preflight() {
            return Ok(Setup::Unavailable(reason));
        }
        let mut session = Session::record()?;
        if let Some(path) = state_file {
            session.persist(path)?;
        }
        session.reserve_pools()?;
        session.create_dirs()?;
        session.mount_pools()?;
        check_interrupted()?;
        Ok(Setup::Ready(session))
    }

    /// Records the current counters; the returned guard is armed.
    fn record() -> Result<Self, String> {
        let mut pools = Vec::new();
        for size in PageSize::ALL.into_iter().filter(|size| size.supported()) {
            let original = Counters::read(size)?;
            pools.push(Pool {
                size,
                original,
                obtained: original.nr,
                free: original.free,
                mount: None,
            });
        }
        Ok(Session {
            pools,
            dir: PathBuf::from(format!("{DIR_PREFIX}{}", std::process::id())),
            dir_owned: false,
            shm_before: shm_leftovers(),
            state_file: None,
            armed: true,
        })
    }

    /// Grows each pool (1 GiB first) and reads back what the kernel gave.
    fn reserve_pools(&mut self) -> Result<(), String> {
        for pool in &mut self.pools {
            check_interrupted()?;
            pool.obtained = hugepages::reserve(pool.size)?;
            pool.free = hugepages::read_counter(pool.size, "free_hugepages")?;
        }
        Ok(())
    }

    /// Creates the session dir and one mount point per pool to mount.
    fn create_dirs(&mut self) -> Result<(), String> {
        check_interrupted()?;
        let mut builder = fs::DirBuilder::new();
        builder.mode(0o700);
        builder.create(&self.dir).map_err(|err| {
            format!(
                "could not create {}: {err}; if it is left over from an earlier run, \
                 check /proc/mounts, unmount anything below it and remove it",
                self.dir.display()
            )
        })?;
        self.dir_owned = true;
        for pool in self.pools.iter().filter(|pool| pool.wants_mount()) {
            let point = self.dir.join(pool.size.tag());
            builder
                .create(&point)
                .map_err(|err| format!("could not create {}: {err}", point.display()))?;
        }
        Ok(())
    }

    /// Mounts hugetlbfs for every pool that has pages (2 MiB: always).
    fn mount_pools(&mut self) -> Result<(), String> {
        for pool in self.pools.iter_mut().filter(|pool| pool.wants_mount()) {
            check_interrupted()?;
            let point = self.dir.join(pool.size.tag());
            mounts::mount_hugetlbfs(pool.size, &point)?;
            pool.mount = Some(point);
        }
        Ok(())
    }

    /// The variables to export to the tests.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut vars = Vec::new();
        for size in [PageSize::Huge2M, PageSize::Huge1G] {
            let pool = self.pool(size);
            if let Some(point) = pool.and_then(|pool| pool.mount.as_ref()) {
                let name = format!("HOSTPOOL_TEST_HUGETLBFS_{}", size.tag());
                vars.push((name, point.display().to_string()));
            }
            let free = pool.map_or(0, |pool| pool.free);
            vars.push((
                format!("HOSTPOOL_TEST_HUGEPAGES_{}", size.tag()),
                free.to_string(),
            ));
        }
        vars.push((REQUIRE_VAR.to_string(), "1".to_string()));
        vars
    }

    /// Prints what was set up, to stderr.
    pub fn print_header(&self) {
        eprintln!("xtask: ---- huge page setup ----");
        for size in [PageSize::Huge2M, PageSize::Huge1G] {
            match self.pool(size) {
                Some(pool) => eprintln!("xtask:   {}", pool.describe()),
                None => eprintln!(
                    "xtask:   {} pages: not supported by this kernel ({} missing); none reserved",
                    size.human(),
                    size.sysfs_dir().display()
                ),
            }
        }
        for (name, value) in self.env() {
            eprintln!("xtask:   export {name}={value}");
        }
    }

    /// Disarms the guard: the setup stays in place (`hugepages up`).
    pub fn keep(mut self) {
        self.armed = false;
    }

    /// Restores now, prints the footer and reports whether all went clean.
    pub fn finish(mut self) -> bool {
        self.armed = false;
        let footer = self.restore();
        footer.print();
        footer.warnings.is_empty()
    }

    /// The pool of `size`, if the kernel supports that size.
    fn pool(&self, size: PageSize) -> Option<&Pool> {
        self.pools.iter().find(|pool| pool.size == size)
    }
}

impl Pool {
    /// 2 MiB pages are always mounted; 1 GiB only if the kernel gave some.
    fn wants_mount(&self) -> bool {
        self.size == PageSize::Huge2M || self.obtained > 0
    }

    /// One header line about this pool.
    fn describe(&self) -> String {
        let change = if self.obtained == self.original.nr {
            format!("{} (unchanged)", self.obtained)
        } else {
            format!("{} -> {}", self.original.nr, self.obtained)
        };
        let mut line = format!(
            "{} pages: nr_hugepages {change} (wanted >= {}), {} free, nr_overcommit_hugepages {}",
            self.size.human(),
            self.size.wanted(),
            self.free,
            self.original.overcommit,
        );
        if self.obtained == 0 {
            let _ = write!(
                line,
                "\nxtask:   !! the kernel gave NO {} pages (not enough free contiguous memory); \
                 not mounted, tests needing them get HOSTPOOL_TEST_HUGEPAGES_{}=0",
                self.size.human(),
                self.size.tag()
            );
        } else if self.obtained < self.size.wanted() {
            let _ = write!(
                line,
                "\nxtask:   !! the kernel gave only {} of {} {} pages",
                self.obtained,
                self.size.wanted(),
                self.size.human()
            );
        }
        if let Some(point) = &self.mount {
            let _ = write!(line, "; hugetlbfs at {}", point.display());
        }
        line
    }
}

/// Fails if a termination signal has arrived (the guard then restores).
fn check_interrupted() -> Result<(), String> {
    match signals::received() {
        Some(sig) => Err(format!("interrupted by {}", signals::name(sig))),
        None => Ok(()),
    }
}

/// Checks, without changing anything, that huge pages can be set up here.
fn preflight() -> Result<(), String> {
    if !PageSize::Huge2M.supported() {
        return Err(format!(
            "this kernel has no 2 MiB huge pages ({} missing)",
            PageSize::Huge2M.sysfs_dir().display()
        ));
    }
    for size in PageSize::ALL.into_iter().filter(|size| size.supported()) {
        hugepages::check_writable(size)?;
    }
    Ok(())
}

/// Names of `hostpool*` entries in /dev/shm (empty if it is unreadable).
fn shm_leftovers() -> Vec<String> {
    let Ok(entries) = fs::read_dir(SHM_DIR) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(SHM_PREFIX))
        .collect();
    names.sort();
    names
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.armed {
            self.armed = false;
            self.restore().print();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disarmed session (dropping it must never touch the machine).
    fn session(obtained_1g: u64) -> Session {
        let pool = |size, nr, obtained, mount: Option<&str>| Pool {
            size,
            original: Counters {
                nr,
                overcommit: 3,
                free: nr,
                surplus: 0,
            },
            obtained,
            free: obtained,
            mount: mount.map(PathBuf::from),
        };
        let mount_1g = (obtained_1g > 0).then_some("/tmp/hostpool-xtask-42/1G");
        Session {
            pools: vec![
                pool(PageSize::Huge1G, 0, obtained_1g, mount_1g),
                pool(PageSize::Huge2M, 7, 1024, Some("/tmp/hostpool-xtask-42/2M")),
            ],
            dir: PathBuf::from("/tmp/hostpool-xtask-42"),
            dir_owned: false,
            shm_before: vec!["hostpool-old".into()],
            state_file: None,
            armed: false,
        }
    }

    #[test]
    fn env_without_1g_pages_exports_zero_and_no_mount() {
        let env = session(0).env();
        let names: Vec<&str> = env.iter().map(|(name, _)| name.as_str()).collect();
        assert!(!names.contains(&"HOSTPOOL_TEST_HUGETLBFS_1G"));
        assert!(env.contains(&("HOSTPOOL_TEST_HUGEPAGES_1G".into(), "0".into())));
        assert!(env.contains(&("HOSTPOOL_TEST_HUGEPAGES_2M".into(), "1024".into())));
        assert!(env.contains(&(REQUIRE_VAR.into(), "1".into())));
        assert!(names.iter().all(|name| ENV_VARS.contains(name)));
    }

    #[test]
    fn env_with_1g_pages_exports_mount() {
        let env = session(2).env();
        let mount = (
            "HOSTPOOL_TEST_HUGETLBFS_1G".into(),
            "/tmp/hostpool-xtask-42/1G".into(),
        );
        assert!(env.contains(&mount));
        assert!(env.contains(&("HOSTPOOL_TEST_HUGEPAGES_1G".into(), "2".into())));
    }

    #[test]
    fn header_reports_zero_1g_pages_clearly() {
        let original = session(0);
        let line = original.pools[0].describe();
        assert!(line.contains("gave NO 1 GiB pages"), "{line}");
        assert!(!original.pools[0].wants_mount());
        assert!(original.pools[1].wants_mount());
    }

    #[test]
    fn state_file_round_trips() {
        let original = session(2);
        let path = std::env::temp_dir().join(format!("xtask-state-test-{}", std::process::id()));
        fs::write(&path, original.state_text()).unwrap();
        let loaded = Session::from_state(&path).map(|mut loaded| {
            loaded.armed = false;
            loaded
        });
        let loaded = loaded.unwrap();
        fs::remove_file(&path).unwrap();
        assert_eq!(loaded.dir, original.dir);
        assert_eq!(loaded.shm_before, original.shm_before);
        for size in PageSize::ALL {
            let (a, b) = (loaded.pool(size).unwrap(), original.pool(size).unwrap());
            assert_eq!(a.original, b.original);
        }
    }

    #[test]
    fn state_file_rejects_foreign_dirs() {
        let mut session = session(0);
        for bad in [
            "/",
            "/tmp",
            "/tmp/hostpool-xtask-",
            "/tmp/hostpool-xtask-1/../../etc",
        ] {
            session.dir = PathBuf::from(bad);
            let path = std::env::temp_dir().join(format!("xtask-bad-state-{}", std::process::id()));
            fs::write(&path, session.state_text()).unwrap();
            // Disarm at once: an accepted bad dir must not be "restored".
            let result = Session::from_state(&path).map(|mut loaded| loaded.armed = false);
            fs::remove_file(&path).unwrap();
            assert!(result.is_err(), "accepted dir {bad}");
        }
    }
}
