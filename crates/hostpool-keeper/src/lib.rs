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
//! An engine leases the pool (`[lease]` `keeper = "NAME"` in its config, see
//! the private `lease` module): the keeper checks the size and page size asked for, hands
//! the memory over, and the engine maps it without a prefault (the pages are
//! resident), then pins and registers it as usual: pins belong to the
//! process that uses the memory. The ranks of one engine share one lease;
//! one lease at a time, or up to `tenants` (`--tenants N`) engines at once,
//! each a tenant with a lease of its own over the whole pool. When a lease
//! ends (every rank closed, or died: an EOF, seen at once) the keeper takes
//! the pool back from it and, once no tenant is left, with
//! `content = "zero"`, clears it (zeroed in place by the prefault threads:
//! its pages stay allocated, so nothing can take them meanwhile) before
//! the next lease; with
//! `content = "keep"` the bytes stay for the next one. Every lease is told
//! the pool's identity ([`LeaseInfo`]): the keeper's instance, the
//! generation, how the previous lease ended and the tag it stored.
//!
//! The messages are JSON over `SOCK_SEQPACKET` (`hostpool_handoff::wire`);
//! a hello of a lease protocol the keeper does not speak is refused first,
//! naming both versions:
//!
//! ```text
//! engine → keeper   Hello {protocol, world, rank, engine, companion, size?, page?, tag?,
//!                          attach_timeout_secs, barrier_timeout_secs}
//! keeper → engine   Lease {protocol, info, logical, mapped, page, backing, extents, files}
//!                   + fds (Files…), or Refused {usage, message, pid}
//! engine → keeper   Arrived {error}        (ranks of a world > 1, after mapping)
//! keeper → engine   Go, or Failed {message, ranks, pid}
//! engine → keeper   Release                (a clean end; an EOF without it is a death)
//! anyone → keeper   Status → Status(json)  (`hostpool keep status`)
//! ```
//!
//! The keeper (the private `server` module) keeps its state apart from its
//! I/O: a state machine (`server::state`, `Serving`) holds the leases in
//! force (its tenants), their ranks, the waiting attaches and the keeper's own state, names
//! connections by id, and changes only by transitions (a hello answered, a
//! rank joined, ranks arriving, releasing or gone, the clock, the clearing,
//! stop requests) that return what to send or close; the I/O side
//! (`server::io`) owns the socket and the connections, reads and feeds
//! events, and sends. `Keeper::serve`'s loop drives both; the pool is
//! cleared between leases on a thread of its own (`server::clear`).

use std::path::Path;

use serde_json::Value;

use pool_core::PoolConfig;
use pool_core::{Error, Result};

pub mod fdstore;
pub mod metrics;
pub mod notify;
pub mod persist;
mod server;
mod sys;

pub use hostpool_handoff::lease::{
    LeaseEnd, LeaseInfo, PreviousLease, SOCKET_PREFIX, list, socket_name, status, status_and_pid,
};
pub use server::{CameBack, Keeper, StopRequests};

/// Whether a lease's memory is cleared before the next lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Content {
    /// Cleared between leases: no engine sees another's bytes.
    #[default]
    Zero,
    /// Kept: a restarted engine finds the bytes its previous run wrote.
    Keep,
}

pool_core::choice!(Content, "content policy", {
    Zero => "zero", "clear the pool between leases (no engine sees another's bytes)",
    Keep => "keep", "keep the bytes for the next lease (a restarted engine reuses its KV cache)",
});

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
    /// `tenants`: how many engines may hold a lease of it at once, 1
    /// (the default: one lease at a time) to [`MAX_TENANTS`].
    pub tenants: u32,
    /// `persist`: a directory that outlives processes (a hugetlbfs or tmpfs
    /// mount, e.g. a Kubernetes hostPath) where the pool's files stay, so
    /// that a keeper started again with the same config maps them: its
    /// bytes and index (`content = "keep"` only).
    pub persist: Option<std::path::PathBuf>,
    /// `adopt_within_secs`: how long a keeper that got no pool back from
    /// systemd or a persist directory waits, before it builds one, for a
    /// tenant that lived through the keeper before to hand the pool's files
    /// back (0, the default: it builds at once; `content = "keep"` only).
    pub adopt_within_secs: f64,
    /// The pool (any pool config key).
    pub pool: PoolConfig,
}

/// The keys of a `[[pool]]` table that are the keeper's, not the pool's.
pub const KEEPER_KEYS: [&str; 6] = [
    "name",
    "content",
    "allow_uids",
    "tenants",
    "persist",
    "adopt_within_secs",
];

/// The most engines one kept pool is leased to at once (`tenants`).
pub const MAX_TENANTS: u32 = 64;

/// What `tenants` must be, for its errors.
fn tenants_range() -> String {
    format!(
        "a kept pool is leased to 1 to {MAX_TENANTS} engines at once (`tenants`, --tenants; 1, \
         the default, is one lease at a time)"
    )
}

impl KeptPoolConfig {
    /// Check what a keeper can keep: a named pool that is not itself shared
    /// or leased, that nothing pins or registers (the engine does, in its
    /// own process), whose memory other processes can map.
    ///
    /// # Errors
    /// [`Error::Config`] saying what to change.
    pub fn validate(&self) -> Result<()> {
        pool_core::check_name("kept pool", &self.name)?;
        let n = &self.name;
        let p = &self.pool;
        if !(1..=MAX_TENANTS).contains(&self.tenants) {
            return Err(Error::config(format!(
                "kept pool `{n}`: tenants = {} is out of range: {}",
                self.tenants,
                tenants_range()
            )));
        }
        if p.sharing.is_some() {
            return Err(Error::config(format!(
                "kept pool `{n}` has a `sharing` table: a keeper's pool is shared by leasing it; \
                 drop `sharing` (the engine's ranks give --shared when they attach)"
            )));
        }
        if p.lease.is_some() {
            return Err(Error::config(format!(
                "kept pool `{n}` has a [lease] table: it would lease a keeper's pool itself; drop \
                 `lease` from the keeper's config"
            )));
        }
        if p.pin.kind.is_some() || !p.register.is_empty() {
            return Err(Error::config(format!(
                "kept pool `{n}` asks for pinning or registration: pins and registrations belong \
                 to the process that uses the memory; drop `pin` and `register` here and give \
                 them to the engine (`hostpool alloc --keeper {n} --pin cuda`)"
            )));
        }
        if p.prefault == pool_core::PrefaultChoice::None {
            return Err(Error::config(format!(
                "kept pool `{n}` has prefault = \"none\": a keeper hands engines resident memory \
                 (their leases skip the prefault), and its clearing would allocate pages it never \
                 faulted; drop it (or give auto, populate-write or touch)"
            )));
        }
        if let Some(dir) = &self.persist {
            if !dir.is_absolute() {
                return Err(Error::config(format!(
                    "kept pool `{n}`: persist = {} must be an absolute path (a hugetlbfs or tmpfs \
                     mount that outlives the keeper, e.g. /dev/hugepages/hostpool)",
                    dir.display()
                )));
            }
            if self.content != Content::Keep {
                return Err(Error::config(format!(
                    "kept pool `{n}`: persist = {} keeps the pool's bytes across the keeper's \
                     restarts, and content = \"zero\" clears them: give content = \"keep\", or \
                     drop persist",
                    dir.display()
                )));
            }
        }
        if !(self.adopt_within_secs.is_finite() && (0.0..=3600.0).contains(&self.adopt_within_secs))
        {
            return Err(Error::config(format!(
                "kept pool `{n}`: adopt_within_secs = {} must be a number of seconds from 0 to 3600 \
                 (how long a restarted keeper waits for a tenant to hand its pool back)",
                self.adopt_within_secs
            )));
        }
        if self.adopt_within_secs > 0.0 && self.content != Content::Keep {
            return Err(Error::config(format!(
                "kept pool `{n}`: adopt_within_secs takes the pool's bytes back from a tenant after \
                 the keeper's restart, and content = \"zero\" clears them: give content = \"keep\", \
                 or drop adopt_within_secs"
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
                pool_core::Choice::parse(&s).map_err(|e| Error::config(e.to_string()))?
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
        let tenants = match map.remove("tenants") {
            None => 1,
            // A number out of range is said so by `validate`.
            Some(v) => match v.as_u64().map(u32::try_from) {
                Some(Ok(t)) => t,
                Some(Err(_)) => {
                    return Err(Error::config(format!(
                        "kept pool `{name}`: tenants = {v} is out of range: {}",
                        tenants_range()
                    )));
                }
                None => {
                    return Err(Error::config(format!(
                        "kept pool `{name}`: `tenants` must be a whole number, not {v}: {}",
                        tenants_range()
                    )));
                }
            },
        };
        let persist = match map.remove("persist") {
            None => None,
            Some(Value::String(s)) => Some(std::path::PathBuf::from(s)),
            Some(other) => {
                return Err(Error::config(format!(
                    "kept pool `{name}`: `persist` must be a directory's path, not {other}"
                )));
            }
        };
        let adopt_within_secs = match map.remove("adopt_within_secs") {
            None => 0.0,
            Some(v) => v.as_f64().ok_or_else(|| {
                Error::config(format!(
                    "kept pool `{name}`: `adopt_within_secs` must be a number of seconds, not {v}"
                ))
            })?,
        };
        let pool = PoolConfig::from_value(Value::Object(map)).map_err(|e| {
            Error::config(format!(
                "kept pool `{name}`: {e} (besides the pool's keys, a [[pool]] table has the \
                 keeper's own: {})",
                KEEPER_KEYS.join(", ")
            ))
        })?;
        let kept = KeptPoolConfig {
            name,
            content,
            allow_uids,
            tenants,
            persist,
            adopt_within_secs,
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
    read_settings(path).map(|s| s.pools)
}

/// A keeper's config: its kept pools, and where it serves its metrics.
#[derive(Debug, Clone)]
pub struct Settings {
    /// One per `[[pool]]` table.
    pub pools: Vec<KeptPoolConfig>,
    /// `metrics = "ADDR"` (`--metrics`): where `/metrics` is served.
    pub metrics: Option<metrics::Endpoint>,
}

/// Read a keeper's config file: its `[[pool]]` tables and its `metrics`.
///
/// # Errors
/// As [`read_config`].
pub fn read_settings(path: &Path) -> Result<Settings> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::on_input_path(
            "read",
            path,
            e,
            format!("cannot read keeper config {}", path.display()),
            "check the path given to --config (a TOML file of [[pool]] tables)",
        )
    })?;
    parse_settings(&text).map_err(|e| match e {
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
    parse_settings(text).map(|s| s.pools)
}

/// Parse a keeper's config text (TOML): its pools and its `metrics`.
///
/// # Errors
/// As [`parse_config`]; a `metrics` that is not a loopback address or a
/// unix socket.
pub fn parse_settings(text: &str) -> Result<Settings> {
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
    let metrics = match map.remove("metrics") {
        None => None,
        Some(Value::String(addr)) => Some(metrics::Endpoint::parse(&addr)?),
        Some(other) => {
            return Err(Error::config(format!(
                "`metrics` in a keeper's config is an address such as \"127.0.0.1:9464\" or \
                 \"unix:/run/hostpool/metrics.sock\", not {other}"
            )));
        }
    };
    if let Some(key) = map.keys().next() {
        return Err(Error::config(format!(
            "unknown key `{key}` in a keeper's config: every setting but `metrics` goes in a \
             [[pool]] table"
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
    Ok(Settings { pools, metrics })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keepers_config_says_where_its_metrics_are_served() {
        let s = parse_settings("metrics = \"unix:/run/m.sock\"\n[[pool]]\nname = \"a\"\n").unwrap();
        assert_eq!(
            s.metrics,
            Some(metrics::Endpoint::Unix("/run/m.sock".into()))
        );
        assert_eq!(s.pools.len(), 1);
        let s = parse_settings("[[pool]]\nname = \"a\"\n").unwrap();
        assert_eq!(s.metrics, None);
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
        assert_eq!(
            (pools[0].tenants, pools[1].tenants),
            (1, 1),
            "one by default"
        );
        let two = parse_config("[[pool]]\nname = \"a\"\ntenants = 2\n").unwrap();
        assert_eq!(two[0].tenants, 2);
        let most = parse_config("[[pool]]\nname = \"a\"\ntenants = 64\n").unwrap();
        assert_eq!(most[0].tenants, MAX_TENANTS);
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
            (
                "[[pool]]\nname = \"a\"\nprefault = \"none\"\n",
                "hands engines resident memory",
            ),
            ("[[pool]]\nname = \"a b\"\n", "must be 1 to 64"),
            (
                "[[pool]]\nname = \"a\"\nallow_uids = \"root\"\n",
                "list of user ids",
            ),
            ("[[pool]]\nname = \"a\"\nsizee = 1\n", "unknown key `sizee`"),
            (
                "[[pool]]\nname = \"a\"\ntenants = 0\n",
                "tenants = 0 is out of range: a kept pool is leased to 1 to 64 engines",
            ),
            (
                "[[pool]]\nname = \"a\"\ntenants = 65\n",
                "tenants = 65 is out of range",
            ),
            (
                "[[pool]]\nname = \"a\"\ntenants = 10000000000\n",
                "tenants = 10000000000 is out of range",
            ),
            (
                "[[pool]]\nname = \"a\"\ntenants = -1\n",
                "`tenants` must be a whole number, not -1",
            ),
            (
                "[[pool]]\nname = \"a\"\ntenants = \"2\"\n",
                "`tenants` must be a whole number",
            ),
            (
                "metrics = \"0.0.0.0:9464\"\n[[pool]]\nname = \"a\"\n",
                "is not a loopback address",
            ),
            (
                "metrics = 9464\n[[pool]]\nname = \"a\"\n",
                "`metrics` in a keeper's config",
            ),
            (
                "other = 1\n[[pool]]\nname = \"a\"\n",
                "every setting but `metrics`",
            ),
        ] {
            let e = parse_config(text).unwrap_err();
            assert!(e.is_usage(), "{text}: {e}");
            assert!(e.to_string().contains(says), "{text}: {e}");
        }
    }
}
