"""Every export gets the mode the umask allows (issue 45): a .keras file, a preset folder, a
Hugging Face folder's safetensors, a zoo LoRA adapter and a PEFT adapter, written under
umask 022 (0644 files, 0755 folders) and 077 (0600, 0700); tempfile and the safetensors
library alone made some of them 0600 / 0700 whatever the umask."""

import os
import stat

import numpy as np
import pytest

from zoo.models import GPTCausalLM
from zoo.presets import save_to_preset
from zoo.training.lora import enable_lora, save_lora, save_peft_adapter
from zoo.training.paths import save_model_atomically


def _modes(root):
    modes = {}
    for folder, folders, files in os.walk(root):
        for name in folders + files:
            path = os.path.join(folder, name)
            modes[os.path.relpath(path, root)] = stat.S_IMODE(os.stat(path).st_mode)
    return modes


@pytest.mark.parametrize(
    "umask, file_mode, folder_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)], ids=["umask 022", "umask 077"]
)
def test_exports_honour_the_umask(umask, file_mode, folder_mode, tmp_path):
    model = GPTCausalLM.from_config_name("gpt_tiny")
    model(np.zeros((1, 8), "int32"))
    previous = os.umask(umask)
    try:
        save_model_atomically(model, str(tmp_path / "model.keras"))
        save_to_preset(model, str(tmp_path / "preset"))
        model.save_to_hf(str(tmp_path / "hf"), report=lambda *_: None)
        enable_lora(model.backbone, 2)
        save_lora(model, str(tmp_path / "adapter.h5"))
        save_peft_adapter(model, str(tmp_path / "peft"))
    finally:
        os.umask(previous)
    modes = _modes(tmp_path)
    for name in (
        "model.keras",
        "adapter.h5",
        "hf/model.safetensors",
        "peft/adapter_model.safetensors",
        "preset/config.json",
    ):
        assert modes[name] == file_mode, (name, oct(modes[name]))
    for name in ("preset", "hf", "peft"):
        assert modes[name] == folder_mode, (name, oct(modes[name]))
    assert set(modes.values()) == {file_mode, folder_mode}, {k: oct(v) for k, v in modes.items()}
