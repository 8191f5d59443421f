//! The machine and the run ([`Environment`]), and the small readers and the
//! clock that fill it in.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::Serialize;

/// The machine and the run.
#[derive(Debug, Serialize)]
pub(super) struct Environment {
    /// UTC, RFC 3339.
    pub(super) date: String,
    pub(super) kernel: String,
    pub(super) cores: usize,
    /// `--size`.
    pub(super) size_requested_bytes: u64,
    /// Rounded up to 2 MiB (1 GiB pages use at least one page).
    pub(super) size_bytes: u64,
    pub(super) repeat: usize,
    pub(super) threads: Vec<usize>,
    pub(super) mem_available_bytes: Option<u64>,
    pub(super) transparent_hugepage: Option<String>,
    pub(super) populate_write_supported: bool,
    /// Free huge pages (free − reserved) per page size when the run started.
    pub(super) huge_pages_free: BTreeMap<String, u64>,
    /// Seconds each kind of memory took to build, fill and release once.
    pub(super) warm_up_seconds: BTreeMap<String, f64>,
    pub(super) hostpool_version: &'static str,
}

/// A file's contents, trimmed; `None` when it cannot be read.
pub(super) fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Now, UTC, as `YYYY-MM-DDTHH:MM:SSZ`.
pub(super) fn utc_now() -> String {
    pool_core::rfc3339(SystemTime::now())
}
