//! The one error type of pool-core and of every plugin.
//!
//! Messages are written for the operator who reads them at 3 a.m.: they say
//! what was being done, on which path, for how many bytes, with which page
//! size, and what to do about it. The errno is the `source`, not repeated in
//! the message; the CLI prints the whole chain.

use std::io;
use std::path::PathBuf;

use crate::layout::{LayoutError, PageSize, format_bytes};
use crate::size::SizeError;

/// `Result` with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while planning, building or tearing down a pool.
///
/// New kinds may be added: a `match` outside this crate needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is wrong; the operator must change it (exit status 2).
    #[error("invalid configuration: {message}")]
    Config {
        /// What was wrong and how to fix it.
        message: String,
    },

    /// A size in the configuration could not be parsed (exit status 2).
    #[error("invalid size for `{key}`: {source}")]
    Size {
        /// The configuration key or flag.
        key: String,
        /// What was wrong with it.
        #[source]
        source: Box<SizeError>,
    },

    /// Layout arithmetic refused the sizes (exit status 2).
    #[error(transparent)]
    Layout(#[from] LayoutError),

    /// A plugin name nobody registered (exit status 2).
    #[error(
        "unknown {kind} `{name}`; available: {available}. If it comes from a crate of its own, \
         make sure the binary links that crate (`use the_crate as _;`)"
    )]
    UnknownPlugin {
        /// "backing", "pinner" or "registrar".
        kind: &'static str,
        /// The name asked for.
        name: String,
        /// The sorted list of registered names, comma-separated.
        available: String,
    },

    /// Two plugins of one kind registered the same name.
    #[error(
        "{kind} `{name}` is registered twice, by `{first}` and by `{second}`; rename one of them"
    )]
    DuplicatePlugin {
        /// "backing", "pinner" or "registrar".
        kind: &'static str,
        /// The contested name.
        name: &'static str,
        /// Crate of one record.
        first: &'static str,
        /// Crate of the other.
        second: &'static str,
    },

    /// Something this host lacks: no driver, no device, no huge pages of that size.
    #[error("{what} is not available on this host: {reason}")]
    NotAvailable {
        /// The feature or plugin.
        what: String,
        /// Why, and what would make it available.
        reason: String,
    },

    /// The node cannot hold the pool (checked before anything is mapped).
    #[error("{resource} cannot hold the pool: it needs {need_h}, {free_h} free; {remedy}", need_h = format_bytes(*.need), free_h = format_bytes(*.free))]
    Capacity {
        /// What was checked, e.g. "anonymous memory (MemAvailable)".
        resource: String,
        /// Bytes the pool needs.
        need: u64,
        /// Bytes available.
        free: u64,
        /// How to make room.
        remedy: String,
    },

    /// A system call failed (exit status 1). Build it with [`Error::os`].
    #[error("{op}{at} failed{for_size}{path_s}; {remedy}",
        at = .addr.map(|a| format!(" at {a:#x}")).unwrap_or_default(),
        for_size = if *.size > 0 { format!(" for {} with {} pages", format_bytes(*.size), .page) } else { String::new() },
        path_s = .path.as_ref().map(|p| format!(" on {}", p.display())).unwrap_or_default())]
    Os {
        /// The call, e.g. "mmap" or "madvise(MADV_POPULATE_WRITE)".
        op: &'static str,
        /// The file or directory involved, if any.
        path: Option<PathBuf>,
        /// The address the call worked on, if any.
        addr: Option<usize>,
        /// Bytes the call worked on (0 when it worked on no memory).
        size: u64,
        /// Page size of the memory involved.
        page: PageSize,
        /// What to do about it.
        remedy: String,
        /// The errno.
        #[source]
        source: io::Error,
    },

    /// Something on the node is in the way of the pool: a pool file owned by
    /// another user, with a wide mode, not a regular file, or held by another
    /// process (exit status 1: the input is fine, the node is not).
    #[error("{message}")]
    Conflict {
        /// The file involved.
        path: PathBuf,
        /// What is in the way and how to clear it.
        message: String,
    },

    /// Pinning or registration failed in a plugin; the message is the plugin's.
    #[error("{what}: {message}")]
    Plugin {
        /// The plugin and step, e.g. "cuda pinner".
        what: String,
        /// What went wrong and how to fix it.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// A stop was requested (a signal, see the `interrupt` module) while the pool
    /// was being built; what was built has been torn down. Exit status
    /// 128 + the signal (130 for SIGINT, 143 for SIGTERM).
    #[error(
        "interrupted by signal {signal} while the pool was being built; what was built has been torn down"
    )]
    Interrupted {
        /// The signal number.
        signal: i32,
    },

    /// A peer in a shared pool failed, died, stopped or never attached.
    #[error("{message}")]
    Peer {
        /// Which peer, and what it did.
        message: String,
        /// The ranks the message blames, in the order it names them, each
        /// once: the rank that failed or died (followed, when it failed
        /// because of peers, by the ranks it blamed), every rank that never
        /// attached or did not reach the barrier, or this rank itself when
        /// its own setup failed. Empty when the message names a peer only by
        /// its pid (a joiner never learns its creator's rank before it is
        /// welcomed) or names none.
        ranks: Vec<u32>,
        /// The process id of the first peer blamed, when it is known.
        pid: Option<u32>,
    },

    /// A shared pool's rank asks for another page size than its creator's
    /// pool has (exit status 2). A rank whose `huge_pages = "prefer"` chose
    /// otherwise than the creator takes the creator's choice instead.
    #[error("{message}")]
    PageSizeMismatch {
        /// Both sides, named.
        message: String,
        /// The creator's page size in bytes.
        creator_page: u64,
    },

    /// A pool's keeper (`[lease]` `keeper = "NAME"`) does not answer, refused the
    /// lease, or failed or died during it (exit status 1).
    #[error("{message}")]
    Keeper {
        /// The kept pool's name.
        name: String,
        /// What happened, naming the keeper's socket, and what to do.
        message: String,
        /// The process the message blames (the keeper, or the lease's
        /// holder), when known.
        pid: Option<u32>,
        /// No keeper answers on the socket (`lease.fallback = "build"`
        /// then builds a pool instead).
        absent: bool,
    },
}

/// Where a failed system call happened: the fields of [`Error::Os`] other
/// than the call and its errno.
#[derive(Debug, Clone)]
pub struct Context {
    path: Option<PathBuf>,
    addr: Option<usize>,
    size: u64,
    page: PageSize,
    remedy: String,
}

impl Context {
    /// A call on `size` bytes of memory with `page`-sized pages (0 bytes for
    /// calls on files or descriptors alone).
    pub fn new(size: u64, page: PageSize) -> Context {
        Context {
            path: None,
            addr: None,
            size,
            page,
            remedy: String::new(),
        }
    }

    /// A call on a file or directory, not on pool memory.
    pub fn file(path: impl Into<PathBuf>) -> Context {
        Context::new(0, PageSize::BASE_4K).path(path)
    }

    /// The file or directory involved.
    #[must_use]
    pub fn path(mut self, path: impl Into<PathBuf>) -> Context {
        self.path = Some(path.into());
        self
    }

    /// The address the call worked on.
    #[must_use]
    pub fn addr(mut self, addr: usize) -> Context {
        self.addr = Some(addr);
        self
    }

    /// What the operator can do about it.
    #[must_use]
    pub fn remedy(mut self, remedy: impl Into<String>) -> Context {
        self.remedy = remedy.into();
        self
    }
}

impl Error {
    /// A failed system call: `op` is the call, `source` its errno, `context`
    /// where it happened and the remedy. Exit status 1.
    pub fn os(op: &'static str, source: impl Into<io::Error>, context: Context) -> Error {
        let Context {
            path,
            addr,
            size,
            page,
            remedy,
        } = context;
        Error::Os {
            op,
            path,
            addr,
            size,
            page,
            remedy: if remedy.is_empty() {
                "see the error number below".to_string()
            } else {
                remedy
            },
            source: source.into(),
        }
    }

    /// A failed system call on a path the operator gave (`dir`,
    /// `--config`): the operator's input (exit 2) when the path does not
    /// exist, is not a directory where one is needed or is one where a file
    /// is (`ENOENT`, `ENOTDIR`, `EISDIR`), or is not text; said in words after
    /// `doing` (e.g. "cannot examine dir /srv/kv"); otherwise (`EACCES`,
    /// `EIO`, ...) a runtime error (exit 1) with the errno as the source.
    pub fn on_input_path(
        op: &'static str,
        path: &std::path::Path,
        source: impl Into<io::Error>,
        doing: impl Into<String>,
        remedy: impl Into<String>,
    ) -> Error {
        let source = source.into();
        let remedy = remedy.into();
        let doing = doing.into();
        match source.raw_os_error() {
            Some(libc::ENOENT) => Error::config(format!("{doing}: it does not exist; {remedy}")),
            Some(libc::ENOTDIR) => Error::config(format!(
                "{doing}: a part of the path is not a directory; {remedy}"
            )),
            Some(libc::EISDIR) => Error::config(format!("{doing}: it is a directory; {remedy}")),
            None if source.kind() == io::ErrorKind::InvalidData => {
                Error::config(format!("{doing}: it is not UTF-8 text; {remedy}"))
            }
            _ => Error::os(
                op,
                source,
                Context::file(path).remedy(format!("{doing}; {remedy}")),
            ),
        }
    }

    /// A configuration error with this message.
    pub fn config(message: impl Into<String>) -> Error {
        Error::Config {
            message: message.into(),
        }
    }

    /// Whether this is the operator's input at fault (exit status 2) rather
    /// than the run (exit status 1).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::Config { .. }
                | Error::PageSizeMismatch { .. }
                | Error::Size { .. }
                | Error::Layout(_)
                | Error::UnknownPlugin { .. }
        )
    }

    /// The error and its causes in one paragraph, as the CLI prints it after
    /// `error: ` and the Python package raises it: each cause appended as
    /// `(cause: ...)` unless the text already says it.
    pub fn chain_message(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            let cause = s.to_string();
            if !text.contains(&cause) {
                text.push_str(&format!(" (cause: {cause})"));
            }
            source = s.source();
        }
        text
    }

    /// Whether this says "the host lacks it" rather than "it broke".
    pub fn is_not_available(&self) -> bool {
        matches!(self, Error::NotAvailable { .. })
    }

    /// The errno, if a system call is at the root of this error.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Os { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// The exit status the CLI uses for this error: 2 for usage, 128 + the
    /// signal for an interrupted build, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Interrupted { signal } => 128 + signal,
            e if e.is_usage() => 2,
            _ => 1,
        }
    }
}

/// A step of teardown that could not be undone. Teardown never stops at one:
/// it logs each and carries on, so that as much as possible is given back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TeardownIssue {
    /// The step, e.g. "munmap" or "unlink".
    pub step: String,
    /// What could not be released, with address, length, path and errno.
    pub detail: String,
}

impl TeardownIssue {
    /// Record an issue and log it at warn level.
    pub fn log(step: impl Into<String>, detail: impl Into<String>) -> TeardownIssue {
        let issue = TeardownIssue {
            step: step.into(),
            detail: detail.into(),
        };
        tracing::warn!(step = %issue.step, "teardown could not undo a step: {}", issue.detail);
        issue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_name_op_address_size_page_path_and_remedy() {
        let e = Error::os(
            "mmap",
            io::Error::from_raw_os_error(libc::ENOMEM),
            Context::new(3 << 30, PageSize::HUGE_2M)
                .path("/dev/hugepages/pool")
                .addr(0x7f00_0000_0000)
                .remedy("reserve more huge pages"),
        );
        let msg = e.to_string();
        for want in [
            "mmap",
            "0x7f0000000000",
            "3 GiB",
            "2 MiB",
            "/dev/hugepages/pool",
            "reserve more",
        ] {
            assert!(msg.contains(want), "missing {want:?} in {msg}");
        }
        assert_eq!(e.errno(), Some(libc::ENOMEM));
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn a_missing_input_path_is_usage_and_any_other_failure_on_it_is_runtime() {
        let p = std::path::Path::new("/srv/pool");
        let doing = "cannot examine dir /srv/pool";
        let missing = Error::on_input_path(
            "statfs",
            p,
            io::Error::from_raw_os_error(libc::ENOENT),
            doing,
            "create it",
        );
        assert_eq!(missing.exit_code(), 2);
        assert_eq!(
            missing.to_string(),
            "invalid configuration: cannot examine dir /srv/pool: it does not exist; create it"
        );
        let denied = Error::on_input_path(
            "statfs",
            p,
            io::Error::from_raw_os_error(libc::EACCES),
            doing,
            "check its permissions",
        );
        assert_eq!(denied.exit_code(), 1);
        assert_eq!(denied.errno(), Some(libc::EACCES));
        let msg = denied.to_string();
        assert!(
            msg.contains(
                "statfs failed on /srv/pool; cannot examine dir /srv/pool; check its permissions"
            ),
            "{msg}"
        );
        assert!(
            !msg.contains("Permission denied"),
            "the errno is the source, not the message: {msg}"
        );
    }

    #[test]
    fn usage_errors_exit_2_and_runtime_errors_exit_1() {
        assert_eq!(Error::config("x").exit_code(), 2);
        let unknown = Error::UnknownPlugin {
            kind: "backing",
            name: "nope".into(),
            available: "anon".into(),
        };
        assert_eq!(unknown.exit_code(), 2);
        assert!(unknown.to_string().contains("available: anon"));
        let na = Error::NotAvailable {
            what: "cuda".into(),
            reason: "no driver".into(),
        };
        assert!(na.is_not_available());
        assert_eq!(na.exit_code(), 1);
    }
}
