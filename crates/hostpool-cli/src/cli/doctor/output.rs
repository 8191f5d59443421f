//! The report: a table for people, or JSON (`--json`).

use std::fmt::Write as _;

use pool_core::PlanReport;
use serde::Serialize;

use super::{Finding, Level};

/// `hostpool doctor --json`.
#[derive(Debug, Serialize)]
pub(super) struct Report<'a> {
    pub(super) findings: &'a [Finding],
    pub(super) pool: Option<&'a PlanReport>,
    pub(super) verdict: Level,
}

/// Widest a column gets before a long cell just pushes the rest right.
const MAX_ITEM: usize = 30;

/// The findings as a table, each remedy below its line, and the verdict.
pub(super) fn human(findings: &[Finding], verdict: Level) -> String {
    let area_w = findings
        .iter()
        .map(|f| f.area.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let item_w = findings
        .iter()
        .map(|f| f.item.chars().count())
        .filter(|&w| w <= MAX_ITEM)
        .max()
        .unwrap_or(4)
        .max(4);
    let mut s = format!(
        "{:<7} {:<area_w$}  {:<item_w$}  VALUE\n",
        "VERDICT", "AREA", "ITEM"
    );
    for f in findings {
        let _ = writeln!(
            s,
            "{:<7} {:<area_w$}  {:<item_w$}  {}",
            f.verdict.name(),
            f.area,
            f.item,
            f.value
        );
        if let (Some(r), false) = (&f.remedy, f.verdict == Level::Ok) {
            let _ = writeln!(s, "{:<7} {:<area_w$}  ↳ {r}", "", "");
        }
    }
    let count = |l: Level| findings.iter().filter(|f| f.verdict == l).count();
    let _ = write!(
        s,
        "verdict: {} ({} fail, {} warn, {} info, {} ok)",
        verdict.name(),
        count(Level::Fail),
        count(Level::Warn),
        count(Level::Info),
        count(Level::Ok)
    );
    s
}
