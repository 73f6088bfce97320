import keras
import numpy as np
import pytest

from zoo.presets import load_tokenizer
from zoo.tokenizers import ByteTokenizer, Tokenizer


def test_round_trip_padding_and_serialisation():
    tokenizer = ByteTokenizer(sequence_length=12)
    ids = tokenizer.encode("héllo")  # é is two bytes
    assert ids.dtype == np.int32 and ids.shape == (12,)
    assert list(ids[:6]) == [104, 195, 169, 108, 108, 111] and not ids[6:].any()
    assert tokenizer.decode(ids) == "héllo"
    batch = tokenizer.encode(["ab", "c" * 20])  # (2, 12): padded and truncated
    assert batch.dtype == np.int32 and batch.shape == (2, 12) and list(batch[0, :3]) == [97, 98, 0]
    assert tokenizer.decode(batch) == ["ab", "c" * 12]
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(tokenizer))
    assert isinstance(clone, ByteTokenizer) and clone.sequence_length == 12
    assert keras.saving.serialize_keras_object(tokenizer)["registered_name"] == "zoo>ByteTokenizer"
    assert ByteTokenizer().decode(ByteTokenizer().encode("x" * 500)) == "x" * 500


def test_unpadded_batch_is_a_list_and_special_ids():
    tokenizer = ByteTokenizer()
    rows = tokenizer.encode(["a", "bb€"])
    assert [r.tolist() for r in rows] == [[97], [98, 98, 226, 130, 172]] and rows[1].dtype == np.int32
    assert isinstance(tokenizer, Tokenizer) and tokenizer.vocabulary_size == 256
    assert (tokenizer.start_token_id, tokenizer.end_token_id, tokenizer.pad_token_id, tokenizer.stop_token_ids) == (
        None,
        None,
        0,
        (),
    )
    assert tokenizer.id_to_token(233) == "é" and tokenizer.token_to_id("é") == 233
    assert all(tokenizer.token_to_id(tokenizer.id_to_token(i)) == i for i in range(256))
    assert tokenizer.decode([104, 0, 105, 0]) == "hi"  # padding skipped
    assert tokenizer.decode([226, 130]) == "\ufffd"  # a cut character


def test_errors():
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 256\), got range \[0, 300\]"):
        ByteTokenizer().decode([0, 300])
    with pytest.raises(ValueError, match="sequence_length must be positive, got 0"):
        ByteTokenizer(0)
    with pytest.raises(TypeError, match="item 1 is a int"):
        ByteTokenizer().encode(["a", 3])
    with pytest.raises(ValueError, match="one character with code < 256, got 'ab'"):
        ByteTokenizer().token_to_id("ab")
    with pytest.raises(ValueError, match=r"token id 256 is not in \[0, 256\)"):
        ByteTokenizer().id_to_token(256)


def test_shipped_presets_still_load_their_tokenizer():
    """The presets' tokenizer.json name the old module (zoo.data.byte_tokenizer): the
    registered name "zoo>ByteTokenizer" is what Keras finds, so they load unchanged."""
    gpt, encoder = load_tokenizer("gpt_tiny_python_docs"), load_tokenizer("encoder_tiny_topics")
    assert (
        type(gpt) is ByteTokenizer and gpt.sequence_length is None and gpt.decode(gpt.encode("def f():")) == "def f():"
    )
    assert type(encoder) is ByteTokenizer and encoder.encode(["if x:"]).shape == (1, 64)


def test_its_hugging_face_files_give_the_same_ids(tmp_path):
    """save_to_directory's byte-level tokenizer.json, read by the `tokenizers` library
    (HFTokenizer, as transformers' PreTrainedTokenizerFast reads it): byte b = id b, id 0
    the pad token, decoding as the ByteTokenizer decodes (padding dropped, bad UTF-8 -> U+FFFD)."""
    pytest.importorskip("tokenizers")
    import json

    from zoo.tokenizers import HFTokenizer

    ByteTokenizer().save_to_directory(tmp_path)
    hf, byte = HFTokenizer.from_directory(tmp_path), ByteTokenizer()
    assert (hf.vocabulary_size, hf.pad_token_id, hf.start_token_id, hf.end_token_id, hf.stop_token_ids) == (
        256,
        0,
        None,
        None,
        (),
    )
    texts = [
        "def f(x):\n    return x ** 2\n",
        "  two  spaces\t\r\n",
        "café 日本語 🙂",
        "\x00NUL\x00",
        "Ā is byte 0's stand-in",
        "".join(map(chr, range(1, 600))),
    ]
    for text in texts:
        assert hf.encode(text).tolist() == byte.encode(text).tolist() == list(text.encode()), text
    rng = np.random.default_rng(0)
    for ids in [
        [104, 0, 105, 0],
        [226, 130],
        [0xE6, 0x97, 65],
        [255, 192, 128, 0xF0, 0x9F],
        *rng.integers(0, 256, (300, 6)),
    ]:
        assert hf.decode(ids) == byte.decode(ids), ids
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["pad_token"] == "\x00"
    assert config["model_input_names"] == ["input_ids", "attention_mask"]  # a Llama takes no token_type_ids
