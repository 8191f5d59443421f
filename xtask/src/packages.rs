//! The system packages the test suite needs: the one list of them, how to
//! tell each is there, and installing the missing ones.
//!
//! `cargo xtask test` (and `ci`, and `packages` alone) calls [`ensure`]
//! before anything else, so a machine that lacks one fails at once, before
//! any build, rather than forty minutes later in the test that needs it:
//!
//! - everything present: one line says so;
//! - something missing, running as root with `apt-get` on the `PATH`:
//!   `apt-get update`, then
//!   `DEBIAN_FRONTEND=noninteractive apt-get install -y <missing>`, then the
//!   same checks again (an error if anything is still missing);
//! - something missing otherwise (not root, or no `apt-get`): an error that
//!   names the missing packages and the command to run.
//!
//! The decision is [`decide`], a pure function of what is present, whether
//! this is root and whether `apt-get` is there.
//!
//! What the suite runs that is not in a minimal Debian image: the Mooncake
//! wheel's `engine.so`, `store.so` and `mooncake_master` link `libibverbs`,
//! `libnuma` and `libcurl` from the system (even for TCP); registrar-rdma's
//! tests also run against the real `libibverbs`; the memlock tests drop
//! `CAP_IPC_LOCK` with `/usr/sbin/capsh`; and every test environment is made
//! with `python3 -m venv`, which on Debian needs `python3-venv` (its
//! `ensurepip`; installing it brings `python3` too). The rest is in every
//! Debian image (`mount`, `umount`, `setpriv`, `unshare`, `ldconfig`, `sh`,
//! `sleep`), or needed to build xtask at all (a C compiler and linker).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::cmd;
use crate::sys;

/// How to tell that a package is installed.
#[derive(Debug)]
pub enum Probe {
    /// A shared library, by soname: in a library directory of this
    /// architecture or in `ldconfig -p`.
    Library(&'static str),
    /// A program on the `PATH`, or at one of these absolute paths.
    Program(&'static str, &'static [&'static str]),
    /// A module that `${PYTHON:-python3}` can import.
    PythonModule(&'static str),
}

/// A Debian package the test suite needs.
#[derive(Debug)]
pub struct Package {
    /// The Debian package name, as `apt-get install` takes it.
    pub name: &'static str,
    /// How to tell it is installed.
    pub probe: Probe,
    /// What needs it, for messages.
    pub why: &'static str,
}

/// Every system package the test suite needs.
pub const PACKAGES: &[Package] = &[
    Package {
        name: "libibverbs1",
        probe: Probe::Library("libibverbs.so.1"),
        why: "the Mooncake wheel links it even for TCP; registrar-rdma's tests run against it",
    },
    Package {
        name: "libnuma1",
        probe: Probe::Library("libnuma.so.1"),
        why: "the Mooncake wheel links it",
    },
    Package {
        name: "libcurl4",
        probe: Probe::Library("libcurl.so.4"),
        why: "the Mooncake wheel links it",
    },
    Package {
        name: "libcap2-bin",
        probe: Probe::Program("capsh", &["/usr/sbin/capsh", "/sbin/capsh"]),
        why: "capsh, for the memlock tests",
    },
    Package {
        name: "python3-venv",
        probe: Probe::PythonModule("ensurepip"),
        why: "python3 -m venv, for the test environments",
    },
];

/// What to do about the packages.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Everything is present.
    Ready,
    /// Install these with `apt-get`, then check again.
    Install(Vec<&'static str>),
    /// Stop: this message names what is missing and how to install it.
    Refuse(String),
}

/// The decision for `packages`, each with whether it is present, given
/// whether this process is root and whether `apt-get` is on the `PATH`.
pub fn decide(packages: &[(&'static Package, bool)], root: bool, apt_get: bool) -> Decision {
    let missing: Vec<&Package> = packages
        .iter()
        .filter(|(_, present)| !present)
        .map(|(package, _)| *package)
        .collect();
    if missing.is_empty() {
        return Decision::Ready;
    }
    if root && apt_get {
        return Decision::Install(missing.iter().map(|p| p.name).collect());
    }
    let names: Vec<&str> = missing.iter().map(|p| p.name).collect();
    let command = format!("sudo apt-get install -y {}", names.join(" "));
    let list: Vec<String> = missing
        .iter()
        .map(|p| format!("  {} ({})", p.name, p.why))
        .collect();
    let how = match (root, apt_get) {
        (false, true) => format!(
            "xtask installs them only as root; run\n\n    {command}\n\nthen run `cargo xtask test` again"
        ),
        (_, false) => format!(
            "this machine has no apt-get: install what these Debian packages provide with its \
             package manager (on Debian or Ubuntu: `{command}`), then run `cargo xtask test` again"
        ),
        (true, true) => unreachable!("root with apt-get installs"),
    };
    Decision::Refuse(format!(
        "the tests need {} system package{} that {} missing:\n{}\n{how}",
        names.len(),
        if names.len() == 1 { "" } else { "s" },
        if names.len() == 1 { "is" } else { "are" },
        list.join("\n"),
    ))
}

/// Checks [`PACKAGES`] and installs the missing ones when it can (see the
/// module docs). `Err` when something is missing and stays missing.
pub fn ensure() -> Result<(), String> {
    let checked = check();
    let root = sys::euid() == 0;
    let apt_get = on_path("apt-get").is_some();
    match decide(&checked, root, apt_get) {
        Decision::Ready => {
            eprintln!("xtask: system packages: all present ({})", names(PACKAGES));
            Ok(())
        }
        Decision::Refuse(message) => Err(message),
        Decision::Install(missing) => {
            install(&missing)?;
            let still: Vec<&str> = check()
                .iter()
                .filter(|(_, present)| !present)
                .map(|(p, _)| p.name)
                .collect();
            if !still.is_empty() {
                return Err(format!(
                    "`apt-get install -y {}` succeeded but {} still missing: the checks in \
                     xtask/src/packages.rs do not find what it installed",
                    missing.join(" "),
                    still.join(", ")
                ));
            }
            eprintln!(
                "xtask: system packages: installed {}; all present",
                missing.join(" ")
            );
            Ok(())
        }
    }
}

/// Every package with whether it is present.
fn check() -> Vec<(&'static Package, bool)> {
    PACKAGES.iter().map(|p| (p, present(&p.probe))).collect()
}

/// `apt-get update`, then `apt-get install -y` of `missing`, without
/// questions.
fn install(missing: &[&str]) -> Result<(), String> {
    eprintln!(
        "xtask: system packages: missing {}; installing them with apt-get",
        missing.join(" ")
    );
    let update = cmd::run_step(Command::new("apt-get").arg("update"), "apt-get update")?;
    if update != 0 {
        return Err(format!(
            "`apt-get update` exited with status {update}: cannot install {}",
            missing.join(" ")
        ));
    }
    let shown = format!(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y {}",
        missing.join(" ")
    );
    let code = cmd::run_step(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y"])
            .args(missing),
        &format!("`{shown}`"),
    )?;
    if code != 0 {
        return Err(format!("`{shown}` exited with status {code}"));
    }
    Ok(())
}

fn names(packages: &[Package]) -> String {
    packages
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `probe` finds its package.
fn present(probe: &Probe) -> bool {
    match probe {
        Probe::Library(soname) => library_present(soname),
        Probe::Program(name, paths) => {
            on_path(name).is_some() || paths.iter().any(|p| is_executable(Path::new(p)))
        }
        Probe::PythonModule(module) => {
            let python = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
            Command::new(python)
                .args(["-c", &format!("import {module}")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        }
    }
}

/// `soname` in a library directory of this architecture, else in
/// `ldconfig -p` (where the dynamic loader finds it).
fn library_present(soname: &str) -> bool {
    let triplet = format!("{}-linux-gnu", std::env::consts::ARCH);
    let dirs = [
        format!("/usr/lib/{triplet}"),
        format!("/lib/{triplet}"),
        "/usr/lib64".to_string(),
        "/lib64".to_string(),
        "/usr/lib".to_string(),
    ];
    if dirs.iter().any(|d| Path::new(d).join(soname).exists()) {
        return true;
    }
    ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|ldconfig| {
            Command::new(ldconfig)
                .arg("-p")
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .ok()
                .filter(|o| o.status.success())
        })
        .is_some_and(|o| ldconfig_lists(&String::from_utf8_lossy(&o.stdout), soname))
}

/// Whether `ldconfig -p`'s output has a line for exactly `soname`.
fn ldconfig_lists(output: &str, soname: &str) -> bool {
    output
        .lines()
        .any(|line| line.split_whitespace().next() == Some(soname))
}

/// `name` in a directory of `PATH`, executable.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(present: &[bool]) -> Vec<(&'static Package, bool)> {
        PACKAGES.iter().zip(present.iter().copied()).collect()
    }

    fn all(present: bool) -> Vec<(&'static Package, bool)> {
        PACKAGES.iter().map(|p| (p, present)).collect()
    }

    /// libibverbs1 and libcap2-bin missing, the rest there.
    fn two_missing() -> Vec<(&'static Package, bool)> {
        PACKAGES
            .iter()
            .map(|p| (p, !matches!(p.name, "libibverbs1" | "libcap2-bin")))
            .collect()
    }

    #[test]
    fn everything_present_is_ready_whoever_runs_it() {
        for root in [false, true] {
            for apt_get in [false, true] {
                assert_eq!(decide(&all(true), root, apt_get), Decision::Ready);
            }
        }
    }

    #[test]
    fn root_with_apt_get_installs_exactly_the_missing_ones() {
        assert_eq!(
            decide(&two_missing(), true, true),
            Decision::Install(vec!["libibverbs1", "libcap2-bin"])
        );
        let every: Vec<&str> = PACKAGES.iter().map(|p| p.name).collect();
        assert_eq!(decide(&all(false), true, true), Decision::Install(every));
    }

    #[test]
    fn not_root_refuses_with_the_sudo_command() {
        let Decision::Refuse(message) = decide(&two_missing(), false, true) else {
            panic!("not root must refuse");
        };
        assert!(
            message.contains("sudo apt-get install -y libibverbs1 libcap2-bin"),
            "{message}"
        );
        assert!(
            message.contains("2 system packages that are missing"),
            "{message}"
        );
        assert!(
            message.contains("libibverbs1 (the Mooncake wheel"),
            "{message}"
        );
        assert!(!message.contains("python3-venv"), "{message}");
    }

    #[test]
    fn without_apt_get_it_refuses_even_as_root() {
        for root in [false, true] {
            let Decision::Refuse(message) = decide(&two_missing(), root, false) else {
                panic!("no apt-get must refuse (root: {root})");
            };
            assert!(message.contains("no apt-get"), "{message}");
            assert!(
                message.contains("sudo apt-get install -y libibverbs1 libcap2-bin"),
                "{message}"
            );
        }
    }

    #[test]
    fn one_missing_package_is_named_in_the_singular() {
        let mut present = vec![true; PACKAGES.len()];
        present[0] = false;
        let Decision::Refuse(message) = decide(&with(&present), false, true) else {
            panic!("must refuse");
        };
        assert!(
            message.contains("1 system package that is missing"),
            "{message}"
        );
        assert!(
            message.contains(&format!("install -y {}\n", PACKAGES[0].name)),
            "{message}"
        );
    }

    #[test]
    fn the_list_names_each_package_once_with_a_probe() {
        let mut names: Vec<&str> = PACKAGES.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PACKAGES.len());
        for name in ["libibverbs1", "libcap2-bin", "python3-venv"] {
            assert!(names.contains(&name), "{name} is in the list");
        }
    }

    #[test]
    fn ldconfig_output_is_matched_by_exact_soname() {
        let output = "3 libs found in cache `/etc/ld.so.cache'\n\
            \tlibibverbs.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libibverbs.so.1\n\
            \tlibcurl-gnutls.so.4 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcurl-gnutls.so.4\n";
        assert!(ldconfig_lists(output, "libibverbs.so.1"));
        assert!(!ldconfig_lists(output, "libcurl.so.4"));
        assert!(!ldconfig_lists(output, "libnuma.so.1"));
    }

    #[test]
    fn the_probes_find_what_every_machine_has() {
        assert!(present(&Probe::Library("libc.so.6")));
        assert!(present(&Probe::Program("sh", &[])));
        assert!(!present(&Probe::Program(
            "xtask-no-such-program",
            &["/nonexistent/x"]
        )));
        assert!(!present(&Probe::Library("libxtask-no-such-library.so.9")));
    }
}
