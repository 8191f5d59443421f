//! The pool lifecycle with plugins submitted from outside pool-core: a
//! recording pinner and two recording registrars, registered through
//! `inventory` exactly as an out-of-tree plugin would be (and an adapter,
//! whose table a plan checks).
//!
//! Proves: build order (map, prefault, pin, register), teardown in reverse
//! (deregister last-first, unpin, then unmap, each while the memory is still
//! mapped), best-effort vs required pinning, rollback of a failed build, and
//! that teardown carries on past a step it cannot undo.

use std::sync::Mutex;

use pool_core::plugin::PinContext;
use pool_core::plugin::{AdapterPlugin, DoctorContext, Finding};
use pool_core::plugin::{Pin, Pinner, PinnerPlugin, Registrar, RegistrarPlugin, Registration};
use pool_core::{
    ByteSize, Error, PinStatus, Pool, PoolConfig, PoolPlan, Quiet, Region, Result, Span,
    TeardownIssue,
};
use serde::Deserialize;
use serde_json::{Value, json};

// Link the facade (and with it the built-in plugins) into this test binary.
use hostpool as _;

static EVENTS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

fn record(tag: &str, event: String) {
    EVENTS.lock().unwrap().push((tag.to_string(), event));
}

fn events(tag: &str) -> Vec<String> {
    EVENTS
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, _)| t == tag)
        .map(|(_, e)| e.clone())
        .collect()
}

/// Whether the span's first page is mapped now, from /proc/self/maps.
fn mapped(span: Span) -> &'static str {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let inside = maps.lines().any(|line| {
        let range = line.split_whitespace().next().unwrap_or("");
        let (lo, hi) = range.split_once('-').unwrap_or(("0", "0"));
        let lo = usize::from_str_radix(lo, 16).unwrap_or(0);
        let hi = usize::from_str_radix(hi, 16).unwrap_or(0);
        lo <= span.addr && span.addr < hi
    });
    if inside { "mapped" } else { "UNMAPPED" }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Opts {
    tag: String,
    #[serde(default)]
    fail: Option<String>,
    #[serde(default)]
    fail_release: bool,
}

#[derive(Debug)]
struct Recorder {
    name: &'static str,
    opts: Opts,
}

#[derive(Debug)]
struct Held {
    name: &'static str,
    opts: Opts,
    span: Span,
}

impl Recorder {
    fn start(&self, region: Region<'_>) -> Result<Held> {
        record(
            &self.opts.tag,
            format!("{} {}", self.name, mapped(region.span())),
        );
        match self.opts.fail.as_deref() {
            Some("unavailable") => Err(Error::NotAvailable {
                what: self.name.into(),
                reason: "no such device on this host".into(),
            }),
            Some(msg) => Err(Error::Plugin {
                what: self.name.into(),
                message: msg.into(),
                source: None,
            }),
            None => Ok(Held {
                name: self.name,
                opts: self.opts.clone(),
                span: region.span(),
            }),
        }
    }
}

impl Held {
    fn release(self) -> Vec<TeardownIssue> {
        record(
            &self.opts.tag,
            format!("release {} {}", self.name, mapped(self.span)),
        );
        if self.opts.fail_release {
            vec![TeardownIssue::log(self.name, "device refused to let go")]
        } else {
            Vec::new()
        }
    }
}

impl Pinner for Recorder {
    fn name(&self) -> &'static str {
        self.name
    }
    fn pin(&self, region: Region<'_>, _: &PinContext) -> Result<Box<dyn Pin>> {
        Ok(Box::new(self.start(region)?))
    }
}

impl Registrar for Recorder {
    fn name(&self) -> &'static str {
        self.name
    }
    fn register(&self, region: Region<'_>, _: &PinContext) -> Result<Box<dyn Registration>> {
        Ok(Box::new(self.start(region)?))
    }
}

impl Pin for Held {
    fn details(&self) -> Value {
        json!({"by": self.name})
    }
    fn unpin(self: Box<Self>) -> Vec<TeardownIssue> {
        self.release()
    }
}

impl Registration for Held {
    fn details(&self) -> Value {
        json!({"by": self.name, "len": self.span.len})
    }
    fn deregister(self: Box<Self>) -> Vec<TeardownIssue> {
        self.release()
    }
}

fn recorder<T: ?Sized>(
    name: &'static str,
    table: Option<&Value>,
    wrap: fn(Recorder) -> Box<T>,
) -> Result<Box<T>> {
    let opts: Opts = pool_core::plugin::parse_table(name, table)?;
    Ok(wrap(Recorder { name, opts }))
}

inventory::submit! {
    PinnerPlugin::new("test-pin", "records calls", "tests/plugins.rs",
        |t| recorder("test-pin", t, |r| Box::new(r) as Box<dyn Pinner>))
}
inventory::submit! {
    RegistrarPlugin::new("test-reg-a", "records calls", "tests/plugins.rs",
        |t| recorder("test-reg-a", t, |r| Box::new(r) as Box<dyn Registrar>))
}
inventory::submit! {
    RegistrarPlugin::new("test-reg-b", "records calls", "tests/plugins.rs",
        |t| recorder("test-reg-b", t, |r| Box::new(r) as Box<dyn Registrar>))
}

fn config(tag: &str, pin: Option<Value>, reg_a: Option<Value>, reg_b: Option<Value>) -> PoolConfig {
    let mut c = PoolConfig {
        size: ByteSize::mib(8),
        backing: "anon".into(),
        ..PoolConfig::default()
    };
    let mut table = |name: &str, extra: Option<Value>| {
        let mut t = json!({"tag": tag});
        if let Some(Value::Object(m)) = extra {
            t.as_object_mut().unwrap().extend(m);
        }
        c.plugins.insert(name.into(), t);
    };
    if let Some(p) = pin {
        table("test-pin", Some(p));
    }
    if let Some(a) = reg_a {
        table("test-reg-a", Some(a));
    }
    if let Some(b) = reg_b {
        table("test-reg-b", Some(b));
    }
    if c.plugins.contains_key("test-pin") {
        c.pin.kind = Some("test-pin".into());
    }
    for r in ["test-reg-a", "test-reg-b"] {
        if c.plugins.contains_key(r) {
            c.register.push(r.into());
        }
    }
    c
}

#[test]
fn teardown_deregisters_last_first_then_unpins_then_unmaps() {
    let c = config("order", Some(json!({})), Some(json!({})), Some(json!({})));
    let pool = Pool::build(&PoolPlan::new(c).unwrap(), &Quiet).unwrap();
    let r = pool.report().clone();
    assert_eq!(r.pin.status, PinStatus::Pinned);
    assert_eq!(r.pin.details, json!({"by": "test-pin"}));
    assert_eq!(r.registrations.len(), 2);
    assert_eq!(r.registrations[1].kind, "test-reg-b");
    assert_eq!(r.registrations[1].details["len"], json!(8 << 20));
    assert!(r.phases.pin.is_some() && r.phases.register.is_some());
    let done = pool.teardown();
    assert!(done.teardown_issues.is_empty());
    assert_eq!(
        events("order"),
        [
            "test-pin mapped",
            "test-reg-a mapped",
            "test-reg-b mapped",
            "release test-reg-b mapped",
            "release test-reg-a mapped",
            "release test-pin mapped",
        ]
    );
}

#[test]
fn best_effort_pin_that_is_unavailable_is_skipped_with_the_reason() {
    let c = config("skip", Some(json!({"fail": "unavailable"})), None, None);
    let pool = Pool::build(&PoolPlan::new(c).unwrap(), &Quiet).unwrap();
    let r = pool.report();
    assert_eq!(r.pin.status, PinStatus::Skipped);
    let reason = r.pin.reason.clone().unwrap();
    assert!(
        reason.contains("not available on this host") && reason.contains("no such device"),
        "{reason}"
    );
    drop(pool);
    assert_eq!(
        events("skip"),
        ["test-pin mapped"],
        "a skipped pin must not be released"
    );
}

#[test]
fn required_pin_that_fails_fails_the_build_and_releases_the_mapping() {
    let mut c = config(
        "required",
        Some(json!({"fail": "driver said no"})),
        None,
        None,
    );
    c.pin.required = true;
    let e = Pool::build(&PoolPlan::new(c).unwrap(), &Quiet).unwrap_err();
    assert!(e.to_string().contains("driver said no"), "{e}");
    assert_eq!(e.exit_code(), 1);
    assert_eq!(events("required"), ["test-pin mapped"]);
}

#[test]
fn a_failed_registration_rolls_back_earlier_ones_and_the_pin_in_reverse() {
    let c = config(
        "rollback",
        Some(json!({})),
        Some(json!({})),
        Some(json!({"fail": "mr refused"})),
    );
    let e = Pool::build(&PoolPlan::new(c).unwrap(), &Quiet).unwrap_err();
    assert!(e.to_string().contains("mr refused"), "{e}");
    assert_eq!(
        events("rollback"),
        [
            "test-pin mapped",
            "test-reg-a mapped",
            "test-reg-b mapped",
            "release test-reg-a mapped",
            "release test-pin mapped",
        ]
    );
}

#[test]
fn teardown_carries_on_past_a_step_it_cannot_undo_and_reports_it() {
    let c = config(
        "stuck",
        Some(json!({})),
        Some(json!({"fail_release": true})),
        None,
    );
    let pool = Pool::build(&PoolPlan::new(c).unwrap(), &Quiet).unwrap();
    let r = pool.teardown();
    assert_eq!(r.teardown_issues.len(), 1);
    assert!(r.teardown_issues[0].detail.contains("refused to let go"));
    assert_eq!(
        events("stuck"),
        [
            "test-pin mapped",
            "test-reg-a mapped",
            "release test-reg-a mapped",
            "release test-pin mapped"
        ]
    );
}

#[test]
fn a_bad_key_in_a_plugin_table_is_rejected_by_that_plugin() {
    let mut c = config("badkey", Some(json!({})), None, None);
    c.plugins.get_mut("test-pin").unwrap()["colour"] = json!("red");
    let e = PoolPlan::new(c).unwrap_err();
    assert!(
        e.to_string().contains("[test-pin]") && e.to_string().contains("colour"),
        "{e}"
    );
    assert_eq!(e.exit_code(), 2);
}

#[test]
fn unknown_pinner_names_the_available_ones_sorted() {
    let mut c = config("unknown", None, None, None);
    c.pin.kind = Some("cudaa".into());
    let e = PoolPlan::new(c).unwrap_err();
    assert!(e.to_string().contains("unknown pinner `cudaa`"), "{e}");
    assert!(
        e.to_string().contains("available: ") && e.to_string().contains("test-pin"),
        "{e}"
    );
}

// ------------------------------------------------------------ adapters

fn validate_test_adapter(table: Option<&Value>) -> Result<()> {
    let opts: Opts = pool_core::plugin::parse_table("test-adapter", table)?;
    record(&opts.tag, "validated".into());
    Ok(())
}

fn test_adapter_doctor(_: &DoctorContext<'_>) -> Vec<Finding> {
    vec![Finding::new("test-adapter", "probe", "here")]
}

inventory::submit! {
    AdapterPlugin::new("test-adapter", "checks its table", "tests/plugins.rs", validate_test_adapter)
        .with_doctor(test_adapter_doctor)
}

#[test]
fn an_adapters_table_is_validated_by_it_when_a_pool_is_planned() {
    let mut c = config("adapter", None, None, None);
    c.plugins
        .insert("test-adapter".into(), json!({"tag": "adapter"}));
    PoolPlan::new(c.clone()).unwrap();
    assert_eq!(events("adapter"), ["validated"]);
    c.plugins.get_mut("test-adapter").unwrap()["colour"] = json!("red");
    let e = PoolPlan::new(c).unwrap_err();
    assert!(
        e.to_string().contains("[test-adapter]") && e.to_string().contains("colour"),
        "{e}"
    );
    assert_eq!(e.exit_code(), 2);
    let plugin = pool_core::plugin::lookup::<AdapterPlugin>("test-adapter").unwrap();
    let found = (plugin.doctor.unwrap())(&DoctorContext::default());
    assert_eq!(found[0].area, "test-adapter");
}

#[test]
fn the_built_in_mooncake_adapter_checks_its_table() {
    let mut c = config("mooncake", None, None, None);
    c.plugins
        .insert("mooncake".into(), json!({"max_region": "1GiB"}));
    let plan = PoolPlan::new(c.clone()).unwrap();
    assert_eq!(
        plan.config().plugin_table("mooncake"),
        Some(&json!({"max_region": "1GiB"}))
    );
    c.plugins.insert("mooncake".into(), json!({"max_regon": 1}));
    let e = PoolPlan::new(c.clone()).unwrap_err();
    assert!(
        e.to_string().contains("[mooncake]") && e.to_string().contains("max_regon"),
        "{e}"
    );
    assert_eq!(e.exit_code(), 2);
    c.plugins.remove("mooncake");
    c.plugins.insert("mooncak".into(), json!({}));
    let e = PoolPlan::new(c).unwrap_err();
    assert!(
        e.to_string().contains("mooncake") && e.to_string().contains("test-adapter"),
        "{e}"
    );
}
