//! The names Kubernetes gives huge page sizes and quantities.

/// The name Kubernetes uses for a page size in `hugepages-<name>` resources
/// and `HugePages-<name>` emptyDir media: `"2Mi"`, `"1Gi"`, `"64Ki"` (a
/// canonical binary quantity).
pub fn k8s_size_name(page_size: u64) -> String {
    k8s_quantity(page_size)
}

/// A canonical Kubernetes binary quantity: `4Gi`, `2Mi`, or plain bytes.
pub(super) fn k8s_quantity(bytes: u64) -> String {
    for (shift, suffix) in [
        (60, "Ei"),
        (50, "Pi"),
        (40, "Ti"),
        (30, "Gi"),
        (20, "Mi"),
        (10, "Ki"),
    ] {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::testing::{G1, M2};

    #[test]
    fn names_of_page_sizes() {
        assert_eq!(k8s_size_name(M2), "2Mi");
        assert_eq!(k8s_size_name(G1), "1Gi");
        assert_eq!(k8s_size_name(64 << 10), "64Ki");
        assert_eq!(k8s_quantity(384 << 30), "384Gi");
        assert_eq!(k8s_quantity(3 << 29), "1536Mi");
        assert_eq!(k8s_quantity(1 << 40), "1Ti");
        assert_eq!(k8s_quantity(1000), "1000");
        assert_eq!(k8s_quantity(0), "0");
    }
}
