"""zoo.data.tfds_source: data dirs, the fast offline failure, mocked TFDS datasets, TFRECORD handling."""

import json
import pathlib
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds

from zoo.data import tfds_source
from zoo.data.tfds_source import DatasetNotPreparedError

# name -> {feature: (shape of one example, dtype kind)}; "O" marks text.
MOCKED = {
    "mnist": {"image": ((28, 28, 1), "u"), "label": ((), "i")},
    "cifar10": {"id": ((), "O"), "image": ((32, 32, 3), "u"), "label": ((), "i")},
    "imdb_reviews": {"text": ((), "O"), "label": ((), "i")},
    "tiny_shakespeare": {"text": ((), "O")},
}


def _set_file_format(builder, file_format):
    """Rewrite the format recorded in a prepared dataset's dataset_info.json."""
    path = builder.data_path / "dataset_info.json"
    info = json.loads(path.read_text())
    info["fileFormat"] = file_format
    path.write_text(json.dumps(info))


# --- data dir -------------------------------------------------------------------------


def test_resolve_data_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ZOO_DATA_DIR", raising=False)
    monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
    assert tfds_source.resolve_data_dir() == str(tmp_path / "home" / "tensorflow_datasets")
    monkeypatch.setenv("TFDS_DATA_DIR", "~/tfds")
    assert tfds_source.resolve_data_dir() == str(tmp_path / "home" / "tfds")
    monkeypatch.setenv("ZOO_DATA_DIR", str(tmp_path / "zoo"))
    assert tfds_source.resolve_data_dir() == str(tmp_path / "zoo")
    assert tfds_source.resolve_data_dir(tmp_path / "given") == str(tmp_path / "given")
    assert tfds_source.resolve_data_dir("~/given") == str(tmp_path / "home" / "given")


def test_env_data_dir_is_where_embedded_data_are_prepared(monkeypatch, tmp_path):
    monkeypatch.setenv("ZOO_DATA_DIR", str(tmp_path))
    source = tfds_source.read_split("zoo_digits", "test")
    assert len(source) == 180
    assert (tmp_path / "zoo_digits" / "1.0.0" / "dataset_info.json").exists()


def test_get_builder_parses_config_and_version_and_writes_nothing(tmp_path):
    builder = tfds_source.get_builder("imdb_reviews/plain_text:1.0.0", tmp_path)
    assert builder.builder_config.name == "plain_text" and str(builder.version) == "1.0.0"
    assert builder.data_path == tmp_path / "imdb_reviews" / "plain_text" / "1.0.0"
    assert tfds_source.get_builder("mnist", tmp_path).info.features["image"].shape == (28, 28, 1)
    assert not any(tmp_path.iterdir())


# --- not prepared: fail fast ------------------------------------------------------------


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_unprepared_public_dataset_fails_fast_with_how_to_prepare(tmp_path, name):
    start = time.monotonic()
    with pytest.raises(DatasetNotPreparedError) as caught:
        tfds_source.read_split(name, "train", data_dir=tmp_path, download=False)
    elapsed = time.monotonic() - start
    assert elapsed < 5.0, f"took {elapsed:.1f} s"
    message = str(caught.value)
    assert f"zoo data prepare {name} --data-dir {tmp_path}" in message
    assert "download=True" in message
    assert caught.value.name == name and caught.value.data_dir == str(tmp_path)
    assert not any(tmp_path.iterdir())  # nothing downloaded or created


def test_prepare_without_download_fails_fast_for_public_datasets(tmp_path):
    start = time.monotonic()
    assert not tfds_source.is_prepared("tiny_shakespeare", tmp_path)
    assert tfds_source.prepared_file_format("tiny_shakespeare", tmp_path) is None
    with pytest.raises(DatasetNotPreparedError, match="zoo data prepare tiny_shakespeare --data-dir"):
        tfds_source.prepare("tiny_shakespeare", tmp_path, download=False)
    assert time.monotonic() - start < 5.0


def test_not_prepared_message_names_other_prepared_versions(tmp_path):
    old = tmp_path / "mnist" / "1.0.0"
    old.mkdir(parents=True)
    (old / "dataset_info.json").write_text("{}")
    with pytest.raises(DatasetNotPreparedError, match=r"1\.0\.0.*'mnist:VERSION'"):
        tfds_source.read_split("mnist", "test", data_dir=tmp_path)


# --- public datasets under tfds.testing.mock_data (no files, no network) ------------------


@pytest.mark.parametrize("name", sorted(MOCKED))
def test_mocked_public_datasets_read_through_read_split(tmp_path, name):
    expected = MOCKED[name]
    with tfds.testing.mock_data(num_examples=7):
        source = tfds_source.read_split(name, "train", data_dir=tmp_path, download=False)
        assert len(source) == 7
        assert set(source[0]) == set(expected)
        arrays = dict(zip(expected, tfds_source.to_numpy(source, list(expected))))
    for key, (shape, kind) in expected.items():
        assert arrays[key].shape == (7, *shape), key
        assert arrays[key].dtype.kind == kind, key
        if kind == "O":
            assert all(isinstance(text, str) for text in arrays[key])
    assert not any(tmp_path.iterdir())


def test_mock_data_serves_tfds_data_source_without_tensorflow(tmp_path):
    # The TFDS 4.9.10 behaviour read_split relies on: mocked data sources, text as str.
    with tfds.testing.mock_data(num_examples=3):
        source = tfds.data_source("imdb_reviews", split="test", data_dir=tmp_path, download=False)
        example = source[0]
    assert len(source) == 3
    assert isinstance(example["text"], str)
    assert isinstance(example["label"], np.ndarray) and example["label"].shape == ()


# --- data prepared in a format we cannot read without TensorFlow --------------------------
# Writing TFRECORD needs TensorFlow (tf.io.TFRecordWriter), so these tests prepare
# array_record data and then rewrite the "fileFormat" field of dataset_info.json.


def test_tfrecord_without_tensorflow_says_what_to_install(monkeypatch, tmp_path, capsys):
    builder = tfds_source.prepare("zoo_digits", tmp_path)
    assert capsys.readouterr().out == ""  # embedded data: no "Downloading and preparing dataset" lines
    _set_file_format(builder, "tfrecord")
    monkeypatch.setattr(tfds_source, "_tensorflow_available", lambda: False)
    assert tfds_source.prepared_file_format("zoo_digits", tmp_path) == "tfrecord"
    assert tfds_source.is_prepared("zoo_digits", tmp_path)
    with pytest.raises(ImportError) as caught:
        tfds_source.read_split("zoo_digits", "train", data_dir=tmp_path)
    message = str(caught.value)
    assert 'pip install "keras-zoo[tensorflow]"' in message
    assert "array_record" in message and "zoo data prepare zoo_digits --data-dir" in message


def test_tfrecord_with_tensorflow_reads_through_as_dataset(monkeypatch, tmp_path):
    builder = tfds_source.prepare("zoo_digits", tmp_path)
    _set_file_format(builder, "tfrecord")
    examples = [{"image": np.zeros((8, 8, 1), np.uint8), "label": np.int64(3)}]
    calls = []

    def fake_as_dataset(self, split):
        calls.append(split)
        return iter(examples)

    monkeypatch.setattr(tfds_source, "_tensorflow_available", lambda: True)
    monkeypatch.setattr(tfds.core.DatasetBuilder, "as_dataset", fake_as_dataset)
    monkeypatch.setattr(tfds, "as_numpy", lambda dataset: dataset)
    source = tfds_source.read_split("zoo_digits", "test[:5]", data_dir=tmp_path)
    assert calls == ["test[:5]"]
    assert isinstance(source, list) and source == examples


def test_other_formats_are_refused_with_how_to_reprepare(tmp_path):
    builder = tfds_source.prepare("zoo_digits", tmp_path)
    _set_file_format(builder, "parquet")
    with pytest.raises(RuntimeError, match="prepare it as array_record"):
        tfds_source.read_split("zoo_digits", "train", data_dir=tmp_path)


# --- to_numpy ------------------------------------------------------------------------------


def test_to_numpy_stacks_text_labels_and_arrays():
    source = [
        {"text": b"caf\xc3\xa9", "label": np.array(1), "image": np.ones((2, 2), np.uint8)},
        {"text": "tea", "label": 2, "image": np.zeros((2, 2), np.uint8)},
        {"text": np.array(b"x"), "label": np.int64(0), "image": np.ones((2, 2), np.uint8)},
    ]
    text, label, image = tfds_source.to_numpy(source, ["text", "label", "image"])
    assert text.dtype == object and list(text) == ["café", "tea", "x"]
    np.testing.assert_array_equal(label, [1, 2, 0])
    assert label.dtype.kind == "i"
    assert image.shape == (3, 2, 2) and image.dtype == np.uint8
    (label_only,) = tfds_source.to_numpy(source, "label")
    assert label_only.shape == (3,)
    (empty,) = tfds_source.to_numpy([], ["label"])
    assert empty.shape == (0,)


def test_read_split_accepts_a_path_data_dir(tmp_path):
    source = tfds_source.read_split("zoo_digits", "validation", data_dir=pathlib.Path(tmp_path))
    assert len(source) == 180
