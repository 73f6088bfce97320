import keras
import numpy as np
import pytest

from tests.models.harness import check_model_contract
from zoo.data import load_shapes
from zoo.distribution import build_distributed, distribution_for, sharding_summary
from zoo.distribution.parity import check_parity, reference_run
from zoo.models import SmallCNN

IMAGE = 16
CLASSES = 8


def _build():
    return SmallCNN(num_classes=CLASSES, image_size=IMAGE, dropout=0.25, seed=7)


def _compile_sgd(model):
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def _compile_adam(model):
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )


@pytest.fixture(scope="module")
def shapes():
    return load_shapes("train", image_size=IMAGE, num_examples=96, seed=3)


@pytest.fixture(scope="module")
def sgd_reference(shapes):
    """The single-device SGD run, shared by the layouts' parity checks."""
    return reference_run(_build, _compile_sgd, *shapes, steps=3, batch_size=32)


@pytest.mark.parametrize(
    "layout, mesh",
    [("data", "data=8"), ("model", "data=2,model=4"), ("model", "data=1,model=8")],
)
def test_three_steps_of_fit_match_one_device(layout, mesh, shapes, sgd_reference):
    x, y = shapes
    distribution = distribution_for(SmallCNN, layout, mesh)
    report = check_parity(_build, _compile_sgd, distribution, x, y, steps=3, reference=sgd_reference)
    assert report.passed, "\n".join(report.format())
    np.testing.assert_allclose(report.distributed_losses, report.reference_losses, rtol=1e-5)
    assert len(report.reference_losses) == 3
    # the check is not vacuous: training moved the loss
    assert report.reference_losses[0] != report.reference_losses[2]


def test_adam_parity_within_documented_tolerance(shapes):
    """Adam divides by sqrt(v): rounding-level gradient noise becomes larger weight noise."""
    x, y = shapes
    report = check_parity(
        _build,
        _compile_adam,
        distribution_for(SmallCNN, "model", "data=2,model=4"),
        x,
        y,
        steps=3,
        batch_size=32,
        atol=1e-4,
        rtol=1e-3,
    )
    assert report.passed, "\n".join(report.format())


EXPECTED_MODEL_SPECS = {
    "block1_conv/kernel": (None, None, None, "model"),
    "block2_conv/kernel": (None, None, None, "model"),
    "block3_conv/kernel": (None, None, None, "model"),
    "block1_norm/gamma": ("model",),
    "block3_norm/moving_variance": ("model",),
    "hidden_dense/kernel": (None, "model"),
    "hidden_dense/bias": ("model",),
    "logits/kernel": ("model", None),
}


@pytest.mark.parametrize("mesh", ["data=2,model=4", "data=1,model=8"])
def test_weights_are_really_sharded(mesh):
    model = build_distributed(_build, distribution_for(SmallCNN, "model", mesh))
    specs = {v.path: tuple(v.value.sharding.spec) for v in model.weights}
    for path, spec in EXPECTED_MODEL_SPECS.items():
        assert specs[path] == spec, path
    assert specs["logits/bias"] in ((), (None,))
    model_size = int(mesh.split("model=")[1])
    kernel = next(v for v in model.weights if v.path == "hidden_dense/kernel")
    shard_shapes = {s.data.shape for s in kernel.value.addressable_shards}
    assert shard_shapes == {(kernel.shape[0], kernel.shape[1] // model_size)}


def test_data_parallel_replicates_weights():
    model = build_distributed(_build, distribution_for(SmallCNN, "data", "data=8"))
    assert all(spec == "replicated" for _, _, spec in sharding_summary(model))
    assert all(len(v.value.sharding.device_set) == 8 for v in model.weights)


def test_model_contract_and_any_size(tmp_path):
    model = SmallCNN(
        num_classes=3, image_size=(40, 24), channels=1, filters=(8, 8, 16), hidden_units=32, dropout=0.1, seed=5
    )
    x = np.random.default_rng(0).random((2, 40, 24, 1), dtype=np.float32)
    check_model_contract(model, x, expected_output_shape=(2, 3), save_dir=tmp_path, preset_dir=tmp_path / "preset")
    assert [layer.name for layer in model.layers if layer.weights] == [
        "block1_conv",
        "block1_norm",
        "block2_conv",
        "block2_norm",
        "block3_conv",
        "block3_norm",
        "hidden_dense",
        "logits",
    ]


def test_keras_file_round_trip_reproduces_outputs(tmp_path, shapes):
    x, _ = shapes
    model = build_distributed(_build, distribution_for(SmallCNN, "model", "data=2,model=4"))
    expected = model.predict(x[:16], verbose=0)
    path = tmp_path / "cnn.keras"
    model.save(path)
    keras.distribution.set_distribution(None)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(loaded, SmallCNN) and loaded.get_config() == model.get_config()
    np.testing.assert_allclose(loaded.predict(x[:16], verbose=0), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"image_size": 4}, "each side >= 8, got (4, 4)"),
        ({"filters": (8, 8)}, "three positive conv widths, got (8, 8)"),
        ({"dropout": 1.0}, "dropout must be in [0, 1), got 1.0"),
        ({"num_classes": 0}, "must be positive, got 0"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError) as error:
        SmallCNN(**kwargs)
    assert message in str(error.value)
