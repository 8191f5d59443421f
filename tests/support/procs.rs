//! Helpers for tests that run `hostpool` processes and kill them: children
//! killed on drop, waits with a limit, signals, a small tmpfs whose use is
//! exact, and another process's memory read and written through
//! `/proc/PID/mem`.
#![allow(dead_code)]

use std::fmt::Display;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::Value;

/// The `hostpool` binary, without logging or stall settings from outside.
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hostpool"));
    c.env_remove("RUST_LOG")
        .env_remove("HOSTPOOL_TEST_FAILPOINTS")
        .env_remove("HOSTPOOL_FAILPOINT_STALL_PREFAULT_MS")
        .env_remove("HOSTPOOL_FAILPOINT_ZERO_STEP_MS")
        .env_remove("HOSTPOOL_TEST_SYSFS_ROOT");
    c
}

/// What the tests add to a [`bin`] command: a rank's flags, failpoints,
/// and the ways it is run.
pub trait HostpoolCommand {
    /// `--shared POOL --world WORLD --rank RANK`: the flags every rank of a
    /// shared pool passes.
    fn rank(&mut self, pool: &str, world: impl Display, rank: impl Display) -> &mut Command;
    /// Failpoints `spec` (`HOSTPOOL_TEST_FAILPOINTS`; empty: none).
    fn failpoints(&mut self, spec: &str) -> &mut Command;
    /// Start it, its stdout and stderr piped.
    fn spawn_piped(&mut self) -> Child;
    /// Start it, its stdout dropped and its stderr piped.
    fn spawn_stderr(&mut self) -> Child;
    /// Run it to its end, which must be exit status `code`: its stderr.
    fn fails(&mut self, code: i32) -> String;
    /// Run it to its end, which must be a success: its JSON report.
    fn succeeds(&mut self) -> Value;
}

impl HostpoolCommand for Command {
    fn rank(&mut self, pool: &str, world: impl Display, rank: impl Display) -> &mut Command {
        self.args(["--shared", pool])
            .args(["--world", &world.to_string()])
            .args(["--rank", &rank.to_string()])
    }

    fn failpoints(&mut self, spec: &str) -> &mut Command {
        self.env("HOSTPOOL_TEST_FAILPOINTS", spec)
    }

    fn spawn_piped(&mut self) -> Child {
        self.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn spawn_stderr(&mut self) -> Child {
        self.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    #[track_caller]
    fn fails(&mut self, code: i32) -> String {
        fails(&self.output().unwrap(), code)
    }

    #[track_caller]
    fn succeeds(&mut self) -> Value {
        succeeds(&self.output().unwrap())
    }
}

/// Its stderr, once `out` is known to have exited with `code`.
#[track_caller]
pub fn fails(out: &Output, code: i32) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{err}");
    err
}

/// `out`'s JSON on stdout (null if none), once it is known to have
/// succeeded; else fail with its stderr.
#[track_caller]
pub fn succeeds(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// A name no other test (or test process) uses.
pub fn name(tag: &str) -> String {
    format!("t{}-{tag}", std::process::id())
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether the hardware tests must run (`cargo xtask test` sets
/// `HOSTPOOL_REQUIRE_HUGEPAGES=1`): a test that cannot then fails.
pub fn required() -> bool {
    std::env::var("HOSTPOOL_REQUIRE_HUGEPAGES").as_deref() == Ok("1")
}

/// Whether this process is root; elsewhere says why the test skips (and
/// fails where hardware tests are required, as in CI).
pub fn root_or_skip(why: &str) -> bool {
    if is_root() {
        return true;
    }
    assert!(!required(), "{why}");
    eprintln!("skip: {why}");
    false
}

/// Children that are killed if the test fails before they exit.
pub struct Children(pub Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl std::ops::Deref for Children {
    type Target = Vec<Child>;
    fn deref(&self) -> &Vec<Child> {
        &self.0
    }
}

impl std::ops::DerefMut for Children {
    fn deref_mut(&mut self) -> &mut Vec<Child> {
        &mut self.0
    }
}

/// Wait for `child` to exit, at most `limit`.
pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Wait (at most `limit`) for `child` to exit with `code`: its stderr.
/// Fails saying `what` if it runs on or ends otherwise.
#[track_caller]
pub fn exits_with(child: &mut Child, code: i32, limit: Duration, what: &str) -> String {
    let Some(st) = wait_timeout(child, limit) else {
        panic!("{what}: pid {} still runs after {limit:?}", child.id());
    };
    let err = stderr_of(child);
    assert_eq!(st.code(), Some(code), "{what}: {err}");
    err
}

/// SIGTERM `child`: it must exit 0 within `limit`.
#[track_caller]
pub fn terminate(child: &mut Child, limit: Duration) {
    signal(child, libc::SIGTERM);
    exits_with(child, 0, limit, "after SIGTERM");
}

/// SIGKILL `child` and reap it.
pub fn kill_and_reap(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Whether `done` holds, now or within `limit` (checked every 10 ms).
pub fn within(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Wait (at most `secs`) until `done`; else fail saying `what`.
#[track_caller]
pub fn until(secs: u64, done: impl FnMut() -> bool, what: impl Fn() -> String) {
    assert!(within(Duration::from_secs(secs), done), "{}", what());
}

/// `cmd` must be a usage error (exit status 2) that says `says`.
#[track_caller]
pub fn assert_usage_error(cmd: &mut Command, says: &str) {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
    assert!(err.contains(says), "{cmd:?}: {err}");
}

/// Everything left on a child's piped stderr (waits for it to close).
pub fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

pub fn signal(child: &Child, sig: i32) {
    let pid = i32::try_from(child.id()).ok().and_then(Pid::from_raw);
    let sig = Signal::from_named_raw(sig).expect("a named signal");
    kill_process(pid.expect("a child pid"), sig).expect("kill");
}

/// Read a child's stdout up to the line `until` matches, returning what
/// was read; panics with its stderr if the stream ends first. It reads a
/// byte at a time, so that nothing after that line is consumed: the next
/// call finds the lines a child wrote at once (a buffered reader dropped
/// here would lose them).
pub fn read_until(child: &mut Child, until: impl Fn(&str) -> bool) -> String {
    let out = child.stdout.as_mut().expect("piped stdout");
    let mut text = String::new();
    loop {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while line.last() != Some(&b'\n') {
            match out.read(&mut byte) {
                Ok(1) => line.push(byte[0]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                _ => break,
            }
        }
        if line.is_empty() {
            let err = stderr_of(child);
            panic!("stdout ended before the line looked for: {text}\nstderr: {err}");
        }
        let line = String::from_utf8_lossy(&line).into_owned();
        text.push_str(&line);
        if until(&line) {
            return text;
        }
    }
}

/// Read one pretty-printed JSON report (ends with a line "}") from a child.
pub fn read_report(child: &mut Child) -> Value {
    let text = read_until(child, |l| l == "}\n");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("no report ({e}): {text}"))
}

/// Read one JSON line from a child.
pub fn read_json_line(child: &mut Child) -> Value {
    let text = read_until(child, |_| true);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Wait (at most `limit`) until a child's piped stderr has a line
/// containing `needle`; the stderr read so far. The rest of stderr is
/// drained in the background until the child closes it, so that the child
/// never blocks on a full pipe nor has its writes fail on a closed one.
pub fn wait_stderr(child: &mut Child, needle: &str, limit: Duration) -> String {
    let err = child.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut err = BufReader::new(err);
        let mut line = Vec::new();
        while err.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            let text = String::from_utf8_lossy(&line);
            // Once the waiter has returned nobody reads these: dropped.
            let _ = tx.send(text.trim_end_matches('\n').to_string());
            line.clear();
        }
    });
    let end = Instant::now() + limit;
    let mut seen = String::new();
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
                if line.contains(needle) {
                    return seen;
                }
            }
            Err(_) => break,
        }
    }
    panic!("no stderr line with `{needle}` within {limit:?}: {seen}");
}

/// A tmpfs of `mib` MiB of its own, unmounted on drop: what is used on it
/// is exact, so a test can require that nothing is left.
pub struct SmallTmpfs(pub PathBuf);

impl SmallTmpfs {
    pub fn mount(tag: &str, mib: u64) -> SmallTmpfs {
        let mnt =
            std::env::temp_dir().join(format!("hostpool-small-tmpfs-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&mnt).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "none"])
            .arg(&mnt)
            .status()
            .unwrap();
        assert!(st.success(), "mount a {mib} MiB tmpfs");
        SmallTmpfs(mnt)
    }

    /// [`SmallTmpfs::mount`] where this process is root; elsewhere says why
    /// the test skips (and fails where hardware tests are required).
    pub fn mount_or_skip(tag: &str, mib: u64) -> Option<SmallTmpfs> {
        root_or_skip("needs root to mount a small tmpfs").then(|| SmallTmpfs::mount(tag, mib))
    }

    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }

    pub fn used(&self) -> u64 {
        let s = rustix::fs::statvfs(&self.0).unwrap();
        (s.f_blocks - s.f_bfree) * s.f_frsize
    }

    /// Files in it (the pools of these tests have none: they are unlinked).
    pub fn files(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .flatten()
            .map(|e| e.path().display().to_string())
            .collect()
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Write `bytes` at `addr` in process `pid` (`/proc/PID/mem`).
pub fn mem_write(pid: u32, addr: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .unwrap();
    f.seek(SeekFrom::Start(addr)).unwrap();
    f.write_all(bytes).unwrap();
}

/// Read `len` bytes at `addr` in process `pid` (`/proc/PID/mem`).
pub fn mem_read(pid: u32, addr: u64, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    f.seek(SeekFrom::Start(addr)).unwrap();
    let mut v = vec![0; len];
    f.read_exact(&mut v).unwrap();
    v
}

/// A report's base address.
pub fn addr(report: &Value) -> u64 {
    u64::from_str_radix(
        report["address"].as_str().unwrap().trim_start_matches("0x"),
        16,
    )
    .unwrap()
}

fn hugepages_2m(file: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{file}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Free 2 MiB huge pages.
pub fn free_2m() -> u64 {
    hugepages_2m("free_hugepages")
}

/// Reserved (promised, not yet faulted) 2 MiB huge pages.
pub fn resv_2m() -> u64 {
    hugepages_2m("resv_hugepages")
}

/// The 2 MiB hugetlbfs mount `cargo xtask test` made, with at least `pages`
/// free pages; elsewhere says why the test skips (and fails where huge page
/// tests are required, as in CI).
pub fn hugetlbfs_2m(pages: u64) -> Option<PathBuf> {
    let dir = std::env::var_os("HOSTPOOL_TEST_HUGETLBFS_2M").map(PathBuf::from);
    let free = free_2m();
    match dir {
        Some(d) if free >= pages => Some(d),
        _ => {
            let why = format!(
                "needs a 2 MiB hugetlbfs mount with {pages} free pages (have {free}); run `cargo \
                 xtask test` as root"
            );
            assert!(!required(), "{why}");
            eprintln!("skip: {why}");
            None
        }
    }
}

/// Wait (at most `limit`) until process `pid` is stopped (state `T` in
/// `/proc/PID/stat`: a `stop` failpoint, or SIGSTOP); fails if it exits or
/// runs on past the limit.
#[track_caller]
pub fn wait_stopped(pid: u32, limit: Duration) {
    let end = Instant::now() + limit;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        match state {
            Some('T' | 't') => return,
            Some('Z') | None => panic!("process {pid} exited before it stopped"),
            _ => {}
        }
        assert!(
            Instant::now() < end,
            "process {pid} did not stop within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The descriptors process `pid` holds whose link starts with `prefix`
/// (`/memfd:`, `/dev/shm/`), as `(fd number, link)`, in fd order.
pub fn fds_of(pid: u32, prefix: &str) -> Vec<(u32, String)> {
    let mut v: Vec<(u32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.parse().ok()?;
            let link = std::fs::read_link(e.path()).ok()?;
            let link = link.to_string_lossy().into_owned();
            link.starts_with(prefix).then_some((n, link))
        })
        .collect();
    v.sort();
    v
}

/// Open another process's descriptor `fd` read-write, as any process with
/// the right to read `/proc/PID/fd` can: the same file, not a copy.
pub fn open_fd_of(pid: u32, fd: u32) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .unwrap()
}

/// Whether `file` is sealed against shrinking and growing, with the seals
/// sealed: what every memfd hostpool hands over carries.
pub fn size_sealed(file: &std::fs::File) -> bool {
    use rustix::fs::SealFlags;
    rustix::fs::fcntl_get_seals(file)
        .is_ok_and(|s| s.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL))
}

/// `ftruncate` of a sealed file to `len` must fail with `EPERM`.
#[track_caller]
pub fn assert_truncate_refused(file: &std::fs::File, len: u64, what: &str) {
    let e = rustix::fs::ftruncate(file, len).expect_err(what);
    assert_eq!(e, rustix::io::Errno::PERM, "{what}: {e}");
}

/// Whether `pages` 1 GiB huge pages are free. Under `cargo xtask test`
/// (which reserves two) a test that cannot get them fails, unless the
/// kernel has no 1 GiB pages at all; elsewhere it says why it skips.
pub fn free_1g_or_skip(pages: u64) -> bool {
    let dir = "/sys/kernel/mm/hugepages/hugepages-1048576kB";
    let free: u64 = std::fs::read_to_string(format!("{dir}/free_hugepages"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if free >= pages {
        return true;
    }
    let why = format!("needs {pages} free 1 GiB huge pages, the kernel has {free}");
    assert!(
        !(required() && std::path::Path::new(dir).is_dir()),
        "{why}, and HOSTPOOL_REQUIRE_HUGEPAGES=1"
    );
    eprintln!("skip: {why}");
    false
}
