//! NUMA topology: which nodes this host has online, the CPUs of each, and
//! the names sysfs gives PCI devices (a GPU's or a NIC's node is read by
//! the core, which words its errors). Placing memory on a node, and
//! checking where it landed, are the core's (`pool_core::host::numa`).

use std::io;
use std::path::Path;

/// Where the kernel lists the online nodes, in [`parse_node_list`]'s format.
pub const ONLINE_NODES_PATH: &str = "/sys/devices/system/node/online";

/// The largest node number [`parse_node_list`] accepts; the kernel's own
/// limit (`MAX_NUMNODES`) is at most 1024.
pub const MAX_NODE_ID: u32 = 65_535;

/// Online NUMA nodes, sorted, from [`ONLINE_NODES_PATH`] (for example
/// `"0-3,5"`). A host without that file (a kernel without NUMA) has node 0
/// only; an unreadable or garbled file is logged and also read as node 0.
pub fn online_nodes() -> Vec<u32> {
    nodes_from(&sysfs("devices/system/node/online"))
}

/// A path under sysfs (moved by a test build's `HOSTPOOL_TEST_SYSFS_ROOT`,
/// see [`crate::sysfs_root`]).
fn sysfs(rel: &str) -> std::path::PathBuf {
    crate::sysfs_root().join(rel)
}

/// A PCI address as sysfs names its device directory,
/// `domain:bus:device.function` in lower-case hex with a domain of at least
/// four digits (`0000:3b:00.0`; Grace and some VMs have wider domains,
/// `00000009:01:00.0` reads as `0009:01:00.0`). The CUDA driver writes
/// `0000:3B:00.0` or `00000000:3B:00.0`; both give `0000:3b:00.0`.
///
/// # Errors
/// A message naming the address when it is not of that form.
pub fn normalize_pci_address(address: &str) -> std::result::Result<String, String> {
    let bad = || {
        format!(
            "PCI address {address:?} is not of the form domain:bus:device.function \
             (such as 0000:3b:00.0)"
        )
    };
    let a = address.trim();
    let (domain, rest) = a.split_once(':').ok_or_else(bad)?;
    let (bus, rest) = rest.split_once(':').ok_or_else(bad)?;
    let (device, function) = rest.split_once('.').ok_or_else(bad)?;
    let hex = |s: &str, max_digits: usize| -> std::result::Result<u32, String> {
        if s.is_empty() || s.len() > max_digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        u32::from_str_radix(s, 16).map_err(|_| bad())
    };
    let (domain, bus, device, function) = (
        hex(domain, 8)?,
        hex(bus, 2)?,
        hex(device, 2)?,
        hex(function, 1)?,
    );
    if device > 0x1f || function > 7 {
        return Err(bad());
    }
    Ok(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// The CPUs of a node in the kernel's list format, from
/// `/sys/devices/system/node/node<N>/cpulist` (`None` when sysfs does not
/// say: a kernel without NUMA, a node without CPUs gives `Some("")`).
pub fn node_cpus(node: u32) -> Option<String> {
    std::fs::read_to_string(sysfs(&format!("devices/system/node/node{node}/cpulist")))
        .ok()
        .map(|s| s.trim().to_string())
}

fn nodes_from(path: &Path) -> Vec<u32> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return vec![0],
        Err(e) => {
            tracing::warn!("cannot read {}: {e}; assuming node 0 only", path.display());
            return vec![0];
        }
    };
    match parse_node_list(&text) {
        Ok(nodes) if !nodes.is_empty() => nodes,
        Ok(_) => {
            tracing::warn!("{} lists no node; assuming node 0 only", path.display());
            vec![0]
        }
        Err(e) => {
            tracing::warn!("{}: {e}; assuming node 0 only", path.display());
            vec![0]
        }
    }
}

/// Parse the kernel's node list format: comma-separated node numbers and
/// inclusive ranges (`"0"`, `"0-3,5"`), with surrounding whitespace ignored.
/// An empty list gives no nodes. The result is sorted, without duplicates.
///
/// # Errors
/// A message naming the bad item: anything but digits and one `-`, an empty
/// item (`"0,,1"`), a reversed range (`"3-1"`), or a node above
/// [`MAX_NODE_ID`].
pub fn parse_node_list(s: &str) -> std::result::Result<Vec<u32>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(Vec::new());
    }
    let number = |item: &str, n: &str| -> std::result::Result<u32, String> {
        let bad = || {
            format!(
                "bad NUMA node list {s:?}: {item:?} is not a node number or a range such as 0-3"
            )
        };
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        match n.parse::<u32>() {
            Ok(v) if v <= MAX_NODE_ID => Ok(v),
            _ => Err(format!(
                "bad NUMA node list {s:?}: node {n} is above the largest node number, {MAX_NODE_ID}"
            )),
        }
    };
    let mut nodes = Vec::new();
    for item in s.split(',') {
        let item = item.trim();
        match item.split_once('-') {
            None => nodes.push(number(item, item)?),
            Some((lo, hi)) => {
                let (lo, hi) = (number(item, lo)?, number(item, hi)?);
                if lo > hi {
                    return Err(format!(
                        "bad NUMA node list {s:?}: range {item:?} runs backwards; write {hi}-{lo}"
                    ));
                }
                nodes.extend(lo..=hi);
            }
        }
    }
    nodes.sort_unstable();
    nodes.dedup();
    Ok(nodes)
}

/// Write nodes in the kernel's list format (`[0, 1, 2, 3, 5]` gives
/// `"0-3,5"`); the inverse of [`parse_node_list`]. No nodes give `""`.
pub fn format_node_list(nodes: &[u32]) -> String {
    let mut nodes = nodes.to_vec();
    nodes.sort_unstable();
    nodes.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < nodes.len() {
        let start = nodes[i];
        while i + 1 < nodes.len() && nodes[i + 1] == nodes[i] + 1 {
            i += 1;
        }
        let end = nodes[i];
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_are_written_as_sysfs_names_them() {
        for (given, want) in [
            ("0000:3B:00.0", "0000:3b:00.0"),
            ("00000000:3B:00.0", "0000:3b:00.0"),
            ("00000009:01:00.0", "0009:01:00.0"),
            ("0001:c1:1f.7", "0001:c1:1f.7"),
            (" 0000:bc:00.1\n", "0000:bc:00.1"),
            ("10000:00:00.0", "10000:00:00.0"),
        ] {
            assert_eq!(normalize_pci_address(given).unwrap(), want, "{given:?}");
        }
        for bad in [
            "",
            "3b:00.0",
            "0000:3b:00",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "0000:3bb:00.0",
            "000000000:3b:00.0",
            "0000:3g:00.0",
            "0000:3b:00.0.1",
        ] {
            let e = normalize_pci_address(bad).unwrap_err();
            assert!(e.contains("domain:bus:device.function"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn parses_the_kernels_node_lists() {
        assert_eq!(parse_node_list("0"), Ok(vec![0]));
        assert_eq!(parse_node_list(" 0\n"), Ok(vec![0]));
        assert_eq!(parse_node_list("0-3,5"), Ok(vec![0, 1, 2, 3, 5]));
        assert_eq!(parse_node_list("0-3,5\n"), Ok(vec![0, 1, 2, 3, 5]));
        assert_eq!(parse_node_list("2,0-1"), Ok(vec![0, 1, 2]));
        assert_eq!(parse_node_list("0-2,1-3"), Ok(vec![0, 1, 2, 3]));
        assert_eq!(parse_node_list("4-4"), Ok(vec![4]));
        assert_eq!(parse_node_list(""), Ok(vec![]));
        assert_eq!(parse_node_list(" \n"), Ok(vec![]));
        assert_eq!(parse_node_list("65535"), Ok(vec![65535]));
    }

    #[test]
    fn rejects_garbage_node_lists() {
        for bad in [
            "x",
            "0,",
            ",0",
            "0,,1",
            "-1",
            "1-",
            "0-1-2",
            "+1",
            "0x1",
            "1 2",
            "0;1",
            "1.5",
            "65536",
            "99999999999",
        ] {
            let e = parse_node_list(bad).unwrap_err();
            assert!(e.contains("bad NUMA node list"), "{bad:?}: {e}");
        }
        let e = parse_node_list("3-1").unwrap_err();
        assert!(e.contains("backwards") && e.contains("1-3"), "{e}");
    }

    #[test]
    fn formats_node_lists_as_the_kernel_does() {
        assert_eq!(format_node_list(&[]), "");
        assert_eq!(format_node_list(&[0]), "0");
        assert_eq!(format_node_list(&[0, 1]), "0-1");
        assert_eq!(format_node_list(&[5, 0, 1, 2, 3, 3]), "0-3,5");
        assert_eq!(format_node_list(&[1, 3, 5]), "1,3,5");
        for text in ["0", "0-3,5", "0-1,4-7,9"] {
            assert_eq!(format_node_list(&parse_node_list(text).unwrap()), text);
        }
    }

    #[test]
    fn online_nodes_include_node_0() {
        let nodes = online_nodes();
        assert!(nodes.contains(&0), "{nodes:?}");
        assert!(nodes.is_sorted());
    }

    #[test]
    fn missing_or_garbled_node_files_mean_node_0() {
        let dir = std::env::temp_dir().join(format!("numa-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(nodes_from(&dir.join("absent")), vec![0]);
        let file = dir.join("online");
        std::fs::write(&file, "0-1,3\n").unwrap();
        assert_eq!(nodes_from(&file), vec![0, 1, 3]);
        std::fs::write(&file, "garbage\n").unwrap();
        assert_eq!(nodes_from(&file), vec![0]);
        std::fs::write(&file, "\n").unwrap();
        assert_eq!(nodes_from(&file), vec![0]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
