//! `hostpool doctor`'s findings for this backing: transparent huge pages,
//! which `thp = true` asks for.

use std::path::Path;

use pool_core::format_bytes;
use pool_core::host::thp;
use pool_core::plugin::{DoctorContext, Finding};
use serde_json::json;

/// The hook in this backing's record.
pub(crate) fn findings(_: &DoctorContext<'_>) -> Vec<Finding> {
    settings()
}

/// The `[selected]` word of a THP setting ([`thp::parse_mode`]), or the
/// whole text.
fn selected(text: &str) -> String {
    thp::parse_mode(text).unwrap_or(text.trim()).to_string()
}

/// The THP `enabled` and `defrag` settings and the THP page size.
fn settings() -> Vec<Finding> {
    if !Path::new(thp::DIR).exists() {
        return vec![
            Finding::new("thp", "transparent huge pages", "not in this kernel").info(
                "anonymous pools with thp = true get 4 KiB pages; use the hugetlbfs backing for \
                 huge pages",
            ),
        ];
    }
    let mut out = Vec::new();
    for (name, wanted) in [("enabled", "always or madvise"), ("defrag", "")] {
        let item = format!("THP {name}");
        let path = thp::path(name);
        out.push(match thp::setting(name) {
            Ok(text) => {
                let s = selected(&text);
                let f = Finding::new("thp", item, s.clone()).details(json!({ "value": s }));
                match (name, s.as_str()) {
                    ("enabled", "never") => f.info(format!(
                        "anonymous pools with thp = true get 4 KiB pages; `echo madvise > {}` \
                         ({wanted})",
                        path.display()
                    )),
                    ("defrag", "never") => f.info(format!(
                        "THP faults never compact memory, so a thp pool may get few huge pages; \
                         `echo madvise > {}`",
                        path.display()
                    )),
                    _ => f,
                }
            }
            Err(e) => Finding::new("thp", item, format!("cannot read {}: {e}", path.display()))
                .info("check that /sys is mounted and readable"),
        });
    }
    out.push(match thp::setting("hpage_pmd_size") {
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(b) => Finding::new("thp", "THP page size", format_bytes(b))
                .details(json!({ "hpage_pmd_size": b })),
            Err(_) => Finding::new(
                "thp",
                "THP page size",
                format!("unreadable hpage_pmd_size `{}`", text.trim()),
            )
            .info("anonymous pools with thp = true assume 2 MiB"),
        },
        Err(e) => Finding::new(
            "thp",
            "THP page size",
            format!("cannot read hpage_pmd_size: {e}"),
        )
        .info("anonymous pools with thp = true assume 2 MiB"),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thp_settings_read_the_bracketed_word() {
        assert_eq!(selected("always [madvise] never\n"), "madvise");
        assert_eq!(selected("weird\n"), "weird");
    }
}
