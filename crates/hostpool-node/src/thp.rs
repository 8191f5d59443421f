//! Transparent huge pages: the settings in
//! `/sys/kernel/mm/transparent_hugepage`, read and parsed in one place.
//!
//! A setting file lists every choice and brackets the selected one
//! (`always [madvise] never`); [`parse_mode`] picks it out.

use std::io;
use std::path::PathBuf;

/// Where the kernel keeps the THP settings.
pub const DIR: &str = "/sys/kernel/mm/transparent_hugepage";

/// The file of one setting: `enabled`, `defrag`, `hpage_pmd_size`.
pub fn path(setting: &str) -> PathBuf {
    PathBuf::from(DIR).join(setting)
}

/// The text of one setting file, as the kernel writes it.
///
/// # Errors
/// The read's error (no THP in this kernel, `/sys` not mounted).
pub fn setting(name: &str) -> io::Result<String> {
    std::fs::read_to_string(path(name))
}

/// The selected choice of a setting's text: `always [madvise] never` →
/// `madvise`. `None` when no word is bracketed.
pub fn parse_mode(text: &str) -> Option<&str> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
        .filter(|w| !w.is_empty())
}

/// The system-wide THP mode (`always`, `madvise` or `never`): the selected
/// choice of `enabled`. `None` when it cannot be read or parsed.
pub fn mode() -> Option<String> {
    parse_mode(&setting("enabled").ok()?).map(str::to_string)
}

/// The THP page size in bytes (`hpage_pmd_size`), when it can be read.
pub fn pmd_size() -> Option<u64> {
    setting("hpage_pmd_size").ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bracketed_choice_is_the_mode() {
        assert_eq!(parse_mode("always [madvise] never\n"), Some("madvise"));
        assert_eq!(parse_mode("[always] madvise never"), Some("always"));
        assert_eq!(parse_mode("always madvise [never]\n"), Some("never"));
        assert_eq!(
            parse_mode("always defer defer+madvise [madvise] never\n"),
            Some("madvise")
        );
        assert_eq!(parse_mode("always madvise never\n"), None);
        assert_eq!(parse_mode("[] never"), None);
        assert_eq!(parse_mode(""), None);
    }

    #[test]
    fn this_kernel_has_a_mode_when_it_has_thp() {
        if std::path::Path::new(DIR).exists() {
            let m = mode().unwrap();
            assert!(["always", "madvise", "never"].contains(&m.as_str()), "{m}");
            assert!(pmd_size().unwrap() >= 1 << 16);
        } else {
            assert_eq!(mode(), None);
        }
    }
}
