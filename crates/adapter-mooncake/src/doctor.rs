//! `hostpool doctor`'s `mooncake` area: whether a Python interpreter
//! (`$HOSTPOOL_PYTHON`, else `python3` on the `PATH`) imports
//! `mooncake.engine`, from which distribution, and with which transports.
//!
//! Mooncake is optional, so nothing here fails: a wheel that does not
//! import is `info`, with why and what to do.

use std::ffi::OsStr;

use pool_core::host::python::{self, Outcome};
use pool_core::plugin::{DoctorContext, Finding};
use serde_json::json;

use crate::NAME;
use crate::probe::{self, Answer};

/// The item of the finding.
const ITEM: &str = "mooncake.engine";

/// How to get the wheel, or point the doctor at it.
pub(crate) const INSTALL: &str = "install Mooncake's wheel into that python (`pip install \
    mooncake-transfer-engine`, or `mooncake-transfer-engine-non-cuda` without CUDA), or set \
    HOSTPOOL_PYTHON to the engine's venv python (`python -m hostpool doctor` sets it to its own)";

/// What to do about libibverbs, which the wheel's `engine.so` links even
/// for TCP.
pub(crate) const IBVERBS: &str = "the wheel's engine.so links libibverbs even for TCP: install it \
    (`apt-get install libibverbs1`, or `dnf install libibverbs`)";

pub(crate) fn findings(_ctx: &DoctorContext<'_>) -> Vec<Finding> {
    let (python, source) = python::python();
    vec![finding(&python, source, probe::probe(&python))]
}

/// The finding for what `python` (named by `source`) answered.
pub(crate) fn finding(python: &OsStr, source: &str, outcome: Outcome<Answer>) -> Finding {
    let shown = python.to_string_lossy();
    let asked = format!("{shown} (from {source})");
    let why = outcome.why_unanswered().unwrap_or_default();
    match outcome {
        Outcome::Answered(answer) if answer.importable() => importable(&shown, source, &answer),
        Outcome::Answered(answer) => {
            let error = answer.error.clone().unwrap_or_default();
            let remedy = if error.contains("libibverbs") {
                IBVERBS.to_string()
            } else if error.starts_with("ModuleNotFoundError") {
                INSTALL.to_string()
            } else {
                format!("fix what the import says; or {INSTALL}")
            };
            Finding::new(NAME, ITEM, format!("not importable by {asked}: {error}"))
                .info(remedy)
                .details(json!({
                    "python": shown,
                    "source": source,
                    "executable": answer.executable,
                    "python_version": answer.python_version,
                    "importable": false,
                    "error": error,
                    "distributions": answer.distributions,
                }))
        }
        unanswered => {
            let value = match &unanswered {
                Outcome::NotStarted(_) => format!("not importable: {asked} {why}"),
                Outcome::TimedOut(deadline) => format!(
                    "not known: {asked} did not import mooncake.engine within {} s and was killed",
                    deadline.as_secs()
                ),
                _ => format!("not known: {asked} {why}"),
            };
            let remedy = unanswered
                .remedy_unanswered(&shown, "mooncake.engine")
                .unwrap_or_default();
            not_asked(&shown, source, value, remedy)
        }
    }
}

fn importable(shown: &str, source: &str, answer: &Answer) -> Finding {
    let what = match answer.distributions.as_slice() {
        [] => "mooncake.engine (no mooncake-transfer-engine distribution found)".to_string(),
        dists => dists
            .iter()
            .map(|d| format!("{} {}", d.name, d.version))
            .collect::<Vec<_>>()
            .join(" and "),
    };
    let module = answer.module.as_deref().unwrap_or("an unknown path");
    let transports = answer.transports();
    Finding::new(
        NAME,
        ITEM,
        format!("{what} at {module}: transports {}", transports.join(", ")),
    )
    .details(json!({
        "python": shown,
        "source": source,
        "executable": answer.executable,
        "python_version": answer.python_version,
        "importable": true,
        "distributions": answer.distributions,
        "distribution": answer.distributions.first().map(|d| &d.name),
        "version": answer.distributions.first().map(|d| &d.version),
        "module": answer.module,
        "transports": transports,
        "flags": answer.flags,
    }))
}

fn not_asked(shown: &str, source: &str, value: String, remedy: impl Into<String>) -> Finding {
    Finding::new(NAME, ITEM, value).info(remedy).details(json!({
        "python": shown,
        "source": source,
        "importable": false,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pool_core::plugin::Level;

    fn answer(json: &str) -> Outcome<Answer> {
        Outcome::Answered(probe::parse(json))
    }

    #[test]
    fn an_importable_wheel_is_ok_with_its_distribution_path_and_transports() {
        let f = finding(
            OsStr::new("/venv/bin/python"),
            "HOSTPOOL_PYTHON",
            answer(
                r#"{"executable": "/venv/bin/python", "distributions": [{"name": "mooncake-transfer-engine-non-cuda", "version": "0.3.13.post1"}], "module": "/venv/mooncake/engine.so", "flags": {"SUPPORT_CUDA": false}, "ibverbs": true}"#,
            ),
        );
        assert_eq!(f.verdict, Level::Ok);
        assert_eq!(f.area, "mooncake");
        assert_eq!(
            f.value,
            "mooncake-transfer-engine-non-cuda 0.3.13.post1 at /venv/mooncake/engine.so: \
             transports tcp, rdma"
        );
        assert!(f.remedy.is_none());
        assert_eq!(f.details["transports"], json!(["tcp", "rdma"]));
        assert_eq!(f.details["version"], "0.3.13.post1");
    }

    #[test]
    fn a_missing_libibverbs_is_info_with_the_package_to_install() {
        let f = finding(
            OsStr::new("python3"),
            "the PATH",
            answer(
                r#"{"distributions": [], "error": "ImportError: libibverbs.so.1: cannot open shared object file: No such file or directory"}"#,
            ),
        );
        assert_eq!(f.verdict, Level::Info);
        assert!(
            f.value
                .contains("not importable by python3 (from the PATH)")
                && f.value.contains("libibverbs.so.1"),
            "{}",
            f.value
        );
        assert!(f.remedy.unwrap().contains("apt-get install libibverbs1"));
    }

    #[test]
    fn no_wheel_is_info_saying_how_to_install_or_point_at_one() {
        let f = finding(
            OsStr::new("/usr/bin/python3"),
            "HOSTPOOL_PYTHON",
            answer(
                r#"{"distributions": [], "error": "ModuleNotFoundError: No module named 'mooncake'"}"#,
            ),
        );
        assert_eq!(f.verdict, Level::Info);
        assert!(
            f.value.contains("No module named 'mooncake'"),
            "{}",
            f.value
        );
        let remedy = f.remedy.unwrap();
        assert!(
            remedy.contains("pip install mooncake-transfer-engine")
                && remedy.contains("-non-cuda")
                && remedy.contains("HOSTPOOL_PYTHON"),
            "{remedy}"
        );
    }

    #[test]
    fn an_interpreter_that_cannot_run_or_hangs_is_info_never_a_failure() {
        let missing = finding(
            OsStr::new("/nonexistent/python"),
            "HOSTPOOL_PYTHON",
            Outcome::NotStarted(std::io::Error::from(std::io::ErrorKind::NotFound)),
        );
        assert_eq!(missing.verdict, Level::Info);
        assert!(
            missing.value.contains("no such program"),
            "{}",
            missing.value
        );
        let hung = finding(
            OsStr::new("python3"),
            "the PATH",
            Outcome::TimedOut(python::DEADLINE),
        );
        assert_eq!(hung.verdict, Level::Info);
        assert!(hung.value.contains("within 20 s"), "{}", hung.value);
        assert!(hung.remedy.is_some());
    }
}
