//! The ratios of each row to memset and to the C reference, and the report
//! as a table.

use super::{GIB, Report, Row, Status, mib};

/// Fill in every measured row's ratios, or say why one is missing.
pub(super) fn ratios(rows: &mut [Row]) {
    // The reference row's rate, or why there is none.
    let reference =
        |rows: &[Row], what: &str, threads: usize, pick: &dyn Fn(&Row) -> bool| match rows
            .iter()
            .find(|r| pick(r))
        {
            Some(r) => r.gb_per_s.ok_or_else(|| {
                format!("no ratio to {what}: its row with {threads} thread(s) was not measured")
            }),
            None => Err(format!(
                "no ratio to {what}: it ran with other thread counts (add --threads {threads})"
            )),
        };
    for i in 0..rows.len() {
        let Some(gbs) = rows[i].gb_per_s else {
            continue;
        };
        let (threads, backing, page) = (rows[i].threads, rows[i].backing, rows[i].page_size_bytes);
        let memset = reference(rows, "memset", threads, &|r| {
            r.method == "memset" && r.threads == threads
        });
        let raw_c = (rows[i].section == "prefault").then(|| {
            reference(rows, "raw-c", threads, &|r| {
                r.method == "raw-c"
                    && r.backing == backing
                    && r.page_size_bytes == page
                    && r.threads == threads
            })
        });
        let row = &mut rows[i];
        match memset {
            Ok(m) => row.ratio_to_memset = Some(gbs / m),
            Err(why) => row.note(why),
        }
        match raw_c {
            Some(Ok(c)) => row.ratio_to_raw_c = Some(gbs / c),
            Some(Err(why)) => row.note(why),
            None => {}
        }
    }
}

/// The report as a table, with the reasons and notes below it.
pub(super) fn table(report: &Report) -> String {
    let env = &report.environment;
    let mut s = format!(
        "hostpool bench: {} per run, median of {}, {} core(s), Linux {}, {}\n\
         GB/s = 1e9 bytes/s. x memset: over memset on resident memory, same threads. \
         x raw C: over one madvise(MADV_POPULATE_WRITE) per thread in C, same memory and threads.\n\n",
        mib(env.size_bytes),
        env.repeat,
        env.cores,
        env.kernel,
        env.date
    );
    s.push_str(&format!(
        "{:<15} {:<14} {:<6} {:>7} {:>9} {:>9} {:>8}  {}\n",
        "method", "backing", "page", "threads", "GB/s", "x memset", "x raw C", "notes"
    ));
    let mut notes: Vec<String> = Vec::new();
    let mut refs = |texts: Vec<String>| -> String {
        texts
            .into_iter()
            .map(|t| {
                let n = match notes.iter().position(|x| *x == t) {
                    Some(n) => n + 1,
                    None => {
                        notes.push(t);
                        notes.len()
                    }
                };
                format!("[{n}]")
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let ratio = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}"));
    let mut section = "";
    for row in &report.rows {
        if row.section != section {
            if !section.is_empty() {
                s.push('\n');
            }
            section = row.section;
        }
        let mut texts = row.reason.iter().cloned().collect::<Vec<_>>();
        texts.extend(row.notes.iter().cloned());
        let figure = match (row.status, row.gb_per_s) {
            (Status::Measured, Some(g)) => format!("{g:.2}"),
            (Status::NoOp, _) => "no-op".into(),
            (Status::Skipped, _) => "skipped".into(),
            _ => "FAILED".into(),
        };
        let threads = match row.threads_used {
            Some(u) if u != row.threads => format!("{}({u})", row.threads),
            _ => row.threads.to_string(),
        };
        if row.method == "mlock"
            && let Some(secs) = row.seconds
        {
            texts.push(format!(
                "{:.1} ms per GiB",
                secs * 1e3 / (row.size_bytes as f64 / GIB as f64)
            ));
        }
        s.push_str(&format!(
            "{:<15} {:<14} {:<6} {:>7} {:>9} {:>9} {:>8}  {}\n",
            row.method,
            row.backing,
            row.page.replace(' ', ""),
            threads,
            figure,
            ratio(row.ratio_to_memset),
            ratio(row.ratio_to_raw_c),
            refs(texts)
        ));
    }
    if !notes.is_empty() {
        s.push('\n');
        for (n, t) in notes.iter().enumerate() {
            s.push_str(&format!("[{}] {t}\n", n + 1));
        }
    }
    if !env.warm_up_seconds.is_empty() {
        s.push_str("\nwarm-up (build, fill, release once): ");
        s.push_str(
            &env.warm_up_seconds
                .iter()
                .map(|(k, v)| format!("{k} {v:.2} s"))
                .collect::<Vec<_>>()
                .join(", "),
        );
        s.push('\n');
    }
    s.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bench_support::benchkit::{ANON_4K, Memory, SHM_4K};

    fn row(method: &'static str, memory: &Memory, threads: usize, secs: f64) -> Row {
        let mut r = Row::new("prefault", method, memory, threads, GIB);
        if method == "memset" {
            r.section = "limit";
        }
        r.seconds_each.push(secs);
        r.finish();
        r
    }

    #[test]
    fn ratios_pair_same_memory_and_threads() {
        let mut rows = vec![
            row("memset", &ANON_4K, 2, 0.1),
            row("raw-c", &ANON_4K, 2, 0.4),
            row("populate-write", &ANON_4K, 2, 0.5),
            row("raw-c", &SHM_4K, 2, 1.0),
        ];
        ratios(&mut rows);
        let pw = &rows[2];
        assert!((pw.ratio_to_memset.unwrap() - 0.2).abs() < 1e-9);
        assert!((pw.ratio_to_raw_c.unwrap() - 0.8).abs() < 1e-9);
        assert_eq!(rows[0].ratio_to_memset, Some(1.0));
        assert_eq!(rows[0].ratio_to_raw_c, None);
        assert!((rows[3].ratio_to_raw_c.unwrap() - 1.0).abs() < 1e-9);
    }
}
