//! Tokenizer built from the GGUF's own vocabulary (no `tokenizer.json` needed), on top of
//! HF `tokenizers`, plus the chat template.
//!
//! Two vocabularies, chosen by `tokenizer.ggml.model` as llama.cpp does:
//! - `"gpt2"`: byte-level BPE from `tokens` + `merges`; the pre-tokenizer regex follows
//!   `tokenizer.ggml.pre` with llama.cpp's table (`llama-vocab.cpp`, `LLAMA_VOCAB_PRE_TYPE_*`).
//! - `"llama"`: SentencePiece BPE from `tokens` + `scores` with byte fallback. llama.cpp's SPM
//!   tokenizer merges the adjacent pair whose merged piece has the highest score, which is
//!   BPE with merges ranked by that score — the same derivation HF uses when converting a
//!   SentencePiece model (`SentencePieceExtractor`).
//!
//! Control and user-defined tokens (`token_type` 3 and 4) are added as special tokens, so
//! `<|im_start|>` in text maps to its id (llama.cpp's `parse_special = true`).
//!
//! Streaming output does not go through HF: [`Tokenizer::token_bytes`] gives each token's raw
//! bytes and [`StreamDecoder`] holds back incomplete UTF-8, so a multi-byte character split
//! across tokens prints once, whole.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

pub use crate::chat_template::ChatTemplate;
use crate::gguf::{GgufIndex, Quoted};
use crate::ModelError;

/// GGUF `token_type` for a normal token (llama.cpp `LLAMA_TOKEN_TYPE_NORMAL`).
const TOKEN_TYPE_NORMAL: i64 = 1;
/// `LLAMA_TOKEN_TYPE_CONTROL`.
const TOKEN_TYPE_CONTROL: i64 = 3;
/// `LLAMA_TOKEN_TYPE_USER_DEFINED`.
const TOKEN_TYPE_USER_DEFINED: i64 = 4;
/// `LLAMA_TOKEN_TYPE_BYTE` (`<0xAB>` pieces of SentencePiece vocabularies).
const TOKEN_TYPE_BYTE: i64 = 6;

/// SentencePiece's word-boundary marker (U+2581).
const SPM_SPACE: char = '\u{2581}';

/// GPT-2's pre-tokenizer regex (what `ByteLevel` with `use_regex` applies).
/// llama.cpp pre-type "smollm"/"starcoder"/...: digits split one by one, then this.
const PRE_DIGITS_THEN_GPT2: &[&str] = &[
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva",
];
/// llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2` regex.
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN35` regex (Qwen3.5's `tokenizer.json`): Qwen2's with
/// combining marks (`\p{M}`) kept inside words.
const QWEN35_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The pre-types llama.cpp maps to `LLAMA_VOCAB_PRE_TYPE_CHATGLM4` (GLM-4 and GLM-4.5's
/// `glm4`, GLM-5's `glm5`, `chatglm-bpe`): the llama 3 regex, and no BOS token.
const GLM_PRE_TYPES: &[&str] = &["glm4", "glm5", "chatglm-bpe"];
/// llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3` regex (also `LLAMA_VOCAB_PRE_TYPE_CHATGLM4`'s).
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp `LLAMA_VOCAB_PRE_TYPE_GPT4O` regex (gpt-oss's o200k, Llama 4), the form llama.cpp
/// runs: `tokenizer.json`'s `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]` and `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`
/// written as "a letter but not a–z" and "a letter but not A–Z" (lookaheads), and its
/// case-insensitive contractions spelled out.
const GPT4O_REGEX: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// `tokenizer.ggml.pre` names llama.cpp maps to [`GPT4O_REGEX`] (`gpt-4o` is gpt-oss's).
const PRE_GPT4O: &[&str] = &["gpt-4o", "llama4", "kanana2", "talkie"];

/// Names llama.cpp treats as end-of-generation when they are control tokens
/// (`llama_vocab::impl::load`, the EOG auto-detection list).
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    HARMONY_RETURN,
    HARMONY_CALL,
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
];

/// gpt-oss's (o200k_harmony) end of a final answer.
const HARMONY_RETURN: &str = "<|return|>";
/// gpt-oss's end of a tool call.
const HARMONY_CALL: &str = "<|call|>";
/// The end of a harmony message, which is not the end of generation: the analysis channel ends
/// with it and the final channel follows.
const HARMONY_END: &str = "<|end|>";

/// Drop `<|end|>` from `eog` when `<|return|>` and `<|call|>` are there too (a harmony
/// vocabulary), as llama.cpp's `llama_vocab::impl::load` does.
fn harmony_eog(tokens: &[String], eog: &mut Vec<u32>) {
    let has = |name: &str| eog.iter().any(|&i| tokens[i as usize] == name);
    if has(HARMONY_RETURN) && has(HARMONY_CALL) {
        eog.retain(|&i| tokens[i as usize] != HARMONY_END);
    }
}

/// Vocabulary family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabKind {
    /// Byte-level BPE (`tokenizer.ggml.model = "gpt2"`).
    Gpt2,
    /// SentencePiece BPE with byte fallback (`"llama"`).
    Spm,
}

/// A chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// Text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.to_owned(),
            content: content.to_owned(),
        }
    }
}

/// Tokenizer for one model.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    kind: VocabKind,
    /// Raw bytes of every token (what the token prints as).
    pieces: Vec<Vec<u8>>,
    /// Beginning-of-sequence id.
    pub bos: Option<u32>,
    /// End-of-sequence id.
    pub eos: Option<u32>,
    /// Whether `encode(.., add_bos = default)` prepends BOS (`tokenizer.ggml.add_bos_token`).
    pub add_bos: bool,
    /// Tokens that end generation (EOS, EOT and llama.cpp's auto-detected list).
    pub eog: Vec<u32>,
    /// Ids of control tokens (not printed when streaming).
    control: Vec<bool>,
    /// The chat template.
    pub chat: ChatTemplate,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab", &self.pieces.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

/// A tokenizer error. The text may come from the `tokenizers` library quoting vocabulary
/// entries (strings from the file), so it is cut like any file string ([`Quoted`]).
fn tok_err(e: impl std::fmt::Display) -> ModelError {
    let text = e.to_string();
    let q = Quoted::new(&text);
    ModelError::Tokenizer(if q.is_whole() { text } else { q.to_string() })
}

/// GPT-2's byte ↔ printable-char table (`bytes_to_unicode` in openai/gpt-2 `encoder.py`).
fn byte_level_decode_table() -> HashMap<char, u8> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    bs.into_iter()
        .zip(cs)
        .filter_map(|(b, c)| Some((char::from_u32(c)?, b as u8)))
        .collect()
}

fn parse_byte_piece(s: &str) -> Option<u8> {
    let hex = s.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

impl Tokenizer {
    /// Build from a GGUF header's `tokenizer.*` keys.
    pub fn from_gguf(idx: &GgufIndex) -> Result<Tokenizer, ModelError> {
        let model = idx.get_str("tokenizer.ggml.model")?;
        let kind = match model {
            "gpt2" => VocabKind::Gpt2,
            "llama" => VocabKind::Spm,
            other => {
                return Err(ModelError::Unsupported(format!(
                    "tokenizer model {} (supported: gpt2, llama)",
                    Quoted::new(other)
                )))
            }
        };
        let tokens: Vec<String> = idx
            .get_array("tokenizer.ggml.tokens")?
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| tok_err("tokenizer.ggml.tokens holds non-strings"))?;
        let n = tokens.len();
        let types: Vec<i64> = match idx
            .get("tokenizer.ggml.token_type")
            .and_then(|v| v.as_array())
        {
            Some(a) if a.len() == n => a
                .iter()
                .map(|v| v.as_i64().unwrap_or(TOKEN_TYPE_NORMAL))
                .collect(),
            Some(a) => {
                return Err(tok_err(format!(
                    "token_type has {} entries for {n} tokens",
                    a.len()
                )))
            }
            None => vec![TOKEN_TYPE_NORMAL; n],
        };
        let id_key = |k: &str| -> Result<Option<u32>, ModelError> {
            match idx.get(k).and_then(|v| v.as_u64()) {
                Some(id) if (id as usize) < n => Ok(Some(id as u32)),
                Some(id) => Err(ModelError::BadToken {
                    id: id as u32,
                    vocab: n,
                }),
                None => Ok(None),
            }
        };
        // llama.cpp drops the BOS of the GLM pre-types (`special_bos_id = LLAMA_TOKEN_NULL`):
        // their files name `[gMASK]` as BOS, which the chat template writes itself.
        let bos = match idx.get("tokenizer.ggml.pre").and_then(|v| v.as_str()) {
            Some(pre) if GLM_PRE_TYPES.contains(&pre) => None,
            _ => id_key("tokenizer.ggml.bos_token_id")?,
        };
        let eos = id_key("tokenizer.ggml.eos_token_id")?;
        let eot = id_key("tokenizer.ggml.eot_token_id")?;
        // llama.cpp defaults: SPM adds BOS, BPE does not, unless the key says otherwise.
        let add_bos = idx
            .get("tokenizer.ggml.add_bos_token")
            .and_then(|v| v.as_bool())
            .unwrap_or(kind == VocabKind::Spm);

        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, &ty)| ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED)
            .map(|(t, &ty)| AddedToken::from(t.clone(), ty == TOKEN_TYPE_CONTROL).normalized(false))
            .collect();

        let (mut inner, pieces) = match kind {
            VocabKind::Gpt2 => {
                let merges: Vec<(String, String)> = idx
                    .get_array("tokenizer.ggml.merges")?
                    .iter()
                    .map(|v| {
                        let s = v.as_str()?;
                        let (a, b) = s.split_once(' ')?;
                        Some((a.to_owned(), b.to_owned()))
                    })
                    .collect::<Option<_>>()
                    .ok_or_else(|| {
                        tok_err("tokenizer.ggml.merges holds a non-string or unsplittable entry")
                    })?;
                let bpe = BPE::builder()
                    .vocab_and_merges(vocab, merges)
                    .build()
                    .map_err(tok_err)?;
                let mut t = tokenizers::Tokenizer::new(bpe);
                let pre = idx
                    .get("tokenizer.ggml.pre")
                    .and_then(|v| v.as_str())
                    .unwrap_or("default");
                t.with_pre_tokenizer(Some(gpt2_pre_tokenizer(pre)?));
                t.with_decoder(Some(ByteLevelDecoder::default()));
                let table = byte_level_decode_table();
                let pieces = tokens
                    .iter()
                    .zip(&types)
                    .map(|(t, &ty)| {
                        if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
                            t.as_bytes().to_vec()
                        } else {
                            // A char outside the table cannot come from a byte-level vocab;
                            // keep its UTF-8 so nothing is silently dropped.
                            t.chars()
                                .flat_map(|c| match table.get(&c) {
                                    Some(&b) => vec![b],
                                    None => c.to_string().into_bytes(),
                                })
                                .collect()
                        }
                    })
                    .collect();
                (t, pieces)
            }
            VocabKind::Spm => {
                let scores: Vec<f64> =
                    match idx.get("tokenizer.ggml.scores").and_then(|v| v.as_array()) {
                        Some(a) if a.len() == n => {
                            a.iter().map(|v| v.as_f64().unwrap_or(0.0)).collect()
                        }
                        _ => {
                            return Err(tok_err(
                                "tokenizer.ggml.scores missing or of the wrong length",
                            ))
                        }
                    };
                let merges = spm_merges(&tokens, &types, &scores);
                let mut b = BPE::builder()
                    .vocab_and_merges(vocab, merges)
                    .byte_fallback(true);
                if let Some(unk) = id_key("tokenizer.ggml.unknown_token_id")? {
                    b = b.unk_token(tokens[unk as usize].clone());
                }
                let bpe = b.build().map_err(tok_err)?;
                let mut t = tokenizers::Tokenizer::new(bpe);
                let prefix = idx
                    .get("tokenizer.ggml.add_space_prefix")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(true);
                let mut norms = Vec::new();
                if prefix {
                    norms.push(Prepend::new(SPM_SPACE.to_string()).into());
                }
                norms.push(
                    Replace::new(" ", SPM_SPACE.to_string())
                        .map_err(tok_err)?
                        .into(),
                );
                t.with_normalizer(Some(NormSequence::new(norms)));
                let mut decs: Vec<DecoderWrapper> = vec![
                    tokenizers::decoders::DecoderWrapper::Replace(
                        Replace::new(SPM_SPACE.to_string(), " ").map_err(tok_err)?,
                    ),
                    ByteFallback::new().into(),
                    Fuse::new().into(),
                ];
                if prefix {
                    decs.push(Strip::new(' ', 1, 0).into());
                }
                t.with_decoder(Some(DecoderSequence::new(decs)));
                let pieces = tokens
                    .iter()
                    .zip(&types)
                    .map(|(t, &ty)| match (ty, parse_byte_piece(t)) {
                        (TOKEN_TYPE_BYTE, Some(b)) => vec![b],
                        _ => t.replace(SPM_SPACE, " ").into_bytes(),
                    })
                    .collect();
                (t, pieces)
            }
        };
        inner.add_special_tokens(&special);

        let control: Vec<bool> = types.iter().map(|&t| t == TOKEN_TYPE_CONTROL).collect();
        let mut eog: Vec<u32> = eos.into_iter().chain(eot).collect();
        for (i, t) in tokens.iter().enumerate() {
            if control[i] && EOG_NAMES.contains(&t.as_str()) && !eog.contains(&(i as u32)) {
                eog.push(i as u32);
            }
        }
        harmony_eog(&tokens, &mut eog);
        let token_text = |id: Option<u32>| id.map_or("", |i| tokens[i as usize].as_str());
        let chat = ChatTemplate::new(
            idx.get("tokenizer.chat_template").and_then(|v| v.as_str()),
            token_text(bos),
            token_text(eos),
        );
        Ok(Tokenizer {
            inner,
            kind,
            pieces,
            bos,
            eos,
            add_bos,
            eog,
            control,
            chat,
        })
    }

    /// Vocabulary family.
    pub fn kind(&self) -> VocabKind {
        self.kind
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// Token ids of `text`; special tokens written in the text are recognised. BOS is
    /// prepended when `add_bos` is true and the vocabulary has one.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, ModelError> {
        let enc = self.inner.encode_fast(text, false).map_err(tok_err)?;
        let mut ids = Vec::with_capacity(enc.get_ids().len() + 1);
        if add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Render `messages` with the chat template (assistant turn opened) and encode them. A
    /// template that fails is an error here; [`ChatTemplate::render_or_chatml`] +
    /// [`Tokenizer::encode_rendered_chat`] fall back to ChatML instead.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, ModelError> {
        self.encode_rendered_chat(&self.chat.render(messages, true)?)
    }

    /// Encode a rendered conversation. A template that writes `bos_token` itself (Llama 3,
    /// Gemma, Mistral) would get a second BOS from a tokenizer that adds one, so the leading
    /// BOS text is dropped then, as llama.cpp's `common_chat_templates_apply` does.
    pub fn encode_rendered_chat(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let bos = self.chat.bos_token();
        let text = match text.strip_prefix(bos) {
            Some(rest) if self.add_bos && !bos.is_empty() => rest,
            _ => text,
        };
        self.encode(text, self.add_bos)
    }

    /// Text of `ids` (HF decoder; control tokens skipped when `skip_special`).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, ModelError> {
        self.inner.decode(ids, skip_special).map_err(tok_err)
    }

    /// Raw bytes token `id` stands for (byte-level and `<0xAB>` pieces mapped back to bytes).
    pub fn token_bytes(&self, id: u32) -> Result<&[u8], ModelError> {
        self.pieces
            .get(id as usize)
            .map(Vec::as_slice)
            .ok_or(ModelError::BadToken {
                id,
                vocab: self.pieces.len(),
            })
    }

    /// True if and only if `id` is a control token.
    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    /// True if and only if `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }
}

fn gpt2_pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper, ModelError> {
    let split = |re: &str| -> Result<PreTokenizerWrapper, ModelError> {
        Ok(Split::new(
            SplitPattern::Regex(re.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(tok_err)?
        .into())
    };
    // ByteLevel(add_prefix_space = false, trim_offsets, use_regex)
    Ok(if PRE_DIGITS_THEN_GPT2.contains(&pre) {
        PreSequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into()
    } else if PRE_GPT4O.contains(&pre) {
        PreSequence::new(vec![
            split(GPT4O_REGEX)?,
            ByteLevel::new(false, false, false).into(),
        ])
        .into()
    } else if pre == "qwen35" {
        PreSequence::new(vec![
            split(QWEN35_REGEX)?,
            ByteLevel::new(false, false, false).into(),
        ])
        .into()
    } else if matches!(pre, "qwen2" | "deepseek-r1-qwen") {
        PreSequence::new(vec![
            split(QWEN2_REGEX)?,
            ByteLevel::new(false, false, false).into(),
        ])
        .into()
    } else if GLM_PRE_TYPES.contains(&pre)
        || matches!(
            pre,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "smaug-bpe"
        )
    {
        PreSequence::new(vec![
            split(LLAMA3_REGEX)?,
            ByteLevel::new(false, false, false).into(),
        ])
        .into()
    } else {
        // gpt2 / default: the regex built into ByteLevel.
        ByteLevel::new(false, true, true).into()
    })
}

/// BPE merges for a SentencePiece vocabulary: every split of a normal token into two
/// vocabulary pieces is a merge, ranked by the merged token's score (highest first), then id.
fn spm_merges(tokens: &[String], types: &[i64], scores: &[f64]) -> Vec<(String, String)> {
    let lookup: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut ranked: Vec<(f64, usize, usize, usize)> = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        if types[id] != TOKEN_TYPE_NORMAL && types[id] != TOKEN_TYPE_USER_DEFINED {
            continue;
        }
        for (cut, _) in t.char_indices().skip(1) {
            if let (Some(&l), Some(&r)) = (lookup.get(&t[..cut]), lookup.get(&t[cut..])) {
                ranked.push((scores[id], id, l, r));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    ranked
        .into_iter()
        .map(|(_, _, l, r)| (tokens[l].clone(), tokens[r].clone()))
        .collect()
}

/// Turns a stream of token ids into printable text, holding back bytes of a UTF-8 character
/// that is not complete yet.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Feed one token; returns the text that is now complete (control tokens print nothing).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, ModelError> {
        if tok.is_control(id) {
            return Ok(String::new());
        }
        self.pending.extend_from_slice(tok.token_bytes(id)?);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            // An invalid sequence (not merely incomplete) is emitted lossily so it cannot
            // block output forever.
            Err(e) if e.error_len().is_some() => self.pending.len(),
            Err(e) => e.valid_up_to(),
        };
        let out: Vec<u8> = self.pending.drain(..valid).collect();
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Whatever is still pending, lossily.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn split(pre: &str, text: &str) -> Vec<String> {
        let p = gpt2_pre_tokenizer(pre).unwrap();
        let mut s = PreTokenizedString::from(text);
        p.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(w, _, _)| w.to_owned())
            .collect()
    }

    /// `<|end|>` ends generation unless the vocabulary is harmony's (it has `<|return|>` and
    /// `<|call|>`), where it only ends a message.
    #[test]
    fn harmony_end_is_not_end_of_generation() {
        let toks: Vec<String> = ["a", "<|end|>", "<|return|>", "<|call|>", "<|im_end|>"]
            .map(String::from)
            .to_vec();
        let mut eog = vec![1, 2, 3, 4];
        harmony_eog(&toks, &mut eog);
        assert_eq!(eog, [2, 3, 4]);
        let mut eog = vec![1, 2, 4];
        harmony_eog(&toks, &mut eog);
        assert_eq!(eog, [1, 2, 4]);
    }

    /// Every pre-tokenizer regex compiles under fancy-regex and splits as llama.cpp's
    /// (expected splits written from the regexes by hand; Ġ is the byte-level space).
    #[test]
    fn pre_tokenizers_split_like_llama_cpp() {
        let text = "I'm 12345 ok\n\nyes";
        // GPT-2's `\s+(?!\S)` leaves the last newline before a word to the `\s+` branch.
        assert_eq!(
            split("smollm", text),
            ["I", "'m", "Ġ", "1", "2", "3", "4", "5", "Ġok", "Ċ", "Ċ", "yes"]
        );
        assert_eq!(
            split("qwen2", text),
            ["I", "'m", "Ġ", "1", "2", "3", "4", "5", "Ġok", "ĊĊ", "yes"]
        );
        assert_eq!(
            split("llama-bpe", text),
            ["I", "'m", "Ġ", "123", "45", "Ġok", "ĊĊ", "yes"]
        );
        assert_eq!(
            split("qwen35", text),
            ["I", "'m", "Ġ", "1", "2", "3", "4", "5", "Ġok", "ĊĊ", "yes"]
        );
        // GLM-4.5 (`glm4`): digits in threes, as llama 3.
        assert_eq!(
            split("glm4", text),
            ["I", "'m", "Ġ", "123", "45", "Ġok", "ĊĊ", "yes"]
        );
        // A combining acute accent (U+0301, bytes CC 81 → "Ìģ") stays in its word for
        // Qwen3.5 and is split off by Qwen2's `\p{L}+`.
        // o200k (gpt-oss): up to 3 digits a piece, a case change starts a word only before a
        // lower-case run ("HTTPServer" → "HTTPServer", "fooBar" → "foo", "Bar"), contractions
        // stay on their word, "/" and newlines stay on punctuation.
        assert_eq!(
            split("gpt-4o", text),
            ["I'm", "Ġ", "123", "45", "Ġok", "ĊĊ", "yes"]
        );
        assert_eq!(
            split("gpt-4o", "fooBar HTTPServer a+=b//\n"),
            ["foo", "Bar", "ĠHTTPServer", "Ġa", "+=", "b", "//Ċ"]
        );
        let marked = "cafe\u{301} x";
        assert_eq!(split("qwen35", marked), ["cafeÌģ", "Ġx"]);
        assert_eq!(split("qwen2", marked), ["cafe", "Ìģ", "Ġx"]);
        assert_eq!(
            split("default", text),
            ["I", "'m", "Ġ12345", "Ġok", "Ċ", "Ċ", "yes"]
        );
    }
}
