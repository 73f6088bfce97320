"""A Hugging Face folder is data from elsewhere: a table of hostile and damaged folders, each
refused by the loader with one line naming the file or key, having opened no file outside
the folder and written nothing (docs/checkpoints-hf.md#what-the-loader-checks).

Each folder is a copy of the smallest committed fixture (tests/fixtures/hf/llama_mha_tied)
with one thing damaged. Every open is recorded (``builtins.open``, ``io.open``,
``os.open`` and ``safetensors.safe_open``, which opens in Rust); ``outside/`` beside the
folder holds a valid copy of its weights and config, which a loader following the
folder's paths would read. Most refusals come before the model is built.
"""

import builtins
import functools
import io
import json
import os
import shutil
import struct

import numpy as np
import pytest
import safetensors
from safetensors.numpy import load_file, save_file

from tests.models.test_hf_checkpoints import FIXTURES
from zoo.models import GPTCausalLM
from zoo.models.gpt import hf_checkpoints
from zoo.models.gpt._hf_keys import UnsupportedCheckpoint
from zoo.presets.safetensors_weights import INDEX_FILE, SINGLE_FILE, CheckpointError, SafetensorsFiles

SOURCE = FIXTURES / "llama_mha_tied"
NORM, EMBEDDING, UP = "model.norm.weight", "model.embed_tokens.weight", "model.layers.1.mlp.up_proj.weight"


# --- the damage: each function changes the copy at `folder`; `outside` holds valid files ---


def weights(folder):
    return load_file(folder / SINGLE_FILE)


def set_tensor(name, value):
    def damage(folder, outside):
        tensors = weights(folder)
        tensors[name] = value(tensors.get(name))
        save_file(tensors, folder / SINGLE_FILE)

    return damage


def drop_tensor(name):
    def damage(folder, outside):
        tensors = weights(folder)
        del tensors[name]
        save_file(tensors, folder / SINGLE_FILE)

    return damage


def with_value(value):
    def change(tensor):
        tensor = tensor.copy()
        tensor.flat[5] = value
        return tensor

    return change


def set_config(**changes):
    def damage(folder, outside):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))  # NaN written as JSON's NaN

    return damage


def index_to(*files):
    """An index placing the tensors in ``files`` in turn (the first a real, inside file),
    with the folder's model.safetensors renamed to the inside file."""

    def damage(folder, outside):
        names = sorted(weights(folder))
        os.rename(folder / SINGLE_FILE, folder / "model-00001-of-00002.safetensors")
        target = [file.format(outside=outside) for file in files]
        weight_map = {name: target[min(i * len(target) // len(names), len(target) - 1)] for i, name in enumerate(names)}
        (folder / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    return damage


def link_outside(name):
    def damage(folder, outside):
        os.remove(folder / name)
        os.symlink(outside / name, folder / name)

    return damage


def truncate(folder, outside):
    data = (folder / SINGLE_FILE).read_bytes()
    (folder / SINGLE_FILE).write_bytes(data[:-100])


def header_says_more_bytes(folder, outside):
    """The last tensor's shape and end offset doubled: the header asks for bytes the file lacks."""
    data = (folder / SINGLE_FILE).read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + length])
    last = max((name for name in header if name != "__metadata__"), key=lambda name: header[name]["data_offsets"][1])
    start, end = header[last]["data_offsets"]
    header[last].update(
        shape=[2 * header[last]["shape"][0], *header[last]["shape"][1:]], data_offsets=[start, end + (end - start)]
    )
    text = json.dumps(header).encode()
    (folder / SINGLE_FILE).write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length :])


def sparse_2gb(folder, outside):
    with open(folder / SINGLE_FILE, "wb") as file:
        file.truncate(2**31)  # sparse: no disk, and no loader may read it whole


def write_file(name, text):
    def damage(folder, outside):
        (folder / name).write_text(text)

    return damage


def special(name, kind):
    """``name`` replaced by a FIFO or a directory: refused by type, never opened (a FIFO would block)."""

    def damage(folder, outside):
        if os.path.lexists(folder / name):
            os.remove(folder / name)
        os.mkfifo(folder / name) if kind == "fifo" else os.mkdir(folder / name)

    return damage


def write_index(text):
    return write_file(INDEX_FILE, text)


OUT_OF_FOLDER = "opens nothing outside"
FILES, BUILD = "any weight file is opened", "the model is built"
# (id, damage, error class, what the one line must contain, refused before: FILES, BUILD or None:
# while its weights are read)
CASES = [
    ("index-absolute-path", index_to("model-00001-of-00002.safetensors", "{outside}/model.safetensors"), CheckpointError,
     r"model.safetensors.index.json \(tensor '.*'\) names the absolute path '.*/outside/model.safetensors'", FILES),
    ("index-dotdot-path", index_to("model-00001-of-00002.safetensors", "../outside/model.safetensors"), CheckpointError,
     r"names '../outside/model.safetensors', which climbs out of the folder with '..'", FILES),
    ("index-missing-file", index_to("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"), CheckpointError,
     r"places tensor '.*' in 'model-00002-of-00002.safetensors', which is missing", FILES),
    ("index-not-json", write_index('{"weight_map": {"model.norm.weight": '), CheckpointError,
     r"model.safetensors.index.json' cannot be read as JSON", FILES),
    ("index-without-weight-map", write_index('{"metadata": {}}'), CheckpointError, r"index.json' has no 'weight_map'", FILES),
    ("weights-symlink-outside", link_outside(SINGLE_FILE), CheckpointError,
     r"names 'model.safetensors', a symlink to '.*/outside/model.safetensors' outside the folder", FILES),
    ("config-symlink-outside", link_outside("config.json"), CheckpointError,
     r"names 'config.json', a symlink to '.*/outside/config.json' outside the folder", FILES),
    ("config-not-json", write_file("config.json", '{"model_type": "llama",\n  "hidden_size": 32'), CheckpointError,
     r"^[^']*/model/config.json is not JSON: Expecting ',' delimiter: line 2 column 20 \(char 43\)$", FILES),
    ("tokenizer-symlink-outside", link_outside("tokenizer.json"), CheckpointError,
     r"names 'tokenizer.json', a symlink to '.*/outside/tokenizer.json' outside the folder", FILES),
    ("tensor-int8", set_tensor(NORM, lambda t: t.astype(np.int8)), CheckpointError,
     rf"tensor '{NORM}' in '.*/model.safetensors' is stored as I8", BUILD),
    ("tensor-int64", set_tensor(EMBEDDING, lambda t: t.astype(np.int64)), CheckpointError, rf"tensor '{EMBEDDING}' .* stored as I64", BUILD),
    ("tensor-bool", set_tensor(NORM, lambda t: t > 0), CheckpointError, rf"tensor '{NORM}' .* stored as BOOL", BUILD),
    ("weight-nan", set_tensor(UP, with_value(np.nan)), CheckpointError,
     rf"tensor '{UP}' in '.*/model.safetensors' holds 1 NaN or infinite value", None),
    ("weight-inf", set_tensor(NORM, with_value(np.inf)), CheckpointError, rf"tensor '{NORM}' in .* holds 1 NaN or infinite value", None),
    ("float64-beyond-float32", set_tensor(NORM, lambda t: with_value(1e300)(t.astype(np.float64))), CheckpointError,
     rf"tensor '{NORM}' holds values beyond the range of the model's float32 \(stored as float64\)", None),
    ("rope-theta-negative", set_config(rope_theta=-1.0), CheckpointError, r"config.json: rope_theta = -1.0 must be a finite number > 0", BUILD),
    ("rope-theta-nan", set_config(rope_theta=float("nan")), CheckpointError, r"config.json: rope_theta = nan must be a finite number > 0", BUILD),
    ("rms-norm-eps-negative", set_config(rms_norm_eps=-1e-6), CheckpointError, r"rms_norm_eps = -1e-06 must be a finite number > 0", BUILD),
    ("hidden-size-zero", set_config(hidden_size=0), CheckpointError, r"config.json: hidden_size = 0 must be a positive integer", BUILD),
    ("layers-not-an-integer", set_config(num_hidden_layers=2.5), CheckpointError, r"num_hidden_layers = 2.5 must be a positive integer", BUILD),
    ("max-positions-negative", set_config(max_position_embeddings=-128), CheckpointError, r"max_position_embeddings = -128 must be", BUILD),
    ("kv-heads-not-dividing", set_config(num_key_value_heads=3), CheckpointError,
     r"num_attention_heads = 4 is not a multiple of num_key_value_heads = 3", BUILD),
    ("vocab-below-tokenizer", set_config(vocab_size=300), CheckpointError,
     r"config.json: vocab_size = 300 is smaller than the 320 token ids of tokenizer.json", BUILD),
    ("truncated-file", truncate, CheckpointError, r"'.*/model.safetensors' is not a readable safetensors file \(113,164 bytes", BUILD),
    ("header-shape-lies", header_says_more_bytes, CheckpointError, r"model.safetensors' is not a readable safetensors file .*not fully covered", BUILD),
    ("sparse-2gb-file", sparse_2gb, CheckpointError, r"model.safetensors' is not a readable safetensors file \(2,147,483,648 bytes", BUILD),
    ("missing-tensor", drop_tensor(NORM), CheckpointError, rf"lacks 1 tensor\(s\) its config.json implies, e.g. \['{NORM}'\]", BUILD),
    ("extra-tensor", set_tensor("model.layers.0.self_attn.o_proj.bias", lambda _: np.zeros(32, np.float32)), UnsupportedCheckpoint,
     r"holds 1 tensor\(s\) the zoo GPT has no weight for, e.g. \['model.layers.0.self_attn.o_proj.bias'\]", BUILD),
    # issue 46: special files, JSON that is not a config, a broken tokenizer, sizes beyond bounds or the headers
    ("config-fifo", special("config.json", "fifo"), CheckpointError, r"/model/config.json is a FIFO \(named pipe\), not a JSON file", FILES),
    ("config-directory", special("config.json", "dir"), CheckpointError, r"/model/config.json is a directory, not a JSON file", FILES),
    ("weights-fifo", special(SINGLE_FILE, "fifo"), CheckpointError, r"/model/model.safetensors is a FIFO \(named pipe\), not a safetensors file", BUILD),
    ("weights-directory", special(SINGLE_FILE, "dir"), CheckpointError, r"/model/model.safetensors is a directory, not a safetensors file", BUILD),
    ("index-fifo", special(INDEX_FILE, "fifo"), CheckpointError, r"model.safetensors.index.json is a FIFO", FILES),
    ("tokenizer-fifo", special("tokenizer.json", "fifo"), CheckpointError, r"/model/tokenizer.json is a FIFO \(named pipe\), not a tokenizer.json", FILES),
    ("tokenizer-broken", write_file("tokenizer.json", '{"version": "1.0", "model": 5}'), CheckpointError,
     r"^[^ ]*/model/tokenizer.json is not a tokenizer the tokenizers library reads: ", FILES),
    ("tokenizer-config-array", write_file("tokenizer_config.json", "[]"), CheckpointError,
     r"/model/tokenizer_config.json holds a JSON list, not an object of keys", FILES),
    ("config-array", write_file("config.json", "[1, 2]"), CheckpointError, r"/model/config.json holds a JSON list, not an object", FILES),
    ("config-nested-too-deep", write_file("config.json", "[" * 100_000 + "]" * 100_000), CheckpointError,
     r"/model/config.json is not JSON the zoo reads: nested too deeply", FILES),
    ("hidden-size-beyond-bound", set_config(hidden_size=10**9), CheckpointError, r"/model/config.json: hidden_size = 1000000000 is above 65,536", FILES),
    ("layers-beyond-bound", set_config(num_hidden_layers=10**5), CheckpointError, r"num_hidden_layers = 100000 is above 1,024", FILES),
    ("hidden-size-infinite", set_config(hidden_size=float("inf")), CheckpointError, r"hidden_size = inf is above 65,536", FILES),
    ("mlp-beyond-weights", set_config(intermediate_size=4096), CheckpointError,
     r"config.json implies block_0/mlp/gate/kernel of shape \(32, 4096\) .* but 'model.layers.0.mlp.gate_proj.weight' in .* gives \(32, 48\)", BUILD),
    ("vocab-beyond-weights", set_config(vocab_size=100_000), CheckpointError,
     r"config.json implies token_embedding/embeddings of shape \(100000, 32\)", BUILD),
]  # fmt: skip


@pytest.fixture
def opened(monkeypatch):
    """Every path opened while the test runs (real paths), by Python or by safetensors."""
    paths = []

    def recording(original):
        def wrapper(file, *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)):
                paths.append(os.path.realpath(os.fsdecode(file)))
            return original(file, *args, **kwargs)

        return wrapper

    for module, name in ((builtins, "open"), (io, "open"), (os, "open"), (safetensors, "safe_open")):
        monkeypatch.setattr(module, name, recording(getattr(module, name)))
    return paths


def snapshot(root):
    """``{path: (size, mtime)}`` of everything under ``root``, symlinks not followed."""
    found = {}
    for folder, subfolders, files in os.walk(root):
        for name in subfolders + files:
            status = os.lstat(os.path.join(folder, name))
            found[os.path.relpath(os.path.join(folder, name), root)] = (status.st_size, status.st_mtime_ns)
    return found


def damaged(tmp_path, damage):
    """``(folder, outside)``: the fixture's copy with ``damage`` done, and the valid files beside it."""
    folder, outside = tmp_path / "model", tmp_path / "outside"
    shutil.copytree(SOURCE, folder)
    shutil.copytree(SOURCE, outside)
    damage(folder, outside)
    return folder, outside


@pytest.fixture
def built(monkeypatch):
    """How many GPTBackbones were built."""
    from zoo.models.gpt.gpt_backbone import GPTBackbone

    count, build = [], GPTBackbone.__init__

    @functools.wraps(build)  # Keras reads the signature
    def counting(self, *args, **kwargs):
        count.append(1)
        build(self, *args, **kwargs)

    monkeypatch.setattr(GPTBackbone, "__init__", counting)
    return count


@pytest.mark.parametrize(
    ("damage", "error", "message", "refused_before"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_a_hostile_folder_is_refused_naming_the_file_or_key(
    tmp_path, opened, built, damage, error, message, refused_before
):
    folder, outside = damaged(tmp_path, damage)
    before = snapshot(tmp_path)
    opened.clear()
    with pytest.raises(error, match=message) as raised:
        GPTCausalLM.from_preset(folder)
    assert "\n" not in str(raised.value)
    assert not [path for path in opened if path.startswith(str(outside.resolve()))], OUT_OF_FOLDER
    if refused_before == FILES:  # the whole index (and every link) checked before any weight file is opened
        assert not [path for path in opened if path.endswith(".safetensors")], f"refused only after {refused_before}"
    if refused_before in (FILES, BUILD):
        assert not built, f"refused only after {refused_before}"
    assert snapshot(tmp_path) == before, "the loader wrote or changed a file"


def test_zoo_export_of_a_hostile_folder_is_one_line_exit_1_and_writes_nothing(tmp_path, opened, capsys):
    from zoo.cli.main import main

    folder, outside = damaged(tmp_path, index_to("model-00001-of-00002.safetensors", "{outside}/model.safetensors"))
    before = snapshot(tmp_path)
    opened.clear()
    assert main(["export", str(folder), str(tmp_path / "exported")]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zoo: error: ") and "names the absolute path" in lines[0], lines
    assert not [path for path in opened if path.startswith(str(outside.resolve()))], OUT_OF_FOLDER
    assert snapshot(tmp_path) == before


def test_a_hub_cache_snapshot_may_link_into_its_blobs(tmp_path):
    """huggingface_hub's cache keeps a snapshot's files as symlinks to ../../blobs/<hash>:
    inside the repository folder, so accepted; a link out of it is not."""
    repository = tmp_path / "hub" / "models--org--tiny"
    snapshot_folder = repository / "snapshots" / ("0" * 40)
    (repository / "blobs").mkdir(parents=True)
    snapshot_folder.mkdir(parents=True)
    shutil.copy(SOURCE / SINGLE_FILE, repository / "blobs" / "abc123")
    os.symlink("../../blobs/abc123", snapshot_folder / SINGLE_FILE)
    with SafetensorsFiles(snapshot_folder) as files:
        assert files.shape(NORM) == (32,)
    shutil.copy(SOURCE / SINGLE_FILE, tmp_path / "elsewhere.safetensors")
    os.remove(snapshot_folder / SINGLE_FILE)
    os.symlink(tmp_path / "elsewhere.safetensors", snapshot_folder / SINGLE_FILE)
    with pytest.raises(CheckpointError, match="outside the folder"):
        SafetensorsFiles(snapshot_folder)


def test_the_undamaged_copy_loads_and_its_opens_are_seen(tmp_path, opened):
    """The table's folders differ from a loadable one only by their damage, and the
    recorder sees safetensors' own opens (the table's "no weight file opened" relies on it)."""
    folder, _ = damaged(tmp_path, lambda folder, outside: None)
    hf_checkpoints.load_causal_lm(GPTCausalLM, str(folder), load_weights=False)
    with SafetensorsFiles(folder) as files:
        assert files.names() == sorted(load_file(SOURCE / SINGLE_FILE))
    assert str((folder / SINGLE_FILE).resolve()) in opened and str((folder / "config.json").resolve()) in opened


def test_zoo_presets_names_a_hugging_face_config_that_is_not_json(tmp_path):
    """``zoo.presets.from_preset`` on a Hugging Face folder whose config.json is damaged says so,
    rather than sending the user to ``GPTCausalLM.from_preset`` for a folder it cannot read."""
    from zoo.presets import PresetError, from_preset

    folder, _ = damaged(tmp_path, write_file("config.json", "not json"))
    with pytest.raises(PresetError, match=r"^[^']*/model/config.json is not JSON: Expecting value: line 1 column 1"):
        from_preset(folder)
