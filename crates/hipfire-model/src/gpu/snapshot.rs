//! A GPU sequence slot's state at one position, saved to the host and restored: what
//! [`crate::Session::snapshot`] / [`crate::Session::restore`] are to the CPU engine (rollback,
//! a second chat turn), for one slot of the GPU decoder.
//!
//! The KV cache is kept by position (positions are only ever appended, so the rows below a
//! snapshot's position stay valid until the slot rewinds below it); the recurrent states of a
//! hybrid model's DeltaNet layers are copied out, since they cannot be truncated back. A
//! snapshot taken before a rewind below its position no longer matches the cache and is
//! refused, as the CPU session refuses it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::GpuDecoder;
use crate::ModelError;

/// Source of decoder ids (a snapshot restores only into the decoder it came from).
static NEXT_DECODER_ID: AtomicU64 = AtomicU64::new(0);

/// One slot's state at one position ([`GpuDecoder::snapshot`]).
#[derive(Debug, Clone)]
pub struct GpuSnapshot {
    decoder: u64,
    slot: usize,
    event: u64,
    pos: usize,
    /// Each DeltaNet layer's state in layer order (its conv window, then its matrices).
    rec: Vec<Vec<f32>>,
    logits: Vec<f32>,
}

impl GpuSnapshot {
    /// The position it was taken at.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The slot it was taken from (and restores into).
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Bytes it holds on the host: the recurrent states and the logits
    /// ([`crate::ModelConfig::recurrent_bytes_per_sequence`] plus `vocab` floats).
    pub fn bytes(&self) -> usize {
        4 * (self.rec.iter().map(Vec::len).sum::<usize>() + self.logits.len())
    }
}

/// The decoder's side of snapshots: its id and, per slot, the rewinds that outdate them.
#[derive(Debug)]
pub(super) struct SnapshotLog {
    id: u64,
    /// Counts snapshots and rewinds, so each is ordered against the others.
    events: u64,
    /// Per slot, `(event, position)` of every rewind that may outdate a snapshot, increasing in
    /// position (an earlier rewind to a position at or above a later one says nothing more).
    rewinds: Vec<Vec<(u64, usize)>>,
}

impl SnapshotLog {
    pub(super) fn new(slots: usize) -> SnapshotLog {
        SnapshotLog {
            id: NEXT_DECODER_ID.fetch_add(1, Ordering::Relaxed),
            events: 0,
            rewinds: vec![Vec::new(); slots],
        }
    }

    /// Notes that `slot` went back to position `to`.
    pub(super) fn rewound(&mut self, slot: usize, to: usize) {
        self.events += 1;
        let event = self.events;
        if let Some(r) = self.rewinds.get_mut(slot) {
            while r.last().is_some_and(|&(_, t)| t >= to) {
                r.pop();
            }
            r.push((event, to));
        }
    }

    fn next_event(&mut self) -> u64 {
        self.events += 1;
        self.events
    }

    /// Whether `slot` went below `pos` after `event`.
    fn rewound_below(&self, slot: usize, event: u64, pos: usize) -> bool {
        self.rewinds
            .get(slot)
            .is_some_and(|r| r.iter().any(|&(e, to)| e > event && to < pos))
    }
}

impl GpuDecoder<'_> {
    /// The selected slot's state now, to [`GpuDecoder::restore`] later: its position, its
    /// recurrent states (copied to the host) and the last logits of [`GpuDecoder::prefill`] /
    /// [`GpuDecoder::step`]. Waits for the stream.
    pub fn snapshot(&mut self) -> Result<GpuSnapshot, ModelError> {
        let slot = self.slot;
        let pos = self.slot_pos[slot];
        if self.rec_lost[slot] && pos > 0 {
            return Err(lost(slot, pos));
        }
        let mut rec = Vec::new();
        for l in &self.layers {
            if let Some(st) = l.rec.get(slot) {
                let mut v = vec![0f32; st.len()];
                st.download(&self.stream, &mut v)?;
                rec.push(v);
            }
        }
        Ok(GpuSnapshot {
            decoder: self.snaps.id,
            slot,
            event: self.snaps.next_event(),
            pos,
            rec,
            logits: self.logits.clone(),
        })
    }

    /// Back to `snap`, taken from this decoder's slot `snap.slot()` at a position the slot has
    /// not gone below since (its cache still holds those positions); refused otherwise. Selects
    /// that slot. Continuing from here is bit-identical to never having gone past it.
    pub fn restore(&mut self, snap: &GpuSnapshot) -> Result<(), ModelError> {
        if snap.decoder != self.snaps.id {
            return Err(ModelError::InvalidOption(
                "a snapshot of another GPU decoder".into(),
            ));
        }
        let slot = snap.slot;
        let now = self.slot_pos.get(slot).copied().unwrap_or(0);
        if snap.pos > now || self.snaps.rewound_below(slot, snap.event, snap.pos) {
            return Err(ModelError::InvalidOption(format!(
                "a snapshot at position {} of slot {slot}, now at {now}: only a position the \
                 slot has reached and not rewound below since can be restored",
                snap.pos
            )));
        }
        // Until every layer is back, the slot's states are neither the old nor the snapshot's.
        self.rec_lost[slot] = true;
        let states = self.layers.iter_mut().filter_map(|l| l.rec.get_mut(slot));
        let mut restored = 0;
        for (st, saved) in states.zip(&snap.rec) {
            if saved.len() != st.len() {
                return Err(ModelError::InvalidOption(format!(
                    "a snapshot whose recurrent state holds {} values where the layer holds {}",
                    saved.len(),
                    st.len()
                )));
            }
            st.upload(&self.stream, saved)?;
            restored += 1;
        }
        if restored != snap.rec.len() {
            return Err(ModelError::InvalidOption(format!(
                "a snapshot of {} recurrent layers for a decoder with {restored}",
                snap.rec.len()
            )));
        }
        self.slot = slot;
        self.slot_pos[slot] = snap.pos;
        self.rec_lost[slot] = false;
        self.snaps.rewound(slot, snap.pos);
        self.logits.clone_from(&snap.logits);
        Ok(())
    }
}

/// The refusal to snapshot or continue a slot whose recurrent state a failed step lost.
pub(super) fn lost(slot: usize, pos: usize) -> ModelError {
    ModelError::InvalidOption(format!(
        "slot {slot}: a failed step left its recurrent (DeltaNet) state half-advanced at \
         position {pos}; reset the slot or restore a snapshot"
    ))
}
