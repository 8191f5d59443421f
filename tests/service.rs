//! The keeper as a node service (issue 42): `/metrics` read by a Prometheus
//! text-format parser and checked against `keep status` through leases, a
//! tenant's death and a clear; systemd's READY and STOPPING received on a
//! datagram socket the test creates as `NOTIFY_SOCKET`; bad and taken
//! addresses refused before anything is built.

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::process::Child;
use std::time::Duration;

use serde_json::Value;
use support::TempDir;
use support::procs::{
    Children, HostpoolCommand, assert_usage_error, bin, exits_with, kill_and_reap, name,
    read_json_line, read_report, signal, until,
};

/// A keeper of an 8 MiB pool `pool` (`--tenants 2`, content zero), with
/// `args`; its ready line.
fn keeper(pool: &str, args: &[&str]) -> (Children, Value) {
    let mut k = Children(vec![
        bin()
            .args(["keep", "--name", pool, "--json", "--size", "8MiB"])
            .args(["--backing", "shm-segmented", "--tenants", "2"])
            .args(args)
            .spawn_piped(),
    ]);
    let ready = read_json_line(&mut k[0]);
    assert_eq!(ready["name"], pool, "{ready}");
    (k, ready)
}

/// An engine holding a lease of `pool` (`alloc --keeper --hold`), once it does.
fn engine(pool: &str) -> Child {
    let mut e = bin()
        .args(["alloc", "--keeper", pool, "--hold", "--json"])
        .spawn_piped();
    read_report(&mut e);
    e
}

fn status(pool: &str) -> Value {
    bin()
        .args(["keep", "status", "--name", pool, "--json"])
        .succeeds()[0]
        .clone()
}

/// `GET /metrics` on the unix socket `path`: the status line, the content
/// type and the body.
fn scrape(path: &std::path::Path, request: &str) -> (String, String, String) {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or("").to_string();
    let kind = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Type: "))
        .unwrap_or("")
        .to_string();
    (status, kind, body.to_string())
}

/// Every sample of the page, parsed by `prometheus-parse`: `name{labels}`
/// (labels sorted) to value, and each metric's type.
fn samples(page: &str) -> (BTreeMap<String, f64>, BTreeMap<String, String>) {
    let lines = page.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("a Prometheus text page");
    let mut out = BTreeMap::new();
    for s in &scrape.samples {
        let mut labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        let value = match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        };
        out.insert(format!("{}{{{}}}", s.metric, labels.join(",")), value);
    }
    // The parser keeps no types: the page's own `# TYPE` lines say them.
    let kinds = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    (out, kinds)
}

/// The page's value of `metric` with `labels` (`k=v`, sorted), 0 when the
/// series is absent.
fn value(s: &BTreeMap<String, f64>, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let mut l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    l.sort();
    s.get(&format!("{metric}{{{}}}", l.join(",")))
        .copied()
        .unwrap_or(0.0)
}

/// The page's figures are the status's: every one `keep status --json`
/// has, for pool `pool`.
#[track_caller]
fn assert_page_is_status(page: &BTreeMap<String, f64>, st: &Value, pool: &str) {
    let p = [("pool", pool)];
    let n = |v: &Value| v.as_f64().unwrap_or(0.0);
    assert_eq!(
        value(page, "hostpool_keeper_pool_bytes", &p),
        n(&st["size"])
    );
    assert_eq!(
        value(page, "hostpool_keeper_pool_mapped_bytes", &p),
        n(&st["mapped"])
    );
    assert_eq!(
        value(page, "hostpool_keeper_page_size_bytes", &p),
        n(&st["page_size"])
    );
    let state = st["state"].as_str().unwrap();
    assert_eq!(
        value(
            page,
            "hostpool_keeper_state",
            &[("pool", pool), ("state", state)]
        ),
        1.0,
        "{state}"
    );
    assert_eq!(
        value(page, "hostpool_keeper_pool_broken", &p),
        f64::from(u8::from(!st["broken"].is_null()))
    );
    // A keeper never pins (each engine pins its own mapping): the status
    // says so, and the page says the status.
    assert_eq!(st["pinned"], false, "{st}");
    assert_eq!(value(page, "hostpool_keeper_pool_pinned", &p), 0.0);
    let came_back = st["came_back"].as_str().unwrap();
    for from in ["built", "fdstore", "persist"] {
        assert_eq!(
            value(
                page,
                "hostpool_keeper_pool_came_back",
                &[("pool", pool), ("from", from)]
            ),
            f64::from(u8::from(from == came_back)),
            "{from}: {st}"
        );
    }
    let blocks = page
        .get(&format!(
            "hostpool_keeper_pool_came_back_blocks{{pool={pool}}}"
        ))
        .copied();
    assert_eq!(blocks, st["came_back_blocks"].as_f64(), "{st}");
    let tenants = st["tenants"].as_array().unwrap();
    assert_eq!(
        value(page, "hostpool_keeper_tenants", &p),
        tenants.len() as f64
    );
    assert_eq!(
        value(page, "hostpool_keeper_max_tenants", &p),
        n(&st["max_tenants"])
    );
    for t in tenants {
        let generation = t["generation"].to_string();
        let engine = t["engine"].as_str().unwrap();
        let l = [
            ("pool", pool),
            ("engine", engine),
            ("generation", &generation),
        ];
        assert_eq!(
            value(page, "hostpool_keeper_lease_ranks", &l),
            t["ranks"].as_array().unwrap().len() as f64
        );
        assert_eq!(
            value(page, "hostpool_tier_tenant_stored_blocks_total", &l),
            n(&t["stored"])
        );
    }
    assert_eq!(
        value(page, "hostpool_keeper_leases_total", &p),
        n(&st["generation"])
    );
    for how in ["closed", "died"] {
        assert_eq!(
            value(
                page,
                "hostpool_keeper_lease_ends_total",
                &[("pool", pool), ("how", how)]
            ),
            n(&st["lease_ends"][how]),
            "{how}"
        );
    }
    assert_eq!(
        value(page, "hostpool_keeper_clears_total", &p),
        n(&st["clears"])
    );
    assert!(
        (value(page, "hostpool_keeper_clear_seconds_total", &p) - n(&st["clear_seconds_total"]))
            .abs()
            < 1e-9
    );
    assert_eq!(
        value(page, "hostpool_keeper_waiting_attaches", &p),
        n(&st["waiting"])
    );
}

/// A scrape, parsed, and the status just after it (nothing changes between
/// the two: no engine comes or goes meanwhile).
fn scrape_and_status(sock: &std::path::Path, pool: &str) -> BTreeMap<String, f64> {
    let (line, kind, body) = scrape(sock, "GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n");
    assert_eq!(line, "HTTP/1.1 200 OK", "{body}");
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    let (page, kinds) = samples(&body);
    for (metric, kind) in &kinds {
        assert_eq!(
            metric.ends_with("_total"),
            kind == "counter",
            "{metric} is a {kind}: counters, and only they, end in _total"
        );
        assert!(metric.starts_with("hostpool_"), "{metric}");
    }
    assert_page_is_status(&page, &status(pool), pool);
    page
}

#[test]
fn the_metrics_page_says_what_keep_status_says_through_leases_a_death_and_a_clear() {
    let dir = TempDir::new("metrics");
    let sock = dir.0.join("metrics.sock");
    let pool = name("metrics");
    let metrics = format!("unix:{}", sock.display());
    let (mut k, _) = keeper(&pool, &["--metrics", &metrics]);
    let page = scrape_and_status(&sock, &pool);
    assert_eq!(
        value(&page, "hostpool_keeper_tenants", &[("pool", &pool)]),
        0.0
    );
    let built = [("pool", pool.as_str()), ("from", "built")];
    assert_eq!(value(&page, "hostpool_keeper_pool_came_back", &built), 1.0);

    // Two tenants hold leases.
    let mut a = Children(vec![engine(&pool)]);
    let mut b = engine(&pool);
    let page = scrape_and_status(&sock, &pool);
    assert_eq!(
        value(&page, "hostpool_keeper_tenants", &[("pool", &pool)]),
        2.0
    );
    assert_eq!(
        value(&page, "hostpool_keeper_leases_total", &[("pool", &pool)]),
        2.0
    );

    // One dies: its lease ends alone.
    kill_and_reap(&mut b);
    until(
        30,
        || status(&pool)["tenants"].as_array().unwrap().len() == 1,
        || format!("{}", status(&pool)),
    );
    let page = scrape_and_status(&sock, &pool);
    let died = [("pool", pool.as_str()), ("how", "died")];
    assert_eq!(value(&page, "hostpool_keeper_lease_ends_total", &died), 1.0);

    // The other releases: the last lease's end clears the pool.
    signal(&a[0], libc::SIGTERM);
    exits_with(&mut a[0], 0, Duration::from_secs(30), "the engine");
    until(
        30,
        || status(&pool)["clears"] == 1 && status(&pool)["state"] == "idle",
        || format!("{}", status(&pool)),
    );
    let page = scrape_and_status(&sock, &pool);
    let closed = [("pool", pool.as_str()), ("how", "closed")];
    assert_eq!(
        value(&page, "hostpool_keeper_lease_ends_total", &closed),
        1.0
    );
    assert_eq!(
        value(&page, "hostpool_keeper_clears_total", &[("pool", &pool)]),
        1.0
    );
    assert!(
        value(
            &page,
            "hostpool_keeper_clear_seconds_total",
            &[("pool", &pool)]
        ) > 0.0
    );

    // Another path is not found; another method is not allowed.
    assert_eq!(
        scrape(&sock, "GET / HTTP/1.1\r\n\r\n").0,
        "HTTP/1.1 404 Not Found"
    );
    assert_eq!(
        scrape(&sock, "POST /metrics HTTP/1.1\r\n\r\n").0,
        "HTTP/1.1 405 Method Not Allowed"
    );

    // The keeper's end takes its socket's file with it.
    signal(&k[0], libc::SIGTERM);
    exits_with(&mut k[0], 0, Duration::from_secs(30), "the keeper");
    assert!(!sock.exists(), "the metrics socket was left behind");
}

#[test]
fn a_loopback_port_serves_the_same_page() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pool = name("metrics-tcp");
    let addr = format!("127.0.0.1:{port}");
    let (mut k, _) = keeper(&pool, &["--metrics", &addr]);
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1;
    let (page, _) = samples(body);
    assert_page_is_status(&page, &status(&pool), &pool);
    signal(&k[0], libc::SIGTERM);
    exits_with(&mut k[0], 0, Duration::from_secs(30), "the keeper");
}

#[test]
fn bad_or_taken_metrics_addresses_are_refused_before_anything_is_built() {
    for (addr, says) in [
        ("0.0.0.0:9464", "is not a loopback address"),
        ("nohost", "not an address"),
        ("unix:relative", "must be absolute"),
    ] {
        assert_usage_error(
            bin().args([
                "keep",
                "--name",
                &name("bad"),
                "--size",
                "8MiB",
                "--metrics",
                addr,
            ]),
            says,
        );
    }
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = bin()
        .args(["keep", "--name", &name("taken"), "--size", "8MiB", "--json"])
        .args(["--backing", "shm-segmented", "--metrics", &addr])
        .output()
        .unwrap();
    let err = support::procs::fails(&out, 1);
    assert!(
        err.contains(&format!("--metrics {addr}: the address is taken")),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "no pool was said to be ready");
}

#[test]
fn systemd_hears_ready_once_the_pool_is_served_and_stopping_when_it_drains() {
    let dir = TempDir::new("notify");
    let path = dir.0.join("notify.sock");
    let systemd = UnixDatagram::bind(&path).unwrap();
    systemd
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let pool = name("notify");
    let mut k = Children(vec![
        bin()
            .args(["keep", "--name", &pool, "--json", "--size", "8MiB"])
            .args(["--backing", "shm-segmented"])
            .env("NOTIFY_SOCKET", &path)
            .spawn_piped(),
    ]);
    let mut buf = [0u8; 512];
    // The pool's files come first, stored with systemd (FDSTORE=1, one
    // message a file), then READY=1.
    let mut stored = 0;
    let said = loop {
        let n = systemd.recv(&mut buf).expect("READY within 60 s");
        let said = String::from_utf8_lossy(&buf[..n]).into_owned();
        if !said.starts_with("FDSTORE=1\n") {
            break said;
        }
        assert!(said.contains(&format!("FDNAME=hostpool.{pool}.")), "{said}");
        stored += 1;
    };
    assert!(stored > 0, "the pool's files are stored before READY");
    assert!(said.starts_with("READY=1\n"), "{said}");
    assert!(said.contains(&format!("STATUS=keeping `{pool}`")), "{said}");
    // Ready means served: a lease is granted at once.
    let ready = read_json_line(&mut k[0]);
    assert_eq!(ready["name"], pool.as_str());
    let mut e = engine(&pool);
    signal(&k[0], libc::SIGTERM);
    let n = systemd.recv(&mut buf).expect("STOPPING within 60 s");
    let said = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(said.starts_with("STOPPING=1\n"), "{said}");
    // Draining: the lease in force ends, then the keeper.
    signal(&e, libc::SIGTERM);
    exits_with(&mut e, 0, Duration::from_secs(30), "the engine");
    exits_with(&mut k[0], 0, Duration::from_secs(60), "the keeper");
}
