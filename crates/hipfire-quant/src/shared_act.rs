//! An activation that several threads prepare together, then all read.
//!
//! A split step's CPU workers all multiply by the same x. Each preparing its own copy means
//! every worker reads all of x (on the H200 box, lines the GPU has just written) and quantises
//! all of it: the workers' preparation was 3.7–4.0 % of a layer's wall there, the same work done
//! fifteen times. A [`SharedActivation`] is prepared once, each thread taking whole blocks of it,
//! and read by all; what orders the preparation before the reads (a counter with release and
//! acquire) is the caller's, which is why the two halves are `unsafe`.

use crate::act::{q8k_block, ActKind, ActivationBuf, Q8K_BLOCK};
use crate::formats::kquant::{Q4K_SUB, Q6K_SUB};
use crate::{Format, QuantError};
use std::cell::UnsafeCell;
use std::ops::Range;

/// Entries per block of the q8_K activation's Σ-per-16 array.
const BSUMS_PER_BLOCK: usize = Q8K_BLOCK / Q6K_SUB;
/// Entries per block of its Σ-per-32 array.
const SUMS32_PER_BLOCK: usize = Q8K_BLOCK / Q4K_SUB;

/// A q8_K activation (for Q4_K and Q6_K weights) filled block by block from several threads.
pub struct SharedActivation {
    act: UnsafeCell<ActivationBuf>,
    /// The q8_K buffers' starts, taken once at construction: they never grow or move, and
    /// each block's writes go through these, so no thread holds a `&mut` to the whole.
    qs: *mut i8,
    d: *mut f32,
    bsums: *mut i16,
    sums32: *mut i16,
    format: Format,
    k: usize,
}

// SAFETY: the pointers are into buffers owned by `act`, which lives as long as `self`; writes
// through them are to disjoint blocks (the contract of `prepare_blocks`), and reads of the whole
// happen only after every write, ordered by the caller (the contract of `activation`).
unsafe impl Send for SharedActivation {}
// SAFETY: as above.
unsafe impl Sync for SharedActivation {}

impl SharedActivation {
    /// Whether `fmt`'s activation can be prepared this way (its activation is q8_K).
    pub fn supports(fmt: Format) -> bool {
        ActivationBuf::takes_q8k(fmt)
    }

    /// An activation of length `k` for `fmt` weights, every block still to prepare.
    ///
    /// Errors: a format whose activation is not q8_K, or `k` not a positive multiple of 256.
    pub fn new(fmt: Format, k: usize) -> Result<SharedActivation, QuantError> {
        fmt.row_bytes(k)?;
        if !Self::supports(fmt) {
            return Err(QuantError::ActivationMismatch {
                format: fmt,
                k,
                act_format: Format::Q4K,
                act_k: k,
            });
        }
        let mut act = ActivationBuf::q8k_zeroed(fmt, k);
        // Always q8_K (`q8k_zeroed`); refused rather than assumed.
        let ActKind::Q8K(q) = &mut act.kind else {
            return Err(QuantError::ActivationMismatch {
                format: fmt,
                k,
                act_format: Format::Q4K,
                act_k: k,
            });
        };
        let (qs, d) = (q.qs.as_mut_ptr(), q.d.as_mut_ptr());
        let (bsums, sums32) = (q.bsums.as_mut_ptr(), q.sums32.as_mut_ptr());
        Ok(SharedActivation {
            act: UnsafeCell::new(act),
            qs,
            d,
            bsums,
            sums32,
            format: fmt,
            k,
        })
    }

    /// Blocks of [`Q8K_BLOCK`] elements: the units threads take.
    pub fn blocks(&self) -> usize {
        self.k / Q8K_BLOCK
    }

    /// Prepare blocks `blocks` from `x` (the whole activation, `k` elements).
    ///
    /// Errors: `x` of another length, a block past the end, or a non-finite value in one of
    /// these blocks (the blocks before it are prepared).
    ///
    /// # Safety
    /// No other thread prepares any of these blocks at the same time or later, and no thread
    /// holds [`SharedActivation::activation`]'s reference meanwhile.
    pub unsafe fn prepare_blocks(&self, x: &[f32], blocks: Range<usize>) -> Result<(), QuantError> {
        if x.len() != self.k {
            return Err(QuantError::ActivationMismatch {
                format: self.format,
                k: self.k,
                act_format: self.format,
                act_k: x.len(),
            });
        }
        if blocks.end > self.blocks() {
            return Err(QuantError::ShortBuffer {
                what: "q8_K blocks",
                need: blocks.end,
                got: self.blocks(),
            });
        }
        for b in blocks {
            // SAFETY: the caller's contract, for each of these blocks.
            unsafe { self.prepare_block(b, &x[b * Q8K_BLOCK..(b + 1) * Q8K_BLOCK])? };
        }
        Ok(())
    }

    /// Prepare block `b` from its own [`Q8K_BLOCK`] values `src` (for a reader that gathers a
    /// block's elements itself, such as from a tagged mailbox).
    ///
    /// Errors: `src` of another length, a block past the end, or a non-finite value.
    ///
    /// # Safety
    /// As [`SharedActivation::prepare_blocks`], for block `b`.
    pub unsafe fn prepare_block(&self, b: usize, src: &[f32]) -> Result<(), QuantError> {
        if src.len() != Q8K_BLOCK {
            return Err(QuantError::ActivationMismatch {
                format: self.format,
                k: Q8K_BLOCK,
                act_format: self.format,
                act_k: src.len(),
            });
        }
        if b >= self.blocks() {
            return Err(QuantError::ShortBuffer {
                what: "q8_K blocks",
                need: b + 1,
                got: self.blocks(),
            });
        }
        if src.iter().any(|v| !v.is_finite()) {
            return Err(QuantError::NonFinite {
                format: self.format,
                what: "activation value",
                block: b,
            });
        }
        // SAFETY: block b is in bounds of every buffer (b < blocks(); the buffers hold
        // blocks() blocks) and, by the contract, written by this thread alone.
        let d = unsafe {
            q8k_block(
                self.format,
                src,
                std::slice::from_raw_parts_mut(self.qs.add(b * Q8K_BLOCK), Q8K_BLOCK),
                std::slice::from_raw_parts_mut(
                    self.bsums.add(b * BSUMS_PER_BLOCK),
                    BSUMS_PER_BLOCK,
                ),
                std::slice::from_raw_parts_mut(
                    self.sums32.add(b * SUMS32_PER_BLOCK),
                    SUMS32_PER_BLOCK,
                ),
            )
        };
        // SAFETY: as above.
        unsafe { self.d.add(b).write(d) };
        Ok(())
    }

    /// The prepared activation.
    ///
    /// # Safety
    /// Every block has been prepared, and those writes happen before this call (for instance
    /// a counter of prepared blocks, incremented with release and read with acquire); no block
    /// is prepared again while the reference lives.
    pub unsafe fn activation(&self) -> &ActivationBuf {
        // SAFETY: by the contract, no write is in flight or to come while this borrow lives.
        unsafe { &*self.act.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::ActKind;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn parts(a: &ActivationBuf) -> (Vec<i8>, Vec<u32>, Vec<i16>, Vec<i16>) {
        let ActKind::Q8K(q) = &a.kind else {
            panic!("q8_K expected")
        };
        (
            q.qs.clone(),
            q.d.iter().map(|v| v.to_bits()).collect(),
            q.bsums.clone(),
            q.sums32.clone(),
        )
    }

    /// Threads taking blocks off a counter, in whatever order they get them, make the same
    /// activation, bit for bit, as `ActivationBuf::prepare`.
    #[test]
    fn blocks_prepared_by_many_threads_equal_prepare() {
        let mut rng = ChaCha8Rng::seed_from_u64(41);
        for (fmt, k, threads) in [
            (Format::Q4K, 4096usize, 5usize),
            (Format::Q6K, 14336, 7),
            (Format::Q4K, 256, 3),
        ] {
            let mut x: Vec<f32> = (0..k).map(|_| rng.random_range(-4.0f32..4.0)).collect();
            x[..Q8K_BLOCK.min(k)].fill(0.0);
            let want = ActivationBuf::prepare(fmt, &x).expect("prepare");
            let shared = SharedActivation::new(fmt, k).expect("shared");
            let (next, done) = (AtomicUsize::new(0), AtomicUsize::new(0));
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| loop {
                        let b = next.fetch_add(1, Ordering::Relaxed);
                        if b >= shared.blocks() {
                            break;
                        }
                        // SAFETY: the counter hands each block to one thread.
                        unsafe { shared.prepare_blocks(&x, b..b + 1) }.expect("block");
                        done.fetch_add(1, Ordering::Release);
                    });
                }
            });
            assert_eq!(done.load(Ordering::Acquire), shared.blocks());
            // SAFETY: every block prepared; the scope joined every thread.
            let got = unsafe { shared.activation() };
            assert_eq!(parts(got), parts(&want), "{fmt} k={k}");
            assert_eq!((got.format(), got.k()), (fmt, k));
        }
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        assert!(SharedActivation::new(Format::Q8_0, 4096).is_err());
        assert!(SharedActivation::new(Format::Q4K, 100).is_err());
        let s = SharedActivation::new(Format::Q4K, 512).expect("shared");
        let mut x = vec![0.5f32; 512];
        // SAFETY: one thread, no reader.
        unsafe {
            assert!(s.prepare_blocks(&x[..256], 0..1).is_err());
            assert!(s.prepare_blocks(&x, 1..3).is_err());
            x[300] = f32::NAN;
            assert!(matches!(
                s.prepare_blocks(&x, 0..2),
                Err(QuantError::NonFinite { block: 1, .. })
            ));
        }
    }
}
