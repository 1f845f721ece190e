//! Decode steps replayed from captured graphs.
//!
//! With every layer resident, a decode step is ~17 kernels a layer (over 500 for Llama-3-8B)
//! and nothing on the host between them. Launched one by one, each costs a driver submission
//! and leaves the GPU a gap between kernels; captured once into a graph and replayed, the step
//! is one submission and the kernels run back to back — llama.cpp's CUDA backend does the same.
//! Everything that changes between steps lives in device memory the graph reads at replay
//! (the token's embedding row and the slot tables, copied in by the graph itself from pinned
//! staging the host fills first); what is baked into the launches — the batch size and the
//! attention's chunk count and heads per block — is the cache key. Steps that run spilled
//! layers are never captured: their CPU arm and joins need the host in the middle of the step.
use std::collections::HashMap;

use hipfire_gpu::Graph;

use super::{GpuDecoder, GpuWeight};
use crate::gpu_attention::SplitPlan;

/// Environment variable that turns replay off when set to anything but `0` or empty: every
/// kernel of a step is launched one by one (as llama.cpp's `GGML_CUDA_DISABLE_GRAPHS`).
pub const DISABLE_GRAPHS_ENV: &str = "HIPFIRE_DISABLE_GRAPHS";

/// Most captured steps kept (least recently used dropped first). One sequence over a whole
/// context takes about a dozen ([`crate::gpu_attention::graph_chunk_step`]); a server's batch
/// sizes multiply that. Each is a few hundred kernel nodes, well under a MiB of driver memory.
pub const GRAPH_CACHE_MAX: usize = 96;

/// What a captured step's launches bake in: rows of the step and the attention plan's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct GraphKey {
    rows: usize,
    n_chunks: usize,
    heads_per_block: usize,
}

impl GraphKey {
    pub(crate) fn new(rows: usize, plan: &SplitPlan) -> GraphKey {
        GraphKey {
            rows,
            n_chunks: plan.n_chunks,
            heads_per_block: plan.heads_per_block,
        }
    }
}

/// Whether the environment leaves replay on.
pub(crate) fn graphs_enabled() -> bool {
    enabled_by(std::env::var_os(DISABLE_GRAPHS_ENV).as_deref())
}

/// Replay stays on unless [`DISABLE_GRAPHS_ENV`] holds something other than `0` or nothing.
fn enabled_by(disable: Option<&std::ffi::OsStr>) -> bool {
    disable.is_none_or(|v| v.is_empty() || v == "0")
}

/// The captured steps of one decoder, by key (`G` is a graph; the tests use a stand-in, as
/// the cache's bookkeeping does not depend on what it holds).
#[derive(Debug)]
pub(crate) struct DecodeGraphs<G = Graph> {
    cache: HashMap<GraphKey, (G, u64)>,
    /// Steps taken, for least-recently-used eviction.
    tick: u64,
    /// Captures made (a replayed step is not counted).
    captures: u64,
}

impl<G> Default for DecodeGraphs<G> {
    fn default() -> Self {
        DecodeGraphs {
            cache: HashMap::new(),
            tick: 0,
            captures: 0,
        }
    }
}

impl<G> DecodeGraphs<G> {
    /// The graph for `key`, marked as just used.
    pub(crate) fn get(&mut self, key: &GraphKey) -> Option<&G> {
        self.tick += 1;
        let tick = self.tick;
        self.cache.get_mut(key).map(|(g, used)| {
            *used = tick;
            &*g
        })
    }

    /// Keeps `graph` for `key`, dropping the least recently used beyond [`GRAPH_CACHE_MAX`].
    pub(crate) fn insert(&mut self, key: GraphKey, graph: G) -> &G {
        self.captures += 1;
        if self.cache.len() >= GRAPH_CACHE_MAX && !self.cache.contains_key(&key) {
            if let Some(old) = self.cache.iter().min_by_key(|(_, v)| v.1).map(|(k, _)| *k) {
                self.cache.remove(&old);
            }
        }
        self.tick += 1;
        let tick = self.tick;
        let entry = self.cache.entry(key).or_insert((graph, tick));
        &entry.0
    }

    /// Captures made so far.
    pub(crate) fn captures(&self) -> u64 {
        self.captures
    }
}

impl GpuDecoder<'_> {
    /// Turns the replay of captured decode steps on or off; returns whether it is on. It is on
    /// from the start unless [`DISABLE_GRAPHS_ENV`] is set, and cannot be turned on with
    /// spilled layers (their steps need the host between kernels; routed experts in host
    /// memory do not count) or on a decoder built with
    /// graphs off, one slot and no batched prefill (no multi-column scratch). Off drops every
    /// captured step.
    pub fn set_graphs(&mut self, on: bool) -> bool {
        // Layers whose projections the planner splits with the CPU; routed experts in host
        // memory are read by the GPU alone (zero-copy), with no host step between kernels.
        let spilled = (0..self.model.config().n_layer).any(|i| {
            self.model
                .layer_tensors(i)
                .layer_projections()
                .into_iter()
                .any(|id| matches!(self.weights[id], Some(GpuWeight::Host(_))))
        });
        if !on || spilled || self.decode_batch.is_none() || !self.ctx.backend().has_graphs() {
            self.graphs = None;
        } else if self.graphs.is_none() {
            self.graphs = Some(DecodeGraphs::default());
        }
        self.graphs.is_some()
    }

    /// Decode steps captured so far (0 with graphs off); a step replayed from a capture does not
    /// count.
    pub fn graph_captures(&self) -> u64 {
        self.graphs.as_ref().map_or(0, |g| g.captures())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(rows: usize, n_chunks: usize) -> GraphKey {
        GraphKey {
            rows,
            n_chunks,
            heads_per_block: 2,
        }
    }

    #[test]
    fn the_cache_keeps_the_most_recently_used_and_counts_captures() {
        let mut c: DecodeGraphs<usize> = DecodeGraphs::default();
        assert!(c.get(&key(1, 1)).is_none());
        for i in 0..GRAPH_CACHE_MAX {
            assert_eq!(*c.insert(key(1, i), i), i);
        }
        assert_eq!(c.captures(), GRAPH_CACHE_MAX as u64);
        // Key 0 is used again, so key 1 is now the least recently used.
        assert_eq!(c.get(&key(1, 0)), Some(&0));
        c.insert(key(2, 7), 1000);
        assert_eq!(c.cache.len(), GRAPH_CACHE_MAX, "bounded");
        assert!(c.get(&key(1, 1)).is_none(), "the least recently used went");
        assert_eq!(c.get(&key(1, 0)), Some(&0));
        assert_eq!(c.get(&key(2, 7)), Some(&1000));
        // The rows are part of the key: the same plan for another batch size is another graph.
        assert!(c.get(&key(3, 7)).is_none());
        assert_eq!(c.captures(), GRAPH_CACHE_MAX as u64 + 1);
    }

    #[test]
    fn graphs_are_off_only_when_the_variable_says_so() {
        let on = |v: Option<&str>| enabled_by(v.map(std::ffi::OsStr::new));
        assert!(on(None) && on(Some("")) && on(Some("0")));
        assert!(!on(Some("1")) && !on(Some("yes")) && !on(Some("00")));
    }
}
