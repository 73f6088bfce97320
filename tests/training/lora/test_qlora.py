"""QLoRA (issue 48): LoRA factors over a base whose kernels are stored in int8 or int4
(``zoo.training.lora.quantized``, Keras' own weight quantization), under one device and
under fsdp, through ``zoo finetune --method qlora`` and back out by ``zoo export --lora``.

The bound each quantized layer is held to, per output column j of a kernel w (the column:
every entry that column's output sums over), for an input x:

    |y_j - y_q,j| <= sum_i |x_i| e_j,   e_j = max_i |w_ij| / 254     (int8: abs-max, 127 steps a side,
                                                                         half a step of rounding)
                                        e_j = (max_i w_ij - min_i w_ij) / 15   (int4: 16 levels over the
                                                                         column's range, half a step of
                                                                         rounding and half of the zero point's)

(int4 takes one scale per block of 128 input rows; these layers have fewer rows, so one
block per column.) On the tiny Hugging Face fixtures (random weights, 2 blocks) int8
moved the logits by 3.1-5.2% of their largest magnitude and int4 by 43-69%: the logits
check is int8's, at 10%; int4 is held to its bound layer by layer.
"""

import gc
import json
import pathlib
import weakref
import zlib

import keras
import numpy as np
import pytest

from zoo import distribution as zd
from zoo._compat import deleting_variables_without_full_collections
from zoo.cli.main import build_parser
from zoo.cli.main import main as zoo_main
from zoo.config import schema
from zoo.config.schema import SettingError
from zoo.data.text_files import load_text_file
from zoo.distribution.parity import StepLosses, compare
from zoo.layers import ColumnParallelDense, fill_quantized, kernel_variable, weight_only_config
from zoo.layers._tensor_parallel_attention import AttentionProjection
from zoo.models import GPTCausalLM, GPTCausalLMPreprocessor
from zoo.tokenizers import HFTokenizer
from zoo.training.finetune import FinetuneSettings, finetune
from zoo.training.lm_finetune import causal_lm_config, finetune_causal_lm, load_causal_lm
from zoo.training.lora import enable_lora, lora_target_layers
from zoo.training.lora.quantized import building_quantized, quantize_frozen, quantized_build_paths

FIXTURE = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "llama_mha_tied"  # V 320, C 32, 2 blocks
BATCH, LENGTH, STEPS, RANK, LEARNING_RATE = 8, 16, 3, 2, 1.0


def _column_errors(kernel, mode, contracted):
    """e_j of the module docstring for a float kernel, the ``contracted`` axes summed over."""
    if mode == "int8":
        return np.abs(kernel).max(axis=contracted) / 254
    return (kernel.max(axis=contracted) - kernel.min(axis=contracted)) / 15


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize(
    "make, x_shape, equation",
    [
        (lambda **dtype: ColumnParallelDense(24, name="up", **dtype), (3, 32), "bi,ij->bj"),
        (
            lambda **dtype: AttentionProjection(
                "btc,chd->bthd", role="heads_out", output_shape=(None, 4, 8), name="query", **dtype
            ),
            (2, 5, 32),
            "btc,chd->bthd",
        ),
    ],
    ids=["dense", "einsum"],
)
def test_a_quantized_layer_stays_within_its_bound(make, x_shape, equation, mode):
    keras.utils.set_random_seed(0)
    layer = make()
    layer.build(x_shape)
    x = np.random.default_rng(1).standard_normal(x_shape).astype("float32")
    kernel = np.asarray(layer.kernel, "float64")
    exact = np.einsum(equation, x.astype("float64"), kernel)
    with deleting_variables_without_full_collections():  # as quantize_frozen does (0.6-1.8 s a layer late in a worker)
        layer.quantize(mode, config=weight_only_config(mode))  # the zoo's layers take it where nothing splits them
    assert layer.quantization_mode == mode and layer.quantization_config.activation_quantizer is None
    quantized = np.asarray(layer(x), "float64")
    built = make(dtype=f"{mode}_from_float32")  # the same layer built quantized (QLoRA's quantized build) ...
    built.build(x_shape)
    fill_quantized(built, kernel.astype("float32"))  # ... given the same float kernel
    np.testing.assert_array_equal(np.asarray(built(x), "float64"), quantized)
    errors = _column_errors(kernel, mode, contracted=0)  # the input's axis: c (dense i)
    bound = np.einsum(equation, np.abs(x).astype("float64"), np.broadcast_to(errors, kernel.shape))
    slack = 1e-5 * np.einsum(equation, np.abs(x).astype("float64"), np.abs(kernel))  # float32 rounding
    assert np.all(np.abs(quantized - exact) <= bound + slack), np.max(np.abs(quantized - exact) - bound)
    assert np.abs(quantized - exact).max() > 0  # the kernel is quantized, not passed through
    assert np.abs(quantized - exact).max() > 0.05 * bound.max()  # and the bound is not vacuous here


def _pairs(count, seed):
    words = ("red", "green", "blue", "cat", "dog", "sun", "moon", "tree")
    rng = np.random.RandomState(seed)
    return [
        {"prompt": f"{words[a]} {words[b]} ->", "completion": f" {words[b]} {words[a]}"}
        for a, b in rng.randint(0, len(words), (count, 2))
    ]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qlora")
    files = {}
    for name, count, seed in (("train", BATCH * STEPS, 0), ("held_out", BATCH, 1)):
        files[name] = folder / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(record) + "\n" for record in _pairs(count, seed)))
    preprocessor = GPTCausalLMPreprocessor(HFTokenizer.from_directory(FIXTURE), LENGTH)
    return folder, files, {name: load_text_file(path, preprocessor) for name, path in files.items()}


MESHES = {  # layout -> the mesh its QLoRA runs on (8 CPU devices); the rest: data=8
    "tp": "data=2,model=4",
    "tp+sp": "data=2,model=4",
    "fsdp+tp": "data=2,model=4",
    "context": "data=2,seq=4",
    "pipeline": "data=4,stage=2",
    "expert": "data=2,expert=4",
    "fsdp+expert": "data=2,expert=4",
    "expert+tp": "data=2,expert=2,model=2",
    "model": "data=2,model=4",
}
MOE_FIXTURE = FIXTURE.parent / "mixtral"  # V 320, C 32, 4 experts (top 2), 2 blocks: the expert layouts'


def _qlora(layout, data, quantize, fixture=FIXTURE):
    """``finetune_causal_lm(method="qlora")`` for STEPS SGD steps under ``layout`` (None: one device)."""
    _, _, examples = data
    distribution = None
    if layout is not None:
        config = causal_lm_config(fixture, layout)
        distribution = zd.distribution_for(GPTCausalLM, layout, MESHES.get(layout, "data=8"), config=config)

    def load():  # under a layout the base is built quantized, each kernel quantized as read; one device
        if layout is None:  # quantizes the float model after loading (quantize_frozen): the same weights
            return load_causal_lm(fixture, layout)
        with building_quantized(quantize):
            return load_causal_lm(fixture, layout)

    model = zd.build_distributed(load, distribution)
    losses = StepLosses()
    before = {}

    class Before(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # one start for every layout, a stack's blocks too
            for variable in self.model.trainable_weights:
                variable.assign(_start(variable))
            before.update(_by_block(self.model.trainable_weights))

    result = finetune_causal_lm(
        model,
        examples["train"],
        None,  # no held-out loss: two programs fewer to compile (the command-line test measures it)
        method="qlora",
        quantize=quantize,
        lora_rank=RANK,
        optimizer=keras.optimizers.SGD(LEARNING_RATE),
        batch_size=BATCH,
        callbacks=[losses, Before()],
        report=lambda line: None,
    )
    return result, losses.losses, before, _by_block(model.trainable_weights)


def _start(variable):
    """A LoRA factor's start, drawn per block from its layer-form path (``lora_kernel_b`` stays zeros)."""
    if variable.path.endswith("lora_kernel_b"):
        return np.zeros(variable.shape, "float32")
    if not variable.path.startswith("blocks/"):
        return (
            np.random.default_rng(zlib.crc32(variable.path.encode())).normal(0, 0.3, variable.shape).astype("float32")
        )
    blocks = variable.shape[0] * variable.shape[1]
    rest = variable.path.removeprefix("blocks/")
    values = [
        np.random.default_rng(zlib.crc32(f"block_{layer}/{rest}".encode())).normal(0, 0.3, variable.shape[2:])
        for layer in range(blocks)
    ]
    return np.stack(values).reshape(variable.shape).astype("float32")


def _by_block(variables):
    """{path: value}, a stack's (R, L/R, ...) ``blocks/<rest>`` as each block's ``block_<l>/<rest>``."""
    values = {}
    for variable in variables:
        value = np.asarray(variable.value)
        if not variable.path.startswith("blocks/"):
            values[variable.path] = value
            continue
        for layer, block in enumerate(value.reshape(-1, *value.shape[2:])):
            values[f"block_{layer}/{variable.path.removeprefix('blocks/')}"] = block
    return values


@pytest.mark.parametrize(
    "layout, quantize",
    [
        ("fsdp", "int4"),
        ("fsdp+tp", "int4"),
        ("fsdp", "int8"),
        ("data", "int4"),
        ("tp", "int8"),
        ("tp+sp", "int4"),
        ("context", "int8"),
        ("pipeline", "int4"),
        ("expert", "int8"),
        ("fsdp+expert", "int4"),
        ("expert+tp", "int4"),
        ("model", "int8"),
    ],
)
def test_qlora_under_a_layout_trains_like_one_device(layout, quantize, data):
    """Every layout QLoRA runs under, against one device: the same losses and LoRA gradients
    (the expert layouts on the Mixtral fixture, whose experts stay float)."""
    fixture = MOE_FIXTURE if "expert" in layout else FIXTURE
    keras.distribution.set_distribution(None)
    reference = _qlora(None, data, quantize, fixture)
    keras.distribution.set_distribution(None)
    result, losses, before, after = _qlora(layout, data, quantize, fixture)
    ref_result, ref_losses, ref_before, ref_after = reference
    model = result["model"]
    # the base is stored quantized, laid out by the layout's map (tensor parallelism: as the layers
    # split the float kernel, each device its shard); only the LoRA factors train
    weights = {v.path.split("attention/query/")[-1]: v for v in model.backbone.weights if "attention/query/" in v.path}
    kernel = weights["kernel"]
    assert kernel.dtype == "int8" and ("g_idx" in weights) == (quantize == "int4")
    split = {
        axis for axes in kernel.value.sharding.spec if axes for axis in ([axes] if isinstance(axes, str) else axes)
    }
    assert split == {"fsdp": {"data"}, "tp": {"model"}, "tp+sp": {"model"}, "fsdp+tp": {"data", "model"}}.get(
        layout, split
    )
    if layout == "pipeline":  # (R, L/R, rows, packed columns): the blocks over the stages
        assert split == {"stage"}
    assert sorted(after) == sorted(ref_after) and all(
        path.endswith(("lora_kernel_a", "lora_kernel_b")) for path in after
    )
    assert compare(ref_before, before, rtol=0, atol=0).within_tolerance  # the same start
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    gradients = {path: (before[path] - after[path]) / LEARNING_RATE for path in after}  # SGD: -lr * summed steps
    ref_gradients = {path: (ref_before[path] - ref_after[path]) / LEARNING_RATE for path in ref_after}
    assert compare(ref_gradients, gradients, rtol=1e-3, atol=1e-5).within_tolerance
    assert max(np.abs(g).max() for g in ref_gradients.values()) > 1e-3  # the factors moved


def test_int8_logits_stay_within_ten_percent_of_the_float_models():
    keras.distribution.set_distribution(None)
    x = np.random.default_rng(0).integers(0, 300, (2, LENGTH))
    model = load_causal_lm(FIXTURE, None)
    exact = np.asarray(model.predict_on_batch(x), "float64")
    floats = [weakref.ref(kernel_variable(layer).value) for layer in lora_target_layers(model.backbone)]
    gc.disable()  # no automatic collection either: what frees the kernels is reference counting
    try:
        quantize_frozen(model.backbone, "int8")  # no gc.collect a layer (zoo._compat)
        quantized = np.asarray(model.predict_on_batch(x), "float64")  # Keras lets go of the last predict's values
        assert [ref() for ref in floats] == [None] * 14  # every float kernel freed
    finally:
        gc.enable()
    assert 0 < np.abs(quantized - exact).max() <= 0.10 * np.abs(exact).max()
    with pytest.raises(ValueError, match="quantize must be one of int8, int4, got 'nf4'"):
        quantize_frozen(model.backbone, "nf4")
    enable_lora(model.backbone, RANK)
    with pytest.raises(ValueError, match=r"LoRA is already enabled on \['block_0/mlp/down', 'block_0/mlp/up',"):
        quantize_frozen(model.backbone, "int8")


def test_a_base_built_quantized_holds_what_quantizing_the_loaded_float_model_gives():
    """``building_quantized``: the checkpoint's kernels quantized as they are read, never a
    float model first; the frozen embedding in the compute dtype."""
    keras.distribution.set_distribution(None)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        with building_quantized("int4"):
            built = load_causal_lm(FIXTURE, None)
        loaded = load_causal_lm(FIXTURE, None)
        quantize_frozen(loaded.backbone, "int4")
        x = np.random.default_rng(3).integers(0, 300, (2, LENGTH))
        np.testing.assert_array_equal(built.predict_on_batch(x), loaded.predict_on_batch(x))
    finally:
        keras.config.set_dtype_policy(previous)
    targets = [layer.path for layer in lora_target_layers(built.backbone)]
    assert quantized_build_paths(built.backbone) == targets and len(targets) == 14
    stored = {v.path: v for v in loaded.weights}
    for variable in built.weights:
        expected = np.asarray(stored[variable.path].value).astype(variable.dtype)  # the embedding: bfloat16
        np.testing.assert_array_equal(np.asarray(variable.value), expected, err_msg=variable.path)
    assert built.backbone.token_embedding.embeddings.dtype == "bfloat16"
    query = built.backbone.get_layer("block_0").attention.query
    with pytest.raises(
        ValueError,
        match=r"'block_0/attention/query': a float kernel of shape \(3, 3\) given for a kernel of shape \(32, 4, 8\)",
    ):
        fill_quantized(query, np.zeros((3, 3), "float32"))
    with pytest.raises(ValueError, match=r"'token_embedding' is not built quantized \(quantization mode None"):
        fill_quantized(loaded.backbone.token_embedding)  # the tied embedding and head: stored in the compute dtype


def test_zoo_finetune_qlora_writes_the_adapter_and_zoo_export_merges_it_onto_the_float_base(data, tmp_path):
    folder, files, _ = data
    output = tmp_path / "tuned"
    argv = (
        f"finetune {FIXTURE} --method qlora --quantize int4 --data-file {files['train']} --validation-file "
        f"{files['held_out']} --layout single --sequence-length {LENGTH} --batch-size {BATCH} --epochs 1 "
        f"--lora-rank {RANK} --optimizer sgd --learning-rate {LEARNING_RATE} --adapter-format peft --output {output} "
        "--precision mixed_bfloat16"
    ).split()
    lines = []
    result = finetune(schema.from_args(FinetuneSettings, build_parser().parse_args(argv)), report=lines.append)
    assert result["heldout_loss"] < result["heldout_loss_before"], lines  # 3 steps over an int4 base
    embedding = result["model"].backbone.token_embedding.embeddings  # frozen: stored in the compute dtype
    assert embedding.dtype == "bfloat16" and keras.config.dtype_policy().name == "float32"  # the policy restored
    assert {p.name for p in (output / "adapter").iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}
    assert not (output / "model.safetensors").exists()  # no model from the quantized base
    assert any(f"zoo export {FIXTURE} MERGED --lora {output / 'adapter'}" in line for line in lines), lines
    tuned = {v.path: np.asarray(v.value) for v in result["model"].trainable_weights}

    merged = tmp_path / "merged"
    assert zoo_main(["export", str(FIXTURE), str(merged), "--lora", str(output / "adapter")]) == 0
    keras.distribution.set_distribution(None)
    float_base = load_causal_lm(FIXTURE, None)
    enable_lora(float_base.backbone, RANK)
    factors = [variable for variable in float_base.weights if variable.path in tuned]
    assert len(factors) == len(tuned) == 2 * 2 * 7  # a, b on 7 layers x 2 blocks
    for variable in factors:  # the trained factors on the float base
        variable.assign(tuned[variable.path])
    x = np.random.default_rng(2).integers(0, 300, (2, LENGTH))
    np.testing.assert_allclose(
        load_causal_lm(merged, None).predict_on_batch(x), float_base.predict_on_batch(x), rtol=1e-4, atol=1e-4
    )


def test_quantize_is_a_setting_of_qlora_alone():
    with pytest.raises(SettingError, match=r"quantize \(--quantize\) = 'int8' is a setting of method qlora"):
        FinetuneSettings(preset=str(FIXTURE), method="lora", quantize="int8")
