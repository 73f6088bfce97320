import keras
import numpy as np
import pytest

from tests.models.harness import check_model_contract
from zoo.data import load
from zoo.distribution import (
    CheckedModelParallel,
    LayoutError,
    build_distributed,
    make_mesh,
)
from zoo.distribution.parity import check_parity
from zoo.models._transformer_layouts import layout_overrides
from zoo.models.encoder import ENCODER_CONFIGS, TransformerEncoderClassifier

LENGTH = 16  # tokens per example


def _tiny(**overrides):
    return TransformerEncoderClassifier.from_config_name("encoder_tiny", **overrides)


def _compile_sgd(model):
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def _tp(mesh_spec="data=2,model=4", layout="tp", config=None):
    mesh = make_mesh(mesh_spec)
    return CheckedModelParallel(
        layout_map=TransformerEncoderClassifier.get_layout_map(mesh, layout, config), batch_dim_name="data"
    )


@pytest.fixture(scope="module")
def topics():
    """96 shuffled windows of python_docs_topics, with trailing padding of 0..8 tokens."""
    x, y = load("python_docs_topics", sequence_length=LENGTH)
    rng = np.random.default_rng(0)
    rows = rng.permutation(len(x))[:96]
    x, y = x[rows].copy(), y[rows]
    for row, pad in enumerate(rng.integers(0, 9, len(x))):
        x[row, LENGTH - pad :] = 0
    return x, y


@pytest.mark.parametrize(
    "distribution, overrides",
    [
        (lambda: keras.distribution.DataParallel(device_mesh=make_mesh("data=8")), dict(pooling="mean")),
        (_tp, dict(pooling="cls", dropout=0.1, seed=3)),
    ],
    ids=["data=8", "tp data=2,model=4 dropout"],
)
def test_three_steps_of_fit_match_one_device(distribution, overrides, topics):
    x, y = topics
    report = check_parity(
        lambda: _tiny(num_layers=1, **overrides), _compile_sgd, distribution(), x, y, steps=3, batch_size=32
    )
    assert report.passed, "\n".join(report.format())
    assert len(report.reference_losses) == 3 and report.reference_losses[0] != report.reference_losses[2]


def test_tensor_parallel_shards_the_weights():
    model = build_distributed(_tiny, _tp(config="encoder_tiny"))
    specs = {v.path: tuple(v.value.sharding.spec) for v in model.weights}
    assert specs["token_embedding/embeddings"] == ("model", None)  # vocabulary-parallel
    assert specs["block_0/attention/query/kernel"] == (None, "model", None)
    assert specs["block_1/attention/output/kernel"] == ("model", None, None)
    assert specs["block_0/mlp/up/kernel"] == (None, "model")
    assert specs["classifier_head/kernel"] == (None, "model")  # 4 classes divide the model axis of 4
    assert all(entry is None for entry in specs["position_embedding/embeddings"])
    embedding = next(v for v in model.weights if v.path == "token_embedding/embeddings")
    assert {s.data.shape for s in embedding.value.addressable_shards} == {(256 // 4, 32)}


@pytest.mark.parametrize("overrides", [dict(pooling="mean"), dict(pooling="cls", position_embedding="rotary")])
def test_padding_does_not_change_the_logits(overrides):
    """What sits at padded positions (the pad id's embedding) and how much padding follows
    the text leave the logits unchanged; a real token's embedding does change them."""
    keras.utils.set_random_seed(1)
    model = _tiny(**overrides)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 256, (4, LENGTH)).astype("int32")
    ids[:, 10:] = 0  # 6 pad tokens after 10 real ones
    ids[1, 3] = 0  # and one in the middle
    expected = model.predict(ids, verbose=0)
    table = model.get_layer("token_embedding").embeddings
    original = table.numpy()
    table.assign(original + (np.arange(256)[:, None] == 0) * rng.standard_normal(original.shape).astype("float32"))
    np.testing.assert_allclose(model.predict(ids, verbose=0), expected, atol=1e-5)
    table.assign(
        original + (np.arange(256)[:, None] == ids[0, 0]) * rng.standard_normal(original.shape).astype("float32")
    )
    assert np.abs(model.predict(ids, verbose=0)[0] - expected[0]).max() > 1e-3
    table.assign(original)
    np.testing.assert_allclose(model.predict(ids[:, :10], verbose=0), expected, atol=1e-5)


def test_config_and_keras_file_round_trip(tmp_path):
    model = _tiny(
        num_key_value_heads=2, mlp="swiglu", norm="rms", position_embedding="rotary", pooling="cls", dropout=0.1, seed=5
    )
    config = model.get_config()
    assert config == TransformerEncoderClassifier.from_config(config).get_config()
    assert config["num_key_value_heads"] == 2 and config["pooling"] == "cls" and config["megatron_sp"] is False
    old = {k: v for k, v in config.items() if k not in ("num_query_heads", "megatron_sp")}  # keys saved before issue 16
    old.update(num_heads=4, tp_sequence_parallel=True)
    assert TransformerEncoderClassifier.from_config(old).get_config() == config | {"megatron_sp": True}
    ids = np.random.default_rng(0).integers(0, 256, (2, LENGTH)).astype("int32")
    check_model_contract(model, ids, expected_output_shape=(2, model.num_classes), save_dir=tmp_path)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(hidden_dim=30), "hidden_dim=30 is not divisible by num_query_heads=4"),
        (dict(num_layers=0), "num_layers must be a positive integer, got 0"),
        (dict(pooling="max"), "pooling must be one of ['cls', 'mean'], got 'max'"),
        (dict(position_embedding="sinusoid"), "position_embedding must be one of ['learned', 'rotary']"),
        (dict(dropout=1.0), "dropout must be in [0, 1), got 1.0"),
        (dict(pad_id=256), "pad_id=256 is not a token id in [0, vocabulary_size=256)"),
    ],
)
def test_bad_config_names_the_numbers(overrides, message):
    with pytest.raises(ValueError) as error:
        _tiny(**overrides)
    assert message in str(error.value)


def test_too_long_input_names_the_lengths():
    with pytest.raises(ValueError, match="sequence length 65 exceeds the 64 positions"):
        _tiny()(np.ones((1, 65), "int32"))


def test_unknown_config_name_lists_the_names():
    with pytest.raises(ValueError) as error:
        TransformerEncoderClassifier.from_config_name("encoder_huge")
    assert "'encoder_huge'" in str(error.value) and str(list(ENCODER_CONFIGS)) in str(error.value)


@pytest.mark.parametrize(
    "layout, overrides, message",
    [
        (
            "tp",
            dict(num_query_heads=2, hidden_dim=32),
            "num_query_heads=2 is not divisible by the 'model' mesh axis of size 4",
        ),
        ("tp", dict(vocabulary_size=258), "vocabulary_size=258 is not divisible by the 'model' mesh axis of size 4"),
        (
            "fsdp",
            dict(hidden_dim=36, num_query_heads=4),
            "hidden_dim=36 is not divisible by the 'data' mesh axis of size 8",
        ),
        ("fsdp", dict(vocabulary_size=260), "vocabulary_size=260 is not divisible by the 'data' mesh axis of size 8"),
        ("tp+sp", {}, "needs the model built with megatron_sp=True"),
    ],
)
def test_layout_map_checks_the_config_up_front(layout, overrides, message):
    mesh = make_mesh("data=8" if layout == "fsdp" else "data=2,model=4")
    config = {**ENCODER_CONFIGS["encoder_tiny"], **overrides}
    with pytest.raises((LayoutError, ValueError)) as error:
        TransformerEncoderClassifier.get_layout_map(mesh, layout, config)
    assert message in str(error.value)


def test_layout_map_rules_per_strategy():
    mesh = make_mesh("data=2,model=4")

    def rules(layout, config=None):
        layout_map = TransformerEncoderClassifier.get_layout_map(mesh, layout, config)
        return {key: layout_map[key].axes for key in layout_map}

    assert rules("data") == {}
    assert rules("tp")[r".*token_embedding/embeddings"] == ("model", None)
    assert rules("fsdp")[r".*token_embedding/embeddings"] == ("data", None)
    assert rules("fsdp")[r".*position_embedding/embeddings"] == (None, "data")
    assert r".*classifier_head/kernel" not in rules("tp")  # num_classes unknown: replicated
    assert r".*classifier_head/kernel" not in rules("tp", _tiny(num_classes=3).get_config())  # 3 classes, 4 devices
    fsdp_tp = rules("fsdp+tp", "encoder_tiny")
    assert fsdp_tp[r".*token_embedding/embeddings"] == ("model", "data")
    assert fsdp_tp[r".*position_embedding/embeddings"] == (None, "data")
    assert fsdp_tp[r".*classifier_head/kernel"] == ("data", "model")
    rotary = {**ENCODER_CONFIGS["encoder_tiny"], "position_embedding": "rotary", **layout_overrides("tp+sp")}
    assert not any("position_embedding" in key for key in rules("tp+sp", rotary))
    assert rules("tp+sp", rotary) == rules("tp", rotary)  # same weight layouts as tp


def test_from_config_name_applies_the_layout():
    model = TransformerEncoderClassifier.from_config_name("encoder_tiny", layout="tp+sp", num_layers=1)
    assert model.megatron_sp and model.num_layers == 1
    assert model.get_layer("block_0").megatron_sp
