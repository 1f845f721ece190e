//! The flags arm's host-side knobs and their measured defaults.

use hipfire_quant::{Format, SharedActivation};

/// The flags arm's host-side tuning (`single_layer --flags-variants`); the default is what
/// measured best on the H200 box (docs/perf-checkpoints/2026-11-29-done-words-dram-layers-h200,
/// -layer-targets-rounds-h200 and 2026-11-30-cpu-idle-chunks-h200). The alternatives that lost
/// their A/B were deleted with their code; their figures stay in those records and in
/// docs/design.md's table of alternatives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlagsTuning {
    /// While a worker waits for x (and for the shared activation), it prefetches up to this
    /// many bytes of the start of its weight rows into its L2 (x86-64; 0: off), so that the
    /// time between steps, when the memory system is idle, does part of the arm's reading
    /// ([`DEFAULT_WAIT_PREFETCH_BYTES`]).
    pub prefetch_bytes: usize,
    /// The CPU rows are cut into about this many chunks per worker (at most
    /// [`crate::flags::MAX_DONE_PARTS`] in all), each with its own done word: every worker starts on its own
    /// chunk (the one it prefetches while waiting), then takes the rest off a counter, so that
    /// a worker slowed by its core (a VM's vCPUs are not equal) hands its share to the others
    /// instead of holding the step ([`DEFAULT_CHUNKS_PER_WORKER`]; 0 counts as 1).
    pub chunks_per_worker: u8,
    /// For formats whose workers prepare x together ([`FlagsTuning::x_is_shared`]), the device
    /// stores each element as one 8-byte word with the step beside it
    /// (`FlagsKernels::publish_tagged`): no system fence and no sequence word behind x; the
    /// workers poll element 0 and check every element's step as they read it. Off
    /// (`memory.flags_x_publish = fenced`) for a platform where an aligned 8-byte device store
    /// is not known to reach host memory whole: x then goes down plain, behind a fence and the
    /// sequence word.
    pub tagged_x: bool,
    /// Blocks of the tagged publish at most ([`DEFAULT_PUBLISH_BLOCKS`]); it uses one per 1024
    /// elements of x up to this. One block writes x over the link at a few GB/s (the publish
    /// took 6.1 µs a step for 16–56 KiB of x on the H200, the 2026-11-30 cpu-idle record), and
    /// the GPU arm starts after it. Still under measurement, so only in builds with the
    /// `experiments` feature; the product publishes with [`DEFAULT_PUBLISH_BLOCKS`].
    #[cfg(feature = "experiments")]
    pub publish_blocks: u32,
}

/// The tagged publish runs as one block by default ([`FlagsTuning::tagged_publish_blocks`]). On
/// the H200, 16 blocks ran the layer at 1.018× with a host sync around every layer (95 %
/// interval 1.003–1.030, 15 interleaved rounds) but 0.998× at 8 layers per timed rep, where that
/// call's rounds spread 0.78–1.45 (docs/perf-checkpoints/2026-11-30-share-intervals-h200 record
/// 08): one block until the chained case, decode's, confirms the gain.
pub const DEFAULT_PUBLISH_BLOCKS: u32 = 1;

/// x travels tagged by default ([`FlagsTuning::tagged_x`]): on the H200 box the device's
/// publish went from 7.4 to 6.1 µs a step, the layer ran 1.010× as fast (median of 15
/// interleaved rounds), and with it the layer met every target at 8 layers per timed rep
/// (docs/perf-checkpoints/2026-11-30-cpu-idle-chunks-h200, record 05).
pub const DEFAULT_TAGGED_X: bool = true;

/// Chunks per worker by default ([`FlagsTuning::chunks_per_worker`]): 4 (60 chunks for 15
/// workers, within the fold's 64 done words). On the H200 box, one part per worker ran at
/// 0.955× of it and 8 chunks at 1.005× (record 04); in an earlier A/B 4 chunks ran 1.008× and 2
/// chunks 0.994× of one part per worker (record 02); medians of 15 interleaved rounds,
/// docs/perf-checkpoints/2026-11-30-cpu-idle-chunks-h200.
pub const DEFAULT_CHUNKS_PER_WORKER: u8 = 4;

/// Bytes of its weight rows a worker prefetches while it waits for x and for the shared
/// activation ([`FlagsTuning::prefetch_bytes`]): 64 KiB, about what fifteen workers can read in
/// the ~13 µs between steps at the box's ~70 GB/s, and a thirtieth of a core's 2 MiB L2. On the
/// H200 box the layer ran 1.035× as fast as with none (16 KiB 1.024×, 256 KiB 1.028×; medians
/// of 13 interleaved rounds, docs/perf-checkpoints/2026-11-30-cpu-idle-chunks-h200, record 01), and
/// none ran at 0.970× of it in record 02; 128 KiB read 0.956–1.016× of it over four A/Bs
/// (records 02–05), so it stays at 64.
pub const DEFAULT_WAIT_PREFETCH_BYTES: usize = 64 << 10;

impl Default for FlagsTuning {
    fn default() -> Self {
        FlagsTuning {
            prefetch_bytes: DEFAULT_WAIT_PREFETCH_BYTES,
            chunks_per_worker: DEFAULT_CHUNKS_PER_WORKER,
            tagged_x: DEFAULT_TAGGED_X,
            #[cfg(feature = "experiments")]
            publish_blocks: DEFAULT_PUBLISH_BLOCKS,
        }
    }
}

impl FlagsTuning {
    /// Whether x travels tagged ([`FlagsTuning::tagged_x`]) for `format` under these knobs.
    pub fn x_is_tagged(&self, format: Format) -> bool {
        self.tagged_x && self.x_is_shared(format)
    }

    /// Whether the workers prepare x together for `format` (its CPU activation is q8_K:
    /// Q4_K, Q6_K): each takes 256-element blocks off a counter, and all read the one result.
    /// On the H200 box this cut the workers' preparation from 3.5 to 1.7 % of the layer's wall,
    /// and the layer ran 1.011× as fast as each worker preparing all of x itself (median of 9
    /// interleaved rounds, twice: docs/perf-checkpoints/2026-11-29-layer-targets-rounds-h200).
    /// Other formats: each worker prepares x itself.
    pub fn x_is_shared(&self, format: Format) -> bool {
        SharedActivation::supports(format)
    }

    /// Blocks of the tagged publish at most: [`DEFAULT_PUBLISH_BLOCKS`], or under the
    /// `experiments` feature the tuning's `publish_blocks`.
    pub fn tagged_publish_blocks(&self) -> u32 {
        #[cfg(feature = "experiments")]
        {
            self.publish_blocks
        }
        #[cfg(not(feature = "experiments"))]
        {
            DEFAULT_PUBLISH_BLOCKS
        }
    }
}
