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
//! this: see [`crate::signals`]. `hugepages up` disarms the guard with
//! [`Session::keep`] after persisting the recorded state to [`STATE_FILE`];
//! `hugepages down` rebuilds an armed guard from that file.

use std::fmt::Write as _;
use std::fs;
use std::io::{ErrorKind, Write as _};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::hugepages::{self, Counters, PageSize};
use crate::mounts::{self, Unmounted};
use crate::signals;

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

/// What restoring did, printed as the footer.
#[derive(Default)]
struct Footer {
    done: Vec<String>,
    warnings: Vec<String>,
}

impl Footer {
    fn print(&self) {
        eprintln!("xtask: ---- huge page restore ----");
        for line in &self.done {
            eprintln!("xtask:   {line}");
        }
        if self.warnings.is_empty() {
            eprintln!("xtask:   machine restored cleanly");
            return;
        }
        eprintln!("xtask: !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
        for warning in &self.warnings {
            eprintln!("xtask: !!! WARNING: {warning}");
        }
        eprintln!("xtask: !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    }
}

/// Restoring (steps 1-5 of the module docs).
impl Session {
    fn restore(&mut self) -> Footer {
        let mut footer = Footer::default();
        if self.dir_owned {
            self.unmount_all(&mut footer);
            self.remove_dirs(&mut footer);
        }
        for pool in &self.pools {
            restore_counter(pool, "nr_hugepages", pool.original.nr, &mut footer);
            restore_counter(
                pool,
                "nr_overcommit_hugepages",
                pool.original.overcommit,
                &mut footer,
            );
            check_pages_released(pool, &mut footer);
        }
        self.check_dev_shm(&mut footer);
        self.remove_state_file(&mut footer);
        footer
    }

    /// Unmounts everything mounted at or below the session dir.
    fn unmount_all(&self, footer: &mut Footer) {
        let points = match mounts::mounts_under(&self.dir) {
            Ok(points) => points,
            Err(err) => {
                footer.warnings.push(err);
                return;
            }
        };
        for point in points {
            report_leftover_files(&point, footer);
            match mounts::unmount(&point) {
                Ok(Unmounted::Cleanly) => {
                    footer.done.push(format!("unmounted {}", point.display()));
                }
                Ok(Unmounted::Lazily) => footer.warnings.push(format!(
                    "{} was busy and was only lazily unmounted (`umount -l`); a process still \
                     uses it and its huge pages stay in use until that process exits",
                    point.display()
                )),
                Err(err) => footer.warnings.push(err),
            }
        }
    }

    /// Removes the mount points and the session dir (never their contents).
    fn remove_dirs(&self, footer: &mut Footer) {
        let subdirs = PageSize::ALL.map(|size| self.dir.join(size.tag()));
        for dir in subdirs.iter().chain([&self.dir]) {
            match fs::remove_dir(dir) {
                Ok(()) if *dir == self.dir => {
                    footer.done.push(format!("removed {}", dir.display()));
                }
                Ok(()) => {}
                Err(err) if err.kind() == ErrorKind::NotFound => {}
                Err(err) => footer.warnings.push(format!(
                    "could not remove {}: {err}; check /proc/mounts and remove it by hand",
                    dir.display()
                )),
            }
        }
    }

    /// Warns about `hostpool*` files in /dev/shm.
    fn check_dev_shm(&self, footer: &mut Footer) {
        let left = shm_leftovers();
        if left.is_empty() {
            footer
                .done
                .push(format!("no {SHM_PREFIX}* files in {SHM_DIR}"));
            return;
        }
        let listed: Vec<String> = left
            .iter()
            .map(|name| {
                let before = if self.shm_before.contains(name) {
                    " (already there before)"
                } else {
                    ""
                };
                format!("{SHM_DIR}/{name}{before}")
            })
            .collect();
        footer.warnings.push(format!(
            "{} file(s) starting with `{SHM_PREFIX}` remain in {SHM_DIR} (leaked shared memory?): {}",
            left.len(),
            listed.join(", ")
        ));
    }
}

/// Warns about files the tests left in the mount at `point`.
fn report_leftover_files(point: &Path, footer: &mut Footer) {
    let Ok(entries) = fs::read_dir(point) else {
        return;
    };
    let names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    if !names.is_empty() {
        footer.warnings.push(format!(
            "tests left {} file(s) in {}: {} (a test leaks hugetlbfs \
             files; unmounting frees them once no process uses them)",
            names.len(),
            point.display(),
            names.join(", ")
        ));
    }
}

/// Writes `original` back to `counter` of `pool` if it differs now.
fn restore_counter(pool: &Pool, counter: &str, original: u64, footer: &mut Footer) {
    let label = format!("{} {counter}", pool.size.human());
    let now = match hugepages::read_counter(pool.size, counter) {
        Ok(now) => now,
        Err(err) => return footer.warnings.push(err),
    };
    if now == original {
        footer.done.push(format!("{label} = {now} (unchanged)"));
        return;
    }
    if let Err(err) = hugepages::write_counter(pool.size, counter, original) {
        return footer.warnings.push(format!("{err}; restore it by hand"));
    }
    match hugepages::read_counter(pool.size, counter) {
        Ok(back) if back == original => footer.done.push(format!("{label} {now} -> {back}")),
        Ok(back) => footer.warnings.push(format!(
            "{label} is {back} after writing {original} (was {now}): pages still in use \
             stay allocated (as surplus) until their user releases them"
        )),
        Err(err) => footer.warnings.push(err),
    }
}

/// Warns if more huge pages of `pool` are in use than before the session.
fn check_pages_released(pool: &Pool, footer: &mut Footer) {
    let now = match Counters::read(pool.size) {
        Ok(now) => now,
        Err(err) => return footer.warnings.push(err),
    };
    let (before, after) = (pool.original.in_use(), now.in_use());
    if after <= before {
        footer.done.push(format!(
            "{} pages: {} free of {} (in use: {after}, before: {before})",
            pool.size.human(),
            now.free,
            now.nr
        ));
        return;
    }
    footer.warnings.push(format!(
        "{} huge page(s) of {} are STILL IN USE after restore (before: {before}; now nr_hugepages \
         {}, surplus {}, free {}). A test leaked a hugetlbfs file or mapping; \
         check `grep -i huge /proc/meminfo` and `grep -l huge /proc/*/maps`",
        after - before,
        pool.size.human(),
        now.nr,
        now.surplus,
        now.free
    ));
}

/// State file of `hugepages up` / `down`.
impl Session {
    /// Writes the recorded state to `path` (which must not exist yet); from
    /// then on restoring also deletes it.
    fn persist(&mut self, path: &Path) -> Result<(), String> {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|err| format!("could not create state file {}: {err}", path.display()))?;
        self.state_file = Some(path.to_path_buf());
        file.write_all(self.state_text().as_bytes())
            .map_err(|err| format!("could not write state file {}: {err}", path.display()))
    }

    fn state_text(&self) -> String {
        let mut text = String::from(
            "# hostpool xtask huge page state; restore with `cargo xtask hugepages down`\n",
        );
        let _ = writeln!(text, "dir={}", self.dir.display());
        for pool in &self.pools {
            let tag = pool.size.tag();
            let _ = writeln!(text, "{tag}.nr_hugepages={}", pool.original.nr);
            let _ = writeln!(
                text,
                "{tag}.nr_overcommit_hugepages={}",
                pool.original.overcommit
            );
            let _ = writeln!(text, "{tag}.free_hugepages={}", pool.original.free);
            let _ = writeln!(text, "{tag}.surplus_hugepages={}", pool.original.surplus);
        }
        for name in &self.shm_before {
            let _ = writeln!(text, "shm_before={name}");
        }
        text
    }

    /// Rebuilds an armed guard from a state file written by [`Self::persist`].
    pub fn from_state(path: &Path) -> Result<Self, String> {
        let text = fs::read_to_string(path)
            .map_err(|err| format!("could not read state file {}: {err}", path.display()))?;
        let mut session = Session {
            pools: Vec::new(),
            dir: PathBuf::new(),
            dir_owned: true,
            shm_before: Vec::new(),
            state_file: None,
            armed: false,
        };
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            session.apply_state_line(line).map_err(|err| {
                format!(
                    "{}:{}: {err}; fix the file, or restore by hand and delete it",
                    path.display(),
                    number + 1
                )
            })?;
        }
        let dir = session.dir.to_string_lossy();
        let suffix = dir.strip_prefix(DIR_PREFIX).unwrap_or("/");
        if suffix.is_empty() || suffix.contains('/') || suffix.contains("..") {
            return Err(format!(
                "{}: `dir` must name a {DIR_PREFIX}<id> directory, got `{dir}`",
                path.display()
            ));
        }
        session.state_file = Some(path.to_path_buf());
        session.armed = true;
        Ok(session)
    }

    fn apply_state_line(&mut self, line: &str) -> Result<(), String> {
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| format!("expected KEY=VALUE, got {line:?}"))?;
        match key {
            "dir" => self.dir = PathBuf::from(value),
            "shm_before" => self.shm_before.push(value.to_string()),
            _ => self.apply_counter(key, value)?,
        }
        Ok(())
    }

    fn apply_counter(&mut self, key: &str, value: &str) -> Result<(), String> {
        let unknown = || format!("unknown key {key:?}");
        let (tag, counter) = key.split_once('.').ok_or_else(unknown)?;
        let size = PageSize::from_tag(tag).ok_or_else(unknown)?;
        let value: u64 = value
            .parse()
            .map_err(|err| format!("{key}: {value:?} is not a number: {err}"))?;
        if !self.pools.iter().any(|pool| pool.size == size) {
            self.pools.push(Pool {
                size,
                original: Counters::default(),
                obtained: 0,
                free: 0,
                mount: None,
            });
        }
        let pool = self
            .pools
            .iter_mut()
            .find(|pool| pool.size == size)
            .ok_or_else(unknown)?;
        match counter {
            "nr_hugepages" => pool.original.nr = value,
            "nr_overcommit_hugepages" => pool.original.overcommit = value,
            "free_hugepages" => pool.original.free = value,
            "surplus_hugepages" => pool.original.surplus = value,
            _ => return Err(unknown()),
        }
        Ok(())
    }

    /// Deletes the state file once its state has been restored.
    fn remove_state_file(&self, footer: &mut Footer) {
        let Some(path) = &self.state_file else {
            return;
        };
        match fs::remove_file(path) {
            Ok(()) => footer.done.push(format!("removed {}", path.display())),
            Err(err) if err.kind() == ErrorKind::NotFound => {}
            Err(err) => footer
                .warnings
                .push(format!("could not remove {}: {err}", path.display())),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.armed {
            self.armed = false;
            self.restore().print();
        }
    }
}

/// `cargo xtask hugepages up`.
pub fn hugepages_up() -> Result<i32, String> {
    let state = Path::new(STATE_FILE);
    if state.exists() {
        return Err(format!(
            "huge pages are already set up by an earlier `cargo xtask hugepages up` \
             ({STATE_FILE} exists); run `cargo xtask hugepages down` first"
        ));
    }
    let session = match Session::start(Some(state))? {
        Setup::Ready(session) => session,
        Setup::Unavailable(reason) => {
            return Err(format!("huge pages could not be reserved: {reason}"));
        }
    };
    session.print_header();
    if let Some(sig) = signals::received() {
        drop(session);
        return Ok(signals::exit_code_for(sig));
    }
    for (name, value) in session.env() {
        println!("export {name}={value}");
    }
    eprintln!(
        "xtask: setup kept; state in {STATE_FILE}; undo with `cargo xtask hugepages down`\n\
         xtask: (the export lines above went to stdout: eval \"$(cargo xtask hugepages up)\")"
    );
    session.keep();
    Ok(0)
}

/// `cargo xtask hugepages down`.
pub fn hugepages_down() -> Result<i32, String> {
    let state = Path::new(STATE_FILE);
    if !state.exists() {
        eprintln!(
            "xtask: nothing to restore: {STATE_FILE} does not exist (no `hugepages up` active)"
        );
        return Ok(0);
    }
    let session = Session::from_state(state)?;
    eprintln!("xtask: restoring the state recorded in {STATE_FILE}");
    let clean = session.finish();
    Ok(i32::from(!clean))
}
