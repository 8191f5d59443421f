//! `tracing` events from hostpool (any thread) to Python's `logging`, logger
//! `hostpool`, never to stderr.
//!
//! Events are queued where they happen, without the GIL (a prefault worker
//! must not wait for Python), and handed to `logging` by the thread that
//! holds it: while a build runs, every few tens of milliseconds, and after
//! each call. `HOSTPOOL_LOG` (a `tracing` filter such as `debug`) chooses
//! what is queued; the default is `info`.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Mutex;

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Events not yet handed to `logging`; the oldest are dropped past this.
const MAX_QUEUED: usize = 10_000;

static QUEUE: Mutex<VecDeque<(Level, String)>> = Mutex::new(VecDeque::new());

struct ToPython;

#[derive(Default)]
struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(
                self.0,
                "{}{value:?}",
                if self.0.is_empty() { "" } else { " " }
            );
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            let _ = write!(
                self.0,
                "{}{value}",
                if self.0.is_empty() { "" } else { " " }
            );
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

impl<S: Subscriber> Layer<S> for ToPython {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut text = Text::default();
        event.record(&mut text);
        let mut queue = QUEUE.lock().unwrap_or_else(|p| p.into_inner());
        if queue.len() >= MAX_QUEUED {
            queue.pop_front();
        }
        queue.push_back((*event.metadata().level(), text.0));
    }
}

/// Route `tracing` to the queue (once per process; a process whose
/// embedder already installed a subscriber keeps it).
pub fn install() {
    // A HOSTPOOL_LOG that is not a filter is said (on the first flush),
    // not silently replaced.
    let (filter, bad) = match std::env::var("HOSTPOOL_LOG") {
        Ok(v) => match EnvFilter::try_new(&v) {
            Ok(f) => (f, None),
            Err(e) => (EnvFilter::new("info"), Some((v, e))),
        },
        Err(_) => (EnvFilter::new("info"), None),
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(ToPython)
        .try_init();
    if let Some((v, e)) = bad {
        tracing::warn!(
            "HOSTPOOL_LOG `{v}` is not a log filter ({e}); passing on `info` and above instead"
        );
    }
}

fn levelno(level: Level) -> i32 {
    match level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG | Level::TRACE => 10,
    }
}

/// Hand the queued events to `logging.getLogger("hostpool")`.
pub fn flush(py: Python<'_>) {
    let events: Vec<(Level, String)> = {
        let mut queue = QUEUE.lock().unwrap_or_else(|p| p.into_inner());
        queue.drain(..).collect()
    };
    if events.is_empty() {
        return;
    }
    let Ok(logger) = py
        .import("logging")
        .and_then(|l| l.call_method1("getLogger", ("hostpool",)))
    else {
        return;
    };
    for (level, text) in events {
        // A failing handler must not turn into a failed build.
        if let Err(e) = logger.call_method1("log", (levelno(level), "%s", text)) {
            e.write_unraisable(py, Some(&logger));
        }
    }
}
