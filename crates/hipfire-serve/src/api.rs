//! OpenAI's request and response bodies, and the checks that turn a request into a
//! [`Generation`] for the engine.
//!
//! Fields this server does not implement are ignored when absent or at their neutral value and
//! refused otherwise (`n > 1`), so a client never silently gets something other than it asked
//! for. A known field of the wrong type is a 400 naming the field (serde's message), as is every
//! out-of-range value.

use serde::Deserialize;
use serde_json::{json, Value};

use hipfire_model::{ChatMessage, SamplingParams, Tokenizer};

use crate::error::ApiError;

/// OpenAI's default `max_tokens` for `/v1/completions` (the legacy endpoint's documented 16).
pub const COMPLETION_DEFAULT_MAX_TOKENS: usize = 16;
/// OpenAI's limit on `stop` sequences per request.
pub const MAX_STOP_SEQUENCES: usize = 4;
/// OpenAI's default sampling temperature (both endpoints).
pub const DEFAULT_TEMPERATURE: f32 = 1.0;

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    /// One sequence.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Deserialize, Default)]
pub struct StreamOptions {
    /// Send a last chunk carrying `usage`.
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling fields both endpoints share.
#[derive(Debug, Deserialize, Default)]
pub struct SamplingFields {
    /// Model name (any value is accepted: the server holds one model).
    pub model: Option<String>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// `stream_options.include_usage`.
    pub stream_options: Option<StreamOptions>,
    /// Most tokens to generate.
    pub max_tokens: Option<i64>,
    /// The newer name of `max_tokens` in the chat API.
    pub max_completion_tokens: Option<i64>,
    /// Softmax temperature, 0 = greedy.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens (an extension llama-server and vLLM accept too).
    pub top_k: Option<i64>,
    /// RNG seed.
    pub seed: Option<i64>,
    /// Stop sequences.
    pub stop: Option<StopField>,
    /// Choices per request (only 1).
    pub n: Option<i64>,
    /// Keep generating past end-of-generation tokens (llama-server's extension; load
    /// generators use it so every server generates exactly `max_tokens`).
    pub ignore_eos: Option<bool>,
}

/// A chat message's `content`: a string, or a list of parts of which the text ones count.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// `[{"type": "text", "text": ...}, ...]`.
    Parts(Vec<ContentPart>),
}

/// One part of a multi-part `content`.
#[derive(Debug, Deserialize)]
pub struct ContentPart {
    /// `text` (others are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// One message of `messages`.
#[derive(Debug, Deserialize)]
pub struct MessageIn {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// Text (absent or null for an assistant turn that only called tools).
    pub content: Option<Content>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<MessageIn>,
    /// Sampling and streaming.
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// `prompt`: a string, or a list holding one string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    /// Text.
    One(String),
    /// A batch of prompts (only one is accepted).
    Many(Vec<String>),
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: PromptField,
    /// Sampling and streaming.
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// Which endpoint a generation answers (response shapes differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

impl Endpoint {
    /// Label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completion => "completion",
        }
    }
}

/// A checked request: prompt tokens, sampling, stop strings, streaming.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Endpoint.
    pub endpoint: Endpoint,
    /// Prompt token ids (non-empty, shorter than the context).
    pub prompt: Vec<u32>,
    /// Sampling (`max_tokens` already clamped to the context left).
    pub params: SamplingParams,
    /// Stop strings (non-empty strings, at most [`MAX_STOP_SEQUENCES`]).
    pub stop: Vec<String>,
    /// Stream server-sent events.
    pub stream: bool,
    /// Send `usage` in a last chunk when streaming.
    pub include_usage: bool,
}

/// Parse a JSON body into `T`, the error naming what was wrong.
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "malformed JSON"
        } else {
            "invalid request body"
        };
        ApiError::invalid(None, format!("{what}: {e}"))
    })
}

fn text_of(m: &MessageIn, i: usize) -> Result<String, ApiError> {
    match &m.content {
        None => Ok(String::new()),
        Some(Content::Text(t)) => Ok(t.clone()),
        Some(Content::Parts(parts)) => {
            let mut s = String::new();
            for p in parts {
                if p.kind != "text" {
                    return Err(ApiError::invalid(
                        Some("messages"),
                        format!(
                            "messages[{i}]: content part of type {:?} is not supported (text only)",
                            p.kind
                        ),
                    ));
                }
                s.push_str(p.text.as_deref().unwrap_or(""));
            }
            Ok(s)
        }
    }
}

impl ChatRequest {
    /// The prompt tokens: the messages through the model's chat template.
    pub fn prompt_tokens(&self, tok: &Tokenizer) -> Result<Vec<u32>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                Some("messages"),
                "messages must hold at least one message",
            ));
        }
        let msgs = self
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| Ok(ChatMessage::new(&m.role, &text_of(m, i)?)))
            .collect::<Result<Vec<_>, ApiError>>()?;
        tok.encode_chat(&msgs)
            .map_err(|e| ApiError::internal(format!("tokenizer: {e}")))
    }
}

impl CompletionRequest {
    /// The prompt tokens (BOS as the model asks).
    pub fn prompt_tokens(&self, tok: &Tokenizer) -> Result<Vec<u32>, ApiError> {
        let text = match &self.prompt {
            PromptField::One(s) => s.as_str(),
            PromptField::Many(v) if v.len() == 1 => v[0].as_str(),
            PromptField::Many(v) => {
                return Err(ApiError::invalid(
                    Some("prompt"),
                    format!("prompt holds {} prompts; send one per request", v.len()),
                ))
            }
        };
        tok.encode(text, tok.add_bos)
            .map_err(|e| ApiError::internal(format!("tokenizer: {e}")))
    }
}

impl SamplingFields {
    /// Check every field against the prompt and the context; `default_max` is the endpoint's
    /// `max_tokens` when absent (`None`: up to the end of the context).
    pub fn check(
        &self,
        endpoint: Endpoint,
        prompt: Vec<u32>,
        ctx_len: usize,
        default_max: Option<usize>,
    ) -> Result<Generation, ApiError> {
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid(
                    Some("n"),
                    format!("n = {n}: only one choice per request is supported"),
                ));
            }
        }
        if prompt.is_empty() {
            return Err(ApiError::invalid(Some("prompt"), "the prompt is empty"));
        }
        if prompt.len() >= ctx_len {
            return Err(ApiError::invalid(
                Some("messages"),
                format!(
                    "the prompt is {} tokens; this server's context is {ctx_len} tokens, \
                     which leaves no room to generate",
                    prompt.len()
                ),
            )
            .with_code("context_length_exceeded"));
        }
        let room = ctx_len - prompt.len();
        let (field, asked) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(v), _) => ("max_completion_tokens", Some(v)),
            (None, v) => ("max_tokens", v),
        };
        let max_tokens = match asked {
            Some(v) if v <= 0 => {
                return Err(ApiError::invalid(
                    Some(if field == "max_tokens" {
                        "max_tokens"
                    } else {
                        "max_completion_tokens"
                    }),
                    format!("{field} = {v} must be at least 1"),
                ))
            }
            Some(v) => usize::try_from(v).unwrap_or(usize::MAX).min(room),
            None => default_max.unwrap_or(room).min(room),
        };
        let temperature = self.temperature.unwrap_or(DEFAULT_TEMPERATURE);
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(ApiError::invalid(
                Some("temperature"),
                format!("temperature {temperature} must be a finite number ≥ 0"),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                Some("top_p"),
                format!("top_p {top_p} must be in (0, 1]"),
            ));
        }
        let top_k = match self.top_k {
            None => 0,
            Some(k) if k < 0 => {
                return Err(ApiError::invalid(
                    Some("top_k"),
                    format!("top_k {k} must be ≥ 0 (0: all tokens)"),
                ))
            }
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
        };
        let seed = match self.seed {
            // Two's-complement reinterpretation keeps every i64 seed distinct.
            Some(s) => s as u64,
            None => rand::random(),
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOP_SEQUENCES || stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                Some("stop"),
                format!("stop takes at most {MAX_STOP_SEQUENCES} non-empty strings, got {stop:?}"),
            ));
        }
        Ok(Generation {
            endpoint,
            prompt,
            params: SamplingParams {
                temperature,
                top_k,
                top_p,
                seed,
                max_tokens,
                stop_at_eog: !self.ignore_eos.unwrap_or(false),
            },
            stop,
            stream: self.stream.unwrap_or(false),
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
        })
    }
}

/// Why a generation ended, as OpenAI spells `finish_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` or the end of the context.
    Length,
}

impl FinishReason {
    /// OpenAI's string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts of one request (`usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Prompt tokens the slot already held from an earlier request (not prefilled again).
    pub cached_tokens: usize,
}

impl Usage {
    /// OpenAI's `usage` object.
    pub fn json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// Identity of one response: `id`, `created`, `model`.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
}

/// The whole (non-streaming) response body.
pub fn full_response(
    endpoint: Endpoint,
    meta: &ResponseMeta,
    text: &str,
    finish: FinishReason,
    usage: Usage,
) -> Value {
    let choice = match endpoint {
        Endpoint::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": null,
            "finish_reason": finish.as_str(),
        }),
        Endpoint::Completion => json!({
            "index": 0,
            "text": text,
            "logprobs": null,
            "finish_reason": finish.as_str(),
        }),
    };
    json!({
        "id": meta.id,
        "object": match endpoint {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completion => "text_completion",
        },
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "usage": usage.json(),
    })
}

/// One streamed chunk: a text delta (`first` adds the chat role), the finish reason on the
/// last, or, with `choices` empty, the usage-only chunk of `include_usage`.
pub fn chunk(
    endpoint: Endpoint,
    meta: &ResponseMeta,
    delta: Option<&str>,
    first: bool,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
) -> Value {
    let choices = if usage.is_some() {
        json!([])
    } else {
        let fr = finish.map(FinishReason::as_str);
        match endpoint {
            Endpoint::Chat => {
                let mut d = serde_json::Map::new();
                if first {
                    d.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = delta {
                    d.insert("content".into(), json!(t));
                }
                json!([{"index": 0, "delta": d, "logprobs": null, "finish_reason": fr}])
            }
            Endpoint::Completion => {
                json!([{"index": 0, "text": delta.unwrap_or(""), "logprobs": null, "finish_reason": fr}])
            }
        }
    };
    let mut v = json!({
        "id": meta.id,
        "object": match endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        },
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
    });
    if let Some(u) = usage {
        v["usage"] = u.json();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> Result<SamplingFields, ApiError> {
        parse_body(json.as_bytes())
    }

    #[test]
    fn bad_values_are_400s_naming_the_field() {
        let prompt = vec![1u32, 2, 3];
        for (body, param) in [
            (r#"{"max_tokens": 0}"#, "max_tokens"),
            (r#"{"max_tokens": -3}"#, "max_tokens"),
            (r#"{"max_completion_tokens": 0}"#, "max_completion_tokens"),
            (r#"{"temperature": -0.5}"#, "temperature"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"top_p": 1.5}"#, "top_p"),
            (r#"{"top_k": -1}"#, "top_k"),
            (r#"{"n": 2}"#, "n"),
            (r#"{"stop": ["a","b","c","d","e"]}"#, "stop"),
            (r#"{"stop": ""}"#, "stop"),
        ] {
            let f = fields(body).expect("parses");
            let e = f
                .check(Endpoint::Chat, prompt.clone(), 100, None)
                .expect_err(body);
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param, Some(param), "{body}");
        }
        for body in [
            r#"{"max_tokens": "ten"}"#,
            r#"{"temperature": "hot"}"#,
            r#"{"stop": 5}"#,
            r#"{"stream": 1}"#,
            "{not json",
        ] {
            let e = fields(body).expect_err(body);
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.body()["error"]["type"], "invalid_request_error");
        }
    }

    #[test]
    fn context_and_max_tokens_are_bounded() {
        let f = fields(r#"{"max_tokens": 1000, "temperature": 0}"#).expect("parses");
        let g = f
            .check(Endpoint::Completion, vec![1; 90], 100, Some(16))
            .expect("fits");
        assert_eq!(g.params.max_tokens, 10, "clamped to the context left");
        assert_eq!(g.params.temperature, 0.0);
        let e = f
            .check(Endpoint::Completion, vec![1; 100], 100, Some(16))
            .expect_err("over");
        assert_eq!(e.code, Some("context_length_exceeded"));
        let d = fields("{}").expect("empty object");
        let g = d
            .check(Endpoint::Completion, vec![1; 5], 100, Some(16))
            .expect("defaults");
        assert_eq!(g.params.max_tokens, 16);
        assert_eq!(g.params.temperature, DEFAULT_TEMPERATURE);
        let g = d
            .check(Endpoint::Chat, vec![1; 5], 100, None)
            .expect("defaults");
        assert_eq!(g.params.max_tokens, 95, "chat: to the end of the context");
        assert!(d.check(Endpoint::Chat, vec![], 100, None).is_err());
    }
}
