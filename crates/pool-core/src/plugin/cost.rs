//! Predicted cost per phase, for `hostpool plan`: rough figures from rates
//! measured on this project's CI machine kind (see the Benchmarks section of
//! `docs/measurements.md`), so that an operator sees what a 400 GiB pool will cost before
//! paying it. `hostpool bench` measures the rates of the node at hand.

use serde::Serialize;

use crate::layout::MappedSize;
use crate::plugin::{PinCost, PrefaultCost};

/// No prefault goes faster than this in total: memory bandwidth for zeroing.
pub const PREFAULT_CEILING_GBPS: f64 = 50.0;

/// `cuMemHostRegister` (and `ibv_reg_mr`) cost per page: vLLM #51080
/// registered 511.96 GiB of 4 KiB pages in 55.4 s on an H200 host, about
/// 0.41 µs per page. The cost is per page, which is why huge pages win.
/// Plugins that register with a device put this in their record's
/// [`PinCost`].
pub const REGISTER_SECONDS_PER_PAGE: f64 = 55.4 / (511.96 * 262_144.0);

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

/// What a pool costs, phase by phase: the inputs of [`predict`].
#[derive(Debug, Clone)]
pub struct CostInputs {
    /// The backing's prefault rates.
    pub prefault: PrefaultCost,
    /// Bytes this process faults (its shard of a shared pool).
    pub prefault_bytes: u64,
    /// Prefault threads.
    pub threads: usize,
    /// The pinner's cost, when a pinner whose record gives one is asked for.
    pub pin: Option<PinCost>,
    /// The costs of the registrars whose records give one.
    pub registrars: Vec<PinCost>,
}

fn pin_seconds(cost: PinCost, size: MappedSize) -> f64 {
    let huge = size.page().get() > crate::sys::base_page_size() as u64;
    if huge && cost.free_on_huge_pages {
        0.0
    } else {
        cost.seconds_per_page * size.pages() as f64
    }
}

/// Predict the phases of a pool of `size`.
pub fn predict(size: MappedSize, inputs: &CostInputs) -> Predicted {
    let page = size.page().get();
    let gbps =
        (inputs.prefault.gbps(page) * inputs.threads.max(1) as f64).min(PREFAULT_CEILING_GBPS);
    Predicted {
        prefault: inputs.prefault_bytes as f64 / (gbps * 1e9),
        pin: inputs.pin.map(|c| pin_seconds(c, size)),
        register: (!inputs.registrars.is_empty()).then(|| {
            inputs
                .registrars
                .iter()
                .map(|&c| pin_seconds(c, size))
                .sum()
        }),
        basis: "rough: rates measured on the 2-core CI machines and vLLM #51080 (registration, per page); \
                run `hostpool bench` for this node's",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{PageSize, round_to_page};

    const REGISTER: PinCost = PinCost {
        seconds_per_page: REGISTER_SECONDS_PER_PAGE,
        free_on_huge_pages: false,
    };
    const MLOCK: PinCost = PinCost {
        seconds_per_page: 0.13 / 262_144.0,
        free_on_huge_pages: true,
    };

    fn inputs(size: MappedSize, threads: usize, pin: Option<PinCost>, regs: usize) -> CostInputs {
        CostInputs {
            prefault: PrefaultCost::DEFAULT,
            prefault_bytes: size.mapped(),
            threads,
            pin,
            registrars: vec![REGISTER; regs],
        }
    }

    #[test]
    fn huge_pages_predict_faster_prefault_and_registration() {
        let small = round_to_page(400 << 30, PageSize::BASE_4K).unwrap();
        let huge = round_to_page(400 << 30, PageSize::HUGE_1G).unwrap();
        let a = predict(small, &inputs(small, 16, Some(REGISTER), 1));
        let b = predict(huge, &inputs(huge, 16, Some(REGISTER), 1));
        assert!(b.prefault < a.prefault);
        assert!(
            b.pin.unwrap() * 1000.0 < a.pin.unwrap(),
            "registration is per page"
        );
        // 400 GiB of 4 KiB pages: about 43 s to register, as vLLM measured.
        assert!((a.pin.unwrap() - 43.3).abs() < 1.0, "{:?}", a.pin);
        let m = predict(small, &inputs(small, 2, Some(MLOCK), 0));
        assert!((m.pin.unwrap() - 52.0).abs() < 0.1 && m.register.is_none());
        let h = predict(huge, &inputs(huge, 2, Some(MLOCK), 0));
        assert_eq!(h.pin, Some(0.0), "mlock of huge pages is a no-op");
        let none = predict(small, &inputs(small, 2, None, 0));
        assert!(
            none.pin.is_none(),
            "a pinner without a cost is not predicted"
        );
    }
}
