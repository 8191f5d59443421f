//! The memlock bound: how much this process may pin, checked before any
//! pinner or registrar pins (seed 004, improved where the kernel says more).
//!
//! - A process with `CAP_IPC_LOCK` is not bound by `RLIMIT_MEMLOCK`
//!   (`mm/mlock.c: can_do_mlock`, `ib_umem_get`): no bound.
//! - Otherwise a finite hard `RLIMIT_MEMLOCK` is the bound (the soft limit
//!   can be raised to it without privilege).
//! - An unlimited limit on ordinary memory is bounded by half of physical RAM
//!   (seed 004's safety margin against pinning the node to death); huge pages
//!   reserved for a hugetlb pool are already set aside and never swapped, so
//!   they get no such guess.
//! - `pin.memlock_bound = "ignore"` turns the check off, since whether the
//!   GPU driver itself counts against the limit is not established.
//!
//! One function serves every pinner and registrar: [`check`].

use serde::Serialize;

use crate::error::{Error, Result};
use crate::host::capacity::meminfo;
use crate::layout::format_bytes;

/// Whether pinners check the memlock bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemlockPolicy {
    /// Check it (default).
    #[default]
    Check,
    /// Do not check it.
    Ignore,
}

crate::choice!(MemlockPolicy, "memlock bound policy", {
    Check => "check", "compare the pool with the memlock bound before pinning",
    Ignore => "ignore", "do not",
});

/// What the process's limits are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemlockState {
    /// Soft `RLIMIT_MEMLOCK`, `None` when unlimited.
    pub soft: Option<u64>,
    /// Hard `RLIMIT_MEMLOCK`, `None` when unlimited.
    pub hard: Option<u64>,
    /// `CAP_IPC_LOCK` in the effective set.
    pub cap_ipc_lock: bool,
    /// Physical RAM (`MemTotal`).
    pub ram: u64,
}

/// This process's limits now.
pub fn state() -> MemlockState {
    let rl = rustix::process::getrlimit(rustix::process::Resource::Memlock);
    let cap_ipc_lock = rustix::thread::capabilities(None)
        .map(|c| {
            c.effective
                .contains(rustix::thread::CapabilitySet::IPC_LOCK)
        })
        .unwrap_or(false);
    MemlockState {
        soft: rl.current,
        hard: rl.maximum,
        cap_ipc_lock,
        ram: meminfo("MemTotal").unwrap_or(0),
    }
}

/// The bound a pin of memory must fit in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemlockBound {
    /// Bytes that may be pinned; `None` when there is no bound.
    pub limit: Option<u64>,
    /// Where the bound comes from, in words.
    pub source: String,
}

impl MemlockBound {
    /// The bound and where it comes from, in words: `8 MiB (RLIMIT_MEMLOCK)`.
    pub fn describe(&self) -> String {
        match self.limit {
            Some(l) => format!("{} ({})", crate::layout::format_bytes(l), self.source),
            None => format!("none ({})", self.source),
        }
    }

    /// Whether `bytes` may be pinned under the bound.
    pub fn allows(&self, bytes: u64) -> bool {
        self.limit.is_none_or(|l| bytes <= l)
    }
}

/// The bound for a pool of ordinary pages (`hugetlb = false`) or reserved
/// huge pages, under `state`. Pure.
pub fn bound(state: &MemlockState, hugetlb: bool) -> MemlockBound {
    match (state.cap_ipc_lock, state.hard, hugetlb) {
        (true, _, _) => MemlockBound {
            limit: None,
            source: "CAP_IPC_LOCK: not bound by RLIMIT_MEMLOCK".into(),
        },
        (false, Some(hard), _) => MemlockBound {
            limit: Some(hard),
            source: format!("the hard RLIMIT_MEMLOCK of {}", format_bytes(hard)),
        },
        (false, None, true) => MemlockBound {
            limit: None,
            source: "RLIMIT_MEMLOCK unlimited, and reserved huge pages are never swapped".into(),
        },
        (false, None, false) => MemlockBound {
            limit: Some(state.ram / 2),
            source: format!(
                "half of physical RAM ({}), the safety bound when RLIMIT_MEMLOCK is unlimited",
                format_bytes(state.ram / 2)
            ),
        },
    }
}

/// How to raise the limit, for error messages.
pub const REMEDY: &str = "raise the memlock limit: `ulimit -l unlimited` in the shell that starts the engine \
    (raising the hard limit needs root), Docker `--ulimit memlock=-1`, systemd or containerd \
    `LimitMEMLOCK=infinity`, or give the process CAP_IPC_LOCK; or set pin.memlock_bound = \"ignore\" \
    to skip this check";

/// Check that pinning `len` bytes with `who` fits the bound. Returns the
/// line that explains the verdict.
///
/// # Errors
/// [`Error::NotAvailable`] naming the size, the bound and its source, and
/// how to raise it, when it does not fit.
pub fn check(len: u64, who: &str, hugetlb: bool, policy: MemlockPolicy) -> Result<String> {
    check_with(&state(), len, who, hugetlb, policy)
}

/// [`check`] under a given state. Pure.
///
/// # Errors
/// As for [`check`].
pub fn check_with(
    state: &MemlockState,
    len: u64,
    who: &str,
    hugetlb: bool,
    policy: MemlockPolicy,
) -> Result<String> {
    if policy == MemlockPolicy::Ignore {
        return Ok("memlock bound not checked (pin.memlock_bound = \"ignore\")".into());
    }
    let b = bound(state, hugetlb);
    match b.limit {
        Some(limit) if len > limit => Err(Error::NotAvailable {
            what: format!("pinning {} with {who}", format_bytes(len)),
            reason: format!("it exceeds {}; {REMEDY}", b.source),
        }),
        Some(limit) => Ok(format!(
            "{} fits {} ({})",
            format_bytes(len),
            format_bytes(limit),
            b.source
        )),
        None => Ok(format!(
            "{} to pin; no memlock bound: {}",
            format_bytes(len),
            b.source
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(hard: Option<u64>, cap: bool) -> MemlockState {
        MemlockState {
            soft: hard,
            hard,
            cap_ipc_lock: cap,
            ram: 64 << 30,
        }
    }

    #[test]
    fn cap_ipc_lock_means_no_bound_whatever_the_limit() {
        assert_eq!(bound(&st(Some(8 << 20), true), false).limit, None);
        assert!(
            check_with(
                &st(Some(8 << 20), true),
                1 << 40,
                "cuda",
                false,
                MemlockPolicy::Check
            )
            .is_ok()
        );
    }

    #[test]
    fn a_finite_hard_limit_bounds_ordinary_and_huge_pages_alike() {
        for huge in [false, true] {
            let e = check_with(
                &st(Some(8 << 20), false),
                196 << 30,
                "cuda",
                huge,
                MemlockPolicy::Check,
            )
            .unwrap_err();
            let msg = e.to_string();
            assert!(e.is_not_available(), "{e:?}");
            for want in [
                "196 GiB",
                "hard RLIMIT_MEMLOCK of 8 MiB",
                "ulimit -l",
                "--ulimit memlock=-1",
                "LimitMEMLOCK=infinity",
            ] {
                assert!(msg.contains(want), "missing {want:?}: {msg}");
            }
            assert!(
                check_with(
                    &st(Some(8 << 20), false),
                    8 << 20,
                    "cuda",
                    huge,
                    MemlockPolicy::Check
                )
                .is_ok()
            );
        }
    }

    #[test]
    fn unlimited_bounds_ordinary_memory_by_half_of_ram_but_not_huge_pages() {
        let s = st(None, false);
        assert_eq!(bound(&s, false).limit, Some(32 << 30));
        assert!(
            check_with(&s, 33 << 30, "mlock", false, MemlockPolicy::Check)
                .unwrap_err()
                .to_string()
                .contains("half of physical RAM")
        );
        assert_eq!(bound(&s, true).limit, None);
        assert!(check_with(&s, 60 << 30, "mlock", true, MemlockPolicy::Check).is_ok());
    }

    #[test]
    fn ignore_skips_the_check() {
        let line = check_with(
            &st(Some(1), false),
            1 << 40,
            "cuda",
            false,
            MemlockPolicy::Ignore,
        )
        .unwrap();
        assert!(line.contains("not checked"));
    }

    #[test]
    fn state_reads_this_process() {
        let s = state();
        assert!(s.ram > 0);
        if let (Some(soft), Some(hard)) = (s.soft, s.hard) {
            assert!(soft <= hard);
        }
    }
}
