"""Every way a preset can be wrong gives a clear error naming the value or file, and
loading never changes a preset's files."""

import json
import os

import pytest

from tests.presets._helpers import copy_preset, file_hashes
from zoo.presets import PresetError, from_preset, load_preset_config, preset_directory, registry


def test_unknown_name_lists_the_available_presets():
    with pytest.raises(PresetError, match=r"unknown preset 'no_such_preset'; available presets: .*small_cnn_shapes"):
        from_preset("no_such_preset")


@pytest.mark.parametrize(
    "name",
    [
        "..",
        "../assets/small_cnn_shapes",
        "small_cnn_shapes/../../registry.py",
        "/etc",
        "a\\..\\b",
        "Small.CNN",
        "",
        "~",
    ],
)
def test_names_can_never_escape_the_presets_folder(name):
    with pytest.raises(
        PresetError, match="is not a preset name: names are lower-case words.*available presets: .*small_cnn_shapes"
    ):
        preset_directory(name)


@pytest.mark.parametrize("name", ["..", "small_cnn_shapes/../../registry.py", "../no/such/dir"])
def test_path_like_names_are_refused_or_missing_directories(name):
    with pytest.raises(PresetError, match="is not a preset name|no preset directory at"):
        from_preset(name)


def test_a_symlinked_preset_folder_outside_the_assets_is_refused(tmp_path, monkeypatch):
    assets, outside = tmp_path / "assets", tmp_path / "outside"
    assets.mkdir()
    outside.mkdir()
    os.symlink(outside, assets / "small_cnn_shapes")
    monkeypatch.setattr(registry, "ASSETS_DIR", str(assets))
    with pytest.raises(PresetError, match="outside the presets folder"):
        preset_directory("small_cnn_shapes")


def test_a_newer_format_version_is_refused(tmp_path):
    preset = copy_preset("small_cnn_shapes", tmp_path)
    metadata = json.loads((preset / "metadata.json").read_text())
    metadata["format_version"] = 99
    (preset / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(
        PresetError, match="has format version 99, newer than the 1 this keras-zoo .* upgrade keras-zoo"
    ):
        from_preset(preset)


@pytest.mark.parametrize("filename", ["config.json", "model.weights.h5", "metadata.json"])
def test_a_missing_file_is_named(tmp_path, filename):
    preset = copy_preset("small_cnn_shapes", tmp_path)
    (preset / filename).unlink()
    with pytest.raises(PresetError, match=f"has no {filename}"):
        from_preset(preset)


def test_broken_json_is_named(tmp_path):
    preset = copy_preset("small_cnn_shapes", tmp_path)
    (preset / "metadata.json").write_text("{ not json")
    with pytest.raises(PresetError, match=r"metadata\.json' is not valid JSON"):
        from_preset(preset)


def test_a_corrupt_weights_file_is_named_and_left_unchanged(tmp_path):
    preset = copy_preset("small_cnn_shapes", tmp_path)
    weights = preset / "model.weights.h5"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64  # damage the middle
    weights.write_bytes(bytes(data))
    before = file_hashes(preset)
    with pytest.raises(PresetError, match=r"model\.weights\.h5' is corrupt or was changed after saving"):
        from_preset(preset)
    assert file_hashes(preset) == before


def test_an_unreadable_weights_file_is_named_and_left_unchanged(tmp_path):
    preset = copy_preset("small_cnn_shapes", tmp_path)
    (preset / "model.weights.h5").write_bytes(b"this is not HDF5")
    metadata = json.loads((preset / "metadata.json").read_text())
    del metadata["files"]  # no checksums: the HDF5 reader meets the damage itself
    (preset / "metadata.json").write_text(json.dumps(metadata))
    before = file_hashes(preset)
    with pytest.raises(PresetError, match=r"cannot load the weights in .*model\.weights\.h5"):
        from_preset(preset)
    assert file_hashes(preset) == before


def _edit_config(preset, edit):
    config = json.loads((preset / "config.json").read_text())
    edit(config)
    (preset / "config.json").write_text(json.dumps(config))
    metadata = json.loads((preset / "metadata.json").read_text())
    del metadata["files"]["config.json"]  # as if the attacker also fixed the checksum
    (preset / "metadata.json").write_text(json.dumps(metadata))


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda c: c.update(registered_name="keras>Sequential"),
            "refusing to load 'keras>Sequential'; presets hold only zoo-registered",
        ),
        (lambda c: c.update(registered_name="zoo>Nothing"), "no zoo class is registered as 'zoo>Nothing'"),
        (lambda c: c.update(registered_name="zoo>ByteTokenizer"), "'zoo>ByteTokenizer' is not a model class"),
        (
            lambda c: c["config"].update(seed={"module": "os", "class_name": "system", "config": "echo hi"}),
            "refusing class 'system' from module 'os'",
        ),
        (
            lambda c: c["config"].update(seed={"module": "zoo.evil", "class_name": "Thing", "config": {}}),
            "refusing class 'Thing' from module 'zoo.evil'",
        ),
        (lambda c: c["config"].update(seed={"class_name": "__lambda__", "config": {}}), "refusing '__lambda__'"),
    ],
)
def test_only_zoo_and_keras_classes_are_deserialised(tmp_path, edit, message):
    preset = copy_preset("small_cnn_shapes", tmp_path)
    _edit_config(preset, edit)
    with pytest.raises(PresetError, match=message):
        from_preset(preset)
    with pytest.raises(PresetError, match=message):
        load_preset_config(preset)
