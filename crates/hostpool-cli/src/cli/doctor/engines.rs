//! `engines`: the serving engines installed beside hostpool in the engine's
//! Python (`$HOSTPOOL_PYTHON`, else `python3`; `python -m hostpool doctor`
//! asks its own), their versions, and whether each is one hostpool was
//! tested with.
//!
//! The interpreter is asked through `pool_core::host::python` (a deadline,
//! no bytecode, not the current directory). The script imports no engine
//! (vLLM, SGLang and LMCache take seconds and import torch): an engine is
//! installed when its distribution's metadata gives a version or its top
//! module is found (`importlib.util.find_spec`). The tested versions are
//! the Python package's own list, `hostpool._engines.TESTED`, read from the
//! same interpreter: the doctor judges the engine by the hostpool it would
//! load.
//!
//! Verdicts: an installed engine at a tested version is `ok`; at another
//! version, `warn` (hostpool's adapters reach the engines' internals, which
//! change between releases, so it may fail); when its version or the tested
//! ones are not known, `info`. An engine that is not installed is no
//! finding of its own: the `python` line lists it. Nothing here fails.

use std::collections::BTreeMap;
use std::ffi::OsStr;

use pool_core::host::python::{self, Outcome};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::Finding;

/// The area.
const AREA: &str = "engines";

/// The engines asked about, in the order they are listed: name,
/// distributions (PyPI names), top module.
const ENGINES: [(&str, &[&str], &str); 4] = [
    ("vllm", &["vllm"], "vllm"),
    ("sglang", &["sglang"], "sglang"),
    ("lmcache", &["lmcache"], "lmcache"),
    (
        "mooncake",
        &[
            "mooncake-transfer-engine",
            "mooncake-transfer-engine-non-cuda",
        ],
        "mooncake",
    ),
];

/// The script's body (after the prelude of `python::script`), with
/// `ENGINES` in place of `@ENGINES@`. It imports no engine, and never
/// raises: whatever fails is in the answer.
const SCRIPT: &str = r#"
out = {"executable": sys.executable, "python_version": sys.version.split()[0], "engines": []}
def error(e):
    return f"{type(e).__name__}: {e}"
def where(spec):
    if spec.origin and spec.origin not in ("namespace", "built-in", "frozen"):
        return spec.origin
    for p in spec.submodule_search_locations or ():
        return str(p)
    return None
try:
    import importlib.metadata as md
    import importlib.util as iu
except BaseException as e:
    out["error"] = error(e)
else:
    for name, dists, module in @ENGINES@:
        e = {"name": name, "module": module, "distributions": [], "errors": []}
        for d in dists:
            try:
                e["distributions"].append({"name": d, "version": md.version(d)})
            except md.PackageNotFoundError:
                pass
            except BaseException as x:
                e["errors"].append(f"{d}: {error(x)}")
        try:
            spec = iu.find_spec(module)
        except BaseException as x:
            e["errors"].append(f"find_spec({module!r}): {error(x)}")
        else:
            e["found"] = spec is not None
            if spec is not None:
                e["path"] = where(spec)
        out["engines"].append(e)
    try:
        spec = iu.find_spec("hostpool")
    except BaseException as x:
        spec = None
        out["hostpool_error"] = error(x)
    if spec is not None:
        out["hostpool"] = where(spec) or "hostpool"
        try:
            import hostpool._engines as tested
            out["tested"] = {
                str(k): [v] if isinstance(v, str) else [str(t) for t in v]
                for k, v in dict(tested.TESTED).items()
            }
        except BaseException as x:
            out["tested_error"] = error(x)
answer(out)
"#;

/// The script, with the engines written into it as a Python literal.
fn script() -> String {
    let engines: Vec<Value> = ENGINES
        .iter()
        .map(|(name, dists, module)| json!([name, dists, module]))
        .collect();
    // JSON's lists and strings are Python's.
    SCRIPT.replace("@ENGINES@", &Value::Array(engines).to_string())
}

/// An installed distribution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Distribution {
    name: String,
    version: String,
}

/// What the script found of one engine.
#[derive(Debug, Clone, Default, Deserialize)]
struct Engine {
    name: String,
    /// Its top module.
    #[serde(default)]
    module: String,
    /// Its installed distributions (more than one: a conflict).
    #[serde(default)]
    distributions: Vec<Distribution>,
    /// Whether its top module is found.
    #[serde(default)]
    found: bool,
    /// Where the module is.
    #[serde(default)]
    path: Option<String>,
    /// What failed while looking (a broken distribution's metadata).
    #[serde(default)]
    errors: Vec<String>,
}

impl Engine {
    fn installed(&self) -> bool {
        self.found || !self.distributions.is_empty()
    }

    fn first(&self) -> Option<&Distribution> {
        self.distributions.first()
    }
}

/// What the script printed.
#[derive(Debug, Clone, Default, Deserialize)]
struct Answer {
    #[serde(default)]
    executable: Option<String>,
    #[serde(default)]
    python_version: Option<String>,
    /// Why `importlib.metadata` or `importlib.util` did not import.
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    engines: Vec<Engine>,
    /// Where the `hostpool` package is (`None`: not installed).
    #[serde(default)]
    hostpool: Option<String>,
    /// Why looking for it failed.
    #[serde(default)]
    hostpool_error: Option<String>,
    /// `hostpool._engines.TESTED`: engine -> tested versions.
    #[serde(default)]
    tested: Option<BTreeMap<String, Vec<String>>>,
    /// Why it could not be read.
    #[serde(default)]
    tested_error: Option<String>,
}

/// Whether hostpool's tested versions are known, and if not why.
#[derive(Debug, Clone, Copy)]
enum Tested<'a> {
    /// `hostpool._engines.TESTED`.
    Known(&'a BTreeMap<String, Vec<String>>),
    /// hostpool is not installed in that python.
    NoHostpool,
    /// hostpool is there (at the path) but its list could not be read.
    Unreadable { at: &'a str, error: &'a str },
}

impl<'a> Tested<'a> {
    fn of(answer: &'a Answer) -> Tested<'a> {
        match (&answer.tested, &answer.hostpool) {
            (Some(t), _) => Tested::Known(t),
            (None, None) => Tested::NoHostpool,
            (None, Some(at)) => Tested::Unreadable {
                at,
                error: answer.tested_error.as_deref().unwrap_or("no answer"),
            },
        }
    }

    /// The versions tested of `engine` (`None`: not known).
    fn versions(self, engine: &str) -> Option<&'a [String]> {
        match self {
            Tested::Known(t) => Some(t.get(engine).map_or(&[][..], Vec::as_slice)),
            _ => None,
        }
    }

    /// Why they are not known, in words (`None`: they are).
    fn unknown(self) -> Option<String> {
        match self {
            Tested::Known(_) => None,
            Tested::NoHostpool => Some(NO_HOSTPOOL.to_string()),
            Tested::Unreadable { at, error } => Some(format!(
                "hostpool at {at} does not list them (hostpool._engines.TESTED: {error})"
            )),
        }
    }

    /// What to do when they are not known.
    fn remedy(self) -> &'static str {
        match self {
            Tested::Known(_) | Tested::NoHostpool => FROM_THE_ENGINE,
            Tested::Unreadable { .. } => {
                "install the hostpool release that matches this CLI into that python: it lists \
                 the engine versions it was tested with"
            }
        }
    }
}

const NO_HOSTPOOL: &str = "hostpool is not installed in this python";

const FROM_THE_ENGINE: &str = "run `python -m hostpool doctor` from the engine's environment";

/// Whether `version` is one of `tested`: the same, or the same but for a
/// local part (`0.34.0+cu128` is `0.34.0`'s build).
fn is_tested(version: &str, tested: &[String]) -> bool {
    let public = version.split('+').next().unwrap_or(version);
    tested.iter().any(|t| t == version || t == public)
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// The details of one engine, installed or not.
fn engine_details(e: &Engine, tested: Tested<'_>) -> Value {
    let versions = tested.versions(&e.name);
    json!({
        "name": e.name,
        "installed": e.installed(),
        "distribution": e.first().map(|d| &d.name),
        "version": e.first().map(|d| &d.version),
        "tested": match (e.first(), versions) {
            (Some(d), Some(t)) => is_tested(&d.version, t),
            _ => false,
        },
        "tested_versions": versions,
        "distributions": e.distributions,
        "module": e.module,
        "module_found": e.found,
        "path": e.path,
        "errors": e.errors,
    })
}

/// The finding of an installed engine (`None`: it is not installed).
fn engine_finding(e: &Engine, tested: Tested<'_>) -> Option<Finding> {
    if !e.installed() {
        return None;
    }
    let name = &e.name;
    let f =
        |value: String| Finding::new(AREA, name.clone(), value).details(engine_details(e, tested));
    let versions = tested.versions(name);
    let pin = |d: &Distribution| match versions.and_then(<[String]>::first) {
        Some(v) => format!("`pip install {}=={v}`", d.name),
        None => format!("`pip install {}`", d.name),
    };
    let Some(d) = e.first() else {
        // Found, but no distribution says which version: a source tree.
        let at = e.path.as_deref().unwrap_or("an unknown path");
        let tested_said = match versions {
            Some(t) if !t.is_empty() => format!(" (tested: {})", and_list(t)),
            _ => String::new(),
        };
        return Some(
            f(format!(
                "{name} at {at} (version unknown: no {} distribution is installed)",
                distributions_of(name).join(" or ")
            ))
            .info(format!(
                "install {name} with pip, so its version can be checked{tested_said}"
            )),
        );
    };
    let from = if d.name == *name {
        String::new()
    } else {
        format!(" from {}", d.name)
    };
    if let [_, _, ..] = e.distributions.as_slice() {
        let all: Vec<String> = e
            .distributions
            .iter()
            .map(|d| format!("{} {}", d.name, d.version))
            .collect();
        return Some(
            f(format!("{name}: {} are all installed", and_list(&all))).warn(format!(
                "they install the same module `{}`, so whose files are there depends on the \
                 order they were installed in: uninstall them all (`pip uninstall -y {}`), then \
                 install the one for this node",
                e.module,
                e.distributions
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            )),
        );
    }
    if !e.found {
        let why = match e.errors.as_slice() {
            [] => String::new(),
            errors => format!(": {}", errors.join("; ")),
        };
        return Some(
            f(format!(
                "{name} {}{from} is installed, but its module `{}` is not found{why}",
                d.version, e.module
            ))
            .warn(format!(
                "reinstall it (`pip install --force-reinstall {}=={}`)",
                d.name, d.version
            )),
        );
    }
    match versions {
        None => Some(
            f(format!(
                "{name} {}{from} (tested versions unknown: {})",
                d.version,
                tested.unknown().unwrap_or_default()
            ))
            .info(tested.remedy()),
        ),
        Some(t) if is_tested(&d.version, t) => {
            Some(f(format!("{name} {} (tested){from}", d.version)))
        }
        Some([]) => Some(
            f(format!(
                "{name} {} (not tested: hostpool lists no tested {name} version){from}",
                d.version
            ))
            .warn(format!(
                "install the hostpool release that matches this CLI, or test {name} {} with \
                 hostpool before relying on it",
                d.version
            )),
        ),
        Some(t) => Some(
            f(format!(
                "{name} {} (not tested: hostpool was tested with {}){from}",
                d.version,
                and_list(t)
            ))
            .warn(format!(
                "install a version hostpool was tested with ({}), or test this one before \
                 relying on it: hostpool's {name} adapter reaches {name}'s internals, which \
                 change between releases",
                pin(d)
            )),
        ),
    }
}

/// The distributions that install the engine `name`.
fn distributions_of(name: &str) -> Vec<String> {
    ENGINES.iter().find(|(n, ..)| *n == name).map_or_else(
        || vec![name.to_string()],
        |(_, d, _)| d.iter().map(|d| (*d).to_string()).collect(),
    )
}

/// The `python` line: the interpreter asked, hostpool beside it, and which
/// engines it has and has not.
fn summary(shown: &str, source: &str, answer: &Answer, tested: Tested<'_>) -> Finding {
    let asked = format!("{shown} (from {source})");
    let version = answer
        .python_version
        .as_deref()
        .unwrap_or("of unknown version");
    let (installed, absent): (Vec<&Engine>, Vec<&Engine>) =
        answer.engines.iter().partition(|e| e.installed());
    let names = |es: &[&Engine]| -> Vec<String> { es.iter().map(|e| e.name.clone()).collect() };
    let mut value = format!("{asked}, Python {version}: ");
    if installed.is_empty() {
        value += &format!(
            "no serving engine installed (looked for {})",
            names(&absent).join(", ")
        );
    } else {
        value += &format!("engines {}", names(&installed).join(", "));
        if !absent.is_empty() {
            value += &format!("; not installed: {}", names(&absent).join(", "));
        }
    }
    if let Some(why) = tested.unknown() {
        value += &format!("; {why}");
    }
    let f = Finding::new(AREA, "python", value).details(json!({
        "python": shown,
        "source": source,
        "executable": answer.executable,
        "python_version": answer.python_version,
        "hostpool": answer.hostpool,
        "hostpool_error": answer.hostpool_error,
        "tested": answer.tested,
        "tested_error": answer.tested_error,
        "installed": names(&installed),
        "not_installed": names(&absent),
        "engines": answer.engines.iter().map(|e| engine_details(e, tested)).collect::<Vec<_>>(),
    }));
    if installed.is_empty() {
        f.info(format!(
            "{FROM_THE_ENGINE}, or set HOSTPOOL_PYTHON to the engine's venv python"
        ))
    } else if tested.unknown().is_some() {
        f.info(tested.remedy())
    } else {
        f
    }
}

/// The findings for what `python` (named by `source`) answered.
fn findings_of(python: &OsStr, source: &str, outcome: Outcome<Answer>) -> Vec<Finding> {
    let shown = python.to_string_lossy();
    let asked = format!("{shown} (from {source})");
    let why = outcome.why_unanswered().unwrap_or_default();
    let not_known = |value: String, remedy: String| {
        vec![
            Finding::new(AREA, "python", value)
                .info(remedy)
                .details(json!({"python": shown, "source": source})),
        ]
    };
    match outcome {
        Outcome::Answered(answer) => {
            if let Some(error) = &answer.error {
                return not_known(
                    format!("not known: {asked} cannot list its packages: {error}"),
                    "HOSTPOOL_PYTHON must name a Python 3.8 or later (the engine's venv python)"
                        .into(),
                );
            }
            let tested = Tested::of(&answer);
            let mut out = vec![summary(&shown, source, &answer, tested)];
            out.extend(
                answer
                    .engines
                    .iter()
                    .filter_map(|e| engine_finding(e, tested)),
            );
            out
        }
        unanswered => not_known(
            format!("not known: {asked} {why}"),
            unanswered
                .remedy_unanswered(&shown, "importlib.metadata")
                .unwrap_or_default(),
        ),
    }
}

/// The engines of the engine's Python.
pub(super) fn findings() -> Vec<Finding> {
    let (interpreter, source) = python::python();
    let outcome = python::ask(&interpreter, &script(), python::DEADLINE);
    findings_of(&interpreter, source, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pool_core::plugin::Level;

    const TESTED: &str = r#""tested": {"vllm": ["0.34.0", "0.33.0"], "sglang": ["0.5.23"], "lmcache": ["0.5.6"], "mooncake": ["0.3.13.post1"]}"#;

    fn engine(name: &str, module: &str, dists: &[(&str, &str)], found: bool) -> String {
        let dists: Vec<Value> = dists
            .iter()
            .map(|(n, v)| json!({"name": n, "version": v}))
            .collect();
        json!({
            "name": name, "module": module, "distributions": dists, "errors": [],
            "found": found, "path": found.then(|| format!("/venv/site-packages/{module}/__init__.py")),
        })
        .to_string()
    }

    fn absent(name: &str) -> String {
        engine(name, name, &[], false)
    }

    /// What the script prints for these engines and this `tested` member
    /// (empty: hostpool is not installed).
    fn answer(engines: &[String], tested: &str) -> Outcome<Answer> {
        let hostpool = if tested.is_empty() {
            String::new()
        } else {
            format!(r#", "hostpool": "/venv/site-packages/hostpool/__init__.py", {tested}"#)
        };
        let line = format!(
            r#"{{"executable": "/venv/bin/python", "python_version": "3.11.7", "engines": [{}]{hostpool}}}"#,
            engines.join(", ")
        );
        Outcome::Answered(python::parse(&format!("noise\n{}{line}\n", python::MARKER)).unwrap())
    }

    fn run(outcome: Outcome<Answer>) -> Vec<Finding> {
        findings_of(OsStr::new("/venv/bin/python"), "HOSTPOOL_PYTHON", outcome)
    }

    fn item<'a>(fs: &'a [Finding], item: &str) -> &'a Finding {
        fs.iter()
            .find(|f| f.item == item)
            .unwrap_or_else(|| panic!("no {item}: {fs:#?}"))
    }

    #[test]
    fn tested_versions_are_ok_others_warn_and_absent_engines_are_only_listed() {
        let fs = run(answer(
            &[
                engine("vllm", "vllm", &[("vllm", "0.34.0")], true),
                engine("sglang", "sglang", &[("sglang", "0.4.0")], true),
                absent("lmcache"),
                engine(
                    "mooncake",
                    "mooncake",
                    &[("mooncake-transfer-engine-non-cuda", "0.3.13.post1")],
                    true,
                ),
            ],
            TESTED,
        ));
        assert_eq!(
            fs.iter().map(|f| f.item.as_str()).collect::<Vec<_>>(),
            ["python", "vllm", "sglang", "mooncake"]
        );
        assert!(fs.iter().all(|f| f.area == "engines"));

        let py = item(&fs, "python");
        assert_eq!(py.verdict, Level::Ok, "{py:#?}");
        assert_eq!(
            py.value,
            "/venv/bin/python (from HOSTPOOL_PYTHON), Python 3.11.7: engines vllm, sglang, \
             mooncake; not installed: lmcache"
        );
        assert_eq!(py.details["not_installed"], json!(["lmcache"]));
        assert_eq!(py.details["engines"][2]["installed"], false);
        assert_eq!(
            py.details["engines"][2]["tested_versions"],
            json!(["0.5.6"])
        );

        let vllm = item(&fs, "vllm");
        assert_eq!(vllm.verdict, Level::Ok);
        assert_eq!(vllm.value, "vllm 0.34.0 (tested)");
        assert!(vllm.remedy.is_none());
        let d = &vllm.details;
        assert_eq!(d["name"], "vllm");
        assert_eq!(d["distribution"], "vllm");
        assert_eq!(d["version"], "0.34.0");
        assert_eq!(d["tested"], true);
        assert_eq!(d["tested_versions"], json!(["0.34.0", "0.33.0"]));

        let sglang = item(&fs, "sglang");
        assert_eq!(sglang.verdict, Level::Warn);
        assert_eq!(
            sglang.value,
            "sglang 0.4.0 (not tested: hostpool was tested with 0.5.23)"
        );
        let remedy = sglang.remedy.as_deref().unwrap();
        assert!(remedy.contains("`pip install sglang==0.5.23`"), "{remedy}");
        assert_eq!(sglang.details["tested"], false);
        assert_eq!(sglang.details["tested_versions"], json!(["0.5.23"]));

        let mc = item(&fs, "mooncake");
        assert_eq!(mc.verdict, Level::Ok);
        assert_eq!(
            mc.value,
            "mooncake 0.3.13.post1 (tested) from mooncake-transfer-engine-non-cuda"
        );
        assert_eq!(
            mc.details["distribution"],
            "mooncake-transfer-engine-non-cuda"
        );
    }

    #[test]
    fn a_local_build_of_a_tested_version_is_tested_and_a_prefix_is_not() {
        let t = ["0.34.0".to_string(), "0.33.0".to_string()];
        assert!(is_tested("0.34.0", &t));
        assert!(is_tested("0.34.0+cu128", &t));
        assert!(!is_tested("0.34.01", &t));
        assert!(!is_tested("0.34", &t));
        assert!(!is_tested("0.34.0.post1", &t));
        assert!(!is_tested("0.34.0", &[]));
        let fs = run(answer(
            &[engine("vllm", "vllm", &[("vllm", "0.33.0+cu126")], true)],
            TESTED,
        ));
        assert_eq!(item(&fs, "vllm").verdict, Level::Ok);
        assert_eq!(item(&fs, "vllm").value, "vllm 0.33.0+cu126 (tested)");
    }

    #[test]
    fn without_hostpool_the_tested_versions_are_unknown_and_only_info() {
        let fs = run(answer(
            &[
                engine("vllm", "vllm", &[("vllm", "0.99.0")], true),
                absent("sglang"),
            ],
            "",
        ));
        for f in &fs {
            assert_eq!(f.verdict, Level::Info, "{f:#?}");
            assert_eq!(
                f.remedy.as_deref(),
                Some("run `python -m hostpool doctor` from the engine's environment")
            );
        }
        let vllm = item(&fs, "vllm");
        assert_eq!(
            vllm.value,
            "vllm 0.99.0 (tested versions unknown: hostpool is not installed in this python)"
        );
        assert_eq!(vllm.details["tested"], false);
        assert!(vllm.details["tested_versions"].is_null());
        assert!(
            item(&fs, "python")
                .value
                .ends_with("; hostpool is not installed in this python"),
            "{fs:#?}"
        );
    }

    #[test]
    fn a_hostpool_without_the_list_says_why_and_what_to_install() {
        let fs = run(answer(
            &[engine("vllm", "vllm", &[("vllm", "0.34.0")], true)],
            r#""tested_error": "ModuleNotFoundError: No module named 'hostpool._engines'""#,
        ));
        let vllm = item(&fs, "vllm");
        assert_eq!(vllm.verdict, Level::Info);
        assert!(
            vllm.value.contains(
                "hostpool at /venv/site-packages/hostpool/__init__.py does not list them"
            ) && vllm.value.contains("No module named 'hostpool._engines'"),
            "{vllm:#?}"
        );
        assert!(vllm.remedy.as_deref().unwrap().contains("matches this CLI"));
        assert_eq!(item(&fs, "python").verdict, Level::Info);
    }

    #[test]
    fn an_engine_hostpool_lists_no_version_of_warns() {
        let fs = run(answer(
            &[engine("lmcache", "lmcache", &[("lmcache", "0.5.6")], true)],
            r#""tested": {"vllm": ["0.34.0"]}"#,
        ));
        let f = item(&fs, "lmcache");
        assert_eq!(f.verdict, Level::Warn);
        assert_eq!(
            f.value,
            "lmcache 0.5.6 (not tested: hostpool lists no tested lmcache version)"
        );
        assert_eq!(f.details["tested_versions"], json!([]));
    }

    #[test]
    fn odd_installs_are_named_a_source_tree_a_lost_module_two_wheels() {
        let fs = run(answer(
            &[
                engine("vllm", "vllm", &[], true),
                engine("sglang", "sglang", &[("sglang", "0.5.23")], false),
                engine(
                    "mooncake",
                    "mooncake",
                    &[
                        ("mooncake-transfer-engine", "0.3.13"),
                        ("mooncake-transfer-engine-non-cuda", "0.3.13.post1"),
                    ],
                    true,
                ),
            ],
            TESTED,
        ));
        let vllm = item(&fs, "vllm");
        assert_eq!(vllm.verdict, Level::Info);
        assert_eq!(
            vllm.value,
            "vllm at /venv/site-packages/vllm/__init__.py (version unknown: no vllm \
             distribution is installed)"
        );
        assert!(
            vllm.remedy
                .as_deref()
                .unwrap()
                .contains("0.34.0 and 0.33.0")
        );
        assert!(vllm.details["version"].is_null());

        let sglang = item(&fs, "sglang");
        assert_eq!(sglang.verdict, Level::Warn);
        assert!(sglang.value.contains("its module `sglang` is not found"));
        assert!(
            sglang
                .remedy
                .as_deref()
                .unwrap()
                .contains("pip install --force-reinstall sglang==0.5.23")
        );

        let mc = item(&fs, "mooncake");
        assert_eq!(mc.verdict, Level::Warn);
        assert_eq!(
            mc.value,
            "mooncake: mooncake-transfer-engine 0.3.13 and mooncake-transfer-engine-non-cuda \
             0.3.13.post1 are all installed"
        );
        assert!(mc.remedy.as_deref().unwrap().contains(
            "pip uninstall -y mooncake-transfer-engine mooncake-transfer-engine-non-cuda"
        ));
    }

    #[test]
    fn no_engine_at_all_is_one_info_line_pointing_at_the_engines_python() {
        let fs = run(answer(&ENGINES.map(|(n, ..)| absent(n)), TESTED));
        assert_eq!(fs.len(), 1, "{fs:#?}");
        assert_eq!(fs[0].verdict, Level::Info);
        assert_eq!(
            fs[0].value,
            "/venv/bin/python (from HOSTPOOL_PYTHON), Python 3.11.7: no serving engine \
             installed (looked for vllm, sglang, lmcache, mooncake)"
        );
        assert!(fs[0].remedy.as_deref().unwrap().contains("HOSTPOOL_PYTHON"));
    }

    #[test]
    fn a_python_that_cannot_answer_is_one_info_line_never_a_failure() {
        let missing = run(Outcome::NotStarted(std::io::Error::from(
            std::io::ErrorKind::NotFound,
        )));
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].verdict, Level::Info);
        assert_eq!(
            missing[0].value,
            "not known: /venv/bin/python (from HOSTPOOL_PYTHON) cannot be run (no such program)"
        );
        assert!(
            missing[0]
                .remedy
                .as_deref()
                .unwrap()
                .contains("HOSTPOOL_PYTHON")
        );
        let hung = run(Outcome::TimedOut(python::DEADLINE));
        assert_eq!(hung[0].verdict, Level::Info);
        assert!(hung[0].value.contains("within 20 s"), "{hung:#?}");
        let odd = run(answer(&[], r#""error": "ImportError: x""#));
        assert_eq!(odd.len(), 1);
        assert_eq!(odd[0].verdict, Level::Info);
        assert!(
            odd[0].value.contains("cannot list its packages"),
            "{odd:#?}"
        );
    }

    #[test]
    fn the_script_names_every_engine_and_answers_on_a_real_python() {
        let s = script();
        assert!(!s.contains("@ENGINES@"));
        assert!(s.contains(r#"["mooncake",["mooncake-transfer-engine","mooncake-transfer-engine-non-cuda"],"mooncake"]"#), "{s}");
        // Whatever python3 the PATH has: it answers for the four engines,
        // whichever it has.
        match python::ask::<Answer>(OsStr::new("python3"), &s, python::DEADLINE) {
            Outcome::Answered(a) => {
                assert!(a.error.is_none(), "{a:?}");
                assert_eq!(
                    a.engines
                        .iter()
                        .map(|e| e.name.as_str())
                        .collect::<Vec<_>>(),
                    ["vllm", "sglang", "lmcache", "mooncake"]
                );
                assert!(a.python_version.is_some());
            }
            other => panic!("python3 did not answer: {other:?}"),
        }
    }
}
