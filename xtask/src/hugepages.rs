//! Huge page pools in sysfs (`/sys/kernel/mm/hugepages/hugepages-<N>kB`).
//!
//! Reading and writing the per-size counters, and reserving pages with
//! read-back (the kernel may give fewer pages than asked for).

use std::fs;
use std::io::{ErrorKind, Write};
use std::path::PathBuf;

/// Root of the per-size huge page directories.
const SYSFS_ROOT: &str = "/sys/kernel/mm/hugepages";
/// Writing `1` here asks the kernel to compact memory (helps 1 GiB pages).
const COMPACT_MEMORY: &str = "/proc/sys/vm/compact_memory";

/// A huge page size the test suite uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageSize {
    /// 2 MiB pages.
    Huge2M,
    /// 1 GiB pages.
    Huge1G,
}

impl PageSize {
    /// All sizes, in the order they are reserved: 1 GiB first, because
    /// 1 GiB pages need contiguous memory that 2 MiB pages would fragment.
    pub const ALL: [PageSize; 2] = [PageSize::Huge1G, PageSize::Huge2M];

    /// Short tag used in mount options, directory names, env variable names
    /// and the state file: `2M` / `1G`.
    pub fn tag(self) -> &'static str {
        match self {
            PageSize::Huge2M => "2M",
            PageSize::Huge1G => "1G",
        }
    }

    /// Human-readable size.
    pub fn human(self) -> &'static str {
        match self {
            PageSize::Huge2M => "2 MiB",
            PageSize::Huge1G => "1 GiB",
        }
    }

    /// Parses a [`tag`](Self::tag).
    pub fn from_tag(tag: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|size| size.tag() == tag)
    }

    /// Minimum number of pages the test suite wants of this size.
    pub fn wanted(self) -> u64 {
        match self {
            PageSize::Huge2M => 1024,
            PageSize::Huge1G => 2,
        }
    }

    /// The sysfs directory of this size's pool.
    pub fn sysfs_dir(self) -> PathBuf {
        let kib = match self {
            PageSize::Huge2M => 2048,
            PageSize::Huge1G => 1_048_576,
        };
        PathBuf::from(format!("{SYSFS_ROOT}/hugepages-{kib}kB"))
    }

    /// Path of one counter file of this size's pool.
    pub fn file(self, counter: &str) -> PathBuf {
        self.sysfs_dir().join(counter)
    }

    /// Whether the running kernel supports this page size.
    pub fn supported(self) -> bool {
        self.sysfs_dir().is_dir()
    }
}

/// The counters of one pool at one point in time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// `nr_hugepages`: pool size, including surplus pages.
    pub nr: u64,
    /// `nr_overcommit_hugepages`: allowed surplus pages.
    pub overcommit: u64,
    /// `free_hugepages`: pages not in use.
    pub free: u64,
    /// `surplus_hugepages`: pages above the persistent pool size
    /// (overcommitted, or still in use after the pool was shrunk).
    pub surplus: u64,
}

impl Counters {
    /// Reads the current counters of `size`.
    pub fn read(size: PageSize) -> Result<Self, String> {
        Ok(Counters {
            nr: read_counter(size, "nr_hugepages")?,
            overcommit: read_counter(size, "nr_overcommit_hugepages")?,
            free: read_counter(size, "free_hugepages")?,
            surplus: read_counter(size, "surplus_hugepages")?,
        })
    }

    /// Pages of the pool that are in use (`nr_hugepages` already counts
    /// surplus pages).
    pub fn in_use(self) -> u64 {
        self.nr.saturating_sub(self.free)
    }
}

/// Reads one numeric sysfs counter of `size`.
pub fn read_counter(size: PageSize, counter: &str) -> Result<u64, String> {
    let path = size.file(counter);
    let text = fs::read_to_string(&path)
        .map_err(|err| format!("could not read {}: {err}", path.display()))?;
    text.trim().parse().map_err(|err| {
        format!(
            "{} holds {:?}, not a number: {err}",
            path.display(),
            text.trim()
        )
    })
}

/// Writes one numeric sysfs counter of `size`.
pub fn write_counter(size: PageSize, counter: &str, value: u64) -> Result<(), String> {
    let path = size.file(counter);
    fs::write(&path, format!("{value}\n"))
        .map_err(|err| format!("could not write {value} to {}: {err}", path.display()))
}

/// Checks that the pool of `size` can be resized by this process, without
/// changing anything. The error explains how to fix it.
pub fn check_writable(size: PageSize) -> Result<(), String> {
    let path = size.file("nr_hugepages");
    match fs::OpenOptions::new().write(true).open(&path) {
        Ok(_) => Ok(()),
        Err(err)
            if matches!(
                err.kind(),
                ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem
            ) =>
        {
            Err(format!(
                "{} is not writable ({err}); run as root (e.g. `sudo -E cargo xtask ...`) \
                 on a host or container with a writable /sys",
                path.display()
            ))
        }
        Err(err) => Err(format!("could not open {}: {err}", path.display())),
    }
}

/// Grows the pool of `size` to at least [`PageSize::wanted`] pages (never
/// shrinks it) and returns the pool size the kernel actually provides.
pub fn reserve(size: PageSize) -> Result<u64, String> {
    reserve_at_least(size, size.wanted())
}

/// Grows the pool of `size` to at least `wanted` pages (never shrinks it)
/// and returns the pool size the kernel actually provides.
pub fn reserve_at_least(size: PageSize, wanted: u64) -> Result<u64, String> {
    let current = read_counter(size, "nr_hugepages")?;
    if current >= wanted {
        return Ok(current);
    }
    let mut got = grow_to(size, wanted)?;
    if got < wanted && size == PageSize::Huge1G {
        // Contiguous 1 GiB ranges are often only available after compaction.
        compact_memory();
        got = grow_to(size, wanted)?;
    }
    Ok(got)
}

/// Asks for `target` pages and reads back what the kernel gave.
fn grow_to(size: PageSize, target: u64) -> Result<u64, String> {
    // The kernel answers a partial allocation with success or with an error
    // (e.g. ENOMEM) depending on the version; the read-back is what counts.
    if let Err(err) = write_counter(size, "nr_hugepages", target) {
        eprintln!("xtask: note: {err}; reading back what the kernel gave");
    }
    read_counter(size, "nr_hugepages")
}

/// Best-effort memory compaction; failures only cost 1 GiB pages.
fn compact_memory() {
    let result = fs::OpenOptions::new()
        .write(true)
        .open(COMPACT_MEMORY)
        .and_then(|mut file| file.write_all(b"1\n"));
    if let Err(err) = result {
        eprintln!("xtask: note: memory compaction via {COMPACT_MEMORY} failed: {err}");
    }
}
