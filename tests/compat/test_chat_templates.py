"""Chat templates: Tessera's Jinja interpreter (data/chat_template.h) against transformers' apply_chat_template (jinja2 in
transformers' sandboxed environment) on the templates in tests/data/chat_templates/: the ChatML template LLM Foundry
falls back to, LLM Foundry's tiktoken default, Llama 2, Llama 3, Llama 3.1 with tools, Mistral Instruct v0.1, Gemma,
Zephyr, Qwen2.5 with tools, and features.jinja (one line per supported construct). For each template and each
conversation (a plain exchange, a system prompt with multi-turn Unicode content, a lone user message, roles out of
order, tool calls and tool results), with and without add_generation_prompt and tools: the same text, or the same
raise_exception message."""
import json
import pathlib

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from conftest import ROOT

TEMPLATES = sorted((ROOT / "tests" / "data" / "chat_templates").glob("*.jinja"))
CONVERSATIONS = {
    "simple": [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi there."}],
    "system_multi": [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "What is 2+2?\n"},
                     {"role": "assistant", "content": " 4 "},
                     {"role": "user", "content": "And 3+3? ünïcödé 😀 \"q\" 'x' {} {{ not a tag }}"}],
    "user_only": [{"role": "user", "content": "  spaced\n\ttext  "}],
    "bad_order": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}],
    "tools": [{"role": "system", "content": "You are a tool user."}, {"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                  "name": "get_weather", "arguments": {"city": "Paris", "unit": "C", "n": 1.5, "ok": True,
                                                       "none": None}}}]},
              {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "tool", "content": "second"},
              {"role": "assistant", "content": "It is 21°C."}],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


@pytest.fixture(scope="module")
def hf_tokenizer():
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token="<s>", eos_token="</s>")


@pytest.mark.parametrize("template", TEMPLATES, ids=[t.stem for t in TEMPLATES])
def test_rendering_equals_apply_chat_template(template, driver, tmp_path, hf_tokenizer):
    source = template.read_text()
    cases, want = [], []
    for name, messages in CONVERSATIONS.items():
        for add_generation_prompt in (False, True):
            for tools in ((None, TOOLS) if name == "tools" else (None,)):
                context = {"messages": messages, "add_generation_prompt": add_generation_prompt,
                           "bos_token": "<s>", "eos_token": "</s>"}
                if tools:
                    context["tools"] = tools
                cases.append(context)
                try:
                    want.append({"text": hf_tokenizer.apply_chat_template(
                        messages, tools=tools, chat_template=source, tokenize=False,
                        add_generation_prompt=add_generation_prompt)})
                except Exception as e:  # jinja2.TemplateError from raise_exception
                    want.append({"error": str(e)})
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    driver("chat-template", template, tmp_path / "cases.json", tmp_path / "out.json")
    got = json.loads((tmp_path / "out.json").read_text())
    assert len(got) == len(want)
    for context, g, w in zip(cases, got, want):
        what = f"{template.name}, {len(context['messages'])} messages, add_generation_prompt " \
               f"{context['add_generation_prompt']}, tools {'tools' in context}"
        if "error" in w:
            assert "error" in g and g["error"].endswith(w["error"]), f"{what}: {g} vs error {w['error']!r}"
        else:
            assert g == w, what
    assert sum("error" in w for w in want) < len(want)  # most cases render


def test_templates_outside_the_subset_are_refused_naming_the_line(driver, tmp_path):
    (tmp_path / "cases.json").write_text(json.dumps([{"messages": []}]))
    for source, message in (("a\n{% macro m() %}x{% endmacro %}", ":2: unsupported tag 'macro'"),
                            ("{{ messages | frobnicate }}", ":1: unknown filter 'frobnicate'"),
                            ("{% if x %}unclosed", "unexpected end of template, expected 'endif'"),
                            ("{{ missing.attr }}", ":1: 'missing' is undefined")):
        (tmp_path / "t.jinja").write_text(source)
        try:
            driver("chat-template", tmp_path / "t.jinja", tmp_path / "cases.json", tmp_path / "out.json")
            error = json.loads((tmp_path / "out.json").read_text())[0]["error"]
        except Exception as e:  # a parse error ends the driver with the message
            error = str(e)
        assert message in error, (source, error)
