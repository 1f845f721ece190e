//! `/metrics`: counters, gauges and histograms in Prometheus's text exposition format
//! (version 0.0.4), written by hand — a dozen series do not need a registry crate.
//!
//! The engine thread and the HTTP tasks update them; each value is an atomic or sits behind a
//! short-held std `Mutex` (never held across an await or a forward pass).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Time-to-first-token buckets (seconds): a 135M model on 2 cores answers in tens of ms, an 8B
/// one with a long prompt in seconds.
const TTFT_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Inter-token buckets (seconds): from a fast batch of one (a few ms) to a loaded box.
const ITL_BUCKETS: &[f64] = &[0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0];
/// Sequences per forward step: powers of two up to a large `--parallel`.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// A cumulative histogram with fixed upper bounds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    state: Mutex<HistState>,
}

#[derive(Debug, Default, Clone)]
struct HistState {
    /// Observations ≤ each bound (not yet cumulative), plus the `+Inf` overflow at the end.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            state: Mutex::new(HistState {
                counts: vec![0; bounds.len() + 1],
                ..HistState::default()
            }),
        }
    }

    /// Record one value.
    pub fn observe(&self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.counts[i] += 1;
        s.sum += v;
        s.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).count
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0;
        for (b, c) in self.bounds.iter().zip(&s.counts) {
            acc += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {acc}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", s.count);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", s.sum, s.count);
    }
}

/// Every series the server exports.
#[derive(Debug)]
pub struct Metrics {
    /// Finished requests by endpoint and HTTP status (`200`, `400`, `429`, ...; a request whose
    /// client went away mid-generation counts as `499`, nginx's "client closed request").
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// Prompt tokens prefilled.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens a slot already held from an earlier request (reused, not prefilled).
    pub prompt_tokens_reused: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Requests waiting for a slot.
    pub queue_depth: AtomicU64,
    /// Sequences holding a slot.
    pub running: AtomicU64,
    /// KV cache bytes the running sequences fill now.
    pub kv_bytes: AtomicU64,
    /// Bytes the slots may fill: slots × (context × KV bytes per position, plus a hybrid's
    /// recurrent state and prefix snapshots) ([`crate::kv_reserve_bytes`]).
    pub kv_capacity_bytes: AtomicU64,
    /// Forward steps run.
    pub steps: AtomicU64,
    /// Sequences per forward step.
    pub batch_size: Histogram,
    /// Request arrival to first generated token.
    pub ttft: Histogram,
    /// Between consecutive tokens of one sequence.
    pub inter_token: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            prompt_tokens_reused: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            queue_depth: AtomicU64::new(0),
            running: AtomicU64::new(0),
            kv_bytes: AtomicU64::new(0),
            kv_capacity_bytes: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            batch_size: Histogram::new(BATCH_BUCKETS),
            ttft: Histogram::new(TTFT_BUCKETS),
            inter_token: Histogram::new(ITL_BUCKETS),
        }
    }
}

impl Metrics {
    /// Count one finished request.
    pub fn request(&self, endpoint: &'static str, status: u16) {
        let mut r = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *r.entry((endpoint, status)).or_default() += 1;
    }

    /// Requests counted for `endpoint` with `status`.
    pub fn requests_with(&self, endpoint: &'static str, status: u16) -> u64 {
        let r = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        r.get(&(endpoint, status)).copied().unwrap_or(0)
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP hipfire_requests_total Finished requests by endpoint and HTTP status.\n\
             # TYPE hipfire_requests_total counter\n",
        );
        let reqs = self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for ((e, s), n) in reqs {
            let _ = writeln!(
                out,
                "hipfire_requests_total{{endpoint=\"{e}\",status=\"{s}\"}} {n}"
            );
        }
        let scalar = |out: &mut String, name: &str, kind: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        };
        scalar(
            &mut out,
            "hipfire_prompt_tokens_total",
            "counter",
            "Prompt tokens prefilled.",
            &self.prompt_tokens,
        );
        scalar(
            &mut out,
            "hipfire_prompt_tokens_reused_total",
            "counter",
            "Prompt tokens a slot already held from an earlier request (not prefilled again).",
            &self.prompt_tokens_reused,
        );
        scalar(
            &mut out,
            "hipfire_generated_tokens_total",
            "counter",
            "Tokens generated.",
            &self.generated_tokens,
        );
        scalar(
            &mut out,
            "hipfire_steps_total",
            "counter",
            "Batched forward steps run.",
            &self.steps,
        );
        scalar(
            &mut out,
            "hipfire_queue_depth",
            "gauge",
            "Requests waiting for a sequence slot.",
            &self.queue_depth,
        );
        scalar(
            &mut out,
            "hipfire_running_sequences",
            "gauge",
            "Sequences holding a slot (prefilling or decoding).",
            &self.running,
        );
        scalar(
            &mut out,
            "hipfire_kv_cache_bytes",
            "gauge",
            "KV cache bytes filled by running sequences.",
            &self.kv_bytes,
        );
        scalar(
            &mut out,
            "hipfire_kv_cache_capacity_bytes",
            "gauge",
            "Bytes the slots may fill: KV cache at full context, plus a hybrid's recurrent state and prefix snapshots.",
            &self.kv_capacity_bytes,
        );
        self.batch_size.render(
            &mut out,
            "hipfire_batch_size",
            "Sequences per batched forward step.",
        );
        self.ttft.render(
            &mut out,
            "hipfire_time_to_first_token_seconds",
            "From request arrival to its first generated token.",
        );
        self.inter_token.render(
            &mut out,
            "hipfire_inter_token_seconds",
            "Between consecutive generated tokens of one sequence.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_text_is_well_formed() {
        let m = Metrics::default();
        for v in [0.003, 0.004, 0.03, 7.0] {
            m.inter_token.observe(v);
        }
        m.request("chat", 200);
        m.request("chat", 200);
        m.request("completion", 400);
        let t = m.render();
        assert!(t.contains("hipfire_inter_token_seconds_bucket{le=\"0.002\"} 0\n"));
        assert!(t.contains("hipfire_inter_token_seconds_bucket{le=\"0.005\"} 2\n"));
        assert!(t.contains("hipfire_inter_token_seconds_bucket{le=\"0.05\"} 3\n"));
        assert!(t.contains("hipfire_inter_token_seconds_bucket{le=\"2\"} 3\n"));
        assert!(t.contains("hipfire_inter_token_seconds_bucket{le=\"+Inf\"} 4\n"));
        assert!(t.contains("hipfire_inter_token_seconds_count 4\n"));
        assert!(t.contains("hipfire_requests_total{endpoint=\"chat\",status=\"200\"} 2\n"));
        assert!(t.contains("hipfire_requests_total{endpoint=\"completion\",status=\"400\"} 1\n"));
        // Every sample line is `name{labels} value` with a number for the value.
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            let v = line.rsplit(' ').next().expect("value");
            assert!(v.parse::<f64>().is_ok(), "{line}");
        }
    }
}
