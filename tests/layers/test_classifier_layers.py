"""The small layers the encoder classifier and the ViT share, through the layer harness."""

import numpy as np
import pytest

from tests.layers.harness import check_layer_contract
from zoo.layers import ClassToken, LearnedPositionEmbedding, TokenPooling


def test_learned_position_embedding_contract(tmp_path):
    check_layer_contract(
        LearnedPositionEmbedding,
        init_kwargs={"sequence_length": 8},
        input_shape=(2, 5, 4),
        expected_output_shape=(2, 5, 4),
        expected_num_trainable_weights=1,
        expected_weight_shapes={"embeddings": (8, 4)},
        save_dir=tmp_path,
    )


def test_learned_position_embedding_adds_the_first_rows_and_refuses_longer_inputs():
    layer = LearnedPositionEmbedding(4)
    x = np.zeros((1, 3, 2), "float32")
    np.testing.assert_allclose(layer(x)[0], layer.embeddings.numpy()[:3])
    with pytest.raises(ValueError, match="sequence length 5 exceeds the 4 positions"):
        layer(np.zeros((1, 5, 2), "float32"))


def test_class_token_contract(tmp_path):
    check_layer_contract(
        ClassToken,
        init_kwargs={},
        input_shape=(2, 5, 4),
        expected_output_shape=(2, 6, 4),
        expected_num_trainable_weights=1,
        expected_weight_shapes={"token": (1, 1, 4)},
        save_dir=tmp_path,
    )


def test_class_token_comes_first():
    x = np.random.default_rng(0).standard_normal((3, 2, 4)).astype("float32")
    out = np.asarray(ClassToken(initializer="ones")(x))
    np.testing.assert_array_equal(out[:, 0], np.ones((3, 4)))
    np.testing.assert_array_equal(out[:, 1:], x)


def test_token_pooling_contract(tmp_path):
    mask = np.array([[True, True, False, False, False], [True, False, True, True, False]])
    check_layer_contract(
        TokenPooling,
        init_kwargs={"mode": "mean"},
        input_shape=(2, 5, 4),
        expected_output_shape=(2, 4),
        expected_num_trainable_weights=0,
        call_inputs={"key_mask": mask},
        save_dir=tmp_path,
    )


def test_token_pooling_averages_kept_tokens_or_takes_the_first():
    x = np.random.default_rng(0).standard_normal((2, 4, 3)).astype("float32")
    mask = np.array([[True, False, True, False], [False, False, False, False]])
    mean = np.asarray(TokenPooling("mean")(x, key_mask=mask))
    np.testing.assert_allclose(mean[0], x[0, [0, 2]].mean(0), rtol=1e-6)
    np.testing.assert_array_equal(mean[1], np.zeros(3))  # nothing kept: zeros, not NaN
    np.testing.assert_allclose(np.asarray(TokenPooling("mean")(x)), x.mean(1), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(TokenPooling("cls")(x, key_mask=mask)), x[:, 0])
    with pytest.raises(ValueError, match="pooling must be one of \\['cls', 'mean'\\], got 'max'"):
        TokenPooling("max")
