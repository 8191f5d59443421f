//! Asking a Python interpreter about its Mooncake wheel: a short `-c`
//! script that imports `mooncake.engine` and prints one JSON line, run
//! under a deadline (the child is killed and reaped when it passes).
//!
//! The interpreter runs with `-B` (it writes no bytecode: the doctor writes
//! nothing) and without the current directory on its path, so a `mooncake`
//! directory where the doctor happens to run does not answer for the wheel.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The variable naming the interpreter to ask.
pub(crate) const PYTHON_VAR: &str = "HOSTPOOL_PYTHON";

/// The interpreter asked when [`PYTHON_VAR`] is unset.
pub(crate) const DEFAULT_PYTHON: &str = "python3";

/// How long the interpreter may take to answer before it is killed.
pub(crate) const DEADLINE: Duration = Duration::from_secs(20);

/// What starts the answer's line on stdout (the import may print too).
const MARKER: &str = "HOSTPOOL-MOONCAKE-PROBE ";

/// The most of each stream kept.
const KEEP: u64 = 1 << 20;

/// The script: the distributions, then the import, then what it supports.
/// It never raises: whatever fails is in the answer.
const SCRIPT: &str = r#"
import json, sys
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]
out = {"executable": sys.executable, "python_version": sys.version.split()[0], "distributions": []}
try:
    import importlib.metadata as md
    seen = set()
    for d in md.distributions():
        name = d.metadata.get("Name") or ""
        if name.lower().replace("_", "-").startswith("mooncake-transfer-engine") and name not in seen:
            seen.add(name)
            out["distributions"].append({"name": name, "version": d.version})
    out["distributions"].sort(key=lambda d: d["name"])
except Exception as e:
    out["metadata_error"] = f"{type(e).__name__}: {e}"
try:
    import mooncake.engine as engine
except BaseException as e:
    out["error"] = f"{type(e).__name__}: {e}"
else:
    out["module"] = getattr(engine, "__file__", None)
    out["flags"] = {n: bool(getattr(engine, n)) for n in dir(engine) if n.startswith("SUPPORT_")}
    try:
        with open("/proc/self/maps") as f:
            out["ibverbs"] = "/libibverbs.so" in f.read()
    except OSError:
        pass
print("HOSTPOOL-MOONCAKE-PROBE " + json.dumps(out), flush=True)
"#;

/// The interpreter to ask, and where its name came from.
pub(crate) fn python() -> (OsString, &'static str) {
    match std::env::var_os(PYTHON_VAR) {
        Some(p) if !p.is_empty() => (p, PYTHON_VAR),
        _ => (DEFAULT_PYTHON.into(), "the PATH"),
    }
}

/// An installed distribution of Mooncake's transfer engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Distribution {
    pub(crate) name: String,
    pub(crate) version: String,
}

/// What the script printed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct Answer {
    /// `sys.executable`.
    #[serde(default)]
    pub(crate) executable: Option<String>,
    #[serde(default)]
    pub(crate) python_version: Option<String>,
    /// Every installed `mooncake-transfer-engine*` distribution.
    #[serde(default)]
    pub(crate) distributions: Vec<Distribution>,
    /// Why `importlib.metadata` could not list them.
    #[serde(default)]
    pub(crate) metadata_error: Option<String>,
    /// Why `import mooncake.engine` failed (`None`: it worked).
    #[serde(default)]
    pub(crate) error: Option<String>,
    /// The engine module's file.
    #[serde(default)]
    pub(crate) module: Option<String>,
    /// The module's `SUPPORT_*` flags.
    #[serde(default)]
    pub(crate) flags: BTreeMap<String, bool>,
    /// Whether importing it loaded libibverbs (`None`: unknown).
    #[serde(default)]
    pub(crate) ibverbs: Option<bool>,
}

/// The transports each `SUPPORT_*` flag of `mooncake.engine` stands for,
/// in the order they are listed.
const FLAGS: [(&str, &str); 6] = [
    ("SUPPORT_CUDA", "cuda"),
    ("SUPPORT_HIP", "hip"),
    ("SUPPORT_MUSA", "musa"),
    ("SUPPORT_INTRA_NVLINK", "nvlink"),
    ("SUPPORT_MNNVL", "mnnvl"),
    ("SUPPORT_EFA", "efa"),
];

impl Answer {
    /// Whether `mooncake.engine` imported.
    pub(crate) fn importable(&self) -> bool {
        self.error.is_none()
    }

    /// What the engine can move data over: `tcp` always (when it imports),
    /// `rdma` when its `engine.so` loaded libibverbs, then one per true
    /// `SUPPORT_*` flag (`nvlink` for `SUPPORT_INTRA_NVLINK`; a flag this
    /// list does not know by its name in lower case).
    pub(crate) fn transports(&self) -> Vec<String> {
        if !self.importable() {
            return Vec::new();
        }
        let mut out = vec!["tcp".to_string()];
        if self.ibverbs == Some(true) {
            out.push("rdma".into());
        }
        for (flag, name) in FLAGS {
            if self.flags.get(flag) == Some(&true) {
                out.push(name.into());
            }
        }
        for (flag, on) in &self.flags {
            if *on && !FLAGS.iter().any(|(f, _)| f == flag) {
                out.push(flag.trim_start_matches("SUPPORT_").to_lowercase());
            }
        }
        out
    }
}

/// How the interpreter answered.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// It printed an answer.
    Answered(Answer),
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

/// The answer in the script's output: the last line with the marker.
pub(crate) fn parse(stdout: &str) -> Option<Answer> {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(MARKER))
        .and_then(|json| serde_json::from_str(json).ok())
}

/// Ask `python` about its Mooncake wheel, within [`DEADLINE`].
pub(crate) fn probe(python: &OsString) -> Outcome {
    let mut command = Command::new(python);
    command.args(["-B", "-c", SCRIPT]);
    match run(command, DEADLINE) {
        Ran::NotStarted(e) => Outcome::NotStarted(e),
        Ran::TimedOut => Outcome::TimedOut(DEADLINE),
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
pub(crate) enum Ran {
    NotStarted(std::io::Error),
    /// Killed (and reaped) at the deadline.
    TimedOut,
    Ended {
        status: ExitStatus,
        stdout: String,
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
pub(crate) fn run(mut command: Command, deadline: Duration) -> Ran {
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

    /// The line 0.3.13.post1 of the non-CUDA wheel answers with.
    const NON_CUDA: &str = r#"HOSTPOOL-MOONCAKE-PROBE {"executable": "/venv/bin/python", "python_version": "3.11.7", "distributions": [{"name": "mooncake-transfer-engine-non-cuda", "version": "0.3.13.post1"}], "module": "/venv/lib/python3.11/site-packages/mooncake/engine.so", "flags": {"SUPPORT_CUDA": false, "SUPPORT_EFA": false, "SUPPORT_HIP": false, "SUPPORT_INTRA_NVLINK": false, "SUPPORT_MNNVL": false, "SUPPORT_MUSA": false}, "ibverbs": true}"#;

    #[test]
    fn the_answer_is_the_last_marked_line_whatever_the_import_printed() {
        let out = format!("I1206 glog noise\n{NON_CUDA}\n");
        let a = parse(&out).unwrap();
        assert!(a.importable());
        assert_eq!(
            a.distributions,
            [Distribution {
                name: "mooncake-transfer-engine-non-cuda".into(),
                version: "0.3.13.post1".into()
            }]
        );
        assert_eq!(
            a.module.as_deref(),
            Some("/venv/lib/python3.11/site-packages/mooncake/engine.so")
        );
        assert_eq!(a.transports(), ["tcp", "rdma"]);
        assert_eq!(parse("no marker here\n"), None);
        assert_eq!(parse("HOSTPOOL-MOONCAKE-PROBE {not json"), None);
    }

    #[test]
    fn flags_become_transports_nvlink_for_intra_nvlink() {
        let a = parse(
            r#"HOSTPOOL-MOONCAKE-PROBE {"distributions": [], "flags": {"SUPPORT_CUDA": true, "SUPPORT_EFA": true, "SUPPORT_INTRA_NVLINK": true, "SUPPORT_MNNVL": false, "SUPPORT_NEWTHING": true}}"#,
        )
        .unwrap();
        assert_eq!(a.transports(), ["tcp", "cuda", "nvlink", "efa", "newthing"]);
    }

    #[test]
    fn an_import_error_is_kept_and_lists_no_transport() {
        let a = parse(
            r#"HOSTPOOL-MOONCAKE-PROBE {"executable": "/usr/bin/python3", "distributions": [{"name": "mooncake-transfer-engine", "version": "0.3.13"}], "error": "ImportError: libibverbs.so.1: cannot open shared object file: No such file or directory"}"#,
        )
        .unwrap();
        assert!(!a.importable());
        assert!(a.transports().is_empty());
        assert!(a.error.unwrap().contains("libibverbs.so.1"));
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
    fn the_script_answers_on_a_real_python_with_or_without_the_wheel() {
        // Whatever python3 the PATH has (CI's has none of Mooncake; the
        // doctor's integration test asks the test venv's, which has it).
        match probe(&OsString::from("python3")) {
            Outcome::Answered(a) => {
                assert!(a.executable.is_some(), "{a:?}");
                assert!(a.python_version.is_some(), "{a:?}");
                assert_eq!(a.importable(), a.module.is_some(), "{a:?}");
                if !a.importable() {
                    assert!(a.error.as_deref().is_some_and(|e| !e.is_empty()), "{a:?}");
                }
            }
            other => panic!("python3 did not answer: {other:?}"),
        }
    }

    #[test]
    fn an_interpreter_that_is_not_python_gives_no_answer() {
        // `sh -B` is an error: no answer, and its last stderr line.
        match probe(&OsString::from("sh")) {
            Outcome::NoAnswer { status, stderr } => {
                assert!(!status.success());
                assert!(!stderr.is_empty());
            }
            other => panic!("{other:?}"),
        }
    }
}
