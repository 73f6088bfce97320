"""Every example a loader leaves out or cuts is counted, with the reason and the setting that
keeps it (issue 46, item 6); ``zoo finetune`` prints the counts in one line at the start."""

import json
import pathlib

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from zoo.data.chat_files import chat_examples
from zoo.data.text_files import load_text_file
from zoo.models import GPTCausalLMPreprocessor
from zoo.tokenizers import ByteTokenizer, HFTokenizer

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf"
EXPECTED = json.loads((FIXTURES / "chat_expected.json").read_text(encoding="utf-8"))["styles"]["qwen2_5"]


def test_chat_conversations_left_out_and_cut_are_counted():
    tokenizer = HFTokenizer.from_directory(FIXTURES / "chat_qwen2_5")
    multi_turn = next(case for case in EXPECTED["cases"] if case["name"] == "multi_turn")["messages"]  # 186 ids
    short = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]  # 80 ids: whole
    late = [{"role": "user", "content": "x " * 200}, {"role": "assistant", "content": "b"}]  # no assistant in 100
    examples = chat_examples([multi_turn, short, late], tokenizer, 100)
    assert len(examples) == 2
    (left_out, cut) = examples.dropped
    assert left_out.startswith(
        "left out 1 of 3 conversations (no assistant token within sequence length 100; --sequence-length "
    )
    assert cut.startswith(
        "cut 1 of 3 conversations at sequence length 100, losing their later tokens (--sequence-length "
    )
    assert examples[:1].dropped == examples.dropped  # kept through row selection


def test_prompt_completion_examples_cut_before_their_end_token_are_counted(tmp_path):
    path = tmp_path / "pc.jsonl"
    rows = [{"prompt": "q", "completion": "short"}, {"prompt": "q", "completion": "a much longer completion"}]
    rows.append({"prompt": "p" * 40, "completion": "lost"})
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    examples = load_text_file(path, GPTCausalLMPreprocessor(ByteTokenizer(), sequence_length=16))
    assert len(examples) == 2
    assert examples.dropped == (
        "left out 1 of 3 examples (no completion token within sequence length 16; a larger --sequence-length keeps them)",
        "cut 1 of 3 examples at sequence length 16, losing their end (a larger --sequence-length keeps them whole)",
    )
