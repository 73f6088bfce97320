"""The embedded datasets as TFDS builders: prepared offline as array_record, read back without TensorFlow."""

import importlib
import json
from unittest import mock

import numpy as np
import pytest
import tensorflow_datasets as tfds

from zoo.data import tfds_source
from zoo.data.builders import EMBEDDED_BUILDERS, DigitsBuilder, PythonDocsBuilder, ShapesBuilder
from zoo.data.digits import DIGIT_CLASSES, read_digits, split_rows
from zoo.data.python_docs import TOPIC_GROUPS, python_docs_text, python_docs_topics
from zoo.data.shapes import SHAPE_CLASSES, load_shapes

SPLITS = ("train", "validation", "test")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """One data dir with every embedded dataset prepared (shapes at its default size 32)."""
    path = tmp_path_factory.mktemp("tfds")
    for name in EMBEDDED_BUILDERS:
        tfds_source.prepare(name, path, download=False)
    return path


def _read(name, split, data_dir, keys):
    """``{key: array}`` of one split, through read_split and to_numpy."""
    arrays = tfds_source.to_numpy(tfds_source.read_split(name, split, data_dir=data_dir), keys)
    return dict(zip(keys, arrays))


@pytest.mark.parametrize("name", sorted(EMBEDDED_BUILDERS))
def test_prepared_as_array_record_only(data_dir, name):
    builder = tfds_source.get_builder(name, data_dir)
    assert tfds_source.prepared_file_format(name, data_dir) == "array_record"
    assert json.loads((builder.data_path / "dataset_info.json").read_text())["fileFormat"] == "array_record"
    files = sorted(p.name for p in builder.data_path.iterdir())
    for split in SPLITS:
        assert f"{name}-{split}.array_record-00000-of-00001" in files
    assert not [f for f in files if "tfrecord" in f or "parquet" in f], files


def test_digits_read_back_equal_to_the_shipped_rows(data_dir):
    pixels, labels = read_digits()
    sizes = {}
    for split in SPLITS:
        arrays = _read("zoo_digits", split, data_dir, ["image", "label"])
        rows = split_rows(len(labels), split)
        assert arrays["image"].dtype == np.uint8 and arrays["image"].shape == (len(rows), 8, 8, 1)
        np.testing.assert_array_equal(arrays["image"][..., 0], pixels[rows])
        np.testing.assert_array_equal(arrays["label"], labels[rows])
        sizes[split] = len(rows)
    assert sizes == {"train": 1437, "validation": 180, "test": 180}


def test_shapes_read_back_equal_to_load_shapes_in_uint8(data_dir):
    for split in SPLITS:
        x, y = load_shapes(split, image_size=32)
        arrays = _read("zoo_shapes", split, data_dir, ["image", "label"])
        assert arrays["image"].dtype == np.uint8
        np.testing.assert_array_equal(arrays["image"], np.round(x * 255.0).astype(np.uint8))
        np.testing.assert_array_equal(arrays["label"], y)


def test_python_docs_read_back_equal_to_the_topic_text(data_dir):
    topics = python_docs_topics()
    groups = {topic: group for group, names in TOPIC_GROUPS.items() for topic in names}
    for split in SPLITS:
        arrays = _read("zoo_python_docs", split, data_dir, ["topic", "group", "text"])
        assert list(arrays["topic"]) == list(topics)  # one example per topic, sorted
        assert "\n\n".join(arrays["text"]) == python_docs_text(split)
        assert list(arrays["group"]) == [groups.get(topic, "") for topic in topics]
    # Every class occurs; "" (ungrouped) only for topics a newer Python adds.
    assert set(TOPIC_GROUPS) <= set(arrays["group"]) <= set(TOPIC_GROUPS) | {""}


def test_split_slices_read_a_prefix_in_order(data_dir):
    full = _read("zoo_digits", "train", data_dir, ["image", "label"])
    part = _read("zoo_digits", "train[:10%]", data_dir, ["image", "label"])
    assert 140 <= len(part["label"]) <= 145
    np.testing.assert_array_equal(part["image"], full["image"][: len(part["image"])])
    np.testing.assert_array_equal(part["label"], full["label"][: len(part["label"])])


def test_embedded_datasets_are_prepared_on_first_use(tmp_path):
    assert not tfds_source.is_prepared("zoo_python_docs", tmp_path)
    source = tfds_source.read_split("zoo_python_docs", "validation", data_dir=tmp_path, download=False)
    assert len(source) == len(python_docs_topics())
    assert tfds_source.is_prepared("zoo_python_docs", tmp_path)
    assert tfds_source.prepared_file_format("zoo_python_docs", tmp_path) == "array_record"


@pytest.mark.parametrize("cls", [ShapesBuilder, DigitsBuilder, PythonDocsBuilder])
def test_split_generators_download_nothing(tmp_path, cls):
    dl_manager = mock.Mock()
    generators = cls(data_dir=tmp_path)._split_generators(dl_manager)
    assert sorted(generators) == sorted(SPLITS)
    assert dl_manager.mock_calls == []


def test_builder_metadata():
    digits = DigitsBuilder(data_dir="/nonexistent")
    for cls in (ShapesBuilder, DigitsBuilder, PythonDocsBuilder):
        info = cls(data_dir="/nonexistent").info
        assert str(info.version) == "1.0.0" and "1.0.0" in info.release_notes
        assert info.description
    assert "Alpaydin" in digits.info.citation and "Kaynak" in digits.info.citation
    assert "1998" in digits.info.citation
    assert digits.info.redistribution_info.license == "CC BY 4.0"
    assert digits.info.homepage.startswith("https://archive.ics.uci.edu/")
    assert digits.info.features["label"].names == list(DIGIT_CLASSES)
    shapes = ShapesBuilder(data_dir="/nonexistent")
    assert shapes.info.features["label"].names == list(SHAPE_CLASSES)
    assert shapes.info.supervised_keys == ("image", "label")


def test_shapes_configs_are_image_sizes(tmp_path):
    assert sorted(ShapesBuilder.builder_configs, key=int) == ["16", "32", "64", "128"]
    assert tfds_source.get_builder("zoo_shapes", tmp_path).builder_config.name == "32"
    for size in (16, 32, 64, 128):
        builder = tfds_source.get_builder(f"zoo_shapes/{size}", tmp_path)
        assert builder.info.features["image"].shape == (size, size, 3)
        assert builder.data_path == tmp_path / "zoo_shapes" / str(size) / "1.0.0"
    assert not any(tmp_path.iterdir())  # constructing builders writes nothing


def test_reimporting_builders_does_not_clash_with_the_tfds_registry():
    import zoo.data.builders.digits_builder as digits_module
    import zoo.data.builders.python_docs_builder as python_docs_module
    import zoo.data.builders.shapes_builder as shapes_module

    for module in (shapes_module, digits_module, python_docs_module):
        importlib.reload(module)  # defines the builder class a second time
    # They stay out of TFDS's global registry; get_builder maps the names instead.
    # (builder_cls asks the registry only: tfds.builder would also find a zoo_digits
    # prepared in the default data dir by an earlier run, as a read-only builder.)
    for name in EMBEDDED_BUILDERS:
        with pytest.raises(tfds.core.registered.DatasetNotFoundError):
            tfds.builder_cls(name)
