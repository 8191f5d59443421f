//! Kept pools: a pool that outlives the engine, so that a restarted engine
//! attaches in milliseconds instead of building hundreds of GiB again.
//!
//! A keeper (`hostpool keep`, [`Keeper`]) builds each named pool once
//! (capacity checks, map, NUMA binding, prefault, any backing that plans
//! files) and keeps it. It serves each pool on an abstract unix socket named
//! from the pool's name alone ([`socket_name`]: `@hostpool-keep/<name>`),
//! checks every client's credentials (`SO_PEERCRED`: the keeper's uid or one
//! of `allow_uids`, else refused) and passes the pool's descriptors with
//! `SCM_RIGHTS`. Nothing of a kept pool is in any directory: its files are
//! unlinked from birth (`O_TMPFILE` or memfds).
//!
//! An engine leases the pool (`keeper = "NAME"` in its config, see
//! `client.rs`): the keeper checks the size and page size asked for, hands
//! the memory over, and the engine maps it without a prefault (the pages are
//! resident), then pins and registers it as usual: pins belong to the
//! process that uses the memory. The ranks of one engine share one lease;
//! one lease at a time. When the lease ends (every rank closed, or died: an
//! EOF, seen at once) the keeper takes the pool back and, with
//! `content = "zero"`, clears it (the files' pages are punched out and
//! faulted in again by the prefault threads) before the next lease; with
//! `content = "keep"` the bytes stay for the next one. Every lease is told
//! the pool's identity ([`LeaseInfo`]): the keeper's instance, the
//! generation, how the previous lease ended and the tag it stored.
//!
//! The messages are JSON over `SOCK_SEQPACKET` ([`crate::wire`]):
//!
//! ```text
//! engine → keeper   Hello {world, rank, engine, size?, page?, tag?, attach_timeout_secs}
//! keeper → engine   Lease {info, logical, mapped, page, backing, extents, files} + fds (Files…)
//!                   or Refused {usage, message, pid}
//! engine → keeper   Arrived {error}        (ranks of a world > 1, after mapping)
//! keeper → engine   Go, or Failed {message, ranks, pid}
//! engine → keeper   Release                (a clean end; an EOF without it is a death)
//! anyone → keeper   Status → Status(json)  (`hostpool keep status`)
//! ```

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::PoolConfig;
use crate::error::{Error, Result};

mod client;
mod server;

pub(crate) use client::attach;
pub use server::{Keeper, StopRequests};

/// The prefix of every keeper's abstract socket name.
pub const SOCKET_PREFIX: &str = "hostpool-keep/";

/// The abstract socket a kept pool is served on, as `ss -x` and
/// `/proc/net/unix` show it: `@hostpool-keep/<name>`.
pub fn socket_name(name: &str) -> String {
    format!("@{SOCKET_PREFIX}{name}")
}

fn address(name: &str) -> Result<rustix::net::SocketAddrUnix> {
    rustix::net::SocketAddrUnix::new_abstract_name(format!("{SOCKET_PREFIX}{name}").as_bytes())
        .map_err(|e| {
            crate::wire::os(
                "socket address",
                e,
                "the kept pool's name is too long for a socket name",
            )
        })
}

/// Whether a lease's memory is cleared before the next lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Content {
    /// Cleared between leases: no engine sees another's bytes.
    #[default]
    Zero,
    /// Kept: a restarted engine finds the bytes its previous run wrote.
    Keep,
}

crate::choice::choice!(Content, "content policy", {
    Zero => "zero", "clear the pool between leases (no engine sees another's bytes)",
    Keep => "keep", "keep the bytes for the next lease (a restarted engine reuses its KV cache)",
});

/// How a lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseEnd {
    /// Every rank released it.
    Closed,
    /// A rank's connection ended without a release: it died.
    Died,
}

/// The lease before this one: who held it and how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviousLease {
    /// The process that held it (for a lease that died, the first rank that
    /// died).
    pub pid: u32,
    /// `closed` or `died`.
    pub how: LeaseEnd,
    /// When it ended (RFC 3339, UTC).
    pub ended_at: String,
}

/// A kept pool's identity, as each lease is told it (the report's `keeper`
/// object, with `attach_seconds`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// The kept pool's name.
    pub name: String,
    /// The keeper's instance: changes when the keeper restarts (and the
    /// generations start again at 1).
    pub instance: String,
    /// Leases so far, this one included.
    pub generation: u64,
    /// `zero` or `keep`.
    pub content: String,
    /// The lease before this one, `None` for the first.
    pub previous: Option<PreviousLease>,
    /// The tag the previous lease stored (`keeper_tag`), `None` if it stored none.
    pub tag: Option<String>,
    /// The keeper's pid.
    pub keeper_pid: u32,
}

/// One kept pool of a keeper's config: a pool config, and the keeper's own
/// keys for it.
#[derive(Debug, Clone)]
pub struct KeptPoolConfig {
    /// The pool's name, which names its socket.
    pub name: String,
    /// `content`: zero (default) or keep.
    pub content: Content,
    /// `allow_uids`: users besides the keeper's own that may lease it.
    pub allow_uids: Vec<u32>,
    /// The pool (any pool config key).
    pub pool: PoolConfig,
}

/// The keys of a `[[pool]]` table that are the keeper's, not the pool's.
pub const KEEPER_KEYS: [&str; 3] = ["name", "content", "allow_uids"];

impl KeptPoolConfig {
    /// Check what a keeper can keep: a named pool that is not itself shared
    /// or leased, that nothing pins or registers (the engine does, in its
    /// own process), whose memory other processes can map.
    ///
    /// # Errors
    /// [`Error::Config`] saying what to change.
    pub fn validate(&self) -> Result<()> {
        let n = &self.name;
        if n.is_empty()
            || n.len() > 64
            || n.starts_with('.')
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(Error::config(format!(
                "kept pool name `{n}` must be 1 to 64 letters, digits, `.`, `_` or `-`, not \
                 starting with `.`"
            )));
        }
        let p = &self.pool;
        if p.sharing.is_some() {
            return Err(Error::config(format!(
                "kept pool `{n}` has a `sharing` table: a keeper's pool is shared by leasing it; \
                 drop `sharing` (the engine's ranks give --shared when they attach)"
            )));
        }
        if p.keeper.is_some() {
            return Err(Error::config(format!(
                "kept pool `{n}` names a keeper itself; drop `keeper` from the keeper's config"
            )));
        }
        if p.pin.kind.is_some() || !p.register.is_empty() {
            return Err(Error::config(format!(
                "kept pool `{n}` asks for pinning or registration: pins and registrations belong \
                 to the process that uses the memory; drop `pin` and `register` here and give \
                 them to the engine (`hostpool alloc --keeper {n} --pin cuda`)"
            )));
        }
        if p.backing == "anon" {
            return Err(Error::config(format!(
                "kept pool `{n}`: backing anon's memory cannot be handed to another process; use \
                 backing shm-segmented or hugetlbfs (or auto, which picks one)"
            )));
        }
        Ok(())
    }

    /// The config the keeper plans with: the pool's, marked as shared so
    /// that backings (and `auto`) plan memory another process can map.
    pub(crate) fn plan_config(&self) -> PoolConfig {
        let mut c = self.pool.clone();
        c.sharing = Some(crate::config::SharingConfig {
            name: format!("keep-{}", self.name),
            world: 1,
            rank: 0,
            attach_timeout_secs: crate::config::DEFAULT_ATTACH_TIMEOUT_SECS,
            barrier_timeout_secs: crate::config::DEFAULT_BARRIER_TIMEOUT_SECS,
            rendezvous: crate::config::Rendezvous::Socket,
            control_dir: None,
        });
        c
    }

    /// One pool's table: the keeper's keys and a pool config.
    ///
    /// # Errors
    /// [`Error::Config`] naming the bad key.
    pub fn from_value(value: Value) -> Result<KeptPoolConfig> {
        let Value::Object(mut map) = value else {
            return Err(Error::config(
                "each [[pool]] of a keeper's config must be a table of keys",
            ));
        };
        let name = match map.remove("name") {
            Some(Value::String(s)) => s,
            Some(other) => {
                return Err(Error::config(format!(
                    "`name` must be a string, not {other}"
                )));
            }
            None => {
                return Err(Error::config(
                    "each [[pool]] needs a `name`, which names its socket (`name = \"kv0\"`)",
                ));
            }
        };
        let content = match map.remove("content") {
            None => Content::Zero,
            Some(Value::String(s)) => {
                crate::choice::Choice::parse(&s).map_err(|e| Error::config(e.to_string()))?
            }
            Some(other) => {
                return Err(Error::config(format!(
                    "`content` must be \"zero\" or \"keep\", not {other}"
                )));
            }
        };
        let allow_uids = match map.remove("allow_uids") {
            None => Vec::new(),
            Some(v) => serde_json::from_value::<Vec<u32>>(v.clone()).map_err(|_| {
                Error::config(format!(
                    "`allow_uids` must be a list of user ids (`allow_uids = [1000]`), not {v}"
                ))
            })?,
        };
        let pool = PoolConfig::from_value(Value::Object(map))
            .map_err(|e| Error::config(format!("kept pool `{name}`: {e}")))?;
        let kept = KeptPoolConfig {
            name,
            content,
            allow_uids,
            pool,
        };
        kept.validate()?;
        Ok(kept)
    }
}

/// A keeper's config file (`keep.toml`): one `[[pool]]` table per kept pool.
///
/// # Errors
/// [`Error::Config`] naming the file and what is wrong.
pub fn read_config(path: &Path) -> Result<Vec<KeptPoolConfig>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::on_input_path(
            "read",
            path,
            e,
            format!("cannot read keeper config {}", path.display()),
            "check the path given to --config (a TOML file of [[pool]] tables)",
        )
    })?;
    parse_config(&text).map_err(|e| match e {
        Error::Config { message } => Error::config(format!("in {}: {message}", path.display())),
        other => other,
    })
}

/// Parse a keeper's config text (TOML).
///
/// # Errors
/// [`Error::Config`] for syntax errors, unknown keys and pools a keeper
/// cannot keep.
pub fn parse_config(text: &str) -> Result<Vec<KeptPoolConfig>> {
    let value: Value =
        toml::from_str(text).map_err(|e| Error::config(format!("TOML syntax error: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(Error::config("a keeper's config is a TOML document"));
    };
    let pools = match map.remove("pool") {
        Some(Value::Array(pools)) if !pools.is_empty() => pools,
        _ => {
            return Err(Error::config(
                "a keeper's config needs one [[pool]] table per kept pool, each with a name \
                 (`[[pool]]`, `name = \"kv0\"`, `size = \"16GiB\"`)",
            ));
        }
    };
    if let Some(key) = map.keys().next() {
        return Err(Error::config(format!(
            "unknown key `{key}` in a keeper's config: every setting goes in a [[pool]] table"
        )));
    }
    let pools = pools
        .into_iter()
        .map(KeptPoolConfig::from_value)
        .collect::<Result<Vec<_>>>()?;
    for (i, p) in pools.iter().enumerate() {
        if pools[..i].iter().any(|q| q.name == p.name) {
            return Err(Error::config(format!(
                "two [[pool]] tables are named `{}`: give each kept pool its own name",
                p.name
            )));
        }
    }
    Ok(pools)
}

/// The names of the kept pools this network namespace serves, from
/// `/proc/net/unix` (every keeper, whoever runs it).
pub fn list() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let mut names: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter_map(|p| p.strip_prefix('@')?.strip_prefix(SOCKET_PREFIX))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Ask the keeper of `name` how its pool is (`hostpool keep status`).
///
/// # Errors
/// [`Error::Keeper`] when no keeper answers or it refuses.
pub fn status(name: &str) -> Result<Value> {
    client::status(name)
}

/// `t` as RFC 3339 in UTC, to the second: `2026-12-02T01:23:45Z`.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The keeper error for `name`: `message`, blaming `pid` when known.
pub(crate) fn keeper_error(name: &str, message: String, pid: Option<u32>, absent: bool) -> Error {
    Error::Keeper {
        name: name.to_string(),
        message,
        pid,
        absent,
    }
}

/// Where a kept pool's socket is, for messages.
pub(crate) fn how_to_start(name: &str) -> String {
    format!(
        "start it (`hostpool keep --name {name} --size SIZE`, or `systemctl start \
         hostpool-keep@{name}`) in this network namespace (a Kubernetes pod shares one), or set \
         keeper_fallback = \"build\" to build a pool of this process's own"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_is_the_calendar_date() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_796_175_825)),
            "2026-12-02T01:43:45Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
    }

    #[test]
    fn a_keepers_config_has_named_pools_and_refuses_what_it_cannot_keep() {
        let pools = parse_config(
            "[[pool]]\nname = \"kv0\"\nsize = \"16MiB\"\ncontent = \"keep\"\nallow_uids = \
             [1000]\n[[pool]]\nname = \"kv1\"\nsize = \"8MiB\"\n",
        )
        .unwrap();
        assert_eq!(pools.len(), 2);
        assert_eq!(pools[0].content, Content::Keep);
        assert_eq!(pools[0].allow_uids, vec![1000]);
        assert_eq!(pools[1].content, Content::Zero);
        assert_eq!(pools[1].pool.size.get(), 8 << 20);
        for (text, says) in [
            ("[[pool]]\nsize = \"1GiB\"\n", "needs a `name`"),
            ("size = \"1GiB\"\n", "one [[pool]] table"),
            (
                "[[pool]]\nname = \"a\"\n[[pool]]\nname = \"a\"\n",
                "two [[pool]]",
            ),
            (
                "[[pool]]\nname = \"a\"\npin = { kind = \"mlock\" }\n",
                "belong to the process",
            ),
            (
                "[[pool]]\nname = \"a\"\nbacking = \"anon\"\n",
                "cannot be handed",
            ),
            (
                "[[pool]]\nname = \"a\"\ncontent = \"maybe\"\n",
                "content policy",
            ),
            ("[[pool]]\nname = \"a b\"\n", "must be 1 to 64"),
            (
                "[[pool]]\nname = \"a\"\nallow_uids = \"root\"\n",
                "list of user ids",
            ),
            ("[[pool]]\nname = \"a\"\nsizee = 1\n", "unknown key `sizee`"),
        ] {
            let e = parse_config(text).unwrap_err();
            assert!(e.is_usage(), "{text}: {e}");
            assert!(e.to_string().contains(says), "{text}: {e}");
        }
    }
}
