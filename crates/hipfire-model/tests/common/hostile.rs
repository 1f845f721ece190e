//! A corpus of hostile and careless GGUF files, generated from a small valid model: crafted
//! metadata (sizes that are huge, zero or disagree with the tensors; hyper-parameters that are
//! not finite; strings and arrays whose lengths run away; tensors outside the file). Shared by
//! hipfire-model's `hostile_gguf` test (in-process load in a child process, plus random
//! mutations) and hipfire-cli's `hostile_models` test (through the `hipfire` binary), so it
//! uses nothing beyond both crates' dependencies.
//!
//! Uses only the crate's long-standing public API (synth, writer, reader), so the same corpus
//! runs against a build without the checks it exercises.
#![allow(dead_code)]

use std::path::Path;

use hipfire_model::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue, TensorSpec};
use hipfire_model::{write_synthetic, Arch, SynthSpec};
use hipfire_quant::Format;

/// Longest error message (bytes) any hostile file may produce: a few quoted names (each cut
/// to 96 characters by the reader) and numbers fit many times over; the unfixed reader printed
/// ~170 MB for one flipped bit in a tensor-name length.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// The base model's architecture key prefix.
const A: &str = "llama";

/// What loading a case must do.
#[derive(Debug, Clone)]
pub enum Expect {
    /// Load fails with a message containing every one of these substrings.
    Refused(&'static [&'static str]),
    /// Load succeeds (and decoding a token works).
    Loads,
    /// Either, as long as it is clean (random mutations).
    Either,
}

/// One crafted file.
#[derive(Debug, Clone)]
pub struct Case {
    /// Short name (used as the file name).
    pub name: String,
    /// The file.
    pub bytes: Vec<u8>,
    /// What loading it must do.
    pub expect: Expect,
}

/// The small valid model every case starts from: 2 llama blocks, width 64, FFN 128, 2/1 heads
/// of 32, a 260-token byte-level vocabulary, Q8_0 matrices (~130 KB, loads in milliseconds).
pub fn base_model(dir: &Path) -> Vec<u8> {
    let spec = SynthSpec {
        name: "hostile-base".into(),
        arch: Arch::Llama,
        n_layer: 2,
        d_model: 64,
        n_ff: 128,
        n_head: 2,
        n_head_kv: 1,
        head_dim: 32,
        vocab: 260,
        ctx_len: 64,
        rope_theta: 10_000.0,
        tied_embeddings: false,
        rope_scaling: hipfire_model::RopeScaling::none(64),
        moe: None,
        delta_net: None,
        rope_dim: None,
        sliding_window: None,
    };
    std::fs::create_dir_all(dir).expect("corpus dir");
    let path = dir.join("base.gguf");
    write_synthetic(&path, &spec, Format::Q8_0, 11, None).expect("synth base model");
    let bytes = std::fs::read(&path).expect("read base model");
    let _ = std::fs::remove_file(&path);
    bytes
}

/// A model as metadata plus (tensor, bytes), to edit and write back.
struct Parts {
    meta: Vec<(String, MetaValue)>,
    tensors: Vec<(TensorSpec, Vec<u8>)>,
}

impl Parts {
    fn of(bytes: &[u8]) -> Parts {
        let f = GgufFile::from_bytes(bytes.to_vec()).expect("base parses");
        let tensors = f
            .index()
            .tensors
            .iter()
            .map(|t| {
                (
                    TensorSpec {
                        name: t.name.clone(),
                        dims: t.dims.clone(),
                        ggml_type: t.ggml_type,
                    },
                    f.tensor_data(t).to_vec(),
                )
            })
            .collect();
        Parts {
            meta: f.index().metadata.clone(),
            tensors,
        }
    }

    fn set(mut self, key: &str, v: MetaValue) -> Parts {
        match self.meta.iter_mut().find(|(k, _)| k == key) {
            Some(kv) => kv.1 = v,
            None => self.meta.push((key.to_owned(), v)),
        }
        self
    }

    fn arch(self, k: &str, v: MetaValue) -> Parts {
        self.set(&format!("{A}.{k}"), v)
    }

    fn tensor(mut self, name: &str, dims: &[u64], values: &[f32]) -> Parts {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensors.push((
            TensorSpec {
                name: name.to_owned(),
                dims: dims.to_vec(),
                ggml_type: GgmlType(0),
            },
            data,
        ));
        self
    }

    fn rename(mut self, from: &str, to: &str) -> Parts {
        let t = self
            .tensors
            .iter_mut()
            .find(|(s, _)| s.name == from)
            .expect("tensor to rename");
        t.0.name = to.to_owned();
        self
    }

    fn write(&self) -> Vec<u8> {
        let specs: Vec<TensorSpec> = self.tensors.iter().map(|(s, _)| s.clone()).collect();
        let mut w = GgufWriter::new(Vec::new(), &self.meta, &specs).expect("writer header");
        for (_, d) in &self.tensors {
            w.write_data(d).expect("tensor data");
        }
        w.finish().expect("finish")
    }
}

fn u32v(v: u32) -> MetaValue {
    MetaValue::U32(v)
}
fn u64v(v: u64) -> MetaValue {
    MetaValue::U64(v)
}
fn f32v(v: f32) -> MetaValue {
    MetaValue::F32(v)
}

/// Offset of the u64 length that precedes the GGUF string `s` (as a key or tensor name).
fn string_len_at(img: &[u8], s: &str) -> usize {
    let mut pat = (s.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(s.as_bytes());
    img.windows(pat.len())
        .position(|w| w == pat.as_slice())
        .unwrap_or_else(|| panic!("{s} not in the image"))
}

pub fn put_u64(img: &mut [u8], at: usize, v: u64) {
    img[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Offset of the `offset` field of tensor `name`'s info.
fn tensor_offset_at(img: &[u8], name: &str) -> usize {
    let at = string_len_at(img, name) + 8 + name.len();
    let n_dims = u32::from_le_bytes(img[at..at + 4].try_into().expect("4 bytes")) as usize;
    at + 4 + 8 * n_dims + 4
}

/// Every crafted case, from the base image.
pub fn crafted(base: &[u8]) -> Vec<Case> {
    let p = || Parts::of(base);
    let mut cases: Vec<Case> = Vec::new();
    let mut add = |name: &str, bytes: Vec<u8>, expect: Expect| {
        cases.push(Case {
            name: name.to_owned(),
            bytes,
            expect,
        })
    };
    use Expect::{Loads, Refused};
    add("valid", base.to_vec(), Loads);

    // Sizes that reach allocations: each must be refused, naming its key.
    add(
        "block-count-huge",
        p().arch("block_count", u32v(u32::MAX)).write(),
        Refused(&["llama.block_count"]),
    );
    add(
        "block-count-u64-max",
        p().arch("block_count", u64v(u64::MAX)).write(),
        Refused(&["llama.block_count"]),
    );
    add(
        "block-count-zero",
        p().arch("block_count", u32v(0)).write(),
        Refused(&["llama.block_count"]),
    );
    add(
        "block-count-zero-ffn-huge",
        p().arch("block_count", u32v(0))
            .arch("feed_forward_length", u64v(1 << 40))
            .write(),
        Refused(&["llama."]),
    );
    add(
        "block-count-zero-heads-huge",
        p().arch("block_count", u32v(0))
            .arch("attention.head_count", u64v(1 << 40))
            .arch("attention.head_count_kv", u64v(1 << 40))
            .write(),
        Refused(&["llama."]),
    );
    add(
        "ffn-huge",
        p().arch("feed_forward_length", u64v(1 << 40)).write(),
        Refused(&["llama.feed_forward_length"]),
    );
    add(
        "ffn-mismatch",
        p().arch("feed_forward_length", u32v(256)).write(),
        Refused(&["llama.feed_forward_length", "blk.0.ffn_up.weight"]),
    );
    add(
        "heads-huge",
        p().arch("attention.head_count", u64v(1 << 40)).write(),
        Refused(&["llama.attention.head_count"]),
    );
    add(
        "kv-heads-huge",
        p().arch("attention.head_count_kv", u64v(u64::MAX)).write(),
        Refused(&["llama.attention.head_count_kv"]),
    );
    add(
        "kv-heads-mismatch",
        p().arch("attention.head_count_kv", u32v(2)).write(),
        Refused(&["llama.attention.head_count_kv", "blk.0.attn_k.weight"]),
    );
    add(
        "embedding-huge",
        p().arch("embedding_length", u64v(1 << 40)).write(),
        Refused(&["llama.embedding_length"]),
    );
    add(
        "embedding-mismatch",
        p().arch("embedding_length", u32v(128)).write(),
        Refused(&["llama.embedding_length", "token_embd.weight"]),
    );
    add(
        "key-length-zero",
        p().arch("attention.key_length", u32v(0)).write(),
        Refused(&["llama.attention.key_length"]),
    );
    add(
        "key-length-huge",
        p().arch("attention.key_length", u64v(1 << 40)).write(),
        Refused(&["llama.attention.key_length"]),
    );
    add(
        "value-length-differs",
        p().arch("attention.value_length", u32v(16)).write(),
        Refused(&["llama.attention.value_length"]),
    );
    add(
        "context-length-zero",
        p().arch("context_length", u32v(0)).write(),
        Refused(&["llama.context_length"]),
    );
    add(
        "context-length-huge",
        p().arch("context_length", u64v(u64::MAX)).write(),
        Refused(&["llama.context_length"]),
    );

    // Quietly wrong before: must be refused, naming both the key and the tensors.
    add(
        "block-count-fewer",
        p().arch("block_count", u32v(1)).write(),
        Refused(&["llama.block_count", "2 blocks"]),
    );
    add(
        "block-count-more",
        p().arch("block_count", u32v(3)).write(),
        Refused(&["llama.block_count", "2 blocks"]),
    );
    add(
        "block-stray",
        p().tensor("blk.7.attn_norm.weight", &[64], &[1.0; 64])
            .write(),
        Refused(&["llama.block_count", "blk.7"]),
    );
    for (name, v) in [
        ("rope-base-nan", f32::NAN),
        ("rope-base-inf", f32::INFINITY),
        ("rope-base-negative", -10_000.0),
        ("rope-base-zero", 0.0),
    ] {
        add(
            name,
            p().arch("rope.freq_base", f32v(v)).write(),
            Refused(&["llama.rope.freq_base"]),
        );
    }
    add(
        "rope-base-string",
        p().arch("rope.freq_base", MetaValue::String("1e4".into()))
            .write(),
        Refused(&["llama.rope.freq_base"]),
    );
    for (name, v) in [
        ("rms-eps-nan", MetaValue::F32(f32::NAN)),
        ("rms-eps-zero", MetaValue::F32(0.0)),
        ("rms-eps-negative", MetaValue::F32(-1e-5)),
        ("rms-eps-underflows-f32", MetaValue::F64(1e-60)),
    ] {
        add(
            name,
            p().arch("attention.layer_norm_rms_epsilon", v).write(),
            Refused(&["llama.attention.layer_norm_rms_epsilon"]),
        );
    }
    add(
        "rope-dim-zero",
        p().arch("rope.dimension_count", u32v(0)).write(),
        Refused(&["llama.rope.dimension_count"]),
    );
    add(
        "rope-dim-odd",
        p().arch("rope.dimension_count", u32v(31)).write(),
        Refused(&["llama.rope.dimension_count"]),
    );
    add(
        "rope-dim-wider-than-head",
        p().arch("rope.dimension_count", u32v(64)).write(),
        Refused(&["llama.rope.dimension_count"]),
    );
    add(
        "rope-factor-nan",
        p().tensor("rope_freqs.weight", &[16], &[f32::NAN; 16])
            .write(),
        Refused(&["rope_freqs.weight"]),
    );
    add(
        "vocab-mismatch",
        {
            let mut parts = p();
            for (k, v) in &mut parts.meta {
                if k == "tokenizer.ggml.tokens" || k == "tokenizer.ggml.token_type" {
                    if let MetaValue::Array(_, items) = v {
                        items.truncate(259);
                    }
                }
            }
            parts.write()
        },
        Refused(&["tokenizer.ggml.tokens"]),
    );
    add(
        "bos-out-of-vocab",
        p().set("tokenizer.ggml.bos_token_id", u32v(100_000))
            .write(),
        Refused(&["100000"]),
    );

    // Strings from the file in messages: cut, never quoted whole.
    let long = "x".repeat(100_000);
    add(
        "architecture-long",
        p().set("general.architecture", MetaValue::String(long.clone()))
            .write(),
        Refused(&["architecture", "100000 bytes"]),
    );
    add(
        "tokenizer-model-long",
        p().set("tokenizer.ggml.model", MetaValue::String(long.clone()))
            .write(),
        Refused(&["tokenizer model", "100000 bytes"]),
    );
    add(
        "tensor-name-64-bytes",
        p().rename("output_norm.weight", &"n".repeat(64)).write(),
        Refused(&["tensor name"]),
    );
    add(
        "block-number-garbage",
        p().tensor("blk.seven.attn_norm.weight", &[64], &[1.0; 64])
            .write(),
        Refused(&["blk.seven"]),
    );
    add(
        "chat-template-unknown",
        p().set(
            "tokenizer.chat_template",
            // Long (a comment holds the bulk) but renders short: the tiny model's context is 64.
            MetaValue::String(format!(
                "[INST] {{{{ messages[0].content }}}} [/INST]{{# {long} #}}"
            )),
        )
        .write(),
        Loads,
    );
    add(
        "chat-template-broken",
        p().set(
            "tokenizer.chat_template",
            MetaValue::String(format!("{{% for m in messages %}}{{{{ m.content }}{long}")),
        )
        .write(),
        Loads,
    );
    add(
        "chat-template-chatml",
        p().set(
            "tokenizer.chat_template",
            MetaValue::String(
                "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}".into(),
            ),
        )
        .write(),
        Loads,
    );

    // Byte-level damage of lengths and offsets.
    let img = base.to_vec();
    let name_len = |s: &str| string_len_at(&img, s);
    {
        // A string length far beyond the file.
        let mut b = img.clone();
        put_u64(&mut b, name_len("general.name") + 8 + 12 + 4, u64::MAX / 2);
        add("string-length-huge", b, Refused(&["string"]));
    }
    {
        // An array length far beyond the file.
        let mut b = img.clone();
        let at = name_len("tokenizer.ggml.tokens") + 8 + "tokenizer.ggml.tokens".len() + 4 + 4;
        put_u64(&mut b, at, 1 << 40);
        add("array-length-huge", b, Refused(&["array length"]));
    }
    {
        // A tensor-name length that swallows the rest of the header and the data: the name
        // then fits in the file, and the unfixed reader quoted it whole in its error.
        let mut b = img.clone();
        let at = name_len("blk.0.attn_norm.weight");
        let swallow = (b.len() - at - 8 - 16) as u64;
        put_u64(&mut b, at, swallow);
        add("tensor-name-length-flipped", b, Refused(&["tensor name"]));
    }
    {
        // A key length under the spec's 65535 that swallows the following entries: the key is
        // read, and every message quoting it must cut it.
        let mut b = img.clone();
        let at = name_len("tokenizer.ggml.model");
        put_u64(&mut b, at, 60_000);
        add("key-length-swallows", b, Refused(&[]));
    }
    {
        let mut b = img.clone();
        put_u64(
            &mut b,
            tensor_offset_at(&img, "output_norm.weight"),
            1 << 40,
        );
        add("tensor-offset-huge", b, Refused(&["output_norm.weight"]));
    }
    {
        let mut b = img.clone();
        put_u64(
            &mut b,
            tensor_offset_at(&img, "output_norm.weight"),
            u64::MAX - 31,
        );
        add("tensor-offset-wraps", b, Refused(&["output_norm.weight"]));
    }
    {
        let mut b = img.clone();
        let at = tensor_offset_at(&img, "output_norm.weight");
        let off = u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
        put_u64(&mut b, at, off + 1);
        add(
            "tensor-offset-misaligned",
            b,
            Refused(&["output_norm.weight"]),
        );
    }
    {
        // Cut one byte before the end of the last tensor's data (not just its padding).
        let f = GgufFile::from_bytes(img.clone()).expect("base parses");
        let end = f.index().tensors.iter().map(|t| t.start + t.n_bytes).max();
        let mut b = img.clone();
        b.truncate(end.expect("tensors") as usize - 1);
        add("data-truncated", b, Refused(&["past the end"]));
    }
    cases
}
