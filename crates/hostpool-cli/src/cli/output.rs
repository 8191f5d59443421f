//! Human-readable reports (the JSON forms are the serialized structs).

use pool_core::PlanReport;
use pool_core::PoolReport;
use pool_core::format_bytes;

fn rate(bytes: u64, secs: f64) -> String {
    if secs > 0.0 {
        format!("{:.2} GiB/s", bytes as f64 / secs / (1u64 << 30) as f64)
    } else {
        "-".to_string()
    }
}

/// The report of `alloc` without `--json`.
pub fn human_report(r: &PoolReport, status: &str) -> String {
    let mut s = format!(
        "pool {status}\n  backing    {} ({} pages)\n  size       {} asked, {} mapped at {}\n",
        r.backing,
        format_bytes(r.page_size),
        format_bytes(r.logical_bytes),
        format_bytes(r.mapped_bytes),
        r.address,
    );
    let phases = [
        ("map", r.phases.map),
        ("prefault", r.phases.prefault),
        ("barrier", r.phases.barrier),
        ("attach", r.phases.attach),
        ("pin", r.phases.pin),
        ("register", r.phases.register),
        ("teardown", r.phases.teardown),
    ];
    for (name, secs) in phases {
        let Some(secs) = secs else { continue };
        let extra = match (name, &r.prefault) {
            ("prefault", Some(p)) => format!(
                "  {} of {}, {}, {} thread(s){}",
                rate(p.bytes, p.seconds),
                format_bytes(p.bytes),
                p.method,
                p.threads,
                if p.fell_back_to_touch {
                    ", fell back to touch"
                } else {
                    ""
                }
            ),
            _ => String::new(),
        };
        s.push_str(&format!("  {name:<10} {secs:.3} s{extra}\n"));
    }
    let status = serde_json::to_value(r.pin.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    s.push_str(&match (&*r.pin.kind, &r.pin.reason) {
        ("off", _) => "  pin        off\n".to_string(),
        (kind, Some(reason)) => format!("  pin        {kind}: {status}: {reason}\n"),
        (kind, None) => format!("  pin        {kind}: {status}\n"),
    });
    if let Some(sh) = &r.sharing {
        s.push_str(&format!(
            "  sharing    `{}` rank {} of {} ({}), shard {}+{}\n",
            sh.name,
            sh.rank,
            sh.world,
            match sh.role {
                pool_core::shared::Role::Creator => "creator",
                pool_core::shared::Role::Joiner => "joiner",
            },
            sh.shard.offset,
            format_bytes(sh.shard.len)
        ));
    }
    if let Some(n) = &r.numa {
        match n.plan.node {
            Some(node) => s.push_str(&format!(
                "  numa       node {node} ({}): {} of {} sampled pages on it\n",
                n.plan.reason, n.on_node, n.sampled
            )),
            None => s.push_str(&format!("  numa       not bound: {}\n", n.plan.reason)),
        }
        for shard in &n.shards {
            let found: Vec<String> = shard
                .pages
                .iter()
                .map(|(node, count)| match node.as_str() {
                    "not_present" => format!("{count} not in this process's memory"),
                    _ => format!("{count} on node {node}"),
                })
                .collect();
            s.push_str(&format!(
                "  numa       rank {} shard{}: {}\n",
                shard.rank,
                shard
                    .node
                    .map(|n| format!(" (node {n})"))
                    .unwrap_or_default(),
                if found.is_empty() {
                    "nothing sampled".to_string()
                } else {
                    found.join(", ")
                }
            ));
        }
    }
    for reg in &r.registrations {
        s.push_str(&format!("  register   {}\n", reg.kind));
    }
    for issue in &r.teardown_issues {
        s.push_str(&format!("  NOT UNDONE {}: {}\n", issue.step, issue.detail));
    }
    s.trim_end().to_string()
}

/// The plan without `--json`.
pub fn human_plan(p: &PlanReport) -> String {
    if let Some(keeper) = &p.keeper {
        let mut s = format!(
            "plan: lease of kept pool `{keeper}` ({}; the keeper's backing and pages, resident)\n",
            match p.logical_bytes {
                0 => "any size".to_string(),
                n => format!("{} asked", format_bytes(n)),
            }
        );
        s.push_str("why:\n");
        for line in &p.explain {
            s.push_str(&format!("  - {line}\n"));
        }
        return s.trim_end().to_string();
    }
    let mut s = format!(
        "plan: {} pool of {} ({} mapped, {} pages), {} segment(s)\n",
        p.backing,
        format_bytes(p.logical_bytes),
        format_bytes(p.mapped_bytes),
        format_bytes(p.page_size),
        p.segments.len()
    );
    for f in &p.files {
        s.push_str(&format!("  file       {f}\n"));
    }
    s.push_str(&format!(
        "  prefault   {} with {} thread(s) over {}\n",
        p.prefault.method,
        p.prefault.threads,
        format_bytes(p.prefault.bytes)
    ));
    for c in &p.capacity {
        s.push_str(&format!(
            "  capacity   {:<22} need {:>10}  free {:>10}  {:?}  ({})\n",
            c.resource,
            format_bytes(c.need),
            c.free.map_or("unknown".into(), format_bytes),
            c.verdict,
            c.source
        ));
    }
    s.push_str(&format!(
        "  shards     {} of up to {}{}\n",
        p.shards.len(),
        format_bytes(p.shards.iter().map(|e| e.len).max().unwrap_or(0)),
        if p.shards.len() > 1 {
            " (page-aligned, disjoint)"
        } else {
            ""
        }
    ));
    if let Some(chunks) = p.pin_plan["chunks"].as_array() {
        s.push_str(&format!(
            "  pin        {} chunk(s) of up to {} (block {})\n",
            chunks.len(),
            format_bytes(
                chunks
                    .iter()
                    .filter_map(|c| c["len"].as_u64())
                    .max()
                    .unwrap_or(0)
            ),
            format_bytes(p.pin_plan["block"].as_u64().unwrap_or(0))
        ));
    }
    let pr = &p.predicted_seconds;
    s.push_str(&format!(
        "  predicted  prefault {:.1} s{}{}\n",
        pr.prefault,
        pr.pin
            .map(|x| format!(", pin {x:.1} s"))
            .unwrap_or_default(),
        pr.register
            .map(|x| format!(", register {x:.1} s"))
            .unwrap_or_default()
    ));
    s.push_str(if p.fits {
        "  verdict    fits\nwhy:\n"
    } else {
        "  verdict    DOES NOT FIT\nwhy:\n"
    });
    for line in &p.explain {
        s.push_str(&format!("  - {line}\n"));
    }
    s.trim_end().to_string()
}

/// `gc` without `--json`.
pub fn human_gc(r: &pool_core::gc::GcReport) -> String {
    let mut s = format!("scanned {}\n", r.dirs.join(", "));
    for e in &r.removed {
        s.push_str(&format!(
            "  removed  {} ({})\n",
            e.path,
            format_bytes(e.bytes)
        ));
    }
    for e in &r.kept {
        s.push_str(&format!(
            "  kept     {}: {}\n",
            e.path,
            e.reason.as_deref().unwrap_or("")
        ));
    }
    s.push_str(&format!(
        "{} stale file(s) removed, {} freed",
        r.removed.len(),
        format_bytes(r.freed_bytes)
    ));
    s
}
