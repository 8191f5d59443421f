//! One line of the report ([`Row`]) and what became of it ([`Status`]).

use serde::Serialize;

use bench_support::benchkit::{self, Memory};

/// What became of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Status {
    /// Timed; `seconds` and `gb_per_s` are set.
    Measured,
    /// Not run; `reason` says why (for example no free huge pages).
    Skipped,
    /// The operation does nothing on this memory; `reason` says why.
    NoOp,
    /// A run failed; `reason` has the error.
    Failed,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Row {
    /// `limit`, `prefault` or `mlock`.
    pub(super) section: &'static str,
    /// `memset`, `raw-c`, `populate-write`, `touch`, `map-populate`, `mlock`.
    pub(super) method: &'static str,
    /// The backing (`anon-thp`: anon with transparent huge pages).
    pub(super) backing: &'static str,
    /// The page size, as people write it.
    pub(super) page: String,
    pub(super) page_size_bytes: u64,
    /// Threads asked for.
    pub(super) threads: usize,
    /// Threads that did the work (fewer when pages cannot be split further).
    pub(super) threads_used: Option<usize>,
    /// Bytes per run.
    pub(super) size_bytes: u64,
    pub(super) status: Status,
    /// Why the row is skipped, a no-op or failed.
    pub(super) reason: Option<String>,
    /// Median seconds of one run.
    pub(super) seconds: Option<f64>,
    /// Every run's seconds, in the order they ran.
    pub(super) seconds_each: Vec<f64>,
    /// `size_bytes / seconds / 1e9`.
    pub(super) gb_per_s: Option<f64>,
    /// Throughput over memset's with the same threads (1 for mlock).
    pub(super) ratio_to_memset: Option<f64>,
    /// Throughput over the C reference's on the same memory and threads.
    pub(super) ratio_to_raw_c: Option<f64>,
    /// The keeper's attach: the build's seconds over the attach's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) speedup_over_build: Option<f64>,
    /// Caveats about a measured figure.
    pub(super) notes: Vec<String>,
}

impl Row {
    /// A row to measure, with no figure yet.
    pub(super) fn new(
        section: &'static str,
        method: &'static str,
        memory: &Memory,
        threads: usize,
        size: u64,
    ) -> Row {
        Row {
            section,
            method,
            backing: memory.label,
            page: benchkit::page_label(memory.page),
            page_size_bytes: memory.page.get(),
            threads,
            threads_used: None,
            size_bytes: size,
            status: Status::Measured,
            reason: None,
            seconds: None,
            seconds_each: Vec::new(),
            gb_per_s: None,
            ratio_to_memset: None,
            ratio_to_raw_c: None,
            speedup_over_build: None,
            notes: Vec::new(),
        }
    }

    /// Whether the row is still being measured.
    pub(super) fn open(&self) -> bool {
        self.status == Status::Measured
    }

    /// Close the row unmeasured; notes about figures no longer apply.
    pub(super) fn set(&mut self, status: Status, reason: String) {
        if self.open() {
            self.status = status;
            self.reason = Some(reason);
            self.seconds_each.clear();
            self.threads_used = None;
            self.notes.clear();
        }
    }

    /// Add a caveat, once.
    pub(super) fn note(&mut self, note: String) {
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// The median and rate, once every run is in.
    pub(super) fn finish(&mut self) {
        if !self.open() {
            return;
        }
        match benchkit::median(&self.seconds_each) {
            Some(s) if s > 0.0 => {
                self.seconds = Some(s);
                self.gb_per_s = Some(self.size_bytes as f64 / s / 1e9);
            }
            _ => {
                self.status = Status::Failed;
                self.reason = Some("no run was timed".into());
            }
        }
    }
}
