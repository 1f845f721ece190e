//! Decode throughput of the CPU path on one GGUF.
//!
//! `cargo run --release -p hipfire-model --example decode_bench -- MODEL.gguf [threads] [n_tokens] [rounds] [prompt] [ctx]`
//!
//! Prefills the prompt, then runs `n_tokens` greedy decode steps (EOG ignored), `rounds`
//! times on one loaded model; prints one JSON line per round with the decode tok/s (forward
//! passes per second after the prompt, prefill excluded) so a driver script can interleave it
//! with other engines.

use hipfire_model::{LoadOptions, Model, ModelError, SamplingParams};

/// Defaults: 2 threads (this CI box has 2 cores), 64 tokens, 3 rounds.
const DEFAULT_THREADS: usize = 2;
const DEFAULT_TOKENS: usize = 64;
const DEFAULT_ROUNDS: usize = 3;
const DEFAULT_PROMPT: &str = "The capital of France is";

fn main() -> Result<(), ModelError> {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: decode_bench MODEL.gguf [threads] [n_tokens] [rounds] [prompt] [ctx]");
        std::process::exit(2);
    };
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (threads, n, rounds) = (
        num(2, DEFAULT_THREADS),
        num(3, DEFAULT_TOKENS),
        num(4, DEFAULT_ROUNDS),
    );
    let prompt = args.get(5).map_or(DEFAULT_PROMPT, String::as_str);
    // Context length (default: the model's, capped as `Model::load` caps it).
    let ctx_len = args.get(6).and_then(|s| s.parse().ok());
    let model = Model::load(
        path,
        &LoadOptions {
            threads,
            ctx_len,
            ..Default::default()
        },
    )?;
    eprintln!("{}", model.placement_summary());
    let ids = model
        .tokenizer()
        .encode(prompt, model.tokenizer().add_bos)?;
    let params = SamplingParams {
        stop_at_eog: false,
        ..SamplingParams::greedy(n + 1)
    };
    for round in 0..rounds {
        let mut s = model.session();
        let st = s.generate(&ids, &params, |_| true)?;
        println!(
            "{{\"engine\":\"hipfire-cpu\",\"round\":{round},\"threads\":{threads},\"prompt_tokens\":{},\"decode_steps\":{},\"prefill_s\":{:.4},\"decode_s\":{:.4},\"decode_tok_s\":{:.2}}}",
            st.prompt_tokens,
            st.decode_steps,
            st.prefill_s,
            st.decode_s,
            st.decode_tok_per_s()
        );
    }
    Ok(())
}
