"""Memory bombs in small files (issue 46, item 1): a config.json declaring 10**9-wide or
10**9-deep models and a 9 KB zoo LoRA file declaring an 8 GB factor are each refused by
``zoo`` in one line naming the file and the value, in under 2 s and 300 MiB of resident
memory, measured by the process itself (``tests/presets/_bombs.py``: Linux's VmHWM reset
before each case; all four cases in one subprocess, so JAX is imported once).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.models.test_hf_checkpoints import FIXTURES
from tests.presets._bombs import keras_bomb

EXPECTED = {  # case -> what its one error line must hold
    "hidden_size 10**9, zoo generate": "/wide/config.json: hidden_size = 1000000000 is above 65,536",
    "num_hidden_layers 10**9, zoo export": "/deep/config.json: num_hidden_layers = 1000000000 is above 1,024",
    "num_hidden_layers 10**5, zoo export": "/deeper/config.json: num_hidden_layers = 100000 is above 1,024",
    "zoo preset num_layers 10**9, zoo generate": (
        "zoo_deep': config.json's config.backbone.config.num_layers = 1000000000 is above 1,024"
    ),
    ".keras num_layers 10**9, zoo generate": (
        "deep.keras': config.json's config.backbone.config.num_layers = 1000000000 is above 1,024"
    ),
    "LoRA factor (2, 10**9), zoo export --lora": "bomb.h5': block_0/attention/query/lora_kernel_a declares shape (2, 1000000000)",
}
SECONDS, GROWTH_MIB, PEAK_MIB = 2.0, 300, 400  # the peak: the process's, JAX imported (~290 MiB here)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="VmHWM is reset through Linux's /proc")
def test_each_bomb_is_refused_in_one_line_in_under_2_s_and_300_mib(tmp_path):
    keras_bomb(tmp_path / "deep.keras")  # here: a model built in the measured process would raise its peak
    run = subprocess.run(
        [sys.executable, "-m", "tests.presets._bombs", str(tmp_path), str(FIXTURES / "llama_mha_tied")],
        capture_output=True, text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )  # fmt: skip
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [row["case"] for row in rows] == list(EXPECTED), run.stderr[-3000:]
    for row in rows:
        assert row["code"] != 0 and "\n" not in row["error"] and row["error"].startswith("zoo: error: "), row
        assert EXPECTED[row["case"]] in row["error"], row
        assert row["seconds"] < SECONDS and row["growth_mib"] < GROWTH_MIB and row["peak_mib"] < PEAK_MIB, row
    assert rows[-1]["size_bytes"] < 32 * 1024  # the file is small; what it declares is 8 GB


def test_a_zoo_preset_size_in_a_list_or_nested_is_bounded_and_shipped_presets_pass():
    """Every number of a list is bounded (a CNN's image_size [32, 10**6]); the four shipped
    presets' configs are within the bounds."""
    from zoo.presets import PresetError, check_config_sizes, list_presets
    from zoo.presets.registry import preset_directory

    config = {"class_name": "SmallCNN", "config": {"image_size": [32, 10**6], "filters": [8, 16]}}
    with pytest.raises(PresetError, match=r"config.json's config.image_size = 1000000 is above 16,384"):
        check_config_sizes("p", config)
    for name in list_presets():
        check_config_sizes(name, json.loads((Path(preset_directory(name)) / "config.json").read_text()))
