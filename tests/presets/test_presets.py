"""Shipped presets: registry, pinned outputs, save -> load round trip, tokenizer, classmethod."""

import json
import os
import pathlib

import keras
import numpy as np
import pytest

from tests.presets._helpers import file_hashes, fixed_images, fixed_text
from zoo.data import ByteTokenizer
from zoo.models import (
    GPTBackbone,
    GPTCausalLM,
    SmallCNN,
    TransformerEncoderClassifier,
    ViTClassifier,
    ZooModel,
)
from zoo.presets import (
    FORMAT_VERSION,
    PRESETS,
    PresetError,
    from_preset,
    list_presets,
    load_tokenizer,
    preset_directory,
    preset_metadata,
    save_to_preset,
)
from zoo.presets.registry import ASSETS_DIR

# The first logits of each preset on a fixed input (``_inputs``): two images' first 5
# classes, two texts' classes, or the GPT's first 5 vocabulary logits at the first two
# positions of the first text. A change in the stored weights, or in the maths of a
# model, moves these.
PINNED = {
    "small_cnn_shapes": [
        [-20.399789810180664, -37.1833610534668, -15.897809982299805, -9.290698051452637, 15.16119384765625],
        [-19.41983985900879, -35.478065490722656, -16.675111770629883, -10.758587837219238, 13.1698637008667],
    ],
    "vit_tiny_shapes": [
        [-0.5664651393890381, 0.043715935200452805, -1.1168081760406494, -2.1706271171569824, 0.8146907091140747],
        [-0.9865344762802124, 0.06688214838504791, -0.8776324391365051, -2.3472790718078613, 0.7840808629989624],
    ],
    "encoder_tiny_topics": [
        [2.491835355758667, -1.4222811460494995, -0.8246244788169861, -0.6331673860549927],
        [2.4117112159729004, -0.15177975594997406, -0.05988141894340515, -1.797183632850647],
    ],
    "gpt_tiny_python_docs": [
        [-5.431732177734375, -6.365478992462158, -5.619128227233887, -6.814786434173584, -5.432982444763184],
        [-3.4911601543426514, -4.321068286895752, -4.59511661529541, -5.169533729553223, -5.9133806228637695],
    ],
}
MAX_TOTAL_BYTES = 4 * 1024 * 1024  # every shipped preset together
TINY = dict(num_classes=3, image_size=16, channels=1, filters=(4, 8, 8), hidden_units=8)  # one config: one compile


def test_registry_matches_the_asset_folders():
    assert list_presets() == sorted(PRESETS) == sorted(PINNED)
    folders = sorted(p.name for p in pathlib.Path(ASSETS_DIR).iterdir() if p.is_dir())
    assert folders == list_presets()
    total = sum(f.stat().st_size for f in pathlib.Path(ASSETS_DIR).rglob("*") if f.is_file())
    assert total < MAX_TOTAL_BYTES, f"shipped presets take {total:,} bytes"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_metadata_describes_the_preset(name):
    metadata, spec = preset_metadata(name), PRESETS[name]
    assert metadata["format_version"] == FORMAT_VERSION and metadata["name"] == name
    assert metadata["class_name"] == spec.model and metadata["dataset"] == spec.dataset
    assert metadata["parameter_count"] > 0 and set(metadata["files"]) >= {"config.json", "model.weights.h5"}
    assert metadata["training"]["recipe"] == "recipes/presets/make_presets.py"
    if "class_names" in metadata and metadata["class_names"]:
        assert 1 / len(metadata["class_names"]) < metadata["test_accuracy"] <= 1.0


def _pinned_slice(name, model):
    inputs = fixed_images() if name.endswith("shapes") else fixed_text(name)
    logits = model.predict(inputs, batch_size=len(inputs), verbose=0)
    return logits[0, :2, :5] if name.startswith("gpt") else logits[:, :5]  # GPT: (T, V) of the first text


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_outputs(name):
    model = from_preset(name)
    assert model.count_params() == preset_metadata(name)["parameter_count"]
    np.testing.assert_allclose(_pinned_slice(name, model), PINNED[name], rtol=1e-5, atol=1e-4)


def test_save_load_round_trip(tmp_path):
    keras.utils.set_random_seed(1)
    model = SmallCNN(**TINY)
    tokenizer = ByteTokenizer(sequence_length=12)
    directory = save_to_preset(
        model, tmp_path / "mine", tokenizer=tokenizer, metadata={"dataset": "digits", "class_names": ["a", "b", "c"]}
    )
    assert sorted(os.listdir(directory)) == ["config.json", "metadata.json", "model.weights.h5", "tokenizer.json"]
    metadata = json.loads((tmp_path / "mine" / "metadata.json").read_text())
    assert (
        metadata["name"] == "mine"
        and metadata["class_name"] == "SmallCNN"
        and metadata["keras_version"] == keras.__version__
    )
    assert metadata["parameter_count"] == model.count_params() and metadata["class_names"] == ["a", "b", "c"]
    assert set(metadata["files"]) == {"config.json", "model.weights.h5", "tokenizer.json"}
    loaded = from_preset(tmp_path / "mine")  # a Path is a directory
    assert isinstance(loaded, SmallCNN) and loaded.filters == (4, 8, 8)
    assert [v.path for v in loaded.weights] == [v.path for v in model.weights]
    for saved, restored in zip(model.weights, loaded.weights):  # bit for bit, so the outputs are too
        np.testing.assert_array_equal(np.asarray(saved.value), np.asarray(restored.value))
    assert from_preset(str(tmp_path / "mine")).name == "small_cnn"  # a string with a separator too
    assert load_tokenizer(tmp_path / "mine").get_config() == tokenizer.get_config()
    assert load_tokenizer("small_cnn_shapes") is None
    assert load_tokenizer("gpt_tiny_python_docs").get_config() == {"sequence_length": None}


@pytest.mark.filterwarnings("ignore:Skipping nested container")  # Keras, on the load that fails on purpose
def test_config_overrides_and_skipped_layers(tmp_path):
    keras.utils.set_random_seed(2)
    model = SmallCNN(**TINY)
    save_to_preset(model, tmp_path / "p")
    wider = from_preset(tmp_path / "p", num_classes=5, skip_layers=("logits",))
    assert wider.num_classes == 5 and wider.get_layer("logits").kernel.shape == (8, 5)
    np.testing.assert_array_equal(
        np.asarray(wider.get_layer("hidden_dense").kernel), np.asarray(model.get_layer("hidden_dense").kernel)
    )
    with pytest.raises(PresetError, match=r"cannot load the weights in .*model\.weights\.h5.*logits"):
        from_preset(tmp_path / "p", num_classes=5)  # the old head does not fit the new one
    with pytest.raises(PresetError, match="the model has no layer 'head' to skip"):
        from_preset(tmp_path / "p", skip_layers=("head",))
    with pytest.raises(
        PresetError, match=r"cannot build SmallCNN from config.json with overrides \{'hidden_units': -1\}"
    ):
        from_preset(tmp_path / "p", hidden_units=-1)


def test_saving_replaces_a_preset_atomically(tmp_path):
    keras.utils.set_random_seed(3)
    model = SmallCNN(**TINY)
    save_to_preset(model, tmp_path / "p", metadata={"run": 1})
    before = file_hashes(tmp_path / "p")
    with pytest.raises(TypeError):  # fails part-way: metadata that is not JSON
        save_to_preset(model, tmp_path / "p", metadata={"run": object()})
    assert file_hashes(tmp_path / "p") == before
    assert sorted(os.listdir(tmp_path)) == ["p"]  # no partial or old folder left behind
    save_to_preset(model, tmp_path / "p", metadata={"run": 2})
    assert json.loads((tmp_path / "p" / "metadata.json").read_text())["run"] == 2
    assert sorted(os.listdir(tmp_path)) == ["p"]


def test_saving_refuses_what_is_not_a_zoo_model_or_a_preset_folder(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    model = SmallCNN(**TINY)
    with pytest.raises(PresetError, match="refusing to replace .*notes.* not a preset"):
        save_to_preset(model, tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(PresetError, match="only zoo models can be saved as presets"):
        save_to_preset(plain, tmp_path / "plain")
    with pytest.raises(PresetError, match=r"metadata keys \['format_version'\] are written by save_to_preset"):
        save_to_preset(model, tmp_path / "x", metadata={"format_version": 9})


def test_model_classes_get_from_preset():
    """``from_preset`` is the zoo base class's own classmethod (zoo.models, no patching by
    zoo.presets); it refuses a preset of another class before building anything.
    GPTCausalLM extends it in its own class body (Hugging Face folders, then the base's)."""
    for cls in (SmallCNN, GPTBackbone, TransformerEncoderClassifier, ViTClassifier):
        assert "from_preset" not in vars(cls) and cls.from_preset.__func__ is vars(ZooModel)["from_preset"].__func__
    assert vars(GPTCausalLM)["from_preset"].__func__.__module__ == GPTCausalLM.__module__
    model = SmallCNN.from_preset("small_cnn_shapes")
    assert isinstance(model, SmallCNN) and model.image_size == (32, 32)
    with pytest.raises(PresetError, match="holds a SmallCNN, not a GPTCausalLM; load it with SmallCNN.from_preset"):
        GPTCausalLM.from_preset("small_cnn_shapes")
    with pytest.raises(PresetError, match="holds a GPTCausalLM, not a GPTBackbone"):
        GPTBackbone.from_preset("gpt_tiny_python_docs")
    lm = GPTCausalLM.from_preset(
        "gpt_tiny_python_docs", load_weights=False, dropout=0.25
    )  # overrides reach the backbone
    assert lm.backbone.dropout == 0.25 and lm.name == "gpt_causal_lm"


def test_preset_directory_is_inside_the_assets():
    directory = preset_directory("small_cnn_shapes")
    assert os.path.commonpath([directory, os.path.realpath(ASSETS_DIR)]) == os.path.realpath(ASSETS_DIR)
