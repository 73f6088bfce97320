"""Run by tests/presets/test_bombs.py in a subprocess of its own: each memory bomb of issue 46
through ``zoo``'s command line, one after the other in this process, printing one JSON line
per case: its exit status, the one error line, seconds, and the peak resident memory while it
ran (Linux's VmHWM, reset before each case through /proc/self/clear_refs) above the resident
memory before it, and the process's peak.

argv: the scratch folder, the fixture folder (a Hugging Face folder copied and damaged).
The scratch folder already holds ``deep.keras`` (``keras_bomb``, made by the caller: building
and saving a model here would raise this process's peak before the cases).
"""

import contextlib
import io
import json
import os
import shutil
import sys
import time


def status_mib(key):
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def with_config(source, folder, **changes):
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return str(folder)


def zoo_preset_bomb(folder):
    """A zoo preset (the shipped gpt_tiny_python_docs) declaring 10**9 blocks, its metadata's
    SHA-256 of config.json recorded anew (as whoever edits the file can)."""
    import hashlib

    from zoo.presets.registry import preset_directory

    shutil.copytree(preset_directory("gpt_tiny_python_docs"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["config"]["backbone"]["config"]["num_layers"] = 10**9
    (folder / "config.json").write_text(json.dumps(config))
    metadata = json.loads((folder / "metadata.json").read_text())
    metadata["files"]["config.json"] = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
    (folder / "metadata.json").write_text(json.dumps(metadata))
    return str(folder)


def keras_bomb(path):
    """A .keras file of the shipped gpt preset whose config.json declares 10**9 blocks
    (``path``; a ``tiny.keras`` beside it is the model as saved)."""
    import zipfile

    from zoo.models import GPTCausalLM

    model_file = path.with_name("tiny.keras")
    GPTCausalLM.from_preset("gpt_tiny_python_docs").save(model_file)
    with zipfile.ZipFile(model_file) as source, zipfile.ZipFile(path, "w") as target:
        for member in source.namelist():
            data = source.read(member)
            if member == "config.json":
                config = json.loads(data)
                config["config"]["backbone"]["config"]["num_layers"] = 10**9
                data = json.dumps(config).encode()
            target.writestr(member, data)
    return str(path)


def lora_bomb(path):
    """22 KB: a zoo LoRA file declaring a (2, 10**9) float32 factor (chunked, nothing stored)."""
    import h5py
    import numpy as np

    with h5py.File(path, "w") as file:
        file.attrs["format"], file.attrs["format_version"] = "zoo-lora", 1
        group = file.create_group("block_0/attention/query")
        group.attrs["rank"], group.attrs["alpha"] = 2, 4
        group.create_dataset("lora_kernel_a", shape=(2, 10**9), dtype="float32", chunks=(1, 1024))
        group.create_dataset("lora_kernel_b", data=np.zeros((2, 8), "float32"))
    return str(path)


def main(scratch, source):
    import pathlib

    from zoo.cli.main import main as zoo

    scratch, source = pathlib.Path(scratch), pathlib.Path(source)
    cases = {
        "hidden_size 10**9, zoo generate": lambda: [
            "generate", "--model", with_config(source, scratch / "wide", hidden_size=10**9), "--prompt", "hi"
        ],
        "num_hidden_layers 10**9, zoo export": lambda: [
            "export", with_config(source, scratch / "deep", num_hidden_layers=10**9), str(scratch / "out1")
        ],
        "num_hidden_layers 10**5, zoo export": lambda: [
            "export", with_config(source, scratch / "deeper", num_hidden_layers=10**5), str(scratch / "out2")
        ],
        "zoo preset num_layers 10**9, zoo generate": lambda: [
            "generate", "--model", zoo_preset_bomb(scratch / "zoo_deep"), "--prompt", "hi"
        ],
        ".keras num_layers 10**9, zoo generate": lambda: [
            "generate", "--model", str(scratch / "deep.keras"), "--prompt", "hi", "--max-new-tokens", "8"
        ],
        "LoRA factor (2, 10**9), zoo export --lora": lambda: [
            "export", str(source), str(scratch / "out3"), "--lora", lora_bomb(scratch / "bomb.h5")
        ],
    }  # fmt: skip
    for name, arguments in cases.items():
        argv = arguments()
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")  # VmHWM := VmRSS
        before, start = status_mib("VmRSS"), time.perf_counter()
        errors = io.StringIO()
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            code = zoo(argv)
        seconds = time.perf_counter() - start
        row = {
            "case": name,
            "code": code,
            "error": errors.getvalue().strip(),
            "seconds": round(seconds, 2),
            "growth_mib": round(status_mib("VmHWM") - before, 1),
            "peak_mib": round(status_mib("VmHWM"), 1),
            "size_bytes": os.path.getsize(argv[-1]) if argv[-1].endswith(".h5") else None,
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
