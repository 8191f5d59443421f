//! What `hostpool doctor` asks of plugins: findings about this node, each
//! with a verdict and a remedy.
//!
//! The core and the CLI know only the areas every pool has (memory, cgroup,
//! memlock, kernel, plugins, leftovers, the pool's plan). Everything specific
//! to a plugin (huge page pools, hugetlbfs mounts, `/dev/shm`, THP, the CUDA
//! driver, RDMA devices) comes from the plugin's own doctor hook, a
//! [`DoctorFn`] in its record, so an out-of-tree plugin adds its findings the
//! same way.
//!
//! A hook is read-only: it maps no pool and writes nothing. It reports the
//! node in its own areas and, when [`DoctorContext::plan`] selects it, what it
//! would do for that pool in area `pool`.

use serde::Serialize;
use serde_json::Value;

use crate::config::PoolConfig;
use crate::host::fs::{FsKind, filesystem_kind};

/// How a finding stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Nothing to do.
    Ok,
    /// Worth knowing; nothing is wrong for the pools this node is used for.
    Info,
    /// Something will be slower, skipped, or may fail.
    Warn,
    /// The pool asked for cannot be built, or the node is broken for it.
    Fail,
}

impl Level {
    /// The verdict's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }
}

/// One line of the doctor's report: [`Finding::new`] and its builder
/// methods (the struct is `#[non_exhaustive]`).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Finding {
    /// The area, e.g. `memory`, `hugepages`, `cuda`, `pool`.
    pub area: &'static str,
    /// What was looked at within the area.
    pub item: String,
    /// What was found, in words.
    pub value: String,
    /// The verdict.
    pub verdict: Level,
    /// What to do, when the verdict is not ok.
    pub remedy: Option<String>,
    /// The figures behind the value, for scripts (absent when none).
    #[serde(skip_serializing_if = "Value::is_null")]
    pub details: Value,
}

impl Finding {
    /// An `ok` finding.
    pub fn new(area: &'static str, item: impl Into<String>, value: impl Into<String>) -> Finding {
        Finding {
            area,
            item: item.into(),
            value: value.into(),
            verdict: Level::Ok,
            remedy: None,
            details: Value::Null,
        }
    }

    /// With this value.
    #[must_use]
    pub fn with_value(mut self, value: impl Into<String>) -> Finding {
        self.value = value.into();
        self
    }

    /// With this verdict.
    #[must_use]
    pub fn level(mut self, verdict: Level) -> Finding {
        self.verdict = verdict;
        self
    }

    /// `info`, with a remedy.
    #[must_use]
    pub fn info(self, remedy: impl Into<String>) -> Finding {
        self.level(Level::Info).remedy(remedy)
    }

    /// `warn`, with a remedy.
    #[must_use]
    pub fn warn(self, remedy: impl Into<String>) -> Finding {
        self.level(Level::Warn).remedy(remedy)
    }

    /// `fail`, with a remedy.
    #[must_use]
    pub fn fail(self, remedy: impl Into<String>) -> Finding {
        self.level(Level::Fail).remedy(remedy)
    }

    /// With a remedy (none when empty).
    #[must_use]
    pub fn remedy(mut self, remedy: impl Into<String>) -> Finding {
        let r = remedy.into();
        self.remedy = (!r.is_empty()).then_some(r);
        self
    }

    /// With the figures behind the value.
    #[must_use]
    pub fn details(mut self, details: Value) -> Finding {
        self.details = details;
        self
    }
}

/// The pool a doctor run was asked about: its config and the sizes its
/// plan resolved.
#[derive(Debug, Clone, Copy)]
pub struct PoolFacts<'a> {
    /// The config.
    pub config: &'a PoolConfig,
    /// The page size of its mapping.
    pub page_size: u64,
    /// Bytes it maps.
    pub mapped_bytes: u64,
    /// Bytes this process faults (its shard of a shared pool).
    pub prefault_bytes: u64,
}

/// What a doctor hook is asked about.
#[derive(Debug, Clone, Copy, Default)]
pub struct DoctorContext<'a> {
    /// The pool asked for (`--config` or pool flags), when one was and it
    /// could be planned.
    pub pool: Option<PoolFacts<'a>>,
}

impl DoctorContext<'_> {
    /// The pool's config, when a pool was asked about.
    pub fn config(&self) -> Option<&PoolConfig> {
        self.pool.map(|p| p.config)
    }

    /// Whether the pool asked for is made of reserved huge pages: its page
    /// is larger than the base page (as for [`crate::Region::is_hugetlb`]),
    /// or its `dir` is on a hugetlbfs mount.
    pub fn pool_is_hugetlb(&self) -> bool {
        let Some(pool) = self.pool else {
            return false;
        };
        pool.page_size > crate::sys::base_page_size() as u64
            || pool
                .config
                .dir
                .as_deref()
                .is_some_and(|d| matches!(filesystem_kind(d), Ok(FsKind::Hugetlbfs { .. })))
    }

    /// `(page size, pages)` the pool needs of reserved huge pages, when it is
    /// made of them.
    pub fn huge_need(&self) -> Option<(u64, u64)> {
        let pool = self.pool?;
        let page = pool.page_size.max(1);
        self.pool_is_hugetlb()
            .then(|| (page, pool.mapped_bytes.div_ceil(page)))
    }

    /// Whether the pool asked for pins with `pinner`.
    pub fn pins_with(&self, pinner: &str) -> bool {
        self.config()
            .is_some_and(|c| c.pin.kind.as_deref() == Some(pinner))
    }

    /// Whether the pool asked for registers with `registrar`.
    pub fn registers_with(&self, registrar: &str) -> bool {
        self.config()
            .is_some_and(|c| c.register.iter().any(|r| r == registrar))
    }

    /// A finding about the pin the pool asks for that would not work: a
    /// failure when the pin is required, else a warning that the best-effort
    /// pin would be skipped.
    pub fn pin_shortfall(&self, finding: Finding, remedy: impl Into<String>) -> Finding {
        if self.config().is_some_and(|c| c.pin.required) {
            finding.fail(remedy)
        } else {
            finding.warn(format!(
                "the pin would be skipped (best effort): {}",
                remedy.into()
            ))
        }
    }

    /// The memlock bound the pool asked for pins under: `None` when no pool
    /// was given or its `memlock_bound` is `ignore`.
    pub fn memlock_bound(&self) -> Option<crate::host::memlock::MemlockBound> {
        let config = self.config()?;
        (config.pin.memlock_bound == crate::host::memlock::MemlockPolicy::Check).then(|| {
            crate::host::memlock::bound(&crate::host::memlock::state(), self.pool_is_hugetlb())
        })
    }
}

/// A reason split at its first `; `: what is wrong, and what to do.
pub fn split_reason(reason: &str) -> (String, Option<String>) {
    match reason.split_once("; ") {
        Some((what, todo)) => (what.to_string(), Some(todo.to_string())),
        None => (reason.to_string(), None),
    }
}

/// A plugin's doctor hook.
pub type DoctorFn = fn(&DoctorContext<'_>) -> Vec<Finding>;
