//! Which repeating layers stay in VRAM and which spill to pinned host memory.
//!
//! Placement follows llama.cpp's convention: the *first* `n_layer − budget` layers spill, the
//! last `budget` stay resident. The decision only needs byte counts, so it is made here from
//! plain numbers — the decoder measures the model and the card, this module decides and
//! refuses — and can be checked without a GPU.

use crate::ModelError;

/// Bytes as GiB, for the refusals' and the placement line's text.
pub(super) fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// What the repeating layers share VRAM with, measured by the decoder before placing them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VramBudget {
    /// Device memory free now (not the card's total: another process may hold some of it).
    pub(crate) free: u64,
    /// The KV caches of every slot and the batched decode step's activations.
    pub(crate) kv: u64,
    /// Weights outside the repeating layers (embeddings, output norm, head): always resident.
    pub(crate) fixed: u64,
    /// The batched prefill's scratch when some layer spills: it then also stages a spilled
    /// layer whole.
    pub(crate) scratch_spilled: u64,
    /// The batched prefill's scratch with every layer resident.
    pub(crate) scratch_resident: u64,
    /// Device memory `auto` leaves free after placing layers (`VRAM_MARGIN_BYTES`).
    pub(crate) auto_margin: u64,
    /// Positions of the KV cache, named in the refusals.
    pub(crate) ctx_len: usize,
    /// Tokens per prefill micro-batch, named in the refusals.
    pub(crate) ubatch: usize,
}

/// The home of every repeating layer: the first [`LayerPlacement::spilled`] in pinned host
/// memory, the rest in VRAM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LayerPlacement {
    /// Bytes of each layer's projections, in layer order.
    layer_bytes: Vec<u64>,
    /// Leading layers that spill.
    n_spilled: usize,
}

impl LayerPlacement {
    /// Places `layer_bytes.len()` layers whose projections take `layer_bytes` each.
    ///
    /// `Some(b)` keeps the last `b` layers resident (clamped to the layer count) and refuses when
    /// they, the KV cache, the fixed weights and the prefill scratch exceed free VRAM. `None`
    /// (`auto`) sets aside the margin, the fixed weights, the KV cache and the scratch sized for
    /// spilling (refusing when that alone does not fit), then keeps layers resident from the last
    /// one backwards while they fit; the first that does not fit ends the run, so the resident
    /// layers stay a contiguous tail.
    pub(crate) fn new(
        layer_bytes: Vec<u64>,
        budget: Option<usize>,
        vram: &VramBudget,
    ) -> Result<LayerPlacement, ModelError> {
        let n_layer = layer_bytes.len();
        let VramBudget {
            free: free_now,
            kv,
            fixed,
            ctx_len,
            ubatch,
            ..
        } = *vram;
        let resident = match budget {
            Some(b) => {
                let b = b.min(n_layer);
                let resident: u64 = layer_bytes[n_layer - b..].iter().sum();
                let scratch = if b < n_layer {
                    vram.scratch_spilled
                } else {
                    vram.scratch_resident
                };
                let need = resident + kv + fixed + scratch;
                if need > free_now {
                    return Err(ModelError::OutOfMemory {
                        memory: "VRAM",
                        what: format!(
                            "{b} resident layers ({:.2} GiB), the KV cache for {ctx_len} positions ({:.2} GiB), the embeddings and head ({:.2} GiB) and the prefill scratch for {ubatch} tokens ({:.2} GiB)",
                            gib(resident),
                            gib(kv),
                            gib(fixed),
                            gib(scratch)
                        ),
                        need,
                        free: free_now,
                        hint: "lower memory.gpu_layer_budget, --ctx-size (model.ctx_size) or --ubatch-size (model.ubatch)",
                    });
                }
                b
            }
            None => {
                // Sized for spilling: whether any layer spills is not known yet.
                let base = vram.auto_margin + fixed + kv + vram.scratch_spilled;
                if base > free_now {
                    return Err(ModelError::OutOfMemory {
                        memory: "VRAM",
                        what: format!(
                            "with every layer spilled, the KV cache for {ctx_len} positions ({:.2} GiB), the embeddings and head ({:.2} GiB), the prefill scratch for {ubatch} tokens ({:.2} GiB) and the {:.0} GiB margin `auto` keeps",
                            gib(kv),
                            gib(fixed),
                            gib(vram.scratch_spilled),
                            gib(vram.auto_margin)
                        ),
                        need: base,
                        free: free_now,
                        hint: "lower --ctx-size (model.ctx_size) or --ubatch-size (model.ubatch)",
                    });
                }
                let free = free_now - base;
                let mut n = 0;
                let mut used = 0u64;
                for lb in layer_bytes.iter().rev() {
                    if used + lb > free {
                        break;
                    }
                    used += lb;
                    n += 1;
                }
                n
            }
        };
        Ok(LayerPlacement {
            n_spilled: n_layer - resident,
            layer_bytes,
        })
    }

    /// Refuses a placement whose spilled layers, pinned, would leave less than `margin` bytes
    /// of host RAM: pinned pages cannot be reclaimed, so the load is refused up front rather
    /// than stalling the host. `available` is `MemAvailable` (`None` where it cannot be read,
    /// which skips the check).
    /// `host_experts` is the routed experts' bytes kept in pinned host memory
    /// ([`ExpertPlacement::host_bytes`]), pinned beside the spilled layers.
    pub(crate) fn check_pinned_ram(
        &self,
        available: Option<u64>,
        margin: u64,
        host_experts: u64,
    ) -> Result<(), ModelError> {
        let Some(avail) = available else {
            return Ok(());
        };
        let (n_spilled, spilled_bytes) = (self.n_spilled, self.spilled_bytes());
        let pinned = spilled_bytes + host_experts;
        if pinned + margin > avail {
            let experts = match host_experts {
                0 => String::new(),
                b => format!(" and routed experts ({:.2} GiB)", gib(b)),
            };
            return Err(ModelError::OutOfMemory {
                memory: "RAM",
                what: format!(
                    "pinning {n_spilled} spilled layers ({:.2} GiB){experts} plus the {:.1} GiB margin (memory.ram_margin_mib)",
                    gib(spilled_bytes),
                    gib(margin)
                ),
                need: pinned + margin,
                free: avail,
                hint: "raise memory.gpu_layer_budget, keep fewer experts on the host (--n-cpu-moe) or lower the margin",
            });
        }
        Ok(())
    }

    /// Repeating layers placed.
    pub(crate) fn n_layer(&self) -> usize {
        self.layer_bytes.len()
    }

    /// Layers kept in VRAM (the last ones).
    pub(crate) fn resident(&self) -> usize {
        self.n_layer() - self.n_spilled
    }

    /// Layers spilled to pinned host memory (the first ones).
    pub(crate) fn spilled(&self) -> usize {
        self.n_spilled
    }

    /// Whether layer `li` lives in pinned host memory.
    pub(crate) fn is_spilled(&self, li: usize) -> bool {
        li < self.n_spilled
    }

    /// Bytes of the spilled layers' projections (what gets pinned).
    pub(crate) fn spilled_bytes(&self) -> u64 {
        self.layer_bytes[..self.n_spilled].iter().sum()
    }

    /// Bytes of the resident layers' projections.
    pub(crate) fn resident_bytes(&self) -> u64 {
        self.layer_bytes[self.n_spilled..].iter().sum()
    }
}

/// Which layers' routed experts stay in pinned host memory whatever VRAM is free (llama.cpp's
/// spellings: `--cpu-moe`, `--n-cpu-moe N`). The others' go to VRAM while it allows
/// ([`ExpertPlacement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostExperts {
    /// None forced: experts are resident while VRAM allows.
    #[default]
    None,
    /// The experts of the first `n` layers (`--n-cpu-moe n`).
    FirstLayers(usize),
    /// Every layer's experts (`--cpu-moe`).
    All,
}

impl HostExperts {
    /// Leading layers of a model of `n_layer` layers whose experts this keeps on the host;
    /// refuses a request on a model without experts (`has_experts` false) and more layers than
    /// the model has.
    pub fn host_layers(self, n_layer: usize, has_experts: bool) -> Result<usize, ModelError> {
        let (n, flag) = match self {
            HostExperts::None => return Ok(0),
            HostExperts::FirstLayers(n) => (n, format!("--n-cpu-moe {n}")),
            HostExperts::All => (n_layer, "--cpu-moe".to_string()),
        };
        if !has_experts {
            return Err(ModelError::InvalidOption(format!(
                "{flag}: the model has no routed experts (it is not a Mixture-of-Experts model)"
            )));
        }
        if n > n_layer {
            return Err(ModelError::InvalidOption(format!(
                "{flag}: the model has {n_layer} layers (give at most {n_layer}, or --cpu-moe \
                 for every layer's experts)"
            )));
        }
        Ok(n)
    }
}

/// Where each layer's routed experts live: experts `0..resident(li)` of layer `li` in VRAM, the
/// others in pinned host memory, read there by the GPU's ids GEMV over PCIe (zero-copy). Experts
/// are placed apart from the layer planner ([`LayerPlacement`] counts the rest of each layer):
/// one expert at a time through it would cost a copy and a host sync per expert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExpertPlacement {
    /// Bytes of one expert (gate + up + down) per layer; 0 for a dense layer.
    expert_bytes: Vec<u64>,
    /// Experts per routed layer.
    n_expert: usize,
    /// Experts of each layer kept in VRAM (the lowest ids).
    resident: Vec<usize>,
}

impl ExpertPlacement {
    /// Places `n_expert` experts of `expert_bytes[li]` bytes each per layer. The experts of the
    /// first `host_layers` layers and of the first `spilled` layers (whose other weights spill)
    /// stay on the host; the others fill `room` bytes of VRAM from the last layer backwards, as
    /// many of each layer's experts as fit (lowest ids first), the rest on the host.
    pub(crate) fn new(
        expert_bytes: Vec<u64>,
        n_expert: usize,
        host_layers: usize,
        spilled: usize,
        room: u64,
    ) -> ExpertPlacement {
        let n_layer = expert_bytes.len();
        let first_gpu = host_layers.max(spilled).min(n_layer);
        let mut resident = vec![0usize; n_layer];
        let mut left = room;
        for li in (first_gpu..n_layer).rev() {
            let eb = expert_bytes[li];
            if eb == 0 {
                continue;
            }
            let fit = (left / eb).min(n_expert as u64) as usize;
            resident[li] = fit;
            left -= fit as u64 * eb;
            if fit < n_expert {
                break;
            }
        }
        ExpertPlacement {
            expert_bytes,
            n_expert,
            resident,
        }
    }

    /// Whether expert `e` of layer `li` lives in VRAM.
    pub(crate) fn is_resident(&self, li: usize, e: usize) -> bool {
        self.resident.get(li).is_some_and(|&r| e < r)
    }

    /// Bytes of the experts in VRAM.
    pub(crate) fn resident_bytes(&self) -> u64 {
        self.expert_bytes
            .iter()
            .zip(&self.resident)
            .map(|(&b, &r)| b * r as u64)
            .sum()
    }

    /// Bytes of the experts in pinned host memory.
    pub(crate) fn host_bytes(&self) -> u64 {
        self.expert_bytes
            .iter()
            .zip(&self.resident)
            .map(|(&b, &r)| b * (self.n_expert - r) as u64)
            .sum()
    }

    /// One phrase for the placement line: experts resident of all, and the per-layer counts
    /// where they differ (`""` for a dense model).
    pub(crate) fn summary(&self) -> String {
        let routed: Vec<usize> = (0..self.resident.len())
            .filter(|&li| self.expert_bytes[li] > 0)
            .collect();
        if routed.is_empty() {
            return String::new();
        }
        let total = routed.len() * self.n_expert;
        let resident: usize = routed.iter().map(|&li| self.resident[li]).sum();
        let per_layer = if resident == 0 || resident == total {
            String::new()
        } else {
            let counts: Vec<String> = routed
                .iter()
                .map(|&li| self.resident[li].to_string())
                .collect();
            format!(" (per layer: {})", counts.join(" "))
        };
        format!(
            "; routed experts {resident} of {total} in VRAM ({:.2} GiB), {} in pinned host memory ({:.2} GiB, read over PCIe){per_layer}",
            gib(self.resident_bytes()),
            total - resident,
            gib(self.host_bytes())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// A card with 24 GiB free, 1.5 GiB of KV cache, ~0.6 GiB of fixed weights and a prefill
    /// scratch that grows by a staged layer when something spills.
    fn vram(free: u64) -> VramBudget {
        VramBudget {
            free,
            kv: 1536 * MIB,
            fixed: 617 * MIB + 12_345,
            scratch_spilled: 873 * MIB + 4_096,
            scratch_resident: 611 * MIB + 4_096,
            auto_margin: 2 * GIB,
            ctx_len: 8192,
            ubatch: 1024,
        }
    }

    /// Eight uneven layers, ~0.4–0.5 GiB each.
    fn layers() -> Vec<u64> {
        vec![
            437 * MIB + 1_111,
            451 * MIB + 2_222,
            429 * MIB + 3_333,
            466 * MIB + 4_444,
            440 * MIB + 5_555,
            458 * MIB + 6_666,
            433 * MIB + 7_777,
            447 * MIB + 8_888,
        ]
    }

    /// The fields of an `OutOfMemory` refusal.
    fn oom(e: ModelError) -> (&'static str, String, u64, u64, &'static str) {
        match e {
            ModelError::OutOfMemory {
                memory,
                what,
                need,
                free,
                hint,
            } => (memory, what, need, free, hint),
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
    }

    #[test]
    fn explicit_budget_that_fits_keeps_the_last_layers() {
        let lb = layers();
        let p = LayerPlacement::new(lb.clone(), Some(5), &vram(24 * GIB)).unwrap();
        assert_eq!((p.n_layer(), p.resident(), p.spilled()), (8, 5, 3));
        assert!((0..3).all(|i| p.is_spilled(i)));
        assert!((3..8).all(|i| !p.is_spilled(i)));
        assert_eq!(p.spilled_bytes(), lb[..3].iter().sum::<u64>());
        assert_eq!(p.resident_bytes(), lb[3..].iter().sum::<u64>());
        assert_eq!(
            p.spilled_bytes() + p.resident_bytes(),
            lb.iter().sum::<u64>()
        );
    }

    #[test]
    fn explicit_budget_that_does_not_fit_is_refused_with_the_numbers() {
        let lb = layers();
        let v = vram(3 * GIB + 77 * MIB);
        let e = LayerPlacement::new(lb.clone(), Some(4), &v).unwrap_err();
        let (memory, what, need, free, hint) = oom(e);
        assert_eq!(memory, "VRAM");
        // Some layer spills, so the scratch is the one that stages spilled layers.
        let want = lb[4..].iter().sum::<u64>() + v.kv + v.fixed + v.scratch_spilled;
        assert_eq!((need, free), (want, v.free));
        assert!(what.starts_with("4 resident layers ("), "{what}");
        assert!(what.contains("KV cache for 8192 positions"), "{what}");
        assert!(what.contains("prefill scratch for 1024 tokens"), "{what}");
        assert!(hint.contains("memory.gpu_layer_budget"), "{hint}");
    }

    #[test]
    fn explicit_budget_past_the_layer_count_clamps_to_all_resident() {
        let lb = layers();
        let p = LayerPlacement::new(lb.clone(), Some(40), &vram(24 * GIB)).unwrap();
        assert_eq!((p.resident(), p.spilled(), p.spilled_bytes()), (8, 0, 0));
        assert!(!p.is_spilled(0));
        // All resident: the refusal counts the scratch without a staged layer.
        let v = vram(4 * GIB);
        let (_, what, need, _, _) = oom(LayerPlacement::new(lb.clone(), Some(40), &v).unwrap_err());
        assert_eq!(
            need,
            lb.iter().sum::<u64>() + v.kv + v.fixed + v.scratch_resident
        );
        assert!(what.starts_with("8 resident layers ("), "{what}");
    }

    #[test]
    fn auto_fills_from_the_last_layer_backwards() {
        // One large first layer and three small ones: room for the three small ones plus a bit.
        let lb = vec![5 * GIB + 313, GIB + 17, GIB + 29, GIB + 41];
        let v = vram(0);
        let base = v.auto_margin + v.fixed + v.kv + v.scratch_spilled;
        let p = LayerPlacement::new(lb.clone(), None, &vram(base + 3 * GIB + 512 * MIB)).unwrap();
        assert_eq!((p.resident(), p.spilled()), (3, 1));
        assert!(p.is_spilled(0));
        assert!((1..4).all(|i| !p.is_spilled(i)));
        assert_eq!(p.spilled_bytes(), lb[0]);
        assert_eq!(p.resident_bytes(), 3 * GIB + 17 + 29 + 41);
        // Exactly enough for the last two: the run stops at the first layer that does not fit.
        let p = LayerPlacement::new(lb.clone(), None, &vram(base + 2 * GIB + 29 + 41)).unwrap();
        assert_eq!((p.resident(), p.spilled()), (2, 2));
        assert!(p.is_spilled(1) && !p.is_spilled(2));
        // Room for everything keeps everything.
        let p = LayerPlacement::new(lb, None, &vram(base + 9 * GIB)).unwrap();
        assert_eq!((p.resident(), p.spilled()), (4, 0));
    }

    #[test]
    fn auto_with_room_for_no_layer_spills_them_all() {
        let lb = layers();
        let v = vram(0);
        let base = v.auto_margin + v.fixed + v.kv + v.scratch_spilled;
        // Less than the last layer left over.
        let p = LayerPlacement::new(lb.clone(), None, &vram(base + 300 * MIB)).unwrap();
        assert_eq!((p.resident(), p.spilled()), (0, 8));
        assert_eq!(p.resident_bytes(), 0);
        assert_eq!(p.spilled_bytes(), lb.iter().sum::<u64>());
    }

    #[test]
    fn auto_whose_base_alone_does_not_fit_is_refused() {
        let v = vram(4 * GIB + 3 * MIB);
        let (memory, what, need, free, hint) =
            oom(LayerPlacement::new(layers(), None, &v).unwrap_err());
        assert_eq!(memory, "VRAM");
        assert_eq!(
            (need, free),
            (v.auto_margin + v.fixed + v.kv + v.scratch_spilled, v.free)
        );
        assert!(what.starts_with("with every layer spilled"), "{what}");
        assert!(what.contains("the 2 GiB margin `auto` keeps"), "{what}");
        assert!(!hint.contains("gpu_layer_budget"), "{hint}");
    }

    /// Expert bytes of a 4-layer routed model: 8 experts a layer of 3 MiB + a little each.
    fn experts_of(n_layer: usize) -> Vec<u64> {
        vec![3 * MIB + 777; n_layer]
    }

    #[test]
    fn experts_fill_vram_from_the_last_layer_backwards_expert_by_expert() {
        let eb = experts_of(4);
        let one = eb[0];
        // Room for 8 + 8 + 3 experts (and a bit): layers 3 and 2 whole, 3 of layer 1, none of 0.
        let p = ExpertPlacement::new(eb.clone(), 8, 0, 0, 19 * one + one / 2);
        assert!((0..8).all(|e| p.is_resident(3, e) && p.is_resident(2, e)));
        assert!((0..3).all(|e| p.is_resident(1, e)));
        assert!((3..8).all(|e| !p.is_resident(1, e)));
        assert!((0..8).all(|e| !p.is_resident(0, e)));
        assert_eq!(p.resident_bytes(), 19 * one);
        assert_eq!(p.host_bytes(), 13 * one);
        assert_eq!(p.resident_bytes() + p.host_bytes(), 32 * one);
        let s = p.summary();
        assert!(s.contains("routed experts 19 of 32 in VRAM"), "{s}");
        assert!(s.contains("13 in pinned host memory"), "{s}");
        assert!(s.contains("(per layer: 0 3 8 8)"), "{s}");
        // Plenty of room: everything resident, no per-layer list.
        let all = ExpertPlacement::new(eb.clone(), 8, 0, 0, u64::MAX);
        assert_eq!((all.resident_bytes(), all.host_bytes()), (32 * one, 0));
        assert!(!all.summary().contains("per layer"));
        // No room: everything on the host.
        let none = ExpertPlacement::new(eb, 8, 0, 0, one - 1);
        assert_eq!((none.resident_bytes(), none.host_bytes()), (0, 32 * one));
    }

    #[test]
    fn host_layers_and_spilled_layers_keep_their_experts_on_the_host() {
        let eb = experts_of(4);
        let one = eb[0];
        // --n-cpu-moe 2 with room for everything: layers 0 and 1 on the host.
        let p = ExpertPlacement::new(eb.clone(), 8, 2, 0, u64::MAX);
        assert!((0..8).all(|e| !p.is_resident(0, e) && !p.is_resident(1, e)));
        assert!((0..8).all(|e| p.is_resident(2, e) && p.is_resident(3, e)));
        assert_eq!(p.host_bytes(), 16 * one);
        // A spilled layer's experts follow it, whatever --n-cpu-moe says.
        let p = ExpertPlacement::new(eb.clone(), 8, 1, 3, u64::MAX);
        assert_eq!(p.resident_bytes(), 8 * one);
        assert!(p.is_resident(3, 7) && !p.is_resident(2, 0));
        // --cpu-moe: every layer.
        let p = ExpertPlacement::new(eb, 8, 4, 0, u64::MAX);
        assert_eq!(p.resident_bytes(), 0);
        // A dense model has no experts to place and says nothing.
        let dense = ExpertPlacement::new(vec![0; 4], 0, 0, 0, u64::MAX);
        assert_eq!((dense.resident_bytes(), dense.host_bytes()), (0, 0));
        assert_eq!(dense.summary(), "");
    }

    /// GLM-4.5's leading dense layers have no experts: they take no room, hold nothing on the
    /// host, and the summary's per-layer list names the routed layers alone. `--n-cpu-moe`
    /// counts layers, dense ones included (llama.cpp's `blk.0..N-1`).
    #[test]
    fn leading_dense_layers_have_no_experts_to_place() {
        let mut eb = experts_of(4);
        eb[0] = 0;
        let one = eb[1];
        // Room for 8 + 3: layer 3 whole, 3 of layer 2, none of 1, layer 0 nothing to place.
        let p = ExpertPlacement::new(eb.clone(), 8, 0, 0, 11 * one + one / 2);
        assert!((0..8).all(|e| p.is_resident(3, e)));
        assert!((0..3).all(|e| p.is_resident(2, e)) && !p.is_resident(2, 3));
        assert!(!p.is_resident(1, 0) && !p.is_resident(0, 0));
        assert_eq!((p.resident_bytes(), p.host_bytes()), (11 * one, 13 * one));
        let s = p.summary();
        assert!(s.contains("routed experts 11 of 24 in VRAM"), "{s}");
        assert!(s.contains("(per layer: 0 3 8)"), "{s}");
        // --n-cpu-moe 1 names only the dense layer: every expert stays resident.
        let p = ExpertPlacement::new(eb.clone(), 8, 1, 0, u64::MAX);
        assert_eq!((p.resident_bytes(), p.host_bytes()), (24 * one, 0));
        // --n-cpu-moe 2: the first routed layer's experts on the host.
        let p = ExpertPlacement::new(eb, 8, 2, 0, u64::MAX);
        assert_eq!((p.resident_bytes(), p.host_bytes()), (16 * one, 8 * one));
        assert!(!p.is_resident(1, 0) && p.is_resident(2, 0));
    }

    #[test]
    fn host_experts_requests_are_checked_against_the_model() {
        assert_eq!(HostExperts::None.host_layers(4, false).unwrap(), 0);
        assert_eq!(HostExperts::None.host_layers(4, true).unwrap(), 0);
        assert_eq!(HostExperts::All.host_layers(4, true).unwrap(), 4);
        assert_eq!(HostExperts::FirstLayers(3).host_layers(4, true).unwrap(), 3);
        assert_eq!(HostExperts::FirstLayers(4).host_layers(4, true).unwrap(), 4);
        let msg = |r: Result<usize, ModelError>| match r {
            Err(ModelError::InvalidOption(m)) => m,
            other => panic!("expected InvalidOption, got {other:?}"),
        };
        let m = msg(HostExperts::FirstLayers(5).host_layers(4, true));
        assert!(m.contains("--n-cpu-moe 5") && m.contains("4 layers"), "{m}");
        let m = msg(HostExperts::All.host_layers(4, false));
        assert!(
            m.contains("--cpu-moe") && m.contains("no routed experts"),
            "{m}"
        );
        let m = msg(HostExperts::FirstLayers(1).host_layers(4, false));
        assert!(m.contains("--n-cpu-moe 1"), "{m}");
    }

    #[test]
    fn pinned_ram_counts_the_experts_kept_on_the_host() {
        let lb = layers();
        let p = LayerPlacement::new(lb.clone(), Some(6), &vram(24 * GIB)).unwrap();
        let spilled: u64 = lb[..2].iter().sum();
        let (margin, experts) = (4 * GIB, 5 * GIB + 3);
        p.check_pinned_ram(Some(spilled + experts + margin), margin, experts)
            .unwrap();
        let avail = spilled + experts + margin - 1;
        let (_, what, need, _, _) = oom(p
            .check_pinned_ram(Some(avail), margin, experts)
            .unwrap_err());
        assert_eq!(need, spilled + experts + margin);
        assert!(what.contains("and routed experts (5.00 GiB)"), "{what}");
    }

    #[test]
    fn pinned_ram_is_checked_against_the_spilled_bytes_and_margin() {
        let lb = layers();
        let p = LayerPlacement::new(lb.clone(), Some(2), &vram(24 * GIB)).unwrap();
        let spilled: u64 = lb[..6].iter().sum();
        let margin = 4 * GIB;
        // Exactly enough passes; unreadable MemAvailable skips the check.
        p.check_pinned_ram(Some(spilled + margin), margin, 0)
            .unwrap();
        p.check_pinned_ram(None, margin, 0).unwrap();
        let avail = spilled + margin - 1;
        let (memory, what, need, free, hint) =
            oom(p.check_pinned_ram(Some(avail), margin, 0).unwrap_err());
        assert_eq!(memory, "RAM");
        assert_eq!((need, free), (spilled + margin, avail));
        assert!(what.starts_with("pinning 6 spilled layers ("), "{what}");
        assert!(what.contains("plus the 4.0 GiB margin"), "{what}");
        assert!(hint.starts_with("raise memory.gpu_layer_budget"), "{hint}");
        // Nothing spilled pins nothing: only the margin has to fit.
        let all = LayerPlacement::new(lb, Some(8), &vram(24 * GIB)).unwrap();
        all.check_pinned_ram(Some(margin), margin, 0).unwrap();
    }
}
