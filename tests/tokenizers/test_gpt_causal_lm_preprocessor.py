"""GPTCausalLMPreprocessor (zoo/models/gpt/): packing, truncation, padding, prompt masking,
left-padded generation inputs and decoding up to a stop token, exact arrays throughout."""

import json

import keras
import numpy as np
import pytest

from zoo.models.gpt import GPTCausalLMPreprocessor
from zoo.tokenizers import ByteTokenizer


def _check(arrays, token_ids, labels, sample_weight):
    assert [a.dtype for a in arrays] == [np.int32, np.int32, np.float32]
    np.testing.assert_array_equal(arrays[0], token_ids)
    np.testing.assert_array_equal(arrays[1], labels)
    np.testing.assert_array_equal(arrays[2], sample_weight)


def test_bytes_packing_truncation_padding_and_prompt_masking():
    preprocessor = GPTCausalLMPreprocessor(ByteTokenizer(), sequence_length=6)  # no start/end token, pad 0
    _check(
        preprocessor(["abc", "abcdefghij"]),
        [[97, 98, 99, 0, 0, 0], [97, 98, 99, 100, 101, 102]],
        [[98, 99, 0, 0, 0, 0], [98, 99, 100, 101, 102, 103]],  # cut to T + 1 = 7 bytes
        [[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]],
    )
    _check(preprocessor(["ab"], ["cd"]), [[97, 98, 99, 100, 0, 0]], [[98, 99, 100, 0, 0, 0]], [[0, 1, 1, 0, 0, 0]])
    token_ids, padding_mask = preprocessor.generate_preprocess(["a", "abc"])
    np.testing.assert_array_equal(token_ids, [[0, 0, 97], [97, 98, 99]])
    np.testing.assert_array_equal(padding_mask, [[False, False, True], [True, True, True]])
    assert token_ids.dtype == np.int32 and padding_mask.dtype == bool
    generated = np.concatenate([token_ids, [[100, 101], [100, 0]]], axis=1)  # no stop tokens: all kept
    assert preprocessor.generate_postprocess(generated) == ["ade", "abcd"]
    assert preprocessor.generate_postprocess(generated[1]) == "abcd"


def test_errors():
    with pytest.raises(ValueError, match="pads to its own sequence_length=8"):
        GPTCausalLMPreprocessor(ByteTokenizer(sequence_length=8), 8)
    with pytest.raises(ValueError, match="sequence_length must be a positive integer, got 0"):
        GPTCausalLMPreprocessor(ByteTokenizer(), 0)
    with pytest.raises(TypeError, match="must be a zoo.tokenizers.Tokenizer, got a str"):
        GPTCausalLMPreprocessor("bytes", 8)
    preprocessor = GPTCausalLMPreprocessor(ByteTokenizer(), 8)
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        preprocessor(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="prompts is empty"):
        preprocessor.generate_preprocess([])


class TestWithHFTokenizer:
    """The tiny BPE: <s> = 0 (its post-processor prepends it), </s> = 1, <eot> = 2, <pad> = 3."""

    @pytest.fixture(autouse=True)
    def _tokenizer(self):
        pytest.importorskip("tokenizers")
        from tests.tokenizers._tiny_bpe import tiny_bpe_json
        from zoo.tokenizers import HFTokenizer

        self.json = tiny_bpe_json()
        self.tokenizer = HFTokenizer(
            self.json, start_token="<s>", end_token="</s>", pad_token="<pad>", stop_tokens=["<eot>"]
        )
        self.make = HFTokenizer

    def content(self, text):
        return self.tokenizer.encode(text)[1:].tolist()  # without the post-processor's <s>

    def test_packing_keeps_one_start_token_and_pads_with_the_pad_id(self):
        a = self.content("the quick brown fox")
        length = len(a) + 3
        preprocessor = GPTCausalLMPreprocessor(self.tokenizer, length)
        packed = [0] + a + [1, 3, 3]  # T + 1
        _check(preprocessor("the quick brown fox"), [packed[:-1]], [packed[1:]], [[1] * (len(a) + 1) + [0, 0]])
        short = GPTCausalLMPreprocessor(self.tokenizer, 3)(["the quick brown fox"])  # cut: no end token
        _check(short, [[0] + a[:2]], [a[:3]], [[1, 1, 1]])
        bare = GPTCausalLMPreprocessor(self.tokenizer, length, add_start_token=False, add_end_token=False)
        _check(bare("the quick brown fox"), [a + [3, 3, 3]], [a[1:] + [3] * 4], [[1] * (len(a) - 1) + [0] * 4])

    def test_prompt_tokens_get_no_weight(self):
        p, c = self.content("Q: 2 + 2?"), self.content(" A: 4")
        length = len(p) + len(c) + 3
        packed = [0] + p + c + [1, 3, 3]  # T + 1
        weights = [0] * len(p) + [1] * (len(c) + 1) + [0, 0]  # the completion and </s>
        _check(
            GPTCausalLMPreprocessor(self.tokenizer, length)(["Q: 2 + 2?"], [" A: 4"]),
            [packed[:-1]],
            [packed[1:]],
            [weights],
        )

    def test_generation_left_pads_and_stops_at_a_stop_token(self):
        preprocessor = GPTCausalLMPreprocessor(self.tokenizer, 16)
        long, short = self.content("the quick brown fox"), self.content("a")
        token_ids, padding_mask = preprocessor.generate_preprocess(["the quick brown fox", "a"])
        width = len(long) + 1
        np.testing.assert_array_equal(token_ids, [[0] + long, [3] * (width - 2) + [0] + short])
        np.testing.assert_array_equal(padding_mask, [[True] * width, [False] * (width - 2) + [True, True]])
        new = self.content(" jumps") + [2] + self.content(" over") + [1]  # <eot> is a stop token, as </s>
        generated = np.concatenate([token_ids, [new, new]], axis=1)
        expected = ["the quick brown fox jumps", "a jumps"]
        assert preprocessor.generate_postprocess(generated, prompt_lengths=width) == expected
        assert preprocessor.generate_postprocess(generated) == expected
        assert preprocessor.generate_postprocess(generated, prompt_lengths=[width, width]) == expected

    def test_start_token_that_is_also_the_end_token(self):
        """GPT-2's <|endoftext|> starts a text and ends it; no pad token (padding with 0)."""
        tokenizer = self.make(self.json, start_token="<eot>", end_token="<eot>", add_special_tokens=False)
        preprocessor = GPTCausalLMPreprocessor(tokenizer, 8)
        a = self.content("the fox")
        _check(
            preprocessor(["the fox"]),
            [([2] + a + [2] + [0] * 8)[:8]],
            [(a + [2] + [0] * 8)[:8]],
            [[1] * (len(a) + 1) + [0] * (7 - len(a))],
        )
        token_ids, _ = preprocessor.generate_preprocess(["the fox"])
        generated = np.concatenate([token_ids, [self.content(" jumps") + [2] + self.content(" over")]], axis=1)
        assert preprocessor.generate_postprocess(generated) == ["the fox jumps"]  # the start token is not a stop
        assert preprocessor.generate_postprocess(generated, prompt_lengths=token_ids.shape[1]) == ["the fox jumps"]

    def test_config_round_trip(self):
        preprocessor = GPTCausalLMPreprocessor(self.tokenizer, 12, add_end_token=False)
        serialised = json.loads(json.dumps(keras.saving.serialize_keras_object(preprocessor)))
        assert serialised["registered_name"] == "zoo>GPTCausalLMPreprocessor"
        clone = keras.saving.deserialize_keras_object(serialised, safe_mode=True)
        assert clone.get_config() == preprocessor.get_config() and clone.tokenizer.stop_token_ids == (1, 2)
        for mine, theirs in zip(preprocessor(["Q?"], ["yes"]), clone(["Q?"], ["yes"])):
            np.testing.assert_array_equal(mine, theirs)
