//! The machine and the run ([`Environment`]), and the small readers and the
//! clock that fill it in.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

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
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc(secs)
}

/// `secs` after the Unix epoch, UTC, as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_798_675_200 + 3_723), "2026-12-31T01:02:03Z");
    }
}
