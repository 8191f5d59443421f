//! What a Python interpreter answers about itself: a short `-c` script run
//! under a deadline (the child is killed and reaped when it passes), which
//! prints one JSON line after a marker. `hostpool doctor` asks this way
//! whether the engine's Python imports Mooncake's wheel (adapter-mooncake)
//! and which serving engines it has (the CLI's `engines` area); each asker
//! owns its script and what it makes of the answer, this module the rest.
//!
//! The interpreter is `$HOSTPOOL_PYTHON`, else `python3` on the `PATH`
//! ([`python`]). It runs with `-B` (it writes no bytecode: the doctor
//! writes nothing), stdin closed, and without the current directory on its
//! path (the prelude of [`script`] drops it), so a `vllm` or `mooncake`
//! directory where the doctor happens to run does not answer for an
//! installed package. The environment passes through unchanged
//! (`PYTHONPATH`, `VIRTUAL_ENV`, ...): it is the engine's environment that
//! is asked about.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;

/// The variable naming the interpreter to ask.
pub const PYTHON_VAR: &str = "HOSTPOOL_PYTHON";

/// The interpreter asked when [`PYTHON_VAR`] is unset or empty.
pub const DEFAULT_PYTHON: &str = "python3";

/// How long an interpreter may take to answer before it is killed.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// What starts the answer's line on stdout (whatever the script imports may
/// print too).
pub const MARKER: &str = "HOSTPOOL-PYTHON-PROBE ";

/// The most of each stream kept.
const KEEP: u64 = 1 << 20;

/// What every script starts with: the current directory off the path, and
/// `answer(obj)`, which prints `obj` as the one JSON line after [`MARKER`].
const PRELUDE: &str = r#"
import json, sys
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]
def answer(out):
    print("HOSTPOOL-PYTHON-PROBE " + json.dumps(out), flush=True)
"#;

/// The interpreter to ask, and where its name came from: [`PYTHON_VAR`],
/// or `the PATH`.
pub fn python() -> (OsString, &'static str) {
    match std::env::var_os(PYTHON_VAR) {
        Some(p) if !p.is_empty() => (p, PYTHON_VAR),
        _ => (DEFAULT_PYTHON.into(), "the PATH"),
    }
}

/// The script run for `body`: the prelude, then `body`, which ends by
/// calling `answer(obj)` with what it found (`json`, `sys` and `answer` are
/// in scope). A body should never raise: a traceback is no answer.
pub fn script(body: &str) -> String {
    format!("{PRELUDE}{body}")
}

/// The answer in a script's output: the last line with the marker, parsed.
pub fn parse<T: DeserializeOwned>(stdout: &str) -> Option<T> {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(MARKER))
        .and_then(|json| serde_json::from_str(json).ok())
}

/// How the interpreter answered.
#[derive(Debug)]
pub enum Outcome<T> {
    /// It printed an answer.
    Answered(T),
    /// It could not be started.
    NotStarted(std::io::Error),
    /// It did not end before the deadline, and was killed.
    TimedOut(Duration),
    /// It ended without an answer.
    NoAnswer {
        /// How it ended.
        status: ExitStatus,
        /// The last line it wrote to stderr.
        stderr: String,
    },
}

impl<T> Outcome<T> {
    /// Why no answer came, in words that follow the interpreter's name
    /// (`cannot be run (no such program)`, `did not answer within 20 s and
    /// was killed`, `ended (exit status: 2) without an answer: ...`);
    /// `None` when it answered.
    pub fn why_unanswered(&self) -> Option<String> {
        match self {
            Outcome::Answered(_) => None,
            Outcome::NotStarted(e) => Some(format!(
                "cannot be run ({})",
                if e.kind() == std::io::ErrorKind::NotFound {
                    "no such program".to_string()
                } else {
                    e.to_string()
                }
            )),
            Outcome::TimedOut(deadline) => Some(format!(
                "did not answer within {} s and was killed",
                deadline.as_secs()
            )),
            Outcome::NoAnswer { status, stderr } => Some(format!(
                "ended ({status}) without an answer{}",
                if stderr.is_empty() {
                    String::new()
                } else {
                    format!(": {stderr}")
                }
            )),
        }
    }

    /// What to do when `shown` (the interpreter as named) gave no answer:
    /// name one that runs, see where `import {import}` hangs, or name a
    /// Python 3; `None` when it answered.
    pub fn remedy_unanswered(&self, shown: &str, import: &str) -> Option<String> {
        match self {
            Outcome::Answered(_) => None,
            Outcome::NotStarted(_) => Some(format!(
                "set {PYTHON_VAR} to the engine's venv python (`python -m hostpool doctor` \
                 sets it to its own), or put {DEFAULT_PYTHON} on the PATH"
            )),
            Outcome::TimedOut(_) => Some(format!(
                "run `{shown} -c 'import {import}'` to see where it hangs, or set \
                 {PYTHON_VAR} to the engine's venv python"
            )),
            Outcome::NoAnswer { .. } => Some(format!(
                "{PYTHON_VAR} must name a Python 3 interpreter (the engine's venv python)"
            )),
        }
    }
}

/// Ask `python` with the script of `body` (see [`script`]), within
/// `deadline`.
pub fn ask<T: DeserializeOwned>(python: &OsStr, body: &str, deadline: Duration) -> Outcome<T> {
    let mut command = Command::new(python);
    command.arg("-B").arg("-c").arg(script(body));
    match run(command, deadline) {
        Ran::NotStarted(e) => Outcome::NotStarted(e),
        Ran::TimedOut => Outcome::TimedOut(deadline),
        Ran::Ended {
            status,
            stdout,
            stderr,
        } => match parse(&stdout) {
            Some(answer) => Outcome::Answered(answer),
            None => Outcome::NoAnswer {
                status,
                stderr: stderr
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim()
                    .to_string(),
            },
        },
    }
}

/// How a command ran under a deadline.
#[derive(Debug)]
pub enum Ran {
    /// It could not be started.
    NotStarted(std::io::Error),
    /// Killed (and reaped) at the deadline.
    TimedOut,
    /// It ended by itself.
    Ended {
        /// How.
        status: ExitStatus,
        /// What it wrote to stdout (at most 1 MiB).
        stdout: String,
        /// What it wrote to stderr (at most 1 MiB).
        stderr: String,
    },
}

/// Read a stream to its end (at most [`KEEP`] bytes) on a thread of its
/// own, so neither pipe can fill while the other is waited on.
fn reader(stream: Option<impl Read + Send + 'static>) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    if let Some(stream) = stream {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = stream.take(KEEP).read_to_end(&mut bytes);
            let _ = tx.send(String::from_utf8_lossy(&bytes).into_owned());
        });
    }
    rx
}

/// Run `command` (stdin closed, stdout and stderr read) until it ends or
/// `deadline` passes; then it is killed and reaped. Never waits longer than
/// the deadline and a moment for its output.
pub fn run(mut command: Command, deadline: Duration) -> Ran {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => return Ran::NotStarted(e),
    };
    let stdout = reader(child.stdout.take());
    let stderr = reader(child.stderr.take());
    let start = Instant::now();
    let mut pause = Duration::from_millis(2);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() < deadline => {
                std::thread::sleep(pause.min(deadline.saturating_sub(start.elapsed())));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            // Past the deadline, or it cannot be waited for: end it.
            Ok(None) | Err(_) => break None,
        }
    };
    let Some(status) = status else {
        if let Err(e) = child.kill() {
            tracing::debug!("killing the probe: {e}");
        }
        if let Err(e) = child.wait() {
            tracing::debug!("reaping the probe: {e}");
        }
        return Ran::TimedOut;
    };
    // A grandchild that kept the pipes open must not hold the doctor up.
    let grace = Duration::from_secs(1);
    Ran::Ended {
        status,
        stdout: stdout.recv_timeout(grace).unwrap_or_default(),
        stderr: stderr.recv_timeout(grace).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Deserialize)]
    struct Probe {
        cwd_on_path: bool,
        path_var: Option<String>,
        dont_write_bytecode: bool,
    }

    /// What the test script answers: whether the current directory is on
    /// the path, `PYTHONPATH` as the interpreter saw it, and `-B`.
    const BODY: &str = r#"
import os
answer({
    "cwd_on_path": any(p in ("", ".") for p in sys.path),
    "path_var": os.environ.get("PYTHONPATH"),
    "dont_write_bytecode": sys.dont_write_bytecode,
})
"#;

    #[test]
    fn the_answer_is_the_last_marked_line_whatever_else_was_printed() {
        #[derive(Debug, PartialEq, Deserialize)]
        struct A {
            n: u32,
        }
        let out = format!("I1206 noise\n{MARKER}{{\"n\": 1}}\nmore noise\n{MARKER}{{\"n\": 2}}\n");
        assert_eq!(parse::<A>(&out), Some(A { n: 2 }));
        assert_eq!(parse::<A>("no marker here\n"), None);
        assert_eq!(parse::<A>(&format!("{MARKER}{{not json")), None);
        // A line that only contains the marker later is no answer.
        assert_eq!(parse::<A>(&format!("x {MARKER}{{\"n\": 1}}")), None);
    }

    #[test]
    fn the_prelude_prints_with_the_marker_parse_reads() {
        // One marker: the prelude's literal is MARKER.
        assert!(PRELUDE.contains(&format!("print({MARKER:?}")), "{PRELUDE}");
        assert!(script("answer(1)").ends_with("answer(1)"));
    }

    #[test]
    fn a_command_past_its_deadline_is_killed_and_reaped() {
        let mut c = Command::new("sleep");
        c.arg("30");
        let start = Instant::now();
        assert!(matches!(run(c, Duration::from_millis(200)), Ran::TimedOut));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn a_command_that_ends_gives_its_status_and_both_streams() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        match run(c, Duration::from_secs(20)) {
            Ran::Ended {
                status,
                stdout,
                stderr,
            } => {
                assert_eq!(status.code(), Some(3));
                assert_eq!(stdout, "out\n");
                assert_eq!(stderr, "err\n");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            run(Command::new("/nonexistent/python3"), Duration::from_secs(1)),
            Ran::NotStarted(_)
        ));
    }

    #[test]
    fn a_real_python_answers_without_the_cwd_with_b_and_the_environment() {
        // Whatever python3 the PATH has; PYTHONPATH set for the whole test
        // process would race other tests, so it is read, not set.
        match ask::<Probe>(OsStr::new("python3"), BODY, DEADLINE) {
            Outcome::Answered(a) => {
                assert!(!a.cwd_on_path, "{a:?}");
                assert!(a.dont_write_bytecode, "{a:?}");
                assert_eq!(
                    a.path_var,
                    std::env::var("PYTHONPATH").ok(),
                    "the environment passes through"
                );
            }
            other => panic!("python3 did not answer: {other:?}"),
        }
    }

    #[test]
    fn what_is_not_an_answer_says_why() {
        // `sh -B` is an error: no answer, and its last stderr line.
        let o = ask::<Probe>(OsStr::new("sh"), BODY, DEADLINE);
        let why = o.why_unanswered().unwrap();
        match o {
            Outcome::NoAnswer { status, stderr } => {
                assert!(!status.success());
                assert!(!stderr.is_empty());
                assert!(
                    why.starts_with("ended (exit status: ") && why.ends_with(&stderr),
                    "{why}"
                );
            }
            other => panic!("{other:?}"),
        }
        // A body that raises is no answer either.
        let o = ask::<Probe>(OsStr::new("python3"), "raise SystemExit('boom')", DEADLINE);
        assert!(
            matches!(&o, Outcome::NoAnswer { stderr, .. } if stderr == "boom"),
            "{o:?}"
        );
        let o = ask::<Probe>(OsStr::new("/nonexistent/python3"), BODY, DEADLINE);
        assert_eq!(
            o.why_unanswered().as_deref(),
            Some("cannot be run (no such program)")
        );
        let o = Outcome::<Probe>::TimedOut(DEADLINE);
        assert_eq!(
            o.why_unanswered().as_deref(),
            Some("did not answer within 20 s and was killed")
        );
        assert_eq!(Outcome::Answered(1).why_unanswered(), None);
    }

    #[test]
    fn a_script_past_the_deadline_is_timed_out() {
        let start = Instant::now();
        let o = ask::<Probe>(
            OsStr::new("python3"),
            "import time\ntime.sleep(30)",
            Duration::from_millis(300),
        );
        assert!(
            matches!(o, Outcome::TimedOut(d) if d == Duration::from_millis(300)),
            "{o:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn each_way_of_not_answering_has_its_remedy() {
        let not_started = Outcome::<Probe>::NotStarted(std::io::ErrorKind::NotFound.into());
        let r = not_started.remedy_unanswered("py", "x.y").unwrap();
        assert!(
            r.contains("set HOSTPOOL_PYTHON") && r.contains("python3 on the PATH"),
            "{r}"
        );
        let hung = Outcome::<Probe>::TimedOut(DEADLINE);
        let r = hung.remedy_unanswered("py", "x.y").unwrap();
        assert!(
            r.starts_with("run `py -c 'import x.y'` to see where it hangs"),
            "{r}"
        );
        let ended = ask::<Probe>(OsStr::new("/nonexistent/python3"), BODY, DEADLINE);
        assert!(ended.remedy_unanswered("py", "x.y").is_some());
        let answered = ask::<Probe>(OsStr::new("python3"), BODY, DEADLINE);
        assert!(
            answered.remedy_unanswered("py", "x.y").is_none(),
            "{answered:?}"
        );
    }

    #[test]
    fn python_is_the_variable_else_python3_on_the_path() {
        // Read only: setting the variable would race other tests.
        let (p, source) = python();
        match std::env::var_os(PYTHON_VAR).filter(|v| !v.is_empty()) {
            Some(v) => assert_eq!((p, source), (v, PYTHON_VAR)),
            None => assert_eq!((p, source), (OsString::from("python3"), "the PATH")),
        }
    }
}
