import keras
import pytest

from tests.models.harness import check_model_contract
from zoo.data import load_shapes
from zoo.distribution import CheckedModelParallel, LayoutError, build_distributed, make_mesh
from zoo.distribution.parity import check_parity
from zoo.models.vit import VIT_CONFIGS, ViTClassifier

IMAGE = 16  # vit_tiny: 16 x 16 images, 4 x 4 patches


def _tiny(**overrides):
    return ViTClassifier.from_config_name("vit_tiny", **overrides)


def _compile_sgd(model):
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def _tp(config=None):
    mesh = make_mesh("data=2,model=4")
    return CheckedModelParallel(layout_map=ViTClassifier.get_layout_map(mesh, "tp", config), batch_dim_name="data")


@pytest.fixture(scope="module")
def shapes():
    return load_shapes("train", image_size=IMAGE, num_examples=96, seed=3)


@pytest.mark.parametrize(
    "distribution, overrides",
    [
        (
            lambda: keras.distribution.DataParallel(device_mesh=make_mesh("data=8")),
            dict(pooling="cls", dropout=0.1, seed=3),
        ),
        (lambda: _tp("vit_tiny"), dict(pooling="mean")),
    ],
    ids=["data=8 dropout", "tp data=2,model=4"],
)
def test_three_steps_of_fit_match_one_device(distribution, overrides, shapes):
    x, y = shapes
    report = check_parity(
        lambda: _tiny(num_layers=1, **overrides), _compile_sgd, distribution(), x, y, steps=3, batch_size=32
    )
    assert report.passed, "\n".join(report.format())
    assert len(report.reference_losses) == 3 and report.reference_losses[0] != report.reference_losses[2]


def test_tensor_parallel_shards_the_weights():
    model = build_distributed(_tiny, _tp("vit_tiny"))
    specs = {v.path: tuple(v.value.sharding.spec) for v in model.weights}
    assert specs["block_0/attention/key/kernel"] == (None, "model", None)
    assert specs["block_1/attention/output/kernel"] == ("model", None, None)
    assert specs["block_1/mlp/down/kernel"] == ("model", None)
    assert specs["classifier_head/kernel"] == (None, "model")  # 8 classes divide the model axis of 4
    for path in ("patch_embedding/kernel", "class_token/token", "position_embedding/embeddings"):
        assert all(entry is None for entry in specs[path]), path
    query = next(v for v in model.weights if v.path == "block_0/attention/query/kernel")
    assert {s.data.shape for s in query.value.addressable_shards} == {(32, 1, 8)}  # 4 heads over 4 devices


def test_fsdp_splits_the_embeddings_over_data():
    mesh = make_mesh("data=8")
    distribution = CheckedModelParallel(
        layout_map=ViTClassifier.get_layout_map(mesh, "fsdp", "vit_tiny"), batch_dim_name="data"
    )
    model = build_distributed(_tiny, distribution)
    specs = {v.path: tuple(v.value.sharding.spec) for v in model.weights}
    assert specs["patch_embedding/kernel"] == (None, None, None, "data")
    assert specs["position_embedding/embeddings"] == (None, "data")
    assert specs["block_0/mlp/up/kernel"] == ("data", None)
    assert specs["classifier_head/kernel"] == ("data", None)


def test_config_and_keras_file_round_trip(tmp_path, shapes):
    model = ViTClassifier(
        image_size=(16, 8),
        patch_size=(4, 2),
        num_classes=3,
        num_layers=1,
        num_query_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        num_key_value_heads=1,
        mlp="geglu",
        norm="rms",
        pooling="mean",
        dropout=0.1,
        seed=2,
    )
    config = model.get_config()
    assert config == ViTClassifier.from_config(config).get_config()
    assert config["image_size"] == [16, 8] and config["patch_size"] == [4, 2] and model.num_patches == 16
    x = shapes[0][:2, :, :8]
    check_model_contract(model, x, expected_output_shape=(2, 3), save_dir=tmp_path)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(image_size=18), "image height 18 is not divisible by patch height 4"),
        (dict(image_size=(16, 10)), "image width 10 is not divisible by patch width 4"),
        (dict(hidden_dim=30), "hidden_dim=30 is not divisible by num_query_heads=4"),
        (dict(patch_size=0), "patch_size must be a positive int or (height, width) of positive ints, got 0"),
        (dict(pooling="max"), "pooling must be one of ['cls', 'mean'], got 'max'"),
        (dict(num_classes=0), "num_classes must be a positive integer, got 0"),
    ],
)
def test_bad_config_names_the_numbers(overrides, message):
    with pytest.raises(ValueError) as error:
        _tiny(**overrides)
    assert message in str(error.value)


def test_unknown_config_name_lists_the_names():
    with pytest.raises(ValueError) as error:
        ViTClassifier.from_config_name("vit_huge")
    assert "'vit_huge'" in str(error.value) and str(list(VIT_CONFIGS)) in str(error.value)


@pytest.mark.parametrize(
    "layout, config, message",
    [
        ("tp", "vit_small", "num_query_heads=6 is not divisible by the 'model' mesh axis of size 4"),
        (
            "tp+sp",
            {**VIT_CONFIGS["vit_tiny"], "megatron_sp": True},
            "token count (patches + class token)=17 is not divisible by the 'model' mesh axis of size 4",
        ),
        ("tp+sp", VIT_CONFIGS["vit_tiny"], "needs the model built with megatron_sp=True"),
    ],
)
def test_layout_map_checks_the_config_up_front(layout, config, message):
    with pytest.raises((LayoutError, ValueError)) as error:
        ViTClassifier.get_layout_map(make_mesh("data=2,model=4"), layout, config)
    assert message in str(error.value)


def test_mean_pooling_fits_sequence_parallel_layout():
    config = {**VIT_CONFIGS["vit_tiny"], "pooling": "mean", "megatron_sp": True}
    layout_map = ViTClassifier.get_layout_map(make_mesh("data=2,model=4"), "tp+sp", config)
    assert layout_map[r".*attention/(query|key|value)/kernel"] is None  # MultiHeadAttention places its own weights
