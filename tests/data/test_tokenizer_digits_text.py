import zlib

import numpy as np
import pytest

from zoo.data import (
    DIGIT_CLASSES,
    TOPIC_CLASSES,
    ByteTokenizer,
    load_digits,
    local_batching,
    process_rows,
    unigram_entropy,
)
from zoo.data.digits import read_digits, split_rows
from zoo.data.png import image_grid, write_png
from zoo.data.python_docs import load_python_docs_lm, load_python_docs_topics, python_docs_text, python_docs_topics


def test_digits_are_the_shipped_uci_data():
    pixels, labels = read_digits()
    assert pixels.shape == (1797, 8, 8) and pixels.max() == 16 and labels.shape == (1797,)
    assert np.bincount(labels).min() >= 170  # ~180 of each digit
    splits = {s: split_rows(1797, s) for s in ("train", "validation", "test")}
    assert [len(r) for r in splits.values()] == [1437, 180, 180]
    assert len(np.unique(np.concatenate(list(splits.values())))) == 1797  # disjoint, complete
    x, y = load_digits("test", image_size=16)
    assert x.shape == (180, 16, 16, 1) and x.dtype == np.float32 and x.max() == 1.0
    np.testing.assert_array_equal(x[:, ::2, ::2, 0] * 16, pixels[splits["test"]])
    assert set(y) == set(range(len(DIGIT_CLASSES)))
    with pytest.raises(ValueError, match="multiple of 8, got 12"):
        load_digits("train", image_size=12)


def test_python_docs_splits_and_tasks():
    topics = python_docs_topics()
    assert len(topics) > 50 and sum(map(len, topics.values())) > 300_000
    train, test = python_docs_text("train"), python_docs_text("test")
    assert len(train) > 15 * len(test)
    assert test[100:200] not in train  # split by position within each topic
    x, y = load_python_docs_lm("validation", sequence_length=64)
    assert x.shape[1] == 64 and (x[:, 1:] == y[:, :-1]).all()
    assert ByteTokenizer().decode(x[0]).strip()[:5].isprintable()
    assert 2.5 < unigram_entropy(x) < 4.0  # English bytes: about 3.3 nats
    xt, yt = load_python_docs_topics("train", sequence_length=128)
    assert xt.shape[1] == 128 and len(xt) == len(yt) and set(yt) == set(range(len(TOPIC_CLASSES)))


def test_process_rows_are_disjoint_equal_and_checked():
    shards = [process_rows(103, index, 4) for index in range(4)]
    assert [len(s) for s in shards] == [25] * 4
    assert len(set().union(*map(set, shards))) == 100
    assert process_rows(10, None, None) == range(0, 10)  # one process: everything
    with pytest.raises(ValueError, match=r"process_index 4 is not in \[0, 4\)"):
        process_rows(10, 4, 4)
    assert local_batching(64, 8, 2) == (32, 4)
    with pytest.raises(ValueError, match="global batch size 30 is not divisible by the 4 processes"):
        local_batching(30, 8, 4)


def test_png_writer_produces_a_valid_file(tmp_path):
    grid = image_grid(np.random.default_rng(0).random((5, 4, 4, 3)), columns=3)
    assert grid.shape == (2 * 6 + 2, 3 * 6 + 2, 3) and grid.dtype == np.uint8
    path = tmp_path / "grid.png"
    write_png(path, grid)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    idat_length = int.from_bytes(data[33:37], "big")
    assert data[37:41] == b"IDAT"
    raw = zlib.decompress(data[41 : 41 + idat_length])
    rows = np.frombuffer(raw, np.uint8).reshape(grid.shape[0], -1)
    np.testing.assert_array_equal(rows[:, 1:].reshape(grid.shape), grid)
    with pytest.raises(ValueError, match="must be uint8"):
        write_png(path, grid.astype(np.float32))
