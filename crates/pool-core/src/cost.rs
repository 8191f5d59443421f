//! Predicted cost per phase, for `hostpool plan`: rough figures from rates
//! measured on this project's CI machine kind (see the README's Benchmarks
//! section), so that an operator sees what a 400 GiB pool will cost before
//! paying it. `hostpool bench` measures the rates of the node at hand.

use serde::Serialize;

use crate::layout::MappedSize;

/// Prefault GB/s (10^9 bytes) of one thread, by backing and page size.
pub fn prefault_gbps_per_thread(backing: &str, page: u64) -> f64 {
    match (backing, page) {
        (_, p) if p >= 1 << 30 => 25.0,
        (_, p) if p >= 2 << 20 => 11.0,
        ("shm-segmented", _) => 1.6,
        _ => 3.1,
    }
}

/// No prefault goes faster than this in total: memory bandwidth for zeroing.
pub const PREFAULT_CEILING_GBPS: f64 = 50.0;

/// `cuMemHostRegister` (and `ibv_reg_mr`) cost per page: vLLM #51080
/// registered 511.96 GiB of 4 KiB pages in 55.4 s on an H200 host, about
/// 0.41 µs per page. The cost is per page, which is why huge pages win.
pub const REGISTER_SECONDS_PER_PAGE: f64 = 55.4 / (511.96 * 262_144.0);

/// `mlock` of resident 4 KiB pages: about 0.13 s/GiB on the CI machines.
pub const MLOCK_SECONDS_PER_GIB_4K: f64 = 0.13;

/// The prediction.
#[derive(Debug, Clone, Serialize)]
pub struct Predicted {
    /// Prefault seconds (this rank's share for a shared pool).
    pub prefault: f64,
    /// Pinning seconds, when a pinner is asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin: Option<f64>,
    /// Registration seconds per registrar and device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub register: Option<f64>,
    /// Where the rates come from.
    pub basis: &'static str,
}

/// Predict the phases of a pool.
pub fn predict(
    backing: &str,
    size: MappedSize,
    prefault_bytes: u64,
    threads: usize,
    pinner: Option<&str>,
    registrars: usize,
) -> Predicted {
    let page = size.page().get();
    let gbps = (prefault_gbps_per_thread(backing, page) * threads.max(1) as f64)
        .min(PREFAULT_CEILING_GBPS);
    let pages = size.pages() as f64;
    let pin = pinner.map(|p| match p {
        "mlock" if page > 4096 => 0.0,
        "mlock" => MLOCK_SECONDS_PER_GIB_4K * size.mapped() as f64 / f64::from(1u32 << 30),
        _ => REGISTER_SECONDS_PER_PAGE * pages,
    });
    Predicted {
        prefault: prefault_bytes as f64 / (gbps * 1e9),
        pin,
        register: (registrars > 0).then_some(REGISTER_SECONDS_PER_PAGE * pages * registrars as f64),
        basis: "rough: rates measured on the 2-core CI machines and vLLM #51080 (registration, per page); \
                run `hostpool bench` for this node's",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{PageSize, round_to_page};

    #[test]
    fn huge_pages_predict_faster_prefault_and_registration() {
        let small = round_to_page(400 << 30, PageSize::BASE_4K).unwrap();
        let huge = round_to_page(400 << 30, PageSize::HUGE_1G).unwrap();
        let a = predict("hugetlbfs", small, small.mapped(), 16, Some("cuda"), 1);
        let b = predict("hugetlbfs", huge, huge.mapped(), 16, Some("cuda"), 1);
        assert!(b.prefault < a.prefault);
        assert!(
            b.pin.unwrap() * 1000.0 < a.pin.unwrap(),
            "registration is per page"
        );
        // 400 GiB of 4 KiB pages: about 43 s to register, as vLLM measured.
        assert!((a.pin.unwrap() - 43.3).abs() < 1.0, "{:?}", a.pin);
        let m = predict("anon", small, small.mapped(), 2, Some("mlock"), 0);
        assert!((m.pin.unwrap() - 52.0).abs() < 0.1 && m.register.is_none());
        let h = predict("hugetlbfs", huge, huge.mapped(), 2, Some("mlock"), 0);
        assert_eq!(h.pin, Some(0.0), "mlock of huge pages is a no-op");
    }
}
