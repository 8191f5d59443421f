//! The state file of `cargo xtask hugepages up` / `down`
//! ([`STATE_FILE`]): `KEY=VALUE` lines with the session dir, the original
//! counters of each pool and the `hostpool*` files that were in /dev/shm.

use std::fmt::Write as _;
use std::fs;
use std::io::{ErrorKind, Write as _};
use std::path::{Path, PathBuf};

use super::restore::Footer;
use super::{DIR_PREFIX, Pool, STATE_FILE, Session, Setup};
use crate::hugepages::{Counters, PageSize};
use crate::signals;

impl Session {
    /// Writes the recorded state to `path` (which must not exist yet); from
    /// then on restoring also deletes it.
    pub(super) fn persist(&mut self, path: &Path) -> Result<(), String> {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|err| format!("could not create state file {}: {err}", path.display()))?;
        self.state_file = Some(path.to_path_buf());
        file.write_all(self.state_text().as_bytes())
            .map_err(|err| format!("could not write state file {}: {err}", path.display()))
    }

    /// The state file's content.
    pub(super) fn state_text(&self) -> String {
        let mut text = String::from(
            "# hostpool xtask huge page state; restore with `cargo xtask hugepages down`\n",
        );
        let _ = writeln!(text, "dir={}", self.dir.display());
        for pool in &self.pools {
            let tag = pool.size.tag();
            let _ = writeln!(text, "{tag}.nr_hugepages={}", pool.original.nr);
            let _ = writeln!(
                text,
                "{tag}.nr_overcommit_hugepages={}",
                pool.original.overcommit
            );
            let _ = writeln!(text, "{tag}.free_hugepages={}", pool.original.free);
            let _ = writeln!(text, "{tag}.surplus_hugepages={}", pool.original.surplus);
        }
        for name in &self.shm_before {
            let _ = writeln!(text, "shm_before={name}");
        }
        text
    }

    /// Rebuilds an armed guard from a state file written by [`Self::persist`].
    pub fn from_state(path: &Path) -> Result<Self, String> {
        let text = fs::read_to_string(path)
            .map_err(|err| format!("could not read state file {}: {err}", path.display()))?;
        let mut session = Session {
            pools: Vec::new(),
            dir: PathBuf::new(),
            dir_owned: true,
            shm_before: Vec::new(),
            state_file: None,
            armed: false,
        };
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            session.apply_state_line(line).map_err(|err| {
                format!(
                    "{}:{}: {err}; fix the file, or restore by hand and delete it",
                    path.display(),
                    number + 1
                )
            })?;
        }
        let dir = session.dir.to_string_lossy();
        let suffix = dir.strip_prefix(DIR_PREFIX).unwrap_or("/");
        if suffix.is_empty() || suffix.contains('/') || suffix.contains("..") {
            return Err(format!(
                "{}: `dir` must name a {DIR_PREFIX}<id> directory, got `{dir}`",
                path.display()
            ));
        }
        session.state_file = Some(path.to_path_buf());
        session.armed = true;
        Ok(session)
    }

    /// Applies one non-comment line of the state file.
    fn apply_state_line(&mut self, line: &str) -> Result<(), String> {
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| format!("expected KEY=VALUE, got {line:?}"))?;
        match key {
            "dir" => self.dir = PathBuf::from(value),
            "shm_before" => self.shm_before.push(value.to_string()),
            _ => self.apply_counter(key, value)?,
        }
        Ok(())
    }

    /// Applies a `<tag>.<counter>=<value>` line.
    fn apply_counter(&mut self, key: &str, value: &str) -> Result<(), String> {
        let unknown = || format!("unknown key {key:?}");
        let (tag, counter) = key.split_once('.').ok_or_else(unknown)?;
        let size = PageSize::from_tag(tag).ok_or_else(unknown)?;
        let value: u64 = value
            .parse()
            .map_err(|err| format!("{key}: {value:?} is not a number: {err}"))?;
        if !self.pools.iter().any(|pool| pool.size == size) {
            self.pools.push(Pool {
                size,
                original: Counters::default(),
                obtained: 0,
                free: 0,
                mount: None,
            });
        }
        let pool = self
            .pools
            .iter_mut()
            .find(|pool| pool.size == size)
            .ok_or_else(unknown)?;
        match counter {
            "nr_hugepages" => pool.original.nr = value,
            "nr_overcommit_hugepages" => pool.original.overcommit = value,
            "free_hugepages" => pool.original.free = value,
            "surplus_hugepages" => pool.original.surplus = value,
            _ => return Err(unknown()),
        }
        Ok(())
    }

    /// Deletes the state file once its state has been restored.
    pub(super) fn remove_state_file(&self, footer: &mut Footer) {
        let Some(path) = &self.state_file else {
            return;
        };
        match fs::remove_file(path) {
            Ok(()) => footer.done.push(format!("removed {}", path.display())),
            Err(err) if err.kind() == ErrorKind::NotFound => {}
            Err(err) => footer
                .warnings
                .push(format!("could not remove {}: {err}", path.display())),
        }
    }
}

/// `cargo xtask hugepages up`.
pub fn hugepages_up() -> Result<i32, String> {
    let state = Path::new(STATE_FILE);
    if state.exists() {
        return Err(format!(
            "huge pages are already set up by an earlier `cargo xtask hugepages up` \
             ({STATE_FILE} exists); run `cargo xtask hugepages down` first"
        ));
    }
    let session = match Session::start(Some(state))? {
        Setup::Ready(session) => session,
        Setup::Unavailable(reason) => {
            return Err(format!("huge pages could not be reserved: {reason}"));
        }
    };
    session.print_header();
    if let Some(sig) = signals::received() {
        drop(session);
        return Ok(signals::exit_code_for(sig));
    }
    for (name, value) in session.env() {
        println!("export {name}={value}");
    }
    eprintln!(
        "xtask: setup kept; state in {STATE_FILE}; undo with `cargo xtask hugepages down`\n\
         xtask: (the export lines above went to stdout: eval \"$(cargo xtask hugepages up)\")"
    );
    session.keep();
    Ok(0)
}

/// `cargo xtask hugepages down`.
pub fn hugepages_down() -> Result<i32, String> {
    let state = Path::new(STATE_FILE);
    if !state.exists() {
        eprintln!(
            "xtask: nothing to restore: {STATE_FILE} does not exist (no `hugepages up` active)"
        );
        return Ok(0);
    }
    let session = Session::from_state(state)?;
    eprintln!("xtask: restoring the state recorded in {STATE_FILE}");
    let clean = session.finish();
    Ok(i32::from(!clean))
}
