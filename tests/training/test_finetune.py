"""Fine-tuning small_cnn_shapes on digits (new 10-class head): every method under
DataParallel and ModelParallel beats the zero-shot head; LoRA's parameter count and
factor layouts (a greedy layout rule, FSDP, tensor parallelism on encoder_tiny_topics)
against one device; adapters saved, loaded and merged."""

import keras
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from zoo import distribution as zd
from zoo.cli.main import build_parser, run
from zoo.config import schema
from zoo.data import load
from zoo.distribution import LayoutError
from zoo.models import SmallCNN
from zoo.presets import from_preset
from zoo.training.finetune import (
    FinetuneSettings,
    finetune,
    load_for_finetuning,
    load_lora,
    merge_lora,
    needs_new_head,
    prepare_finetuning,
    save_lora,
    trainable_parameter_count,
)

MESHES = {"data": "data=8", "model": "data=2,model=4"}
HIDDEN_IN, HIDDEN_OUT, CLASSES = 4 * 4 * 32, 64, 10  # small_cnn_shapes: flatten (32/8)^2 x 32 -> 64; digits: 10
HEAD = HIDDEN_OUT * CLASSES + CLASSES
ALL_TRAINABLE = 39_552 - 2 * (8 + 16 + 32) + (CLASSES - 8) * (HIDDEN_OUT + 1)  # minus batch-norm statistics, new head


def lora_count(rank):
    """By hand: the one backbone Dense layer, r * (in + out)."""
    return rank * (HIDDEN_IN + HIDDEN_OUT)


def digits(count, offset=0):
    x, y = load("digits", "train", image_size=32, num_examples=offset + count)
    return np.repeat(x[offset:], 3, axis=-1), y[offset:]  # grey -> RGB, as finetune does


@pytest.mark.parametrize("method", ["frozen", "lora", "full"])
@pytest.mark.parametrize("layout", ["data", "model"])
def test_finetuning_beats_the_zero_shot_head(method, layout, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # without --output the run's files go to a new folder under ./runs/finetune
    lines = []
    output = tmp_path / "tuned" if (method, layout) == ("lora", "model") else None
    config = FinetuneSettings(
        preset="small_cnn_shapes",
        dataset="digits",
        method=method,
        layout=layout,
        mesh=MESHES[layout],
        epochs=4,
        train_examples=192,
        output=str(output) if output else None,
    )
    result = finetune(config, report=lines.append)
    assert result["zero_shot_accuracy"] < 0.2, lines  # a zero head: one class for everything
    assert result["test_accuracy"] > result["zero_shot_accuracy"] + 0.2, lines
    expected = {"frozen": HEAD, "lora": HEAD + lora_count(4), "full": ALL_TRAINABLE}[method]
    assert result["trainable_parameters"] == expected
    model = result["model"]
    if layout == "model":
        assert model.get_layer("hidden_dense")._kernel.value.sharding.spec == P(None, "model")
    if output:
        _check_saved(result, output)


def _check_saved(result, output):
    """The merged preset predicts as the LoRA model did; the adapter file holds only factors."""
    images, _ = digits(16)
    expected = result["model"].predict(images, batch_size=16, verbose=0)
    keras.distribution.set_distribution(None)
    merged = from_preset(output)
    assert merged.num_classes == CLASSES and not any("lora" in v.path for v in merged.weights)
    np.testing.assert_allclose(merged.predict(images, batch_size=16, verbose=0), expected, rtol=1e-4, atol=1e-4)
    import h5py

    with h5py.File(output / "lora.weights.h5") as file:
        names = []
        file.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
    assert names == ["hidden_dense/lora_kernel_a", "hidden_dense/lora_kernel_b"]


def _greedy_distribution():
    """SmallCNN's layout map with the hidden kernel's rule made greedy (keras#19496)."""
    mesh = zd.make_mesh(MESHES["model"])
    layout_map = SmallCNN.get_layout_map(mesh)
    del layout_map[r".*hidden_dense/kernel"]
    layout_map[r".*hidden_dense/.*kernel.*"] = (None, "model")  # also matches lora_kernel_a/b
    return zd.CheckedModelParallel(layout_map=layout_map, batch_dim_name="data")


def test_greedy_rule_breaks_plain_keras_lora():
    """What the zoo avoids: Keras places lora_kernel_a (512, 2) by the greedy rule."""
    keras.distribution.set_distribution(_greedy_distribution())
    model = load_for_finetuning("small_cnn_shapes", CLASSES)
    with pytest.raises(LayoutError, match="lora_kernel_a.*dimension 1 of size 2 is not divisible"):
        model.get_layer("hidden_dense").enable_lora(2)


def test_lora_factors_follow_their_kernel_under_a_greedy_rule():
    distribution = _greedy_distribution()
    rules = list(distribution.layout_map)
    model = zd.build_distributed(lambda: load_for_finetuning("small_cnn_shapes", CLASSES), distribution)
    assert needs_new_head("small_cnn_shapes", CLASSES) and not needs_new_head("small_cnn_shapes", 8)
    adapted = prepare_finetuning(model, "lora", head="logits", lora_rank=2)
    layer = model.get_layer("hidden_dense")
    assert [a.name for a in adapted] == ["hidden_dense"] and layer.lora_rank == 2
    assert layer.lora_kernel_a.value.sharding.spec == P(None, None)  # kernel's input layout, rank whole
    assert layer.lora_kernel_b.value.sharding.spec == P(None, "model")  # kernel's output layout
    assert list(distribution.layout_map) == rules  # the temporary exact keys are gone
    assert trainable_parameter_count(model) == lora_count(2) + HEAD
    assert {v.path for v in model.trainable_weights} == {
        "hidden_dense/lora_kernel_a",
        "hidden_dense/lora_kernel_b",
        "logits/kernel",
        "logits/bias",
    }
    x, y = digits(32)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    slots = [v for v in model.optimizer.variables if "lora_kernel_b" in v.path]
    assert slots and all(v.value.sharding.spec == P(None, "model") for v in slots)


def _fsdp_distribution():
    """FSDP for SmallCNN: batch and the large weights split over one 8-way data axis."""
    mesh = zd.make_mesh("data=8")
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[r".*hidden_dense/kernel"] = ("data", None)  # (512, 64)
    layout_map[r".*block3_conv/kernel"] = (None, None, None, "data")  # (3, 3, 16, 32)
    return zd.CheckedModelParallel(layout_map=layout_map, batch_dim_name="data")


def _lora_model(distribution, rank=2):
    keras.utils.set_random_seed(7)
    model = zd.build_distributed(lambda: load_for_finetuning("small_cnn_shapes", CLASSES), distribution)
    prepare_finetuning(model, "lora", head="logits", lora_rank=rank)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def test_lora_under_fsdp_trains_like_one_device(tmp_path):
    x, y = digits(96)  # 3 steps: the zero head moves first, then lora_kernel_b, then lora_kernel_a
    single = _lora_model(None)
    save_lora(single, tmp_path / "start.h5")
    start_a = np.asarray(single.get_layer("hidden_dense").lora_kernel_a.value)
    single.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    trained = single.get_layer("hidden_dense")
    assert np.abs(np.asarray(trained.lora_kernel_b.value)).max() > 0
    assert np.abs(np.asarray(trained.lora_kernel_a.value) - start_a).max() > 0

    fsdp = _lora_model(_fsdp_distribution())
    layer = fsdp.get_layer("hidden_dense")
    assert layer.kernel.shape == (HIDDEN_IN, HIDDEN_OUT) and layer._kernel.value.sharding.spec == P("data", None)
    assert layer.lora_kernel_a.value.sharding.spec == P("data", None)
    assert layer.lora_kernel_b.value.sharding.spec == P(None, None)
    load_lora(fsdp, tmp_path / "start.h5")  # the same starting factors
    fsdp.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    for name in ("lora_kernel_a", "lora_kernel_b"):
        np.testing.assert_allclose(
            np.asarray(getattr(layer, name).value),
            np.asarray(getattr(single.get_layer("hidden_dense"), name).value),
            rtol=1e-4,
            atol=1e-5,
        )


def test_lora_save_load_and_merge_under_model_parallel(tmp_path):
    images, _ = digits(16)
    distribution = zd.distribution_for(SmallCNN, "model", MESHES["model"])
    tuned = _lora_model(distribution, rank=3)
    layer = tuned.get_layer("hidden_dense")
    layer.lora_kernel_b.assign(
        np.random.RandomState(0).normal(0, 0.1, size=layer.lora_kernel_b.shape).astype("float32")
    )
    expected = tuned.predict(images, batch_size=16, verbose=0)
    path = save_lora(tuned, tmp_path / "adapter.h5")

    fresh = load_for_finetuning("small_cnn_shapes", CLASSES)  # same distribution, no LoRA yet
    for mine, theirs in zip(fresh.get_layer("logits").weights, tuned.get_layer("logits").weights):
        mine.assign(np.asarray(theirs.value))  # the head is not part of an adapter
    assert [a.name for a in load_lora(fresh, path)] == ["hidden_dense"]
    assert fresh.get_layer("hidden_dense").lora_rank == 3
    np.testing.assert_allclose(fresh.predict(images, batch_size=16, verbose=0), expected, rtol=1e-5, atol=1e-5)

    merged = merge_lora(tuned)
    assert not any("lora" in v.path for v in merged.weights) and not merged.get_layer("hidden_dense").lora_enabled
    assert merged.get_layer("hidden_dense").kernel.value.sharding.spec == P(None, "model")
    np.testing.assert_allclose(merged.predict(images, batch_size=16, verbose=0), expected, rtol=1e-5, atol=1e-5)

    save_lora(_lora_model(distribution, rank=2), tmp_path / "rank2.h5")
    with pytest.raises(ValueError, match="LoRA rank 3, alpha 3; LoRA file .* holds rank 2"):
        load_lora(tuned, tmp_path / "rank2.h5")
    with pytest.raises(ValueError, match="has no LoRA-enabled layer"):
        save_lora(merged, tmp_path / "none.h5")
    (tmp_path / "bad.h5").write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="bad.h5' is not a readable HDF5 file"):
        load_lora(fresh, tmp_path / "bad.h5")


def test_cli_arguments_and_errors(capsys):
    parser = build_parser()
    args = parser.parse_args(
        [
            "finetune",
            "small_cnn_shapes",
            "--dataset",
            "digits",
            "--method",
            "frozen",
            "--lora-rank",
            "8",
            "--mesh",
            "data=8",
        ]
    )
    config = schema.from_args(FinetuneSettings, args)
    assert (config.preset, config.method, config.lora_rank, config.mesh, config.learning_rate) == (
        "small_cnn_shapes",
        "frozen",
        8,
        "data=8",
        None,
    )
    with pytest.raises(
        ValueError, match="fine-tuning needs a classification dataset; 'python_docs' is language modelling"
    ):
        finetune(FinetuneSettings(dataset="python_docs"))
    with pytest.raises(
        ValueError,
        match=r"FinetuneSettings.method: 'half' is not one of the allowed values \['frozen', 'lora', 'qlora', 'full'\]",
    ):
        FinetuneSettings(method="half")
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        run(parser.parse_args(["finetune", "nope"]))


# block_0's LoRA factor layouts (lora_kernel_a, lora_kernel_b) per Transformer layout
ENCODER_FACTOR_SPECS = {
    "tp": {  # attention heads split; ParallelMLP's layers place their own factors
        "attention/query/kernel": (P(None, "model", None), P(None, None)),  # kernel (C, H/M, D)
        "attention/key/kernel": (P(None, "model", None), P(None, None)),
        "attention/value/kernel": (P(None, "model", None), P(None, None)),
        "attention/output/kernel": (P("model", None, None), P(None, None)),  # kernel (H/M, D, C)
        "mlp/up/kernel": (P(None, None), P(None, "model")),  # ColumnParallelDense's own
        "mlp/down/kernel": (P("model", None), P(None, None)),  # RowParallelDense's own
    },
    "fsdp": {  # every kernel split over data on one dimension; the factors follow it
        "attention/query/kernel": (P("data", None, None), P(None, None)),  # kernel (C/N, H, D)
        "attention/key/kernel": (P("data", None, None), P(None, None)),
        "attention/value/kernel": (P("data", None, None), P(None, None)),
        "attention/output/kernel": (P(None, None, None), P(None, "data")),  # kernel (H, D, C/N)
        "mlp/up/kernel": (P("data", None), P(None, None)),  # kernel (C/N, F)
        "mlp/down/kernel": (P(None, None), P(None, "data")),  # kernel (F, C/N)
    },
}


@pytest.mark.parametrize("layout, mesh", [("tp", MESHES["model"]), ("fsdp", "data=8")])
def test_lora_on_transformer_layers_matches_one_device(layout, mesh, tmp_path):
    """encoder_tiny_topics: LoRA on the EinsumDense attention projections and on
    ParallelMLP's column/row-parallel layers, under tensor parallelism and FSDP, computes
    what one device computes, with each factor laid out like its kernel."""
    from zoo.models.encoder import TransformerEncoderClassifier

    tokens = np.random.RandomState(1).randint(1, 256, size=(8, 64)).astype("int32")
    single = from_preset("encoder_tiny_topics")
    for layer in prepare_finetuning(single, "lora", head="classifier_head", lora_rank=2):
        layer.lora_kernel_b.assign(
            np.random.RandomState(2).normal(0, 0.05, layer.lora_kernel_b.shape).astype("float32")
        )
    expected = single.predict(tokens, batch_size=8, verbose=0)
    save_lora(single, tmp_path / "adapter.h5")

    distribution = zd.distribution_for(TransformerEncoderClassifier, layout, mesh)
    model = zd.build_distributed(lambda: from_preset("encoder_tiny_topics"), distribution)
    adapted = prepare_finetuning(model, "lora", head="classifier_head", lora_rank=2)
    c, h, d, f, r = 32, 4, 8, 64, 2  # encoder_tiny: width, heads, head dim, MLP width; the rank
    per_block = 3 * r * (c * h + d) + r * (h * d + c) + r * (c + f) + r * (f + c)  # query/key/value, output, up, down
    assert trainable_parameter_count(model) == 2 * per_block + (c * 4 + 4)  # 2 blocks + the 4-class head
    assert len(load_lora(model, tmp_path / "adapter.h5")) == len(adapted) == 12  # 6 per block
    specs = {
        layer._kernel.path.split("/", 1)[1]: (
            layer.lora_kernel_a.value.sharding.spec,
            layer.lora_kernel_b.value.sharding.spec,
        )
        for layer in adapted
        if layer._kernel.path.startswith("block_0/")
    }
    assert specs == ENCODER_FACTOR_SPECS[layout]
    np.testing.assert_allclose(model.predict(tokens, batch_size=8, verbose=0), expected, rtol=1e-5, atol=1e-5)
    merged = merge_lora(model)
    np.testing.assert_allclose(merged.predict(tokens, batch_size=8, verbose=0), expected, rtol=1e-5, atol=1e-5)
