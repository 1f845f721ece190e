//! [`StepModel`] on the GPU: one [`GpuDecoder`] with a KV cache per slot.
//!
//! A step's prompt chunks run through the decoder's batched prefill, slot by slot; its decode
//! tokens (one per sequence) go together through [`GpuDecoder::decode_slots`], one forward over
//! all of them, so every weight — resident, or spilled and split between the GPU and the CPU —
//! is read once per step for the whole running batch.

use hipfire_model::gpu::GpuDecoder;
use hipfire_model::ModelError;

use crate::engine::{Feed, StepModel};

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
        let mut decode_slots = Vec::new();
        for f in feeds {
            match f.tokens {
                [] => {
                    return Err(ModelError::InvalidOption(format!(
                        "an empty feed for slot {}",
                        f.slot
                    )))
                }
                [t] => {
                    decode.push((f.slot, *t));
                    decode_slots.push(f.slot);
                }
                tokens => {
                    self.dec.select_slot(f.slot)?;
                    let logits = self.dec.prefill(tokens)?;
                    if f.want_logits {
                        self.logits[f.slot].clear();
                        self.logits[f.slot].extend_from_slice(logits);
                    }
                }
            }
        }
        if decode.is_empty() {
            return Ok(());
        }
        let vocab = self.dec.model().config().vocab;
        let out = self.dec.decode_slots(&decode)?;
        for (slot, row) in decode_slots.into_iter().zip(out.chunks_exact(vocab)) {
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
}
