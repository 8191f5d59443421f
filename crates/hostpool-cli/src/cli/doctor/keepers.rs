//! `keepers`: the kept pools this network namespace serves (`hostpool
//! keep`), each asked for its status: size, page size, backing, who leases
//! it. A keeper socket that does not answer is a warning: its engines
//! cannot attach.

use pool_core::format_bytes;

use super::Finding;

/// One finding per kept pool; none when no keeper runs.
pub(super) fn findings() -> Vec<Finding> {
    hostpool_keeper::list()
        .into_iter()
        .map(|name| match hostpool_keeper::status(&name) {
            Ok(s) => {
                let tenants = s["tenants"].as_array().cloned().unwrap_or_default();
                let lease = match (s["lease"].as_object(), tenants.len()) {
                    // Several engines at once: each, by engine and pid.
                    (Some(_), n) if n > 1 => format!(
                        "leased by {n} engines ({})",
                        tenants
                            .iter()
                            .map(|t| match t["engine"].as_str().unwrap_or("") {
                                "" => format!("pid {}", t["pids"][0]),
                                engine => format!("`{engine}` pid {}", t["pids"][0]),
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    (Some(l), _) => format!(
                        "leased by pid {} since {}",
                        l["pid"],
                        l["since"].as_str().unwrap_or("?")
                    ),
                    (None, _) => s["state"].as_str().unwrap_or("?").to_string(),
                };
                let value = format!(
                    "{} ({} pages, {}), content {}, generation {}, {lease}; keeper pid {}",
                    format_bytes(s["size"].as_u64().unwrap_or(0)),
                    format_bytes(s["page_size"].as_u64().unwrap_or(0)),
                    s["backing"].as_str().unwrap_or("?"),
                    s["content"].as_str().unwrap_or("?"),
                    s["generation"],
                    s["pid"],
                );
                let f = Finding::new("keepers", name, value);
                match s["broken"].as_str() {
                    Some(why) => f.warn(format!(
                        "{why}; restart the keeper (`kill -TERM {}`, then start it again)",
                        s["pid"]
                    )),
                    None => f,
                }
                .details(s)
            }
            Err(e) => Finding::new("keepers", name, "does not answer").warn(format!(
                "{}; a process holds the keeper's socket but does not serve it: find it with `ss \
                 -xlp | grep hostpool-keep`",
                e.chain_message()
            )),
        })
        .collect()
}
