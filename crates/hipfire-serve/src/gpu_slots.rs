//! [`StepModel`] on the GPU: one [`GpuDecoder`] with a KV cache per slot.
//!
//! A step's prompt chunks go together through [`GpuDecoder::prefill_slots`] (one batched step:
//! a spilled layer is staged in VRAM once for all of them); its decode tokens (one per
//! sequence) go together through [`GpuDecoder::decode_slots`], one forward over all of them, so
//! every weight — resident, or spilled and split between the GPU and the CPU — is read once per
//! step for the whole running batch.

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
