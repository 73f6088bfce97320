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
    assert (tokenizer.start_token_id, tokenizer.end_token_id, tokenizer.pad_token_id, tokenizer.stop_token_ids) == (None, None, 0, ())
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
    assert type(gpt) is ByteTokenizer and gpt.sequence_length is None and gpt.decode(gpt.encode("def f():")) == "def f():"
    assert type(encoder) is ByteTokenizer and encoder.encode(["if x:"]).shape == (1, 64)
