//! Chat templates rendered by hipfire (minijinja) against Python jinja2 in transformers'
//! environment, recorded by `scripts/record_chat_templates.py` into
//! `tests/fixtures/chat_templates.json`: real templates (Llama 3, 3.2 and 3.3, Gemma 2 and 3,
//! DeepSeek-R1, Mistral v0.2 and Nemo, Qwen2.5, SmolLM2's from its GGUF) over single- and
//! multi-turn conversations with and without a system message, `add_generation_prompt` on and
//! off, plus small templates for the Python behaviour templates rely on (`tojson`, printing
//! `None`/`True`, string and dict methods, Python's whitespace, loop controls, namespaces,
//! `{% generation %}` blocks). Equality is byte for byte; a template that raises must raise
//! the same message.

use std::collections::BTreeSet;
use std::path::PathBuf;

use hipfire_model::{ChatMessage, ChatTemplate, TemplateError};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn fixture() -> Value {
    let p = fixtures().join("chat_templates.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("fixture json")
}

fn messages(case: &Value) -> Vec<ChatMessage> {
    case["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            ChatMessage::new(
                m["role"].as_str().expect("role"),
                m["content"].as_str().expect("content"),
            )
        })
        .collect()
}

/// Where two strings first differ, for a readable failure.
fn first_difference(a: &str, b: &str) -> String {
    let i = a
        .bytes()
        .zip(b.bytes())
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let ctx = |s: &str| {
        let mut lo = i.saturating_sub(40).min(s.len());
        while !s.is_char_boundary(lo) {
            lo -= 1;
        }
        let mut hi = (i + 40).min(s.len());
        while !s.is_char_boundary(hi) {
            hi += 1;
        }
        format!("{:?}", &s[lo..hi])
    };
    format!(
        "first difference at byte {i}: hipfire {} vs jinja2 {}",
        ctx(a),
        ctx(b)
    )
}

#[test]
fn templates_render_as_jinja2_does() {
    let f = fixture();
    // The local time jinja2's strftime_now reported (Llama 3.2 prints the date).
    let now =
        chrono::NaiveDateTime::parse_from_str(f["now"].as_str().expect("now"), "%Y-%m-%dT%H:%M:%S")
            .expect("now");
    let mut files_seen = BTreeSet::new();
    let (mut texts, mut raised) = (0, 0);
    for case in f["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let source = match case.get("template_file").and_then(Value::as_str) {
            Some(file) => {
                files_seen.insert(file.to_owned());
                std::fs::read_to_string(fixtures().join("chat_templates").join(file))
                    .expect("template file")
            }
            None => case["template"].as_str().expect("template").to_owned(),
        };
        let got = ChatTemplate::compile(
            &source,
            case["bos_token"].as_str().expect("bos"),
            case["eos_token"].as_str().expect("eos"),
        )
        .and_then(|mut t| {
            t.set_now(Some(now));
            t.render(
                &messages(case),
                case["add_generation_prompt"].as_bool().expect("agp"),
            )
        });
        match (case.get("text").and_then(Value::as_str), got) {
            (Some(want), Ok(got)) => {
                assert!(got == want, "{name}: {}", first_difference(&got, want));
                texts += 1;
            }
            (None, Err(TemplateError::Raised { message, .. })) => {
                assert_eq!(message, case["raised"].as_str().expect("raised"), "{name}");
                raised += 1;
            }
            (want, got) => panic!("{name}: jinja2 gave {want:?}, hipfire {got:?}"),
        }
    }
    // 10 real templates × 4 conversations × 2 add_generation_prompt, 14 small templates × 2
    // conversations and one (Python whitespace) × 1; Gemma 2 and Mistral v0.2 refuse a system
    // message (4 cases each), one small template raises for one conversation.
    assert_eq!((texts, raised), (100, 9));
    // Every committed template is exercised.
    let on_disk: BTreeSet<String> = std::fs::read_dir(fixtures().join("chat_templates"))
        .expect("template dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".jinja"))
        .collect();
    assert_eq!(files_seen, on_disk);
    assert_eq!(on_disk.len(), 10);
}

#[test]
fn failures_name_the_template_and_the_cause() {
    let msgs = [
        ChatMessage::new("system", "s"),
        ChatMessage::new("user", "u"),
    ];
    let gemma2 = std::fs::read_to_string(fixtures().join("chat_templates/gemma2.jinja"))
        .expect("gemma2 template");
    let render = |src: &str, bos: &str, eos: &str| {
        ChatTemplate::compile(src, bos, eos).and_then(|t| t.render(&msgs, true))
    };
    let e = render(&gemma2, "<bos>", "<eos>").unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with(
            r#"chat template "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not suppo"… (591 bytes) raised"#
        ),
        "{text}"
    );
    assert!(text.ends_with("System role not supported"), "{text}");
    // A function transformers does not define either (an older vLLM-only helper).
    let e = render("{{ date_today() }}", "", "").unwrap_err();
    assert_eq!(
        e,
        TemplateError::Unknown {
            template: "{{ date_today() }}".into(),
            what: "function",
            name: "date_today".into(),
        }
    );
    assert_eq!(
        e.to_string(),
        "chat template \"{{ date_today() }}\" uses function `date_today`, which is not defined"
    );
}
