//! Asking a Python interpreter about its Mooncake wheel: a short script
//! that imports `mooncake.engine` and answers with one JSON line, asked
//! through `pool_core::host::python` (the interpreter, the deadline past
//! which it is killed and reaped, `-B` and no current directory on its path,
//! the marked answer), so a `mooncake` directory where the doctor happens to
//! run does not answer for the wheel.

use std::collections::BTreeMap;
use std::ffi::OsStr;

use pool_core::host::python::{self, Outcome};
use serde::{Deserialize, Serialize};

/// The script's body (after the prelude of `python::script`): the
/// distributions, then the import, then what it supports. It never raises:
/// whatever fails is in the answer.
const SCRIPT: &str = r#"
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
answer(out)
"#;

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

/// Ask `python` about its Mooncake wheel, within [`python::DEADLINE`].
pub(crate) fn probe(python: &OsStr) -> Outcome<Answer> {
    python::ask(python, SCRIPT, python::DEADLINE)
}

/// The answer in `json`, as the script prints it after the import's own
/// output.
#[cfg(test)]
pub(crate) fn parse(json: &str) -> Answer {
    python::parse(&format!("I1206 glog noise\n{}{json}\n", python::MARKER)).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What 0.3.13.post1 of the non-CUDA wheel answers.
    const NON_CUDA: &str = r#"{"executable": "/venv/bin/python", "python_version": "3.11.7", "distributions": [{"name": "mooncake-transfer-engine-non-cuda", "version": "0.3.13.post1"}], "module": "/venv/lib/python3.11/site-packages/mooncake/engine.so", "flags": {"SUPPORT_CUDA": false, "SUPPORT_EFA": false, "SUPPORT_HIP": false, "SUPPORT_INTRA_NVLINK": false, "SUPPORT_MNNVL": false, "SUPPORT_MUSA": false}, "ibverbs": true}"#;

    #[test]
    fn the_wheels_answer_names_its_distribution_module_and_transports() {
        let a = parse(NON_CUDA);
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
    }

    #[test]
    fn flags_become_transports_nvlink_for_intra_nvlink() {
        let a = parse(
            r#"{"distributions": [], "flags": {"SUPPORT_CUDA": true, "SUPPORT_EFA": true, "SUPPORT_INTRA_NVLINK": true, "SUPPORT_MNNVL": false, "SUPPORT_NEWTHING": true}}"#,
        );
        assert_eq!(a.transports(), ["tcp", "cuda", "nvlink", "efa", "newthing"]);
    }

    #[test]
    fn an_import_error_is_kept_and_lists_no_transport() {
        let a = parse(
            r#"{"executable": "/usr/bin/python3", "distributions": [{"name": "mooncake-transfer-engine", "version": "0.3.13"}], "error": "ImportError: libibverbs.so.1: cannot open shared object file: No such file or directory"}"#,
        );
        assert!(!a.importable());
        assert!(a.transports().is_empty());
        assert!(a.error.unwrap().contains("libibverbs.so.1"));
    }

    #[test]
    fn the_script_answers_on_a_real_python_with_or_without_the_wheel() {
        // Whatever python3 the PATH has (CI's has none of Mooncake; the
        // doctor's integration test asks the test venv's, which has it).
        match probe(OsStr::new("python3")) {
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
}
