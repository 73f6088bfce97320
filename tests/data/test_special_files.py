"""A FIFO, a device or a directory where a data file, a chat template or a tokenizer file is
expected is refused by type before it is opened (issue 46, item 7): a FIFO would block the
reader for ever, /dev/zero never ends. Each refusal is one line naming the file."""

import os
import pathlib

import pytest

from zoo.data.chat_files import read_messages_jsonl
from zoo.data.text_files import load_text_file, read_text
from zoo.tokenizers import ByteTokenizer, HFTokenizer


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "data.jsonl"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("reader", [read_text, read_messages_jsonl, lambda path: load_text_file(path, ByteTokenizer())])
def test_a_fifo_is_refused_unopened(fifo, reader):
    with pytest.raises(ValueError, match=rf"^{fifo} is a FIFO \(named pipe\), not a .jsonl or text file: refused"):
        reader(fifo)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_dev_zero_is_refused_unread():
    with pytest.raises(ValueError, match=r"^/dev/zero is a character device, not a .jsonl or text file"):
        read_text("/dev/zero")


def test_a_tokenizer_folder_with_special_files_is_refused(tmp_path):
    os.mkfifo(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match=r"tokenizer.json is a FIFO \(named pipe\), not a tokenizer.json"):
        HFTokenizer.from_directory(tmp_path)
    os.remove(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": 5}')
    with pytest.raises(ValueError, match=r"tokenizer.json is not a tokenizer the tokenizers library reads"):
        HFTokenizer.from_directory(tmp_path)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_zoo_finetune_refuses_a_special_data_file_before_any_work(fifo):
    """Before the model is loaded (``finetune.check_paths``, which ``zoo recipe check`` runs
    too): a device or FIFO as --data-file / --validation-file, named with its flag."""
    from tests.models.test_hf_checkpoints import FIXTURES
    from zoo.config.settings import FinetuneSettings
    from zoo.training.finetune import check_paths
    from zoo.training.paths import PathError

    preset = str(FIXTURES / "llama_mha_tied")
    with pytest.raises(PathError, match=r"^--data-file '/dev/zero': is a character device, not a file"):
        check_paths(FinetuneSettings(preset=preset, data_file="/dev/zero"))
    data = pathlib.Path(fifo).parent / "train.jsonl"  # (the fifo fixture is data.jsonl)
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    with pytest.raises(PathError, match=r"^--validation-file '.*': is a FIFO \(named pipe\), not a file"):
        check_paths(FinetuneSettings(preset=preset, data_file=str(data), validation_file=str(fifo)))
    check_paths(FinetuneSettings(preset=preset, data_file=str(data)))  # a regular file passes
