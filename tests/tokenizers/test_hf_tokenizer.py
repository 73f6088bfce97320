import json
import os
import pathlib
import sys

import keras
import numpy as np
import pytest

pytest.importorskip("tokenizers")

from tests.tokenizers._tiny_bpe import END, EOT, PAD, START, tiny_bpe_json, write_hf_folder
from zoo.tokenizers import HFTokenizer, Tokenizer

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf"
TEXTS = ["the quick brown fox", "héllo wörld: ∑ 日本 🙂", "def add(x, y): return x + y", ""]


def _tokenizer(**kwargs):
    return HFTokenizer(tiny_bpe_json(), start_token="<s>", end_token="</s>", pad_token="<pad>", **kwargs)


def test_encode_decode_round_trip_with_the_post_processor():
    tokenizer = _tokenizer()
    assert isinstance(tokenizer, Tokenizer) and tokenizer.vocabulary_size == 300
    assert (tokenizer.start_token_id, tokenizer.end_token_id, tokenizer.pad_token_id) == (START, END, PAD)
    assert tokenizer.stop_token_ids == (END,)
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert ids.dtype == np.int32 and ids.ndim == 1 and ids[0] == START  # the template's <s>
        assert tokenizer.decode(ids) == text
    assert len(tokenizer.encode("the quick brown fox")) < 1 + len("the quick brown fox")  # merges learned
    rows = tokenizer.encode(TEXTS)
    assert [r.tolist() for r in rows] == [tokenizer.encode(t).tolist() for t in TEXTS]
    padded = np.full((2, 40), PAD, np.int32)
    for row, text in zip(padded, TEXTS[:2]):
        ids = tokenizer.encode(text)
        row[: len(ids)] = ids
    assert tokenizer.decode(padded) == TEXTS[:2]  # special tokens and padding skipped
    bare = _tokenizer(add_special_tokens=False).encode("the quick")
    assert bare.tolist() == tokenizer.encode("the quick")[1:].tolist()
    assert tokenizer.id_to_token(END) == "</s>" and tokenizer.token_to_id("<eot>") == EOT


def test_config_round_trip_holds_the_json():
    tokenizer = _tokenizer(stop_tokens=["<eot>"], clean_up_tokenization_spaces=True)
    serialised = json.loads(json.dumps(keras.saving.serialize_keras_object(tokenizer)))
    assert (
        serialised["registered_name"] == "zoo>HFTokenizer" and serialised["config"]["tokenizer_json"] == tiny_bpe_json()
    )
    clone = keras.saving.deserialize_keras_object(serialised, safe_mode=True)
    assert clone.get_config() == tokenizer.get_config() and clone.stop_token_ids == (END, EOT)
    assert clone.encode(TEXTS[1]).tolist() == tokenizer.encode(TEXTS[1]).tolist()
    assert clone.decode(clone.encode("it is here .")) == "it is here."  # transformers' clean-up


def test_from_directory_reads_the_special_tokens_and_the_stop_list(tmp_path):
    folder = write_hf_folder(tmp_path / "tiny", generation={"bos_token_id": START, "eos_token_id": [END, EOT]})
    tokenizer = HFTokenizer.from_directory(folder)
    assert (tokenizer.start_token, tokenizer.end_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    assert tokenizer.stop_token_ids == (END, EOT)
    one_eos = HFTokenizer.from_directory(
        write_hf_folder(tmp_path / "one", config={}, generation={"bos_token_id": START, "eos_token_id": EOT})
    )
    assert (one_eos.start_token_id, one_eos.end_token_id, one_eos.pad_token_id, one_eos.stop_token_ids) == (
        START,
        EOT,
        None,
        (EOT,),
    )


def test_add_bos_and_eos_flags_rebuild_the_post_processor_as_transformers_llama_does(tmp_path):
    """What transformers 4.57's LlamaTokenizerFast gave on these folders (checked by hand)."""
    config = {
        "tokenizer_class": "LlamaTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "add_bos_token": False,
        "add_eos_token": True,
    }
    tokenizer = HFTokenizer.from_directory(write_hf_folder(tmp_path / "eos", config=config))
    ids = tokenizer.encode("the fox")
    assert ids[0] != START and ids[-1] == END and tokenizer.decode(ids) == "the fox"
    del config["add_bos_token"]  # transformers' default: True
    ids = HFTokenizer.from_directory(write_hf_folder(tmp_path / "both", config=config)).encode("the fox")
    assert ids[0] == START and ids[-1] == END
    config = dict(config, tokenizer_class="PreTrainedTokenizerFast")  # which ignores the flags: the JSON's template
    ids = HFTokenizer.from_directory(write_hf_folder(tmp_path / "fast", config=config)).encode("the fox")
    assert ids[0] == START and ids[-1] != END


def test_save_to_directory_round_trip(tmp_path):
    tokenizer = _tokenizer(stop_tokens=["<eot>"])
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))  # a model's: kept
    tokenizer.save_to_directory(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert (
        config["tokenizer_class"] == "PreTrainedTokenizerFast"
        and config["bos_token"] == "<s>"
        and config["pad_token"] == "<pad>"
    )
    assert json.loads((tmp_path / "generation_config.json").read_text()) == {
        "temperature": 0.7,
        "eos_token_id": [END, EOT],
    }
    loaded = HFTokenizer.from_directory(tmp_path)
    assert loaded.get_config() == tokenizer.get_config()


def test_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=f"no tokenizer.json in '{tmp_path}'"):
        HFTokenizer.from_directory(tmp_path)
    with pytest.raises(ValueError, match="end_token: token '<end>' is not in the vocabulary"):
        HFTokenizer(tiny_bpe_json(), end_token="<end>")
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 300\), got range \[5, 300\]"):
        _tokenizer().decode([5, 300])
    with pytest.raises(ValueError, match="token '<end>' is not in the vocabulary"):
        _tokenizer().token_to_id("<end>")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if not installed
    with pytest.raises(ImportError, match=r'pip install "keras-zoo\[hf\]"'):
        HFTokenizer(tiny_bpe_json())


FIXTURE_FOLDERS = sorted(path.parent for path in FIXTURES.glob("*/tokens.json"))


@pytest.mark.skipif(not FIXTURE_FOLDERS, reason="no tests/fixtures/hf/*/tokens.json")
@pytest.mark.parametrize("folder", FIXTURE_FOLDERS, ids=[folder.name for folder in FIXTURE_FOLDERS])
def test_matches_transformers_on_the_fixtures(folder):
    """Each fixture folder's tokens.json holds what transformers' AutoTokenizer gave."""
    expected = json.loads((folder / "tokens.json").read_text())
    tokenizer = HFTokenizer.from_directory(os.fspath(folder))
    ids = tokenizer.encode(expected["text"])
    assert ids.tolist() == expected["ids"]
    assert tokenizer.decode(ids) == expected["decoded"]
    generation = json.loads((folder / "generation_config.json").read_text())
    eos = generation["eos_token_id"]
    assert set(tokenizer.stop_token_ids) == {tokenizer.end_token_id, *(eos if isinstance(eos, list) else [eos])}
    assert tokenizer.start_token_id == generation["bos_token_id"]
