//! What a process of the node is doing and holds: another process's state
//! from `/proc/PID/stat` (a peer that is late says why: stopped, stuck in
//! the kernel, or running), and this process's memory figures from
//! `/proc/self/status` ([`status_field`]: `VmLck`, `VmPin`).

/// Where a process stands, as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcState {
    /// Stopped by a signal (`T`) or traced by a debugger (`t`).
    Stopped,
    /// In uninterruptible sleep (`D`): stuck in the kernel.
    Uninterruptible,
    /// Running or sleeping normally.
    Alive,
    /// A zombie (`Z`) or dead (`X`): it has exited.
    Exited,
}

/// The state of process `pid`; `None` when there is no such process (or
/// `/proc` cannot tell).
pub fn state(pid: u32) -> Option<ProcState> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_state(&stat)
}

/// The state field of a `/proc/PID/stat` line: the first field after the
/// command name, whose parentheses may enclose spaces and parentheses.
fn parse_state(stat: &str) -> Option<ProcState> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(match rest.trim_start().chars().next()? {
        'T' | 't' => ProcState::Stopped,
        'D' => ProcState::Uninterruptible,
        'Z' | 'X' | 'x' => ProcState::Exited,
        _ => ProcState::Alive,
    })
}

/// Why process `pid` is late, in words for an error message.
pub fn why_late(pid: u32) -> String {
    match state(pid) {
        Some(ProcState::Stopped) => {
            format!("it is stopped (SIGSTOP, or a debugger): `kill -CONT {pid}` resumes it")
        }
        Some(ProcState::Uninterruptible) => {
            "it is stuck in the kernel (state D, often on memory or I/O)".to_string()
        }
        Some(ProcState::Exited) => "it has exited".to_string(),
        Some(ProcState::Alive) => "it is running (still working, or hung)".to_string(),
        None => "it is gone".to_string(),
    }
}

/// A memory figure of this process from `/proc/self/status`, in bytes:
/// `status_field("VmLck")` (bytes locked by `mlock`), `"VmPin"` (bytes
/// pinned, e.g. by RDMA registrations), `"VmRSS"`. `None` when the file
/// cannot be read or has no such field.
pub fn status_field(field: &str) -> Option<u64> {
    kb_field(&std::fs::read_to_string("/proc/self/status").ok()?, field)
}

/// Bytes of this process's memory in `[addr, addr + len)` that `field` of
/// `/proc/self/smaps` counts (`AnonHugePages`: backed by transparent huge
/// pages), summed over the mappings inside the range. `None` when smaps
/// cannot be read.
pub fn smaps_bytes(addr: usize, len: u64, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps").ok()?;
    Some(smaps_sum(&text, addr as u64, len, field))
}

fn smaps_sum(text: &str, addr: u64, len: u64, field: &str) -> u64 {
    let end = addr.saturating_add(len);
    let mut inside = false;
    let mut total = 0u64;
    for line in text.lines() {
        let header = line
            .split_once(' ')
            .and_then(|(range, _)| range.split_once('-'))
            .and_then(|(a, b)| {
                Some((
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                ))
            });
        if let Some((a, b)) = header {
            inside = a >= addr && b <= end;
            continue;
        }
        if inside && let Some(bytes) = kb_field(line, field) {
            total = total.saturating_add(bytes);
        }
    }
    total
}

/// A `Name:   1234 kB` line of a `/proc/PID/status` or `/proc/meminfo`
/// text, in bytes (a figure without a unit as it is).
pub(crate) fn kb_field(text: &str, field: &str) -> Option<u64> {
    let rest = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    let mut words = rest.split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_figures_are_summed_over_the_mappings_inside_the_range() {
        let text = "7f0000000000-7f0000200000 rw-p 00000000 00:00 0\nSize: 2048 kB\nAnonHugePages: \
                    2048 kB\n7f0000200000-7f0000400000 rw-p 00000000 00:00 0\nAnonHugePages: 0 \
                    kB\n7f0000400000-7f0000600000 rw-p 00000000 00:00 0\nAnonHugePages: 2048 kB\n";
        let base = 0x7f00_0000_0000;
        assert_eq!(smaps_sum(text, base, 4 << 20, "AnonHugePages"), 2 << 20);
        assert_eq!(smaps_sum(text, base, 6 << 20, "AnonHugePages"), 4 << 20);
        assert_eq!(
            smaps_sum(text, base + (2 << 20), 2 << 20, "AnonHugePages"),
            0
        );
        let mine = vec![0u8; 1 << 20];
        let at = mine.as_ptr() as usize & !4095;
        assert!(smaps_bytes(at, 4096, "Rss").is_some());
    }

    #[test]
    fn status_fields_are_read_in_bytes() {
        let text = "Name:\tcat\nVmLck:\t       8 kB\nVmPin:\t       0 kB\nVmLckX:\t 1 kB\n\
                    Threads:\t1\nVmBad:\t 3 MB\n";
        assert_eq!(kb_field(text, "VmLck"), Some(8192));
        assert_eq!(kb_field(text, "VmPin"), Some(0));
        assert_eq!(kb_field(text, "Threads"), Some(1));
        assert_eq!(kb_field(text, "VmBad"), None);
        assert_eq!(kb_field(text, "VmLc"), None);
        assert_eq!(kb_field(text, "VmSwap"), None);
        assert_eq!(kb_field(text, "Name"), None);
        assert!(status_field("VmRSS").unwrap() > 0);
        assert!(status_field("VmLck").is_some());
        assert_eq!(status_field("NoSuchField"), None);
    }

    #[test]
    fn the_state_is_read_after_the_last_parenthesis() {
        assert_eq!(parse_state("42 (a) b) T 1 2 3"), Some(ProcState::Stopped));
        assert_eq!(parse_state("42 (x) D 1"), Some(ProcState::Uninterruptible));
        assert_eq!(parse_state("42 (x) S 1"), Some(ProcState::Alive));
        assert_eq!(parse_state("42 (x) Z 1"), Some(ProcState::Exited));
        assert_eq!(parse_state("garbage"), None);
    }

    #[test]
    fn this_process_is_alive_and_a_missing_one_is_gone() {
        assert_eq!(state(std::process::id()), Some(ProcState::Alive));
        assert_eq!(state(u32::MAX), None);
        assert_eq!(why_late(u32::MAX), "it is gone");
    }
}
