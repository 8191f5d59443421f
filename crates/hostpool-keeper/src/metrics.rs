//! The keeper's figures for Prometheus: `hostpool keep --metrics ADDR`
//! serves `/metrics` in the Prometheus text format (0.0.4) on a loopback
//! address or a unix socket.
//!
//! One source for every figure: each scrape asks each kept pool's keeper
//! for its status on the keeper's own socket, as `hostpool keep status`
//! does ([`hostpool_handoff::lease::status_typed`]), and renders that
//! [`KeeperStatus`] ([`render`]) with the `prometheus` crate's encoder. So
//! `/metrics` says what `keep status` says, from the same answer, and a
//! scrape never touches the keeper's state from another thread.
//!
//! Names follow Prometheus' conventions: the `hostpool_` prefix, base units
//! (`_bytes`, `_seconds`), `_total` for counters, and one label `pool` on
//! every series (plus `engine` and `generation` for a tenant's, `how` for lease ends,
//! `state` for the keeper's state, `from` for how the pool came).
//! `docs/operators.md` lists them.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus::{Encoder, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

use hostpool_handoff::lease::{CameBack, KeeperState, KeeperStatus};
use pool_core::{Error, Result};

/// Where `/metrics` is served: `--metrics ADDR` (`metrics = "ADDR"` in a
/// keeper's config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A loopback address and port (`127.0.0.1:9464`, `[::1]:9464`,
    /// `localhost:9464`).
    Tcp(SocketAddr),
    /// A unix stream socket at this path (`unix:/run/hostpool/metrics.sock`).
    Unix(PathBuf),
}

impl Endpoint {
    /// Parse `ADDR`: `unix:PATH` (or an absolute path), or a loopback
    /// `HOST:PORT`.
    ///
    /// # Errors
    /// [`Error::Config`] for anything else, an address that is not loopback
    /// included (the page is for the node's own scraper or an agent beside
    /// it; put a proxy in front to expose it further).
    pub fn parse(text: &str) -> Result<Endpoint> {
        if let Some(path) = text
            .strip_prefix("unix:")
            .or(text.starts_with('/').then_some(text))
        {
            if !path.starts_with('/') {
                return Err(Error::config(format!(
                    "--metrics {text}: a unix socket's path must be absolute (unix:/run/hostpool/metrics.sock)"
                )));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        let addr = match text.strip_prefix("localhost:") {
            Some(port) => port
                .parse::<u16>()
                .ok()
                .map(|p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p)),
            None => text.parse::<SocketAddr>().ok(),
        };
        let Some(addr) = addr else {
            return Err(Error::config(format!(
                "--metrics {text}: not an address: give a loopback HOST:PORT (127.0.0.1:9464, \
                 [::1]:9464) or unix:PATH"
            )));
        };
        if !addr.ip().is_loopback() {
            return Err(Error::config(format!(
                "--metrics {text}: {} is not a loopback address: the keeper serves its metrics on \
                 127.0.0.1, ::1 or a unix socket only (scrape it from the node, or put a proxy in \
                 front)",
                addr.ip()
            )));
        }
        Ok(Endpoint::Tcp(addr))
    }
}

impl Endpoint {
    /// The address as `--metrics` takes it.
    pub fn spec(&self) -> String {
        match self {
            Endpoint::Tcp(a) => a.to_string(),
            Endpoint::Unix(p) => format!("unix:{}", p.display()),
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "http://{a}/metrics"),
            Endpoint::Unix(p) => write!(f, "unix:{} (GET /metrics)", p.display()),
        }
    }
}

/// A bound `/metrics` endpoint; dropping it removes its unix socket's file.
#[derive(Debug)]
pub struct Metrics {
    listener: Listener,
    endpoint: Endpoint,
}

#[derive(Debug)]
enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// How long a scraper may take to send its request, or to take the page.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

impl Metrics {
    /// Bind `endpoint`. A unix socket's path left by a keeper that died is
    /// replaced; one that a live process answers on is refused.
    ///
    /// # Errors
    /// [`Error::Conflict`] when the address is taken; [`Error::Config`] for
    /// a path that is not a socket; [`Error::Plugin`] when `bind` fails (the
    /// path's directory missing, say).
    pub fn bind(endpoint: Endpoint) -> Result<Metrics> {
        let taken = |e: std::io::Error| Error::Conflict {
            path: match &endpoint {
                Endpoint::Tcp(a) => PathBuf::from(a.to_string()),
                Endpoint::Unix(p) => p.clone(),
            },
            message: format!(
                "--metrics {}: the address is taken ({e}): another keeper or program serves \
                 there; give another",
                endpoint.spec()
            ),
        };
        let listener = match &endpoint {
            Endpoint::Tcp(addr) => Listener::Tcp(TcpListener::bind(addr).map_err(taken)?),
            Endpoint::Unix(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    use std::os::unix::fs::FileTypeExt;
                    if !meta.file_type().is_socket() {
                        return Err(Error::config(format!(
                            "--metrics unix:{}: the path exists and is not a socket; give \
                             another path",
                            path.display()
                        )));
                    }
                    if std::os::unix::net::UnixStream::connect(path).is_ok() {
                        return Err(taken(std::io::ErrorKind::AddrInUse.into()));
                    }
                    // A socket nobody answers on: a dead keeper's.
                    let _ = std::fs::remove_file(path);
                }
                Listener::Unix(
                    UnixListener::bind(path).map_err(|e| pool_core::Error::Plugin {
                        what: "keep --metrics".into(),
                        message: format!(
                            "cannot bind unix:{}: check that its directory exists and is \
                             writable",
                            path.display()
                        ),
                        source: Some(Box::new(e)),
                    })?,
                )
            }
        };
        Ok(Metrics { listener, endpoint })
    }

    /// Where it serves.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Serve scrapes of the kept pools `names` until `stop` is set (checked
    /// at least every 200 ms), one connection at a time.
    pub fn serve(&self, names: &[String], stop: &AtomicBool) {
        while !stop.load(Ordering::SeqCst) {
            let ready = match &self.listener {
                Listener::Tcp(l) => readable(l.as_fd()),
                Listener::Unix(l) => readable(l.as_fd()),
            };
            if !ready {
                continue;
            }
            match &self.listener {
                Listener::Tcp(l) => {
                    if let Ok((mut s, _)) = l.accept() {
                        let _ = s.set_read_timeout(Some(CLIENT_TIMEOUT));
                        let _ = s.set_write_timeout(Some(CLIENT_TIMEOUT));
                        answer(&mut s, names);
                    }
                }
                Listener::Unix(l) => {
                    if let Ok((mut s, _)) = l.accept() {
                        let _ = s.set_read_timeout(Some(CLIENT_TIMEOUT));
                        let _ = s.set_write_timeout(Some(CLIENT_TIMEOUT));
                        answer(&mut s, names);
                    }
                }
            }
        }
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        if let Endpoint::Unix(path) = &self.endpoint {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Whether `fd` has a connection to accept within 200 ms.
fn readable(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let timeout = Timespec {
        tv_sec: 0,
        tv_nsec: 200_000_000,
    };
    matches!(poll(&mut fds, Some(&timeout)), Ok(n) if n > 0)
}

/// Read one HTTP request from `s` and answer it: the page for `GET
/// /metrics`, 404 or 405 otherwise.
fn answer(s: &mut (impl Read + Write), names: &[String]) {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&request);
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (status, kind, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET" | "HEAD", "/metrics") => {
            let statuses: Vec<KeeperStatus> = names.iter().filter_map(|n| status_of(n)).collect();
            match render(&statuses) {
                Ok(page) => ("200 OK", TextEncoder::new().format_type().to_string(), page),
                Err(e) => (
                    "500 Internal Server Error",
                    "text/plain".into(),
                    format!("{e}\n"),
                ),
            }
        }
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain".into(),
            "the keeper serves /metrics\n".into(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain".into(),
            "GET /metrics\n".into(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes());
    if method != "HEAD" {
        let _ = s.write_all(body.as_bytes());
    }
    let _ = s.flush();
}

/// The status of kept pool `name` (`None` when its keeper does not answer,
/// it is stopping, say, or says a status this build cannot read; its series
/// are left out of this scrape).
fn status_of(name: &str) -> Option<KeeperStatus> {
    hostpool_handoff::lease::status_typed(name).ok()
}

/// The metrics of the keepers' `statuses` (what `keep status --json`
/// prints), in the Prometheus text format.
///
/// # Errors
/// An encoding failure of the `prometheus` crate (a bad label value).
pub fn render(statuses: &[KeeperStatus]) -> Result<String> {
    let failed = |e: prometheus::Error| Error::Plugin {
        what: "keep --metrics".into(),
        message: "the metrics could not be encoded".into(),
        source: Some(Box::new(e)),
    };
    let registry = Registry::new();
    let gauge = |name: &str, help: &str, labels: &[&str]| -> Result<IntGaugeVec> {
        let g = IntGaugeVec::new(Opts::new(name, help), labels).map_err(failed)?;
        registry.register(Box::new(g.clone())).map_err(failed)?;
        Ok(g)
    };
    let fgauge = |name: &str, help: &str, labels: &[&str]| -> Result<GaugeVec> {
        let g = GaugeVec::new(Opts::new(name, help), labels).map_err(failed)?;
        registry.register(Box::new(g.clone())).map_err(failed)?;
        Ok(g)
    };
    let counter = |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec> {
        let c = IntCounterVec::new(Opts::new(name, help), labels).map_err(failed)?;
        registry.register(Box::new(c.clone())).map_err(failed)?;
        Ok(c)
    };
    let fcounter = |name: &str, help: &str, labels: &[&str]| -> Result<prometheus::CounterVec> {
        let c = prometheus::CounterVec::new(Opts::new(name, help), labels).map_err(failed)?;
        registry.register(Box::new(c.clone())).map_err(failed)?;
        Ok(c)
    };
    let pool = &["pool"];
    // A tenant: its engine and its lease's generation (two engines without
    // an id are two tenants of engine "").
    let per_engine = &["pool", "engine", "generation"];
    let bytes = gauge("hostpool_keeper_pool_bytes", "The kept pool's size.", pool)?;
    let mapped = gauge(
        "hostpool_keeper_pool_mapped_bytes",
        "The kept pool's mapped bytes (its size rounded up to whole pages).",
        pool,
    )?;
    let page = gauge(
        "hostpool_keeper_page_size_bytes",
        "The kept pool's page size.",
        pool,
    )?;
    let info = gauge(
        "hostpool_keeper_pool_info",
        "The kept pool's backing, NUMA node (\"\" when not bound), content (zero or keep) and the \
         keeper's instance; always 1.",
        &["pool", "backing", "numa_node", "content", "instance"],
    )?;
    let pinned = gauge(
        "hostpool_keeper_pool_pinned",
        "1 when the keeper pinned the pool (a keeper never does: each engine pins its mapping).",
        pool,
    )?;
    let came_back = gauge(
        "hostpool_keeper_pool_came_back",
        "1 for how the kept pool came to its keeper (built; fdstore: from systemd's file \
         descriptor store; persist: from its persist directory), 0 for the others.",
        &["pool", "from"],
    )?;
    let came_back_blocks = gauge(
        "hostpool_keeper_pool_came_back_blocks",
        "The blocks the index at the pool's tail recorded when the keeper adopted the pool (a \
         pool that came back with an index only).",
        pool,
    )?;
    let broken = gauge(
        "hostpool_keeper_pool_broken",
        "1 when the kept pool is broken (a file truncated by a holder, a failed clearing): every \
         lease is refused until the keeper restarts.",
        pool,
    )?;
    let state = gauge(
        "hostpool_keeper_state",
        "1 for the keeper's state (idle, leased, clearing, broken, stopping), 0 for the others.",
        &["pool", "state"],
    )?;
    let tenants = gauge(
        "hostpool_keeper_tenants",
        "Engines holding a lease of the kept pool now.",
        pool,
    )?;
    let max_tenants = gauge(
        "hostpool_keeper_max_tenants",
        "The most engines that may hold a lease at once (--tenants).",
        pool,
    )?;
    let waiting = gauge(
        "hostpool_keeper_waiting_attaches",
        "Attaches waiting for the pool to be cleared.",
        pool,
    )?;
    let ranks = gauge(
        "hostpool_keeper_lease_ranks",
        "The ranks of a tenant's lease attached now.",
        per_engine,
    )?;
    let companions = gauge(
        "hostpool_keeper_lease_companions",
        "The companions (vLLM's scheduler, say) of a tenant's lease attached now.",
        per_engine,
    )?;
    let leases = counter(
        "hostpool_keeper_leases_total",
        "Leases granted since the keeper started (its generation).",
        pool,
    )?;
    let ends = counter(
        "hostpool_keeper_lease_ends_total",
        "Leases that ended since the keeper started, by how: closed (every process released) or \
         died.",
        &["pool", "how"],
    )?;
    let clears = counter(
        "hostpool_keeper_clears_total",
        "Clearings of the pool between leases (content = zero) that finished.",
        pool,
    )?;
    let clear_seconds = fcounter(
        "hostpool_keeper_clear_seconds_total",
        "Seconds spent clearing the pool between leases.",
        pool,
    )?;
    let last_clear = fgauge(
        "hostpool_keeper_last_clear_seconds",
        "Seconds the last clearing took.",
        pool,
    )?;
    let slots = gauge(
        "hostpool_index_slots",
        "The slots of the index at the pool's tail.",
        pool,
    )?;
    let records = gauge(
        "hostpool_index_records",
        "The blocks the index records now.",
        pool,
    )?;
    let stored = counter(
        "hostpool_tier_stored_blocks_total",
        "Blocks stored in the CPU tier by every tenant since the keeper started.",
        pool,
    )?;
    let hits = counter(
        "hostpool_tier_hits_total",
        "Blocks read from the CPU tier by every tenant since the keeper started.",
        pool,
    )?;
    let from_others = counter(
        "hostpool_tier_hits_from_others_total",
        "Of those, blocks a tenant read that another tenant (or an earlier lease) stored.",
        pool,
    )?;
    let opens = counter(
        "hostpool_tier_opens_total",
        "Opens of the CPU tier by a tenant, by how it started: warm (its blocks found: a restore) \
         or cold.",
        &["pool", "start"],
    )?;
    let t_stored = counter(
        "hostpool_tier_tenant_stored_blocks_total",
        "Blocks a tenant stored in the CPU tier during its lease.",
        per_engine,
    )?;
    let t_hits = counter(
        "hostpool_tier_tenant_hits_total",
        "Blocks a tenant read from the CPU tier during its lease.",
        per_engine,
    )?;
    let t_from_others = counter(
        "hostpool_tier_tenant_hits_from_others_total",
        "Of those, blocks another tenant (or an earlier lease) stored.",
        per_engine,
    )?;
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    for s in statuses {
        let name = s.name.as_str();
        bytes.with_label_values(&[name]).set(int(s.size));
        mapped.with_label_values(&[name]).set(int(s.mapped));
        page.with_label_values(&[name]).set(int(s.page_size));
        let numa = s.numa_node.map(|n| n.to_string()).unwrap_or_default();
        info.with_label_values(&[name, &s.backing, &numa, &s.content, &s.instance])
            .set(1);
        pinned.with_label_values(&[name]).set(i64::from(s.pinned));
        for from in CameBack::ALL {
            came_back
                .with_label_values(&[name, from.name()])
                .set(i64::from(from == s.came_back));
        }
        if let Some(blocks) = s.came_back_blocks {
            came_back_blocks.with_label_values(&[name]).set(int(blocks));
        }
        broken
            .with_label_values(&[name])
            .set(i64::from(s.broken.is_some()));
        for st in KeeperState::ALL {
            state
                .with_label_values(&[name, st.name()])
                .set(i64::from(st == s.state));
        }
        tenants
            .with_label_values(&[name])
            .set(int(s.tenants.len() as u64));
        max_tenants
            .with_label_values(&[name])
            .set(i64::from(s.max_tenants.max(1)));
        waiting.with_label_values(&[name]).set(int(s.waiting));
        for t in &s.tenants {
            let lease = t.generation.to_string();
            let l = [name, t.engine.as_str(), lease.as_str()];
            ranks.with_label_values(&l).set(int(t.ranks.len() as u64));
            companions
                .with_label_values(&l)
                .set(int(t.companions.len() as u64));
            t_stored.with_label_values(&l).inc_by(t.stored);
            t_hits.with_label_values(&l).inc_by(t.hits);
            t_from_others
                .with_label_values(&l)
                .inc_by(t.hits_from_others);
        }
        leases.with_label_values(&[name]).inc_by(s.generation);
        for (how, n) in [("closed", s.lease_ends.closed), ("died", s.lease_ends.died)] {
            ends.with_label_values(&[name, how]).inc_by(n);
        }
        clears.with_label_values(&[name]).inc_by(s.clears);
        clear_seconds
            .with_label_values(&[name])
            .inc_by(if s.clear_seconds_total.is_finite() {
                s.clear_seconds_total.max(0.0)
            } else {
                0.0
            });
        if let Some(secs) = s.last_clear_seconds {
            last_clear.with_label_values(&[name]).set(secs);
        }
        if let Some(index) = &s.index {
            slots.with_label_values(&[name]).set(int(index.slots));
            records.with_label_values(&[name]).set(int(index.records));
        }
        stored.with_label_values(&[name]).inc_by(s.tier.stored);
        hits.with_label_values(&[name]).inc_by(s.tier.hits);
        from_others
            .with_label_values(&[name])
            .inc_by(s.tier.hits_from_others);
        for (start, n) in [("warm", s.tier.opens.warm), ("cold", s.tier.opens.cold)] {
            opens.with_label_values(&[name, start]).inc_by(n);
        }
    }
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut out)
        .map_err(failed)?;
    String::from_utf8(out).map_err(|e| Error::Plugin {
        what: "keep --metrics".into(),
        message: "the metrics are not UTF-8".into(),
        source: Some(Box::new(e)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_address_is_loopback_or_a_unix_socket() {
        assert_eq!(
            Endpoint::parse("127.0.0.1:9464").unwrap(),
            Endpoint::Tcp("127.0.0.1:9464".parse().unwrap())
        );
        assert_eq!(
            Endpoint::parse("localhost:1").unwrap(),
            Endpoint::Tcp("127.0.0.1:1".parse().unwrap())
        );
        assert!(matches!(
            Endpoint::parse("[::1]:9").unwrap(),
            Endpoint::Tcp(_)
        ));
        assert_eq!(
            Endpoint::parse("unix:/run/m.sock").unwrap(),
            Endpoint::Unix("/run/m.sock".into())
        );
        assert_eq!(
            Endpoint::parse("/run/m.sock").unwrap(),
            Endpoint::Unix("/run/m.sock".into())
        );
        for (bad, says) in [
            ("0.0.0.0:9464", "is not a loopback address"),
            ("10.1.2.3:80", "is not a loopback address"),
            ("nohost", "not an address"),
            ("unix:relative", "must be absolute"),
        ] {
            let e = Endpoint::parse(bad).unwrap_err();
            assert!(matches!(e, Error::Config { .. }), "{e:?}");
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
    }

    /// A keeper's status, as it sends it, with `fields` set.
    fn status(fields: serde_json::Value) -> KeeperStatus {
        let mut v = json!({
            "name": "kv0", "socket": "@hostpool-keep.kv0", "pid": 10, "uid": 0,
            "instance": "abc", "protocol": hostpool_handoff::PROTOCOL,
            "started_at": "2025-01-01T00:00:00Z", "state": "idle", "broken": null,
            "backing": "anon", "size": 1024, "mapped": 4096, "page_size": 4096,
            "numa_node": null, "numa": null, "content": "keep", "allow_uids": [],
            "generation": 0, "lease": null, "tenants": [], "max_tenants": 1, "waiting": 0,
            "previous": null, "tag": null, "last_clear_seconds": null, "index": null,
        });
        for (k, f) in fields.as_object().unwrap() {
            v[k] = f.clone();
        }
        KeeperStatus::from_value("kv0", v, None).unwrap()
    }

    /// Every figure of a status is a series, counters end in `_total`,
    /// and a pool without tenants or an index has none of theirs.
    #[test]
    fn a_status_renders_as_series_of_the_pool() {
        let rank = json!({"rank": 0, "pid": 1, "uid": 0});
        let leased = status(json!({
            "numa_node": 1, "state": "leased", "max_tenants": 2, "generation": 5,
            "tenants": [{"engine": "a", "pids": [1, 2, 3], "ranks": [rank, rank],
                          "companions": [{"pid": 3, "uid": 0}], "world": 2,
                          "since": "2025-01-01T00:00:01Z", "generation": 5, "live": true,
                          "tag": null, "stored": 3, "hits": 2, "hits_from_others": 1}],
            "lease_ends": {"closed": 3, "died": 1}, "clears": 2, "clear_seconds_total": 0.5,
            "last_clear_seconds": 0.25,
            "index": {"slots": 8, "records": 3, "digest": "d", "model": null},
            "tier": {"stored": 7, "hits": 4, "hits_from_others": 2, "opens": {"warm": 3, "cold": 1}},
            "came_back": "persist", "came_back_blocks": 3,
        }));
        let page = render(&[leased]).unwrap();
        for line in [
            "hostpool_keeper_pool_bytes{pool=\"kv0\"} 1024",
            "hostpool_keeper_page_size_bytes{pool=\"kv0\"} 4096",
            "hostpool_keeper_pool_info{backing=\"anon\",content=\"keep\",instance=\"abc\",numa_node=\"1\",pool=\"kv0\"} 1",
            "hostpool_keeper_pool_pinned{pool=\"kv0\"} 0",
            "hostpool_keeper_pool_came_back{from=\"persist\",pool=\"kv0\"} 1",
            "hostpool_keeper_pool_came_back{from=\"built\",pool=\"kv0\"} 0",
            "hostpool_keeper_pool_came_back{from=\"fdstore\",pool=\"kv0\"} 0",
            "hostpool_keeper_pool_came_back_blocks{pool=\"kv0\"} 3",
            "hostpool_keeper_state{pool=\"kv0\",state=\"leased\"} 1",
            "hostpool_keeper_state{pool=\"kv0\",state=\"idle\"} 0",
            "hostpool_keeper_pool_broken{pool=\"kv0\"} 0",
            "hostpool_keeper_tenants{pool=\"kv0\"} 1",
            "hostpool_keeper_max_tenants{pool=\"kv0\"} 2",
            "hostpool_keeper_lease_ranks{engine=\"a\",generation=\"5\",pool=\"kv0\"} 2",
            "hostpool_keeper_lease_companions{engine=\"a\",generation=\"5\",pool=\"kv0\"} 1",
            "hostpool_keeper_leases_total{pool=\"kv0\"} 5",
            "hostpool_keeper_lease_ends_total{how=\"died\",pool=\"kv0\"} 1",
            "hostpool_keeper_clear_seconds_total{pool=\"kv0\"} 0.5",
            "hostpool_keeper_last_clear_seconds{pool=\"kv0\"} 0.25",
            "hostpool_index_records{pool=\"kv0\"} 3",
            "hostpool_tier_hits_from_others_total{pool=\"kv0\"} 2",
            "hostpool_tier_tenant_stored_blocks_total{engine=\"a\",generation=\"5\",pool=\"kv0\"} 3",
            "# TYPE hostpool_keeper_clears_total counter",
            "hostpool_tier_opens_total{pool=\"kv0\",start=\"warm\"} 3",
        ] {
            assert!(page.lines().any(|l| l == line), "missing {line}:\n{page}");
        }
        let empty = render(&[status(json!({"name": "kv1"}))]).unwrap();
        assert!(!empty.contains("hostpool_index_records{"), "{empty}");
        assert!(!empty.contains("engine="), "{empty}");
        assert!(
            !empty.contains("hostpool_keeper_pool_came_back_blocks{"),
            "built: no blocks came back\n{empty}"
        );
        assert!(
            empty
                .lines()
                .any(|l| l == "hostpool_keeper_pool_came_back{from=\"built\",pool=\"kv1\"} 1"),
            "{empty}"
        );
    }
}
