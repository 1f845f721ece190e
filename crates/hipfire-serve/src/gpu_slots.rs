//! [`StepModel`] on the GPU: one [`GpuDecoder`] with a KV cache per slot.
//!
//! A step's decode tokens (one per sequence) go together through
//! [`GpuDecoder::decode_segments`], one forward over all of them, so every weight — resident, or
//! spilled and split between the GPU and the CPU — is read once per step for the whole running
//! batch. Its prompt chunks either ride along in that forward as further rows (short ones, beside
//! decode tokens, when [`ride_along`] says the extra columns cost less than a staged step) or go
//! together through [`GpuDecoder::prefill_slots`] first (one batched step: a spilled layer is
//! staged in VRAM once for all of them).

use hipfire_model::gpu::GpuDecoder;
use hipfire_model::ModelError;

use crate::engine::{Feed, PrefillBudget, StepModel};

/// Prompt tokens per sequence per step on the GPU: half of the default micro-batch, so two
/// arrivals' prompts share a step's staging.
pub const GPU_PREFILL_CHUNK: usize = 512;
/// Prompt tokens per step on the GPU, all sequences together: one default micro-batch. A
/// step's prefill then costs about one spilled-layer staging plus ~0.1 s of GEMMs (pp1024 of
/// the synthetic Llama-3-8B ran ~12k tok/s with 16 of 32 layers spilled,
/// docs/perf-checkpoints/2026-12-01-gpu-prefill-h200), the longest pause a decoding stream
/// sees while prompts arrive.
pub const GPU_PREFILL_PER_STEP: usize = 1024;

/// Activation columns the GPU reads a spilled weight's rows once for: a batched step of more
/// columns reads them again per further group.
pub const GPU_COLS_PER_READ: usize = hipfire_model::gpu::GEMV_MAX_COLS;

/// The cost model of [`ride_along`] counts time in units of one read of every spilled byte over
/// PCIe: a staged prefill step copies the spilled layers into VRAM at the pinned H2D rate, and
/// the GPU arm of a batched split reads its share of them from pinned host memory at about the
/// same rate. The CPU arm's cost of one activation column over all the spilled rows, in that
/// unit: at 8 columns the batched split balanced at a GPU share of 0.47–0.56 while the CPU arm
/// read 41.6–47.3 GB/s (compute-bound) and a staged step moved 16 layers' 1.97 GB in ~36 ms
/// (~55 GB/s), so the CPU takes about 55 / 45 ÷ 8 ≈ 0.15 of a PCIe read per column
/// (docs/perf-checkpoints/2026-12-02-batched-split-h200, H200 box, synthetic Llama-3-8B Q4_K).
pub const CPU_COL_COST: f64 = 0.15;

/// The CPU arm's floor in the same unit, for few columns: it reads its rows from DRAM once
/// whatever the column count, at about twice PCIe's rate on the H200 box (~100 GB/s).
pub const CPU_READ_COST: f64 = 0.5;

/// The threshold of [`ride_along`]: a staged prefill step's cost in the same unit. It copies
/// every spilled byte into VRAM once (its GEMMs overlap the copies: ~36 ms for the staging of
/// 16 spilled layers of the synthetic Llama-3-8B at 8 streams, that record's "Where 8 streams
/// lose to engine time"), so 1; a prompt rides along while its extra columns cost the decode
/// step less than this.
pub const STAGED_STEP_COST: f64 = 1.0;

/// What [`ride_along`] decides from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RideAlong {
    /// Decode tokens of the step (one row each).
    pub decode_rows: usize,
    /// Prompt tokens of the step, all sequences together.
    pub prompt_rows: usize,
    /// Most rows the decoder's batched decode step holds ([`GpuDecoder::decode_rows`]).
    pub step_rows: usize,
    /// Bytes of the spilled layers ([`GpuDecoder::spilled_bytes`]): 0 with every layer resident.
    pub spilled_bytes: u64,
}

/// Time (in units of one PCIe read of the spilled bytes) the spilled layers of a batched
/// decode step of `cols` columns take: the rows split between the GPU arm (one read per
/// [`GPU_COLS_PER_READ`] columns) and the CPU arm (its DRAM read, or [`CPU_COL_COST`] per
/// column once compute-bound) so that both finish together, as the share controller aims.
fn decode_cost(cols: usize) -> f64 {
    if cols == 0 {
        return 0.0;
    }
    let gpu = cols.div_ceil(GPU_COLS_PER_READ) as f64;
    let cpu = CPU_READ_COST.max(cols as f64 * CPU_COL_COST);
    gpu * cpu / (gpu + cpu)
}

/// Whether the step's prompt chunks ride along as rows of its batched decode step instead of a
/// staged prefill step before it. Only beside decode tokens (a prompt alone has no decode pass
/// to share), only with spilled layers (with every layer resident a prefill step stages
/// nothing, so this model sees nothing to save; riding along there is unmeasured), only within
/// the decoder's rows, and only while the extra columns cost the decode step less than a staged step
/// ([`STAGED_STEP_COST`]). With the constants' figures 1 to 4 decode rows take up to 25 prompt
/// rows, 8 up to 24 (a step of 32 columns: two GPU reads, one CPU pass), 16 up to 16.
pub fn ride_along(s: &RideAlong) -> bool {
    if s.decode_rows == 0 || s.prompt_rows == 0 || s.spilled_bytes == 0 {
        return false;
    }
    let cols = s.decode_rows + s.prompt_rows;
    if cols > s.step_rows {
        return false;
    }
    decode_cost(cols) - decode_cost(s.decode_rows) < STAGED_STEP_COST
}

/// The GPU decoder's slots and the last logits of each.
pub struct GpuSlots<'m> {
    dec: GpuDecoder<'m>,
    logits: Vec<Vec<f32>>,
}

impl std::fmt::Debug for GpuSlots<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSlots")
            .field("slots", &self.logits.len())
            .finish()
    }
}

impl<'m> GpuSlots<'m> {
    /// Over `dec`'s slots ([`GpuDecoder::with_slots`]).
    pub fn new(dec: GpuDecoder<'m>) -> GpuSlots<'m> {
        let n = dec.slots();
        GpuSlots {
            dec,
            logits: vec![Vec::new(); n],
        }
    }

    /// The decoder (its placement line, its executor's trace).
    pub fn decoder(&self) -> &GpuDecoder<'m> {
        &self.dec
    }

    fn run(&mut self, feeds: &[Feed<'_>]) -> Result<(), ModelError> {
        let mut decode = Vec::new();
        let mut prompts: Vec<(usize, &[u32], bool)> = Vec::new();
        for f in feeds {
            match f.tokens {
                [] => {
                    return Err(ModelError::InvalidOption(format!(
                        "an empty feed for slot {}",
                        f.slot
                    )))
                }
                [t] => decode.push((f.slot, *t)),
                tokens => prompts.push((f.slot, tokens, f.want_logits)),
            }
        }
        let vocab = self.dec.model().config().vocab;
        let choice = RideAlong {
            decode_rows: decode.len(),
            prompt_rows: prompts.iter().map(|p| p.1.len()).sum(),
            step_rows: self.dec.decode_rows(),
            spilled_bytes: self.dec.spilled_bytes(),
        };
        if ride_along(&choice) {
            // One forward for the whole step: the decode tokens and the prompt chunks as rows.
            tracing::debug!(
                decode_rows = choice.decode_rows,
                prompt_rows = choice.prompt_rows,
                "prompt chunks ride along in the decode step"
            );
            let toks: Vec<[u32; 1]> = decode.iter().map(|d| [d.1]).collect();
            let segs: Vec<(usize, &[u32])> = decode
                .iter()
                .zip(&toks)
                .map(|(d, t)| (d.0, &t[..]))
                .chain(prompts.iter().map(|p| (p.0, p.1)))
                .collect();
            let wanted = decode
                .iter()
                .map(|d| (d.0, true))
                .chain(prompts.iter().map(|p| (p.0, p.2)));
            let out = self.dec.decode_segments(&segs)?;
            for ((slot, want), row) in wanted.zip(out.chunks_exact(vocab)) {
                if want {
                    self.logits[slot].clear();
                    self.logits[slot].extend_from_slice(row);
                }
            }
            return Ok(());
        }
        // Prompt chunks: as few batched steps as the step's token capacity allows, each staging
        // the spilled layers once for all of its sequences.
        let cap = self.dec.step_tokens().max(1);
        let mut i = 0;
        while i < prompts.len() {
            let mut n = 0;
            let mut j = i;
            while j < prompts.len() && (j == i || n + prompts[j].1.len() <= cap) {
                n += prompts[j].1.len();
                j += 1;
            }
            let group = &prompts[i..j];
            let segs: Vec<(usize, &[u32])> = group.iter().map(|p| (p.0, p.1)).collect();
            let out = if n <= cap {
                self.dec.prefill_slots(&segs)?.to_vec()
            } else {
                // One prompt chunk beyond a step (the engine's budget is larger than this
                // decoder's step): the decoder's own prefill cuts it into steps.
                self.dec.select_slot(segs[0].0)?;
                self.dec.prefill(segs[0].1)?.to_vec()
            };
            for (p, row) in group.iter().zip(out.chunks_exact(vocab)) {
                if p.2 {
                    self.logits[p.0].clear();
                    self.logits[p.0].extend_from_slice(row);
                }
            }
            i = j;
        }
        if decode.is_empty() {
            return Ok(());
        }
        let out = self.dec.decode_slots(&decode)?;
        for (&(slot, _), row) in decode.iter().zip(out.chunks_exact(vocab)) {
            self.logits[slot].clear();
            self.logits[slot].extend_from_slice(row);
        }
        Ok(())
    }
}

impl StepModel for GpuSlots<'_> {
    fn slots(&self) -> usize {
        self.logits.len()
    }

    fn reset(&mut self, slot: usize) {
        if self.dec.select_slot(slot).is_ok() {
            self.dec.reset();
        }
    }

    fn forward(&mut self, feeds: &[Feed<'_>]) -> Result<(), ModelError> {
        let mut seen = vec![false; self.logits.len()];
        for f in feeds {
            match seen.get_mut(f.slot) {
                Some(s @ false) => *s = true,
                _ => {
                    return Err(ModelError::InvalidOption(format!(
                        "feed for slot {} of {} (absent or twice)",
                        f.slot,
                        self.logits.len()
                    )))
                }
            }
        }
        // On error no slot may have changed: positions are rolled back (the cache rows past a
        // position are never read).
        let before: Vec<usize> = (0..self.logits.len())
            .map(|s| self.dec.slot_position(s))
            .collect();
        let r = self.run(feeds);
        if r.is_err() {
            for (slot, &pos) in before.iter().enumerate() {
                self.dec.truncate_slot(slot, pos);
            }
        }
        r
    }

    fn logits(&self, slot: usize) -> &[f32] {
        self.logits.get(slot).map_or(&[], |l| l.as_slice())
    }

    fn position(&self, slot: usize) -> usize {
        self.dec.slot_position(slot)
    }

    /// Up to [`GPU_PREFILL_CHUNK`] tokens per sequence and [`GPU_PREFILL_PER_STEP`] in all
    /// (within the decoder's step): a batched prefill step stages every spilled layer once
    /// whatever its token count, so fewer, larger steps cost less.
    fn prefill_budget(&self) -> PrefillBudget {
        let cap = self.dec.step_tokens().max(1);
        PrefillBudget {
            chunk: GPU_PREFILL_CHUNK.min(cap),
            per_step: GPU_PREFILL_PER_STEP.min(cap),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H200 record's setting: 16 of 32 Llama-3-8B layers spilled (1.97 GB), 8 slots.
    fn at(decode_rows: usize, prompt_rows: usize) -> RideAlong {
        RideAlong {
            decode_rows,
            prompt_rows,
            step_rows: 8 + 32,
            spilled_bytes: 1_970_000_000,
        }
    }

    #[test]
    fn the_load_generators_prompt_rides_along_beside_eight_streams() {
        // scripts/serve_load.py: ~17 prompt tokens arriving while 7 or 8 streams decode.
        for decode in 1..=8 {
            assert!(ride_along(&at(decode, 17)), "{decode} decode rows");
        }
        assert!(ride_along(&at(8, 24)), "32 columns: two GPU reads");
        assert!(!ride_along(&at(8, 25)), "a third GPU read");
        assert!(ride_along(&at(8, 1)));
    }

    #[test]
    fn resident_models_alone_prompts_and_empty_steps_keep_the_staged_path() {
        let resident = RideAlong {
            spilled_bytes: 0,
            ..at(8, 17)
        };
        assert!(!ride_along(&resident), "nothing to stage: today's path");
        assert!(!ride_along(&at(0, 17)), "no decode pass to share");
        assert!(!ride_along(&at(8, 0)), "no prompt");
    }

    #[test]
    fn steps_beyond_the_decoders_rows_are_staged() {
        let one_more = RideAlong {
            step_rows: 8 + 16,
            ..at(8, 17)
        };
        assert!(!ride_along(&one_more), "past the scratch");
        let small = RideAlong {
            step_rows: 20,
            ..at(8, 17)
        };
        assert!(!ride_along(&small));
        let exact = RideAlong {
            step_rows: 25,
            ..at(8, 17)
        };
        assert!(ride_along(&exact));
    }

    #[test]
    fn prompts_that_cost_more_than_a_staged_step_are_staged() {
        // One decode row: the CPU arm is still reading memory, so 32 prompt columns (three
        // more GPU reads' worth of balanced work) cost more than one copy of the spilled bytes.
        let wide = RideAlong {
            step_rows: 64,
            ..at(1, 32)
        };
        assert!(!ride_along(&wide));
        assert!(decode_cost(33) - decode_cost(1) >= STAGED_STEP_COST);
        assert!(ride_along(&at(1, 24)));
    }

    #[test]
    fn the_cost_grows_with_the_columns_so_a_shorter_prompt_never_loses_its_ride() {
        for decode in 1..=16 {
            let mut rode = true;
            for prompt in 1..=48 {
                let s = RideAlong {
                    step_rows: 64,
                    ..at(decode, prompt)
                };
                let now = ride_along(&s);
                assert!(
                    rode || !now,
                    "{decode} + {prompt}: rides after a shorter one did not"
                );
                rode = now;
            }
        }
        let mut last = 0.0;
        for cols in 0..=64 {
            let c = decode_cost(cols);
            assert!(c >= last, "not monotone at {cols}");
            last = c;
        }
        // A balanced split is faster than either arm alone.
        assert!(decode_cost(8) < 1.0 && decode_cost(8) < 8.0 * CPU_COL_COST);
    }
}
