"""``{"messages": [...]}`` JSONL -> ``LMExamples`` with the loss on the assistant tokens only."""

import json
import pathlib
import types

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from zoo.data.chat_files import chat_examples, is_messages_jsonl, load_chat_file, read_messages_jsonl
from zoo.tokenizers import HFTokenizer

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf"
EXPECTED = json.loads((FIXTURES / "chat_expected.json").read_text(encoding="utf-8"))["styles"]["qwen2_5"]


def _write(path, records):
    path.write_text("\n".join(json.dumps(record, ensure_ascii=False) for record in records) + "\n\n", encoding="utf-8")
    return path


def test_rows_are_the_chat_ids_shifted_with_the_assistant_mask(tmp_path):
    tokenizer = HFTokenizer.from_directory(FIXTURES / "chat_qwen2_5")
    cases = [case for case in EXPECTED["cases"] if not case["add_generation_prompt"]]
    file = _write(tmp_path / "chat.jsonl", [{"messages": case["messages"], "id": i} for i, case in enumerate(cases)])
    assert is_messages_jsonl(file) and read_messages_jsonl(file) == [case["messages"] for case in cases]
    length = 256  # longer than every case: whole conversations, padded
    examples = load_chat_file(file, types.SimpleNamespace(tokenizer=tokenizer, sequence_length=length))
    assert examples.token_ids.shape == (len(cases), length)
    for row, case in enumerate(cases):
        ids, mask = np.asarray(case["ids"]), np.asarray(case["assistant_mask"])
        n = len(ids)
        assert examples.token_ids[row, :n].tolist() == ids.tolist()
        assert examples.labels[row, : n - 1].tolist() == ids[1:].tolist()
        assert examples.sample_weight[row, : n - 1].tolist() == mask[1:].tolist()  # a label counts iff it is assistant
        assert (examples.sample_weight[row, n - 1 :] == 0).all() and (
            examples.labels[row, n - 1 :] == tokenizer.pad_token_id
        ).all()


def test_cut_conversations_and_ones_without_assistant_tokens_in_reach():
    tokenizer = HFTokenizer.from_directory(FIXTURES / "chat_qwen2_5")
    case = next(case for case in EXPECTED["cases"] if case["name"] == "multi_turn")
    first = case["assistant_mask"].index(1)
    examples = chat_examples([case["messages"]], tokenizer, first + 3)
    assert examples.sample_weight.tolist() == [np.asarray(case["assistant_mask"][1 : first + 4], np.float32).tolist()]
    with pytest.raises(ValueError, match="no conversation has an assistant token within sequence length"):
        chat_examples([case["messages"]], tokenizer, first - 1)


def test_errors_name_the_line(tmp_path):
    bad = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant"}]}
    with pytest.raises(ValueError, match=r"line 2: message 1 needs a string 'content'"):
        read_messages_jsonl(
            _write(
                tmp_path / "a.jsonl",
                [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, bad],
            )
        )
    with pytest.raises(ValueError, match="line 1: no assistant message"):
        read_messages_jsonl(_write(tmp_path / "b.jsonl", [{"messages": [{"role": "user", "content": "a"}]}]))
    prompt_file = _write(tmp_path / "c.jsonl", [{"prompt": "a", "completion": "b"}])
    assert not is_messages_jsonl(prompt_file)
    with pytest.raises(ValueError, match=r'line 1: expected \{"messages"'):
        read_messages_jsonl(prompt_file)
