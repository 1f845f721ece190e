//! Chat templates: the GGUF's own `tokenizer.chat_template` (Jinja) rendered with
//! [`minijinja`] in the environment HF transformers gives it, so a prompt is byte for byte
//! what `tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=…)`
//! returns for the same template.
//!
//! transformers (`utils/chat_template_utils.py`, `_compile_jinja_template` and
//! `render_jinja_template`) compiles the template in an `ImmutableSandboxedEnvironment` with
//! `trim_blocks` and `lstrip_blocks` on and the `loopcontrols` extension, overrides the `tojson`
//! filter with `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`, adds the globals `raise_exception(message)` and `strftime_now(format)`
//! (local time), parses `{% generation %}` blocks (its `AssistantTracker`, which renders
//! their body), and renders with `messages`, `tools=None`, `documents=None`,
//! `add_generation_prompt` and the tokenizer's special tokens (`bos_token`, `eos_token`). The
//! same is set up here, plus what Python gives a template for free: string, dict and list
//! methods (`.strip()`, `.startswith()`, `.split()`, `.items()`, … from `minijinja-contrib`'s
//! pycompat) and Python's `str()` of a printed value (`None`, `True`, `1.0`, lists and dicts).
//!
//! A file without a template, or with one that does not compile, gets ChatML (transformers'
//! former default template, also llama.cpp's fallback); [`ChatTemplate::render_or_chatml`]
//! falls back the same way when the file's template fails while rendering and says why.
//!
//! The rendered text may begin with the template's own `bos_token`;
//! [`crate::Tokenizer::encode_rendered_chat`] drops it when the tokenizer adds BOS itself, as
//! llama.cpp's `common_chat_templates_apply` does.
//!
//! A loaded model's tokenizer holds its template (`model.tokenizer().chat`); a server renders
//! a request's messages with it and encodes the text:
//!
//! ```
//! use hipfire_model::{ChatMessage, ChatTemplate, TemplateOrigin};
//!
//! let t = ChatTemplate::new(
//!     Some("{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content.strip() }}\n{% endfor %}\
//!           {% if add_generation_prompt %}[assistant] {% endif %}"),
//!     "<s>",
//!     "</s>",
//! );
//! assert_eq!(t.origin(), &TemplateOrigin::File);
//! let msgs = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", " hi ")];
//! assert_eq!(t.render(&msgs, true)?, "<s>[system] Be brief.\n[user] hi\n[assistant] ");
//! // Refuse a failing template with `render`, or fall back as `hipfire run` does:
//! let r = t.render_or_chatml(&msgs, true)?;
//! assert!(r.fallback.is_none());
//! // then `tokenizer.encode_rendered_chat(&r.text)` gives the prompt ids.
//! # Ok::<(), hipfire_model::TemplateError>(())
//! ```

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior, Value};

use crate::gguf::{Quoted, MAX_QUOTED_CHARS};
use crate::tokenizer::ChatMessage;

/// ChatML as transformers' former `default_chat_template` wrote it (and as llama.cpp's
/// `LLM_CHAT_TEMPLATE_CHATML` renders it): the fallback when a file's template is missing or
/// unusable.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Largest template source accepted, bytes. The real templates under
/// `tests/fixtures/chat_templates` are 0.4–4.6 KiB; a source 200× the largest of them is not a
/// chat template, and refusing it bounds what compiling may allocate.
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;

/// Instructions one render may execute (minijinja fuel). The 89 rendering cases that
/// `tests/fixtures/chat_templates.json` held on 2026-12-01 (Llama 3.2 and the whitespace case
/// came later) needed at most 564, measured by bisecting the fuel per case; the real templates'
/// six-message conversations need less. That leaves ~35 000× headroom for long conversations;
/// the bound only stops a template that loops without end, which spends it in 1.5 s (the
/// runaway unit test, test profile on the 2-core box).
const RENDER_FUEL: u64 = 20_000_000;

/// Characters of an engine or `raise_exception` message kept in a [`TemplateError`]: a template
/// can raise a message as long as it likes; real ones are one sentence (Gemma's "Conversation
/// roles must alternate user/assistant/user/assistant/..." is 67).
pub const MAX_MESSAGE_CHARS: usize = 240;

/// Name under which the template is compiled (shows in minijinja's error locations).
const TEMPLATE_NAME: &str = "chat_template";

/// Why a chat template could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The source does not parse as Jinja.
    #[error("chat template {template} does not compile: {message}")]
    Compile {
        /// The template's start (bounded).
        template: Quoted,
        /// The engine's message, with the line (cut to [`MAX_MESSAGE_CHARS`]).
        message: String,
    },
    /// The template called `raise_exception(message)` (e.g. Gemma's "System role not supported").
    #[error("chat template {template} raised an exception: {message}")]
    Raised {
        /// The template's start (bounded).
        template: Quoted,
        /// The message the template gave (cut to [`MAX_MESSAGE_CHARS`]).
        message: String,
    },
    /// The template calls a function, filter, test or method that is not defined here.
    #[error("chat template {template} uses {what} `{name}`, which is not defined")]
    Unknown {
        /// The template's start (bounded).
        template: Quoted,
        /// `function`, `filter`, `test` or `method`.
        what: &'static str,
        /// Its name (cut to [`MAX_QUOTED_CHARS`]).
        name: String,
    },
    /// Any other failure while rendering (a type error, an undefined value used, fuel spent).
    #[error("chat template {template} failed to render: {message}")]
    Render {
        /// The template's start (bounded).
        template: Quoted,
        /// The engine's message, with the line (cut to [`MAX_MESSAGE_CHARS`]).
        message: String,
    },
    /// The source is longer than [`MAX_TEMPLATE_BYTES`].
    #[error("chat template is {len} bytes, more than the {max} accepted")]
    TooLong {
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
}

/// Which template [`ChatTemplate::render`] uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateOrigin {
    /// The file's own `tokenizer.chat_template`.
    File,
    /// ChatML: the file has no template.
    ChatMlNoTemplate,
    /// ChatML: the file's template could not be compiled (the error says why).
    ChatMlFallback(TemplateError),
}

/// A rendered conversation, and why the fallback was used if it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The prompt text.
    pub text: String,
    /// `None` when the file's template rendered it; otherwise why ChatML did instead (a
    /// missing template gives `None` here too: see [`ChatTemplate::origin`]).
    pub fallback: Option<TemplateError>,
}

/// A compiled chat template plus the special tokens it is rendered with.
pub struct ChatTemplate {
    /// Holds [`TEMPLATE_NAME`] (the file's template, when it compiled) and the ChatML one.
    env: Environment<'static>,
    origin: TemplateOrigin,
    /// The file's template, quoted for messages.
    quoted: Quoted,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("quoted", &self.quoted)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

/// Name of the ChatML fallback template inside the environment.
const CHATML_NAME: &str = "chatml";

impl ChatTemplate {
    /// The template a file gives (`tokenizer.chat_template`, if any) with its BOS/EOS token
    /// texts (empty when the vocabulary has none, as llama.cpp passes them). Never fails: a
    /// missing or broken template leaves ChatML in use, recorded in [`ChatTemplate::origin`].
    pub fn new(source: Option<&str>, bos_token: &str, eos_token: &str) -> ChatTemplate {
        match source {
            None => Self::build(None, bos_token, eos_token),
            Some(s) => Self::compile(s, bos_token, eos_token).unwrap_or_else(|e| {
                let mut t = Self::build(None, bos_token, eos_token);
                t.quoted = Quoted::new(s);
                t.origin = TemplateOrigin::ChatMlFallback(e);
                t
            }),
        }
    }

    /// Compile `source`, failing if it does not compile (for callers that want to refuse
    /// rather than fall back).
    pub fn compile(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, TemplateError> {
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(TemplateError::TooLong {
                len: source.len(),
                max: MAX_TEMPLATE_BYTES,
            });
        }
        let t = Self::build(Some(source), bos_token, eos_token);
        // `build` only records a compile error for the file's template (ChatML compiles).
        match t.origin {
            TemplateOrigin::ChatMlFallback(e) => Err(e),
            _ => Ok(t),
        }
    }

    /// ChatML alone (what a file without a template gets).
    pub fn chatml(bos_token: &str, eos_token: &str) -> ChatTemplate {
        Self::build(None, bos_token, eos_token)
    }

    fn build(source: Option<&str>, bos_token: &str, eos_token: &str) -> ChatTemplate {
        let mut env = environment();
        // ChatML is a constant that compiles; an error here would be a bug in this file,
        // and is still not a panic: rendering it would then report the missing template.
        let _ = env.add_template(CHATML_NAME, CHATML_TEMPLATE);
        let (origin, quoted) = match source {
            None => (TemplateOrigin::ChatMlNoTemplate, Quoted::new("")),
            Some(s) => {
                let q = Quoted::new(s);
                match env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(s)) {
                    Ok(()) => (TemplateOrigin::File, q),
                    Err(e) => (
                        TemplateOrigin::ChatMlFallback(TemplateError::Compile {
                            template: q.clone(),
                            message: message(&e),
                        }),
                        q,
                    ),
                }
            }
        };
        ChatTemplate {
            env,
            origin,
            quoted,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        }
    }

    /// Make `strftime_now` report `now` as the local time (`None`: the clock), for prompts
    /// that must not change with the date (tests, reproducible runs).
    pub fn set_now(&mut self, now: Option<chrono::NaiveDateTime>) {
        match now {
            Some(t) => self
                .env
                .add_function("strftime_now", move |format: String| strftime(&t, &format)),
            None => self.env.add_function("strftime_now", strftime_now),
        }
    }

    /// Which template is in use.
    pub fn origin(&self) -> &TemplateOrigin {
        &self.origin
    }

    /// Whether the file carries a template (usable or not): such a model expects chat input.
    pub fn file_has_template(&self) -> bool {
        self.origin != TemplateOrigin::ChatMlNoTemplate
    }

    /// The BOS text the template sees as `bos_token`.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The EOS text the template sees as `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Render `messages` with the template in use (the file's, or ChatML per
    /// [`ChatTemplate::origin`]); `add_generation_prompt` appends the assistant turn opener.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let name = match self.origin {
            TemplateOrigin::File => TEMPLATE_NAME,
            _ => CHATML_NAME,
        };
        self.render_named(name, messages, add_generation_prompt)
    }

    /// Render with the file's template, or with ChatML when it is unusable or fails on these
    /// messages (the error is returned alongside, for a warning).
    pub fn render_or_chatml(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Rendered, TemplateError> {
        let fallback = match &self.origin {
            TemplateOrigin::File => match self.render(messages, add_generation_prompt) {
                Ok(text) => {
                    return Ok(Rendered {
                        text,
                        fallback: None,
                    })
                }
                Err(e) => Some(e),
            },
            TemplateOrigin::ChatMlNoTemplate => None,
            TemplateOrigin::ChatMlFallback(e) => Some(e.clone()),
        };
        let text = self.render_named(CHATML_NAME, messages, add_generation_prompt)?;
        Ok(Rendered { text, fallback })
    }

    fn render_named(
        &self,
        name: &str,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let quoted = if name == CHATML_NAME {
            Quoted::new(CHATML_TEMPLATE)
        } else {
            self.quoted.clone()
        };
        let tmpl = self
            .env
            .get_template(name)
            .map_err(|e| TemplateError::Render {
                template: quoted.clone(),
                message: message(&e),
            })?;
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_pairs([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        let ctx = Value::from_pairs([
            ("messages", Value::from(msgs)),
            ("tools", Value::from(())),
            ("documents", Value::from(())),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", Value::from(self.bos_token.as_str())),
            ("eos_token", Value::from(self.eos_token.as_str())),
        ]);
        tmpl.render(ctx).map_err(|e| classify(e, quoted))
    }
}

/// transformers' `AssistantTracker` extension adds `{% generation %}…{% endgeneration %}`
/// (marking the assistant's tokens for training masks); rendering, it outputs the body
/// unchanged. minijinja has no such tag, so each becomes the block tag that renders the same,
/// `{% if true %}…{% endif %}`, keeping its whitespace-control marks (`{%-`, `-%}`), which
/// `trim_blocks` and `lstrip_blocks` treat alike for every block tag.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at + 2..];
        let marks = |t: &str| t.strip_prefix(['-', '+']).unwrap_or(t).len();
        let after_open = &tag[tag.len() - marks(tag)..];
        let body = after_open.trim_start();
        let word_end = body
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .unwrap_or(body.len());
        let replacement = match &body[..word_end] {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        let tail = body[word_end..].trim_start();
        let tail_after_mark = tail.strip_prefix(['-', '+']).unwrap_or(tail);
        match replacement {
            Some(r) if tail_after_mark.starts_with("%}") => {
                // `{%` + marks and spaces before the word, the new word, then the rest as is.
                let lead = &rest[at..at + 2 + (tag.len() - body.len())];
                out.push_str(lead);
                out.push_str(r);
                rest = &body[word_end..];
            }
            _ => {
                out.push_str("{%");
                rest = tag;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The environment transformers renders chat templates in (see the module docs).
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    let mut syntax = minijinja::syntax::SyntaxConfig::builder();
    syntax
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false);
    // The default delimiters always build; keep the defaults' (identical) whitespace rules
    // otherwise rather than panic.
    if let Ok(s) = syntax.build() {
        env.set_syntax(s);
    }
    // jinja2's default `Undefined`: prints as nothing, fails on attribute access.
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_unknown_method_callback(|state, value, method, args| {
        // Python's whitespace for str.strip/lstrip/rstrip; pycompat has the rest.
        let sides = match method {
            "strip" => Some((true, true)),
            "lstrip" => Some((true, false)),
            "rstrip" => Some((false, true)),
            _ => None,
        };
        match (value.as_str(), sides) {
            (Some(s), Some((left, right))) => {
                let (chars,): (Option<&str>,) = minijinja::value::from_args(args)?;
                Ok(Value::from(python_strip(s, chars, left, right)))
            }
            _ => minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args),
        }
    });
    // jinja2's `trim` is `str.strip(chars)` too.
    env.add_filter("trim", |s: &str, chars: Option<&str>| {
        python_strip(s, chars, true, true).to_owned()
    });
    env.set_fuel(Some(RENDER_FUEL));
    env.set_formatter(|out, _state, value| {
        let mut s = String::new();
        python_str(&mut s, value)?;
        out.write_str(&s).map_err(Error::from)
    });
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_filter("string", |v: Value| -> Result<String, Error> {
        let mut s = String::new();
        python_str(&mut s, &v)?;
        Ok(s)
    });
    env
}

/// Python's `str.isspace()`: Unicode White_Space (Rust's `char::is_whitespace`) plus the
/// separators U+001C..U+001F, which Python counts and Unicode does not.
fn python_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `s.strip(chars)` / `lstrip` / `rstrip`: `chars` is a set of characters, `None` whitespace.
fn python_strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let strip = |c: char| match chars {
        Some(set) => set.contains(c),
        None => python_is_space(c),
    };
    let s = if left { s.trim_start_matches(strip) } else { s };
    if right {
        s.trim_end_matches(strip)
    } else {
        s
    }
}

/// Marker carried as the source of the error `raise_exception` returns, so the message is
/// told apart from the engine's own errors.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

fn strftime_now(format: String) -> Result<String, Error> {
    strftime(&chrono::Local::now().naive_local(), &format)
}

/// Python's `datetime.strftime(format)` for the codes chrono shares with C's `strftime`.
pub(crate) fn strftime(t: &chrono::NaiveDateTime, format: &str) -> Result<String, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item> = StrftimeItems::new(format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format {format:?}"),
        ));
    }
    let mut s = String::new();
    write!(s, "{}", t.format_with_items(items.into_iter())).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format {format:?}"),
        )
    })?;
    Ok(s)
}

/// `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, the
/// filter transformers installs (keyword arguments as there).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(usize::try_from(n.max(0)).unwrap_or(0).min(64))),
            (None, Some(s)) => Some(s.to_owned()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ))
            }
        },
    };
    // Python's defaults: (', ', ': ') without indent, (',', ': ') with it.
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match (
                parts.first().and_then(Value::as_str),
                parts.get(1).and_then(Value::as_str),
            ) {
                (Some(a), Some(b)) if parts.len() == 2 => (a.to_owned(), b.to_owned()),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let opts = JsonOpts {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
    };
    let mut out = String::new();
    json_dump(&mut out, &value, &opts, 0)?;
    Ok(Value::from(out))
}

struct JsonOpts {
    ensure_ascii: bool,
    sort_keys: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
}

/// Nesting depth past which `tojson` gives up (Python's recursion limit is about 1000 frames;
/// values built by a template cannot be cyclic, so this only bounds stack use).
const MAX_JSON_DEPTH: usize = 256;

fn json_dump(out: &mut String, v: &Value, o: &JsonOpts, depth: usize) -> Result<(), Error> {
    if depth > MAX_JSON_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => push_json_number(out, v),
        ValueKind::String => json_string(out, v.as_str().unwrap_or_default(), o.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            json_container(out, o, depth, '[', ']', &items, |out, item| {
                json_dump(out, item, o, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut pairs: Vec<(String, Value)> = Vec::new();
            for k in v.try_iter()? {
                let val = v.get_item(&k)?;
                pairs.push((json_key(&k)?, val));
            }
            if o.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            json_container(out, o, depth, '{', '}', &pairs, |out, (k, val)| {
                json_string(out, k, o.ensure_ascii);
                out.push_str(&o.key_sep);
                json_dump(out, val, o, depth + 1)
            })?;
        }
        ValueKind::Undefined => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: Object of type Undefined is not JSON serializable",
            ))
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: Object of type {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// `[a, b]` / `{…}` with Python's layout: items on their own indented lines when `indent`
/// is set, an empty container always `[]` / `{}`.
fn json_container<T>(
    out: &mut String,
    o: &JsonOpts,
    depth: usize,
    open: char,
    close: char,
    items: &[T],
    mut each: impl FnMut(&mut String, &T) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = &o.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    newline(out, depth + 1);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&o.item_sep);
            newline(out, depth + 1);
        }
        each(out, item)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// A dict key as `json.dumps` converts it.
fn json_key(k: &Value) -> Result<String, Error> {
    match k.kind() {
        ValueKind::String => Ok(k.as_str().unwrap_or_default().to_owned()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool => Ok(if k.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number => {
            let mut s = String::new();
            push_json_number(&mut s, k);
            Ok(s)
        }
        other => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {other}"),
        )),
    }
}

fn push_json_number(out: &mut String, v: &Value) {
    if v.is_integer() {
        // Integers print exactly (i128 covers every integer minijinja holds).
        match i128::try_from(v.clone()) {
            Ok(i) => {
                let _ = write!(out, "{i}");
            }
            Err(_) => out.push_str(&v.to_string()),
        }
    } else {
        let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
        if f.is_nan() {
            out.push_str("NaN");
        } else if f.is_infinite() {
            out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
        } else {
            out.push_str(&python_float_repr(f));
        }
    }
}

/// A JSON string literal as Python's `json` encoder writes it.
fn json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            // ensure_ascii escapes everything outside ' '..='~' (DEL included), as UTF-16.
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional between 1e-4 and
/// 1e16, scientific (`1e+16`, `1.5e-05`) outside.
fn python_float_repr(f: f64) -> String {
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_owned();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits: "d.ddde±x".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f < 0.0 { "-" } else { "" };
    // Position of the decimal point relative to the digit string (0.d1d2… × 10^decpt).
    let decpt = exp + 1;
    let n = digits.len() as i32;
    if (-4 < decpt) && (decpt <= 16) {
        let s = if decpt <= 0 {
            format!("0.{}{}", "0".repeat((-decpt) as usize), digits)
        } else if decpt >= n {
            format!("{}{}.0", digits, "0".repeat((decpt - n) as usize))
        } else {
            format!(
                "{}.{}",
                &digits[..decpt as usize],
                &digits[decpt as usize..]
            )
        };
        format!("{sign}{s}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits.clone()
        };
        let e = decpt - 1;
        format!("{sign}{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
    }
}

/// Python's `str(value)`, what jinja2 prints for `{{ value }}`.
fn python_str(out: &mut String, v: &Value) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(v.as_str().unwrap_or_default()),
        _ => python_repr(out, v, 0)?,
    }
    Ok(())
}

/// Python's `repr(value)` (inside a list or dict, and for non-strings at top level).
fn python_repr(out: &mut String, v: &Value, depth: usize) -> Result<(), Error> {
    if depth > MAX_JSON_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "value nested too deeply to print",
        ));
    }
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => {
            if v.is_integer() {
                push_json_number(out, v);
            } else {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                if f.is_nan() {
                    out.push_str("nan");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "inf" } else { "-inf" });
                } else {
                    out.push_str(&python_float_repr(f));
                }
            }
        }
        ValueKind::String => python_str_repr(out, v.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(out, &item, depth + 1)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, k) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(out, &k, depth + 1)?;
                out.push_str(": ");
                python_repr(out, &v.get_item(&k)?, depth + 1)?;
            }
            out.push('}');
        }
        // Objects (namespaces, loop state, macros) print as minijinja describes them.
        _ => {
            let _ = write!(out, "{v}");
        }
    }
    Ok(())
}

/// Python's `repr(str)`: single quotes unless the text holds `'` and no `"`; backslash, the
/// quote and ASCII control characters escaped (non-ASCII is kept, as Python keeps printable
/// characters; Python also escapes non-printable non-ASCII, which chat text does not hold).
fn python_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `s` cut to `max` characters, `…` marking a cut.
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// minijinja's message on one line, bounded (its `Display` quotes no template source without
/// `{:#}`, but a detail can hold a value the template built).
fn message(e: &Error) -> String {
    cut(&e.to_string().replace('\n', " "), MAX_MESSAGE_CHARS)
}

/// The typed error for a render failure.
fn classify(e: Error, template: Quoted) -> TemplateError {
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    while let Some(s) = src {
        if let Some(r) = s.downcast_ref::<Raised>() {
            return TemplateError::Raised {
                template,
                message: cut(&r.0, MAX_MESSAGE_CHARS),
            };
        }
        src = s.source();
    }
    let detail = e.detail().unwrap_or_default();
    let unknown = |what: &'static str, name: Option<&str>| TemplateError::Unknown {
        template: template.clone(),
        what,
        name: cut(name.unwrap_or(detail).trim(), MAX_QUOTED_CHARS),
    };
    match e.kind() {
        // Details as minijinja 3 words them (vm/mod.rs, value/mod.rs).
        ErrorKind::UnknownFunction => unknown("function", detail.strip_suffix(" is unknown")),
        ErrorKind::UnknownFilter => unknown(
            "filter",
            detail
                .strip_prefix("filter ")
                .and_then(|d| d.strip_suffix(" is unknown")),
        ),
        ErrorKind::UnknownTest => unknown(
            "test",
            detail
                .strip_prefix("test ")
                .and_then(|d| d.strip_suffix(" is unknown")),
        ),
        ErrorKind::UnknownMethod => unknown(
            "method",
            detail.rsplit_once(" has no method named ").map(|(_, n)| n),
        ),
        _ => TemplateError::Render {
            template: template.clone(),
            message: message(&e),
        },
    }
}

/// Render `source` once with these messages (no fallback).
#[cfg(test)]
fn render_source(
    source: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String, TemplateError> {
    ChatTemplate::compile(source, bos_token, eos_token)?.render(messages, add_generation_prompt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(s: &str) -> ChatMessage {
        ChatMessage::new("user", s)
    }

    #[test]
    fn a_server_can_share_one_template_across_threads() {
        fn shared<T: Send + Sync>(_: &T) {}
        let t = ChatTemplate::new(Some(CHATML_TEMPLATE), "", "");
        shared(&t);
        let text = std::thread::scope(|s| {
            let h = s.spawn(|| t.render(&[user("from a thread")], true));
            h.join().expect("thread")
        })
        .unwrap();
        assert_eq!(
            text,
            "<|im_start|>user\nfrom a thread<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn generation_tags_become_if_blocks() {
        assert_eq!(
            rewrite_generation_tags("a{% generation %}b{%- endgeneration -%}c{%+generation+%}"),
            "a{% if true %}b{%- endif -%}c{%+if true+%}"
        );
        // Other tags, words that only start alike, and unterminated tags are left alone.
        for s in [
            "{% if x %}{% endif %}",
            "{% generations %}",
            "{% generation_x %}",
            "{% generation",
            "{%",
            "{{ '%}' }}",
        ] {
            assert_eq!(rewrite_generation_tags(s), s);
        }
    }

    #[test]
    fn float_repr_matches_python() {
        // Values and strings from CPython 3.11 `repr(float)`.
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123456.789, "123456.789"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (-0.0, "-0.0"),
            (2.0f64.powi(60), "1.152921504606847e+18"),
        ] {
            assert_eq!(python_float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn strftime_matches_python() {
        // Python's `datetime.strftime` outputs for fixed times, written down here so the test
        // needs neither Python nor a fixture file where it runs: the fixture's time
        // (scripts/record_chat_templates.py, Llama 3.2's "%d %b %Y" first), a leap day at
        // midnight (12 AM, `%y` 00) and a one-digit day and day-of-year in the morning.
        const FORMATS: [&str; 7] = [
            "%d %b %Y",
            "%Y-%m-%d",
            "%B %d, %Y",
            "%A %H:%M:%S",
            "%-d %b %Y",
            "%j %y %I %p",
            "%%",
        ];
        let cases: [(&str, [&str; 7]); 3] = [
            (
                "2024-07-06T13:05:09",
                [
                    "06 Jul 2024",
                    "2024-07-06",
                    "July 06, 2024",
                    "Saturday 13:05:09",
                    "6 Jul 2024",
                    "188 24 01 PM",
                    "%",
                ],
            ),
            (
                "2000-02-29T00:07:03",
                [
                    "29 Feb 2000",
                    "2000-02-29",
                    "February 29, 2000",
                    "Tuesday 00:07:03",
                    "29 Feb 2000",
                    "060 00 12 AM",
                    "%",
                ],
            ),
            (
                "2025-01-05T09:00:00",
                [
                    "05 Jan 2025",
                    "2025-01-05",
                    "January 05, 2025",
                    "Sunday 09:00:00",
                    "5 Jan 2025",
                    "005 25 09 AM",
                    "%",
                ],
            ),
        ];
        for (at, wants) in cases {
            let at = chrono::NaiveDateTime::parse_from_str(at, "%Y-%m-%dT%H:%M:%S").unwrap();
            for (fmt, want) in FORMATS.iter().zip(wants) {
                assert_eq!(strftime(&at, fmt).unwrap(), want, "{at} {fmt}");
            }
        }
        let at = chrono::NaiveDate::from_ymd_opt(2024, 7, 6)
            .unwrap()
            .and_hms_opt(13, 5, 9)
            .unwrap();
        // `strftime_now` itself renders today's date in the same format.
        let today = strftime(&chrono::Local::now().naive_local(), "%Y").unwrap();
        let got = render_source("{{ strftime_now('%Y') }}", &[user("x")], true, "", "").unwrap();
        assert_eq!(got, today);
        assert!(strftime(&at, "%Q").is_err());
    }

    #[test]
    fn raise_exception_is_typed() {
        let e = render_source(
            "{% if messages|length > 1 %}{{ raise_exception('only one message, please') }}{% endif %}ok",
            &[user("a"), user("b")],
            true,
            "",
            "",
        )
        .unwrap_err();
        match &e {
            TemplateError::Raised { message, template } => {
                assert_eq!(message, "only one message, please");
                assert!(template.is_whole());
                assert!(template
                    .prefix()
                    .starts_with("{% if messages|length > 1 %}"));
            }
            other => panic!("{other:?}"),
        }
        assert!(e
            .to_string()
            .contains("raised an exception: only one message, please"));
        // One message: renders.
        assert_eq!(
            render_source(
                "{% if messages|length > 1 %}{{ raise_exception('x') }}{% endif %}ok",
                &[user("a")],
                true,
                "",
                ""
            )
            .unwrap(),
            "ok"
        );
    }

    #[test]
    fn unknown_names_are_typed() {
        let cases = [
            ("{{ no_such_fn('x') }}", "function", "no_such_fn"),
            (
                "{{ messages | no_such_filter }}",
                "filter",
                "no_such_filter",
            ),
            (
                "{% if messages is no_such_test %}{% endif %}",
                "test",
                "no_such_test",
            ),
            (
                "{{ messages[0].content.frobnicate() }}",
                "method",
                "frobnicate",
            ),
        ];
        for (src, want_what, want_name) in cases {
            match render_source(src, &[user("hi")], true, "", "") {
                Err(TemplateError::Unknown { what, name, .. }) => {
                    assert_eq!((what, name.as_str()), (want_what, want_name), "{src}");
                }
                other => panic!("{src}: {other:?}"),
            }
        }
    }

    #[test]
    fn broken_template_falls_back_to_chatml_and_says_so() {
        let t = ChatTemplate::new(Some("{% for m in messages %}{{ m.content }"), "<s>", "</s>");
        let TemplateOrigin::ChatMlFallback(TemplateError::Compile { template, .. }) = t.origin()
        else {
            panic!("{:?}", t.origin());
        };
        assert_eq!(template, "{% for m in messages %}{{ m.content }");
        assert!(t.file_has_template());
        let r = t.render_or_chatml(&[user("hi")], true).unwrap();
        assert_eq!(
            r.text,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(matches!(r.fallback, Some(TemplateError::Compile { .. })));
        // A template that compiles but raises on these messages falls back the same way.
        let t = ChatTemplate::new(Some("{{ raise_exception('no') }}"), "", "");
        assert_eq!(t.origin(), &TemplateOrigin::File);
        let r = t.render_or_chatml(&[user("hi")], false).unwrap();
        assert_eq!(r.text, "<|im_start|>user\nhi<|im_end|>\n");
        assert!(matches!(r.fallback, Some(TemplateError::Raised { .. })));
        // No template: ChatML, no error to report.
        let t = ChatTemplate::new(None, "", "");
        assert!(!t.file_has_template());
        let r = t.render_or_chatml(&[user("hi")], true).unwrap();
        assert_eq!(r.fallback, None);
        assert!(r.text.ends_with("<|im_start|>assistant\n"));
    }

    #[test]
    fn too_long_and_runaway_templates_are_bounded() {
        let long = "x".repeat(MAX_TEMPLATE_BYTES + 1);
        assert!(matches!(
            ChatTemplate::compile(&long, "", ""),
            Err(TemplateError::TooLong { .. })
        ));
        // A template's own message and a long template are quoted bounded.
        let src = format!(
            "{{{{ raise_exception('{}') }}}}{}",
            "m".repeat(10_000),
            "x".repeat(10_000)
        );
        let e = render_source(&src, &[user("hi")], true, "", "").unwrap_err();
        let TemplateError::Raised { message, template } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(message.chars().count(), MAX_MESSAGE_CHARS + 1);
        assert!(message.ends_with('…'));
        assert_eq!(template.len(), src.len());
        assert!(e.to_string().len() < 4 * (MAX_QUOTED_CHARS + MAX_MESSAGE_CHARS));
        // 10^8 iterations would run for minutes; fuel stops it.
        let e = render_source(
            "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
            &[user("hi")],
            true,
            "",
            "",
        )
        .unwrap_err();
        assert!(matches!(e, TemplateError::Render { .. }), "{e:?}");
    }
}
