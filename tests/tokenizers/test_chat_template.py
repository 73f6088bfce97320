"""Chat templates: the zoo's rendering, token ids and assistant-only loss mask equal
transformers' ``apply_chat_template`` on the published Llama 3.2 and Qwen2.5 templates
(tests/fixtures/hf/chat_expected.json, made by tests/fixtures/hf/make_chat_fixtures.py)."""

import datetime
import json
import pathlib

import keras
import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from zoo.tokenizers import ChatTemplate, HFTokenizer
from zoo.tokenizers.chat import encode_chat

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf"
EXPECTED = json.loads((FIXTURES / "chat_expected.json").read_text(encoding="utf-8"))["styles"]
CASES = [(style, case["name"]) for style, entry in EXPECTED.items() for case in entry["cases"]]
_TOKENIZERS = {}


def _tokenizer(style):
    if style not in _TOKENIZERS:
        _TOKENIZERS[style] = HFTokenizer.from_directory(FIXTURES / EXPECTED[style]["folder"])
    return _TOKENIZERS[style]


def _case(style, name):
    return next(case for case in EXPECTED[style]["cases"] if case["name"] == name)


@pytest.mark.parametrize("style,name", CASES)
def test_text_and_ids_equal_transformers(style, name):
    case, tokenizer, variables = _case(style, name), _tokenizer(style), EXPECTED[style]["variables"]
    prompt = case["add_generation_prompt"]
    text = tokenizer.apply_chat_template(case["messages"], add_generation_prompt=prompt, tokenize=False, **variables)
    assert text == case["text"]
    ids = tokenizer.apply_chat_template(case["messages"], add_generation_prompt=prompt, **variables)
    assert ids.dtype == np.int32 and ids.tolist() == case["ids"]


@pytest.mark.parametrize("style,name", CASES)
def test_loss_mask_is_exactly_the_assistant_tokens(style, name):
    """Found by rendering prefixes (the published templates have no {% generation %}),
    and through the {% generation %} copy: both equal transformers' assistant mask."""
    case, tokenizer, variables = _case(style, name), _tokenizer(style), EXPECTED[style]["variables"]
    prompt = case["add_generation_prompt"]
    assert not tokenizer.chat_template.has_generation_blocks
    ids, mask = tokenizer.encode_chat(case["messages"], add_generation_prompt=prompt, **variables)
    assert ids.tolist() == case["ids"] and mask.dtype == np.int32
    assert mask.tolist() == case["assistant_mask"]
    marked = ChatTemplate(EXPECTED[style]["generation_template"], tokenizer.chat_template.special_tokens)
    assert marked.has_generation_blocks
    ids, mask = encode_chat(tokenizer, case["messages"], prompt, chat_template=marked, **variables)
    assert ids.tolist() == case["ids"] and mask.tolist() == case["assistant_mask"]


def test_the_mask_holds_each_turns_content_and_end_token():
    tokenizer = _tokenizer("qwen2_5")
    case = _case("qwen2_5", "multi_turn")
    ids, mask = tokenizer.encode_chat(case["messages"])
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))  # starts and ends of the runs of 1
    runs = [ids[start:end].tolist() for start, end in zip(edges[::2], edges[1::2])]
    assert [tokenizer.library.decode(run, skip_special_tokens=False) for run in runs] == [
        message["content"] + "<|im_end|>" for message in case["messages"] if message["role"] == "assistant"
    ]


def test_templates_are_read_from_the_config_or_the_jinja_file():
    llama, qwen = _tokenizer("llama3"), _tokenizer("qwen2_5")
    assert not (FIXTURES / "chat_llama3" / "chat_template.jinja").exists()  # tokenizer_config.json's "chat_template"
    assert (FIXTURES / "chat_qwen2_5" / "chat_template.jinja").exists()
    assert llama.chat_template.special_tokens == {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    assert qwen.chat_template.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}  # bos null
    assert llama.stop_token_ids == (322, 1) and qwen.stop_token_ids == (322, 320)
    assert HFTokenizer.from_directory(FIXTURES / "llama_mha_tied").chat_template is None
    with pytest.raises(ValueError, match="has no chat template"):
        ChatTemplate.from_directory(FIXTURES / "llama_mha_tied")


def test_one_start_token_though_the_template_writes_it_and_the_post_processor_adds_one():
    tokenizer = _tokenizer("llama3")
    case = _case("llama3", "first_prompt")
    ids = tokenizer.apply_chat_template(case["messages"], add_generation_prompt=True, date_string="26 Jul 2024")
    assert ids[0] == tokenizer.start_token_id and ids[1] != tokenizer.start_token_id
    assert tokenizer.encode("hi")[0] == tokenizer.start_token_id  # encode still adds it


def test_config_and_folder_round_trips_keep_the_template(tmp_path):
    tokenizer = _tokenizer("qwen2_5")
    clone = keras.saving.deserialize_keras_object(
        json.loads(json.dumps(keras.saving.serialize_keras_object(tokenizer)))
    )
    assert clone.chat_template == tokenizer.chat_template
    tokenizer.save_to_directory(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
    assert config["chat_template"] == tokenizer.chat_template.template
    case = _case("qwen2_5", "generation_prompt")
    again = HFTokenizer.from_directory(tmp_path / "saved")
    assert again.apply_chat_template(case["messages"], add_generation_prompt=True).tolist() == case["ids"]


def test_jinja_environment_matches_transformers():
    def render(source, **variables):
        return ChatTemplate(source).render([{"role": "user", "content": "x"}], **variables)

    assert render("{{ {'a': '<é>'} | tojson }}") == '{"a": "<é>"}'  # no HTML escaping, not ASCII-only
    assert render("{{ [1, 2] | tojson(indent=2) }}") == "[\n  1,\n  2\n]"
    assert render("{% if true %}\n  A{% endif %}\nB") == "  AB"  # trim_blocks; lstrip_blocks only before tags
    assert render("{%- for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}") == "01"
    assert render("{{ strftime_now('%Y') }}") in {
        str(datetime.datetime.now().year),
        str(datetime.datetime.now().year - 1),
    }
    assert render("{{ tools is none }} {{ documents is none }} {{ bos_token is defined }}") == "True True False"
    assert render("{{ bos_token }}", bos_token="<s>") == "<s>"
    import jinja2

    with pytest.raises(jinja2.TemplateError, match="roles must alternate"):
        render("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        render("{{ messages.append(1) }}")  # immutable sandbox


def test_prefix_method_refuses_templates_that_rewrite_earlier_turns():
    drops_past = (
        "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}[elided]"
        "{% else %}<{{ m.role }}>{{ m.content }}</s>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    with pytest.raises(ValueError, match="assistant spans cannot be found by rendering prefixes"):
        ChatTemplate(drops_past).assistant_spans(messages)
    text, spans = ChatTemplate(drops_past).assistant_spans(messages[:2])
    assert [text[a:b] for a, b in spans] == ["b</s>"]


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="message 1 needs a string 'role'"):
        ChatTemplate("{{ 1 }}").render([{"role": "user", "content": "a"}, {"content": "b"}])
    with pytest.raises(ValueError, match="list of"):
        ChatTemplate("{{ 1 }}").render("hello")
    tokenizer = HFTokenizer.from_directory(FIXTURES / "llama_mha_tied")
    with pytest.raises(ValueError, match="has no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "a"}])
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "a"}],
        tokenize=False,
        chat_template="{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
    )
    assert text == "<|begin_of_text|>a<|end_of_text|>"


def test_a_missing_jinja2_names_the_extra(monkeypatch):
    import sys

    from zoo.tokenizers import _jinja

    monkeypatch.setitem(sys.modules, "jinja2", None)
    with pytest.raises(ImportError, match=r"pip install 'keras-zoo\[hf\]'"):
        _jinja.jinja2_module()
