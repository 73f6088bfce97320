"""After ``import zoo`` alone, plain Keras loads every saved zoo model and preset (issue 15).

Keras finds a saved class by its registered name (``"zoo>SmallCNN"``); it imports the
module a config names only for ``keras`` and ``keras_hub``. So ``zoo/__init__.py`` has
to import every module that registers a class. Here one fresh process, which imports
nothing but ``zoo`` and ``keras``, loads a ``.keras`` file of each model family, of
``GPTBackbone``, of a LoRA-enabled model and of a model made of the zoo's layers (every
weight set to random numbers first, so a weight Keras failed to load cannot pass as its
fresh initialisation), and every shipped preset the way plain Keras would
(``config.json`` through ``deserialize_keras_object``, then ``load_weights``). It writes
the weights it holds back; they must equal what was saved, bit for bit. Every class
registered anywhere in zoo/ must be registered in that process and appear in one of the
files."""

import ast
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import keras
import numpy as np

import zoo
from zoo.layers import ClassToken, LearnedPositionEmbedding, LogitSoftcap, TokenPooling
from zoo.presets import from_preset, list_presets, load_tokenizer, preset_directory

ZOO = pathlib.Path(zoo.__file__).parent
FAMILIES = ("SmallCNN", "GPTCausalLM", "TransformerEncoderClassifier", "ViTClassifier")  # one preset each

# The fresh process: what a user of plain Keras writes, plus writing the weights back.
CHILD = r"""
import json, os, sys

import zoo, keras  # nothing else from zoo
import numpy as np

job = json.loads(sys.argv[1])
report = {"registered": sorted(n for n in keras.saving.get_custom_objects() if n.startswith("zoo>"))}

def write_back(name, model):
    np.savez(os.path.join(job["out"], name + ".npz"), *[np.asarray(w) for w in model.weights])
    report[name] = {"class": type(model).__name__, "paths": [w.path for w in model.weights]}

for name, path in job["files"].items():
    write_back(name, keras.saving.load_model(path, safe_mode=True))
for name, folder in job["presets"].items():
    with open(os.path.join(folder, "config.json")) as f:
        model = keras.saving.deserialize_keras_object(json.load(f), safe_mode=True)
    model.load_weights(os.path.join(folder, "model.weights.h5"))
    write_back(name, model)
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        with open(os.path.join(folder, "tokenizer.json")) as f:
            tokenizer = keras.saving.deserialize_keras_object(json.load(f), safe_mode=True)
        report[name]["tokenizer"] = [type(tokenizer).__name__, tokenizer.get_config()]
print(json.dumps(report))
"""


def _layers_model():
    """The zoo layers the families hold only inside another layer, as a functional model,
    at the presets' sizes (C = 32, 4 heads of 8, F = 64, 64 + 1 tokens: no new compile)."""
    x = keras.Input((64, 32), name="x")  # (B, T, C)
    y = ClassToken(name="class_token")(x)  # (B, 1 + T, C)
    y = LearnedPositionEmbedding(65, name="position_embedding")(y)
    y = zoo.layers.MultiHeadAttention(num_heads=4, head_dim=8, num_kv_heads=2, rotary=True, name="attention")(y)
    y = zoo.layers.TransformerBlock(num_heads=4, head_dim=8, hidden_dim=64, name="block")(y)
    y = zoo.layers.PipelinedBlocks(1, dict(num_heads=4, head_dim=8, hidden_dim=64), name="pipelined")(y)
    y = zoo.layers.ParallelMLP(64, gated=True, name="mlp")(y)
    y = zoo.layers.MoEFeedForward(2, 1, 16, shared_expert_dim=16, name="moe")(y)
    y = zoo.layers.ColumnParallelDense(64, name="column")(y)  # (B, 1 + T, F)
    y = zoo.layers.RowParallelDense(32, name="row")(y)  # (B, 1 + T, C)
    y = zoo.layers.OffsetRMSNormalization(name="offset_norm")(y)
    y = TokenPooling("mean", name="pooling")(y)  # (B, C)
    y = LogitSoftcap(30.0, name="softcap")(y)  # float32 (B, C)
    return keras.Model(x, y, name="zoo_layers")


def _weights(model):
    return {w.path: np.asarray(w) for w in model.weights}


def _randomize(model, seed):
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(rng.standard_normal(weight.shape).astype(weight.dtype))


def _enable_lora(model):
    """Keras LoRA on the CNN's two Dense layers (rank 1, b set to 0.5). Keras saves such a layer
    with the factors merged into its kernel (the ``kernel`` property) and reloads it
    without LoRA: returns {kernel path: the merged kernel the file must hold}."""
    merged = {}
    for name in ("hidden_dense", "logits"):
        layer = model.get_layer(name)
        layer.enable_lora(1)
        layer.lora_kernel_b.assign(np.full(layer.lora_kernel_b.shape, 0.5, "float32"))  # Keras starts it at 0
        merged[f"{name}/kernel"] = np.asarray(layer.kernel)  # kernel + (alpha / rank) a @ b
    return merged


def _registered_in_sources():
    """``zoo>Name`` for every class in zoo/ decorated with ``register_keras_serializable``."""
    names = set()
    for path in ZOO.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                "register_keras_serializable" in ast.unparse(d) for d in node.decorator_list
            ):
                names.add(f"zoo>{node.name}")
    return names


def _registered_names_in(config):
    """Every ``registered_name`` inside a serialised config."""
    if isinstance(config, dict):
        found = {config["registered_name"]} if isinstance(config.get("registered_name"), str) else set()
        return found.union(*(_registered_names_in(v) for v in config.values()))
    if isinstance(config, list):
        return set().union(*(_registered_names_in(v) for v in config))
    return set()


def _run_child(job):
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}  # import zoo must choose JAX itself
    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(job)],
        env=env,
        cwd=job["out"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _assert_same_weights(name, expected, report, out):
    """The child's weights of ``name`` are ``expected`` ({path: array}), bit for bit."""
    assert report["paths"] == list(expected), f"{name}: weight paths differ:\n{report['paths']}\n{list(expected)}"
    with np.load(out / f"{name}.npz") as loaded:
        for index, (path, value) in enumerate(expected.items()):
            np.testing.assert_array_equal(
                loaded[f"arr_{index}"], value, err_msg=f"{name}: {path} differs after loading"
            )


def test_import_zoo_alone_lets_plain_keras_load_every_saved_zoo_model_and_preset(tmp_path):
    presets = {name: preset_directory(name) for name in list_presets()}
    expected, saved_names, by_class, preset_classes = {}, set(), {}, {}
    for name, folder in presets.items():
        model = from_preset(name)
        expected[name] = _weights(model)
        by_class[type(model).__name__] = model
        preset_classes[name] = type(model).__name__
        for file in ("config.json", "tokenizer.json"):
            if os.path.exists(os.path.join(folder, file)):
                saved_names |= _registered_names_in(json.loads(pathlib.Path(folder, file).read_text()))
    assert set(FAMILIES) <= set(by_class), f"a preset per model family is expected, got {sorted(by_class)}"

    # The families' files: the presets' models with random weights. At the presets' sizes
    # every initialiser the fresh process runs is compiled once, here, and read from the
    # session's compilation cache there (tiny models of other sizes would compile twice).
    cnn, gpt = by_class["SmallCNN"], by_class["GPTCausalLM"]
    fixture = pathlib.Path(__file__).parent / "fixtures" / "hf" / "llama_mha_tied"  # a Hugging Face tokenizer.json
    gpt.preprocessor = zoo.models.GPTCausalLMPreprocessor(
        zoo.tokenizers.HFTokenizer.from_directory(fixture), sequence_length=16
    )
    # compiled with the zoo's AdamW: its file's compile config names zoo>AdamW
    gpt.compile(optimizer=zoo.training.optimizers.AdamW(moment_dtype="bfloat16"), loss="mse")
    to_save = {name: by_class[name] for name in FAMILIES}
    to_save.update(GPTBackbone=gpt.backbone, zoo_layers=_layers_model())
    files = {}
    for seed, (name, model) in enumerate([*to_save.items(), ("lora_cnn", cnn)]):
        _randomize(model, seed)
        merged = _enable_lora(model) if name == "lora_cnn" else {}  # after small_cnn.keras is written
        files[name] = str(tmp_path / f"{name}.keras")
        model.save(files[name])
        with zipfile.ZipFile(files[name]) as archive:
            saved_names |= _registered_names_in(json.loads(archive.read("config.json")))
        lora = ("lora_kernel_a", "lora_kernel_b")  # merged into the kernel by Keras' save
        expected[name] = {w.path: merged.get(w.path, np.asarray(w)) for w in model.weights if not w.path.endswith(lora)}

    report = _run_child({"files": files, "presets": presets, "out": str(tmp_path)})

    registered = _registered_in_sources()
    assert registered <= set(report["registered"]), (
        f"not registered after `import zoo` alone: {sorted(registered - set(report['registered']))}; "
        f"import their modules in zoo/__init__.py"
    )
    assert registered <= saved_names, f"classes no file here exercises: {sorted(registered - saved_names)}"
    for name in [*files, *presets]:
        _assert_same_weights(name, expected[name], report[name], tmp_path)
    classes = {
        **{name: type(model).__name__ for name, model in to_save.items()},
        "lora_cnn": "SmallCNN",
        **preset_classes,
    }
    assert {name: report[name]["class"] for name in classes} == classes
    for name in presets:
        tokenizer = load_tokenizer(name)
        if tokenizer is not None:
            assert report[name]["tokenizer"] == [type(tokenizer).__name__, tokenizer.get_config()]
