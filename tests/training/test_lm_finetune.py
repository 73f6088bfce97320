"""Fine-tuning a causal LM (issue 17): the tiny Llama fixture (tests/fixtures/hf/llama_mha_tied)
with LoRA on a prompt/completion JSONL file, under ``tp`` and under ``context`` (ring,
data=2,seq=4): 3 steps match one device (per-step losses, gradients, weights), and a few
dozen more steps lower the held-out loss. ``zoo finetune`` on the same fixture and file
writes a Hugging Face folder (LoRA merged) and the adapter. Then the text files' formats
and errors (no compile).

Compiles are shared: one single-device reference run (module-scoped) for both layouts;
every training run has the same shapes (batch 4 of 16 tokens), so the longer runs reuse
the compiled 3-step programs and the command-line run loads the context layout's from
the session's persistent compilation cache. SGD makes each step ``-lr * gradient``, so
the gradients are read from the steps without compiling a gradient program.
"""

import dataclasses
import json
import pathlib

import keras
import numpy as np
import pytest

from zoo import distribution as zd
from zoo.cli.main import build_parser
from zoo.config import schema
from zoo.data.text_files import LMExamples, load_text_file, pack_ids, pack_texts, read_jsonl, split_held_out
from zoo.distribution.parity import StepLosses, compare
from zoo.models import GPTCausalLM, GPTCausalLMPreprocessor
from zoo.tokenizers import ByteTokenizer, HFTokenizer
from zoo.training.finetune import FinetuneSettings, finetune
from zoo.training.lm_finetune import (
    causal_lm_config,
    finetune_causal_lm,
    heldout_loss,
    load_causal_lm,
    prepare_causal_lm,
    token_batches,
)
from zoo.training.lora._layers import layer_prefix

FIXTURE = (
    pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama_mha_tied"
)  # V 320, C 32, 4 heads, 2 layers, tied
BATCH, LENGTH = 4, 16  # the smallest shapes data=2 and seq=4 take (16 = 4 per sequence shard)
STEPS, RANK, LEARNING_RATE = 3, 2, 1.0  # SGD on the LoRA factors alone takes large steps
LAYOUTS = {"tp": ("data=2,model=4", {}), "context": ("data=2,seq=4", {"context_attention": "ring"})}
WORDS = ("red", "green", "blue", "cat", "dog", "sun", "moon", "tree")


def _pairs(count, seed):
    """Prompt 'a b ->', completion ' b a': the completion's words come from the prompt."""
    rng = np.random.RandomState(seed)
    return [
        {"prompt": f"{WORDS[a]} {WORDS[b]} ->", "completion": f" {WORDS[b]} {WORDS[a]}"}
        for a, b in rng.randint(0, len(WORDS), (count, 2))
    ]


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@dataclasses.dataclass
class Data:
    folder: pathlib.Path
    train_file: pathlib.Path
    held_out_file: pathlib.Path
    train: LMExamples
    held_out: LMExamples


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm_finetune")
    train_file = _write_jsonl(folder / "train.jsonl", _pairs(48, seed=0))
    held_out_file = _write_jsonl(folder / "held_out.jsonl", _pairs(8, seed=1))
    preprocessor = GPTCausalLMPreprocessor(HFTokenizer.from_directory(FIXTURE), LENGTH)
    return Data(
        folder,
        train_file,
        held_out_file,
        load_text_file(train_file, preprocessor),
        load_text_file(held_out_file, preprocessor),
    )


class _Trace(keras.callbacks.Callback):
    """The trainable weights before the first step and after each one."""

    def on_train_begin(self, logs=None):
        self.weights = [self._values()]

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(self._values())

    def _values(self):
        return {variable.path: np.asarray(variable.value) for variable in self.model.trainable_weights}


@dataclasses.dataclass
class Run:
    model: object
    result: dict
    losses: list
    weights: list  # STEPS + 1 dicts {path: value}

    def gradients(self, step):
        """d(loss)/d(weight) of step ``step`` (1-based): SGD's step is -lr * gradient."""
        before, after = self.weights[step - 1], self.weights[step]
        return {path: (before[path] - after[path]) / LEARNING_RATE for path in before}


def _finetune(layout, data):
    """``finetune_causal_lm`` for STEPS steps on the fixture under ``layout`` (None: one device)."""
    distribution = None
    if layout is not None:
        mesh, options = LAYOUTS[layout]
        distribution = zd.distribution_for(
            GPTCausalLM, layout, mesh, config=causal_lm_config(FIXTURE, layout), **options
        )
    model = zd.build_distributed(lambda: load_causal_lm(FIXTURE, layout), distribution)
    losses, trace = StepLosses(), _Trace()
    result = finetune_causal_lm(
        model,
        data.train[: STEPS * BATCH],
        data.held_out,
        method="lora",
        lora_rank=RANK,
        optimizer=keras.optimizers.SGD(LEARNING_RATE),
        batch_size=BATCH,
        callbacks=[losses, trace],
        report=lambda line: None,
    )
    return Run(model, result, losses.losses, trace.weights)


@pytest.fixture(scope="module")
def reference(data):
    """One device: the run both layouts are held to."""
    keras.distribution.set_distribution(None)
    run = _finetune(None, data)
    keras.distribution.set_distribution(None)
    return run


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_lora_finetuning_matches_one_device_and_lowers_the_held_out_loss(layout, data, reference):
    run = _finetune(layout, data)
    # the same starting point: the fixture's weights, LoRA factors drawn from the same seed
    assert (
        sorted(run.weights[0]) == sorted(reference.weights[0]) and len(run.weights[0]) == 2 * 2 * 7
    )  # a, b on 7 layers x 2 blocks
    assert compare(reference.weights[0], run.weights[0], rtol=0, atol=0).within_tolerance
    assert run.result["heldout_loss_before"] == pytest.approx(reference.result["heldout_loss_before"], rel=1e-5)
    assert len(run.losses) == STEPS
    np.testing.assert_allclose(run.losses, reference.losses, rtol=1e-4)
    for step in range(1, STEPS + 1):
        gradients = compare(reference.gradients(step), run.gradients(step), rtol=1e-3, atol=1e-5)
        assert gradients.within_tolerance, f"step {step}: {gradients}"
        assert max(np.abs(g).max() for g in reference.gradients(step).values()) > 1e-3  # steps that move
    assert compare(reference.weights[-1], run.weights[-1], rtol=1e-4, atol=1e-6).within_tolerance
    if layout == "tp":  # each factor laid out like its kernel: a of the query (C, H/M, D) is (C, H/M, r)
        query_a = next(v for v in run.model.trainable_weights if v.path == "block_0/attention/query/lora_kernel_a")
        assert tuple(query_a.value.sharding.spec) == (None, "model", None)

    # a few dozen more steps, on the same compiled programs (same shapes)
    before = run.result["heldout_loss_before"]
    run.model.fit(token_batches(data.train, batch_size=BATCH, shuffle=True, seed=1), epochs=3, verbose=0)  # 36 steps
    after = heldout_loss(run.model, data.held_out, batch_size=BATCH)
    assert after < before - 0.5, (before, after)  # 6.47 -> 5.2 nats per completion token


def test_zoo_finetune_scan_layers_trains_the_stacked_blocks_and_writes_the_layers_files(data, reference):
    """``zoo finetune FIXTURE --scan-layers``: the Hugging Face folder loads into stacked blocks
    (one scan), LoRA on them under fsdp lowers the held-out loss from the layers form's, and
    the folder and the PEFT adapter are the layers' (the adapter on the fixture gives the
    merged folder's weights)."""
    output = data.folder / "tuned_scanned"
    argv = ["finetune", str(FIXTURE), "--data-file", str(data.train_file), "--validation-file", str(data.held_out_file)]
    argv += ["--scan-layers", "--layout", "fsdp", "--mesh", "data=8", "--sequence-length", str(LENGTH)]
    argv += ["--batch-size", "8", "--epochs", "1", "--lora-rank", str(RANK), "--optimizer", "sgd"]
    argv += ["--learning-rate", str(LEARNING_RATE), "--adapter-format", "peft", "--output", str(output)]
    lines = []
    result = finetune(schema.from_args(FinetuneSettings, build_parser().parse_args(argv)), report=lines.append)
    keras.distribution.set_distribution(None)
    assert result["model"].backbone.stacked
    assert any("LoRA in 14 layers" in line for line in lines), lines  # 7 in each of the 2 stacked blocks
    assert result["heldout_loss_before"] == pytest.approx(reference.result["heldout_loss_before"], rel=1e-5)
    assert result["heldout_loss"] < result["heldout_loss_before"] - 0.5, lines
    saved = {v.path: np.asarray(v.value) for v in GPTCausalLM.from_preset(output).weights}
    assert "block_1/attention/query/kernel" in saved and not any("lora" in path for path in saved)
    from zoo.training.lora.peft_adapters import load_peft_adapter

    with_adapter = GPTCausalLM.from_preset(FIXTURE)
    assert len(load_peft_adapter(with_adapter, output / "adapter")) == 14
    for variable in with_adapter.weights:
        np.testing.assert_allclose(
            np.asarray(variable.value), saved[variable.path], rtol=1e-5, atol=1e-6, err_msg=variable.path
        )


def test_zoo_finetune_writes_the_merged_hf_folder_and_the_adapter(data, reference):
    """``zoo finetune FIXTURE --data-file ...`` under the context layout, in-process."""
    output = data.folder / "tuned"
    argv = [
        "finetune",
        str(FIXTURE),
        "--data-file",
        str(data.train_file),
        "--validation-file",
        str(data.held_out_file),
        "--layout",
        "context",
        "--mesh",
        "data=2,seq=4",
        "--context-attention",
        "ring",
        "--sequence-length",
        str(LENGTH),
        "--batch-size",
        str(BATCH),
        "--epochs",
        "1",
        "--lora-rank",
        str(RANK),
        "--optimizer",
        "sgd",
        "--learning-rate",
        str(LEARNING_RATE),
        "--adapter-format",
        "peft",
        "--output",
        str(output),
    ]
    lines = []
    result = finetune(schema.from_args(FinetuneSettings, build_parser().parse_args(argv)), report=lines.append)
    assert result["heldout_loss"] < result["heldout_loss_before"] - 0.5, lines
    assert result["heldout_loss_before"] == pytest.approx(reference.result["heldout_loss_before"], rel=1e-5)
    assert {"config.json", "model.safetensors", "tokenizer.json", "adapter"} <= {p.name for p in output.iterdir()}
    assert {p.name for p in (output / "adapter").iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}
    assert any(line.startswith("held-out loss after:") for line in lines), lines
    run_folder = data.folder / "tuned.run"  # the run's own files, not data.folder's (the next run's)
    assert (run_folder / "metrics.csv").read_text().startswith("epoch,step,") and not (
        data.folder / "metrics.csv"
    ).exists()

    model = result["model"]
    keras.distribution.set_distribution(None)
    saved = {v.path: np.asarray(v.value) for v in GPTCausalLM.from_preset(output).weights}
    merged = {
        f"{layer_prefix(layer)}/kernel": np.asarray(layer.kernel) for layer in result["adapted_layers"]
    }  # kernel + (alpha/r) a @ b
    assert len(merged) == 14 and not any("lora" in path for path in saved)
    for path, value in saved.items():
        expected = merged.get(path)
        if expected is None:  # not adapted: the fixture's own weight, untouched
            expected = next(np.asarray(v.value) for v in model.weights if v.path == path)
        np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-7, err_msg=path)
    # the PEFT adapter on the fixture gives the same weights (tests/training/lora/test_peft_adapters.py: and PEFT's logits)
    from zoo.training.lora.peft_adapters import load_peft_adapter

    with_adapter = GPTCausalLM.from_preset(FIXTURE)
    assert len(load_peft_adapter(with_adapter, output / "adapter")) == 14
    for variable in with_adapter.weights:
        np.testing.assert_allclose(
            np.asarray(variable.value), saved[variable.path], rtol=1e-5, atol=1e-6, err_msg=variable.path
        )


# --- text files, packing, options (no compile) ---------------------------------------------------


def test_prompt_tokens_carry_no_loss(data):
    tokenizer = HFTokenizer.from_directory(FIXTURE)
    examples = data.train
    assert examples.token_ids.shape == examples.labels.shape == examples.sample_weight.shape == (48, LENGTH)
    np.testing.assert_array_equal(examples.token_ids[:, 1:], examples.labels[:, :-1])  # labels: the next token
    first = _pairs(1, seed=0)[0]
    counted = examples.labels[0][examples.sample_weight[0] == 1]
    assert counted[-1] == tokenizer.end_token_id
    assert tokenizer.decode(counted[:-1]) == tokenizer.decode(tokenizer.encode(first["completion"]))
    assert examples.token_ids[0, 0] == tokenizer.start_token_id


def test_plain_text_is_packed_with_every_token_a_label_once():
    preprocessor = GPTCausalLMPreprocessor(ByteTokenizer(), 4)
    examples = pack_texts(["abcdefghij"], preprocessor)  # byte ids; no start or end token
    np.testing.assert_array_equal(examples.token_ids, [[97, 98, 99, 100], [101, 102, 103, 104], [105, 106, 0, 0]])
    np.testing.assert_array_equal(examples.labels, [[98, 99, 100, 101], [102, 103, 104, 105], [106, 0, 0, 0]])
    np.testing.assert_array_equal(examples.sample_weight[2], [1, 0, 0, 0])
    assert examples.loss_tokens == 9
    with pytest.raises(ValueError, match="at least 2 tokens"):
        pack_ids([5], 4)
    train, held_out = split_held_out(examples, 0.3)
    assert (len(train), len(held_out)) == (2, 1) and held_out.token_ids[0, 0] == 105
    with pytest.raises(ValueError, match="cannot be split"):
        split_held_out(examples[:1], 0.5)


@pytest.mark.parametrize(
    "content, message",
    [
        ("", r"x\.jsonl: the file is empty"),
        ('{"prompt": "a", "completion": "b"}\n\n{"prompt": "c"}\n', r"x\.jsonl line 3: missing key 'completion'"),
        (
            '{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": 3}\n',
            r"line 2: 'completion' must be a string, got int",
        ),
        ('{"prompt": "a", "completion": "b"}\n{"prompt": "a",\n', r"line 2: not valid JSON \(Expecting"),
        ('["a", "b"]\n', r"line 1: expected a JSON object such as \{\"prompt\""),
        ('{"text": "a"}\n{"prompt": "a", "completion": "b"}\n', r"line 2: missing key 'text'"),
    ],
)
def test_jsonl_errors_name_the_line_and_key(tmp_path, content, message):
    path = tmp_path / "x.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_jsonl(path)


def test_text_records_and_missing_files(tmp_path):
    path = _write_jsonl(tmp_path / "docs.jsonl", [{"text": "ab"}, {"text": "cd", "source": "ignored"}])
    assert read_jsonl(path) == ("text", (["ab", "cd"],))
    with pytest.raises(ValueError, match="nothing.jsonl: no such file"):
        load_text_file(tmp_path / "nothing.jsonl", GPTCausalLMPreprocessor(ByteTokenizer(), 4))
    long_prompt = _write_jsonl(tmp_path / "long.jsonl", [{"prompt": "x" * 10, "completion": "y"}])
    with pytest.raises(ValueError, match="no example has a completion token within sequence length 4"):
        load_text_file(long_prompt, GPTCausalLMPreprocessor(ByteTokenizer(), 4))


def test_refused_options(data, tmp_path):
    with pytest.raises(ValueError, match="method 'frozen' trains only a classifier's new head"):
        prepare_causal_lm(None, "frozen")
    with pytest.raises(ValueError, match="method 'frozen' trains only a classifier's new head"):
        finetune(FinetuneSettings(preset=str(FIXTURE), method="frozen", data_file=str(data.train_file)))
    with pytest.raises(ValueError, match="--optimizer sgd has no default learning rate"):
        finetune(FinetuneSettings(preset=str(FIXTURE), optimizer="sgd", data_file=str(data.train_file)))
    with pytest.raises(
        ValueError, match="a causal LM fine-tunes on --data-file FILE .* 'digits' is image classification data"
    ):
        finetune(FinetuneSettings(preset=str(FIXTURE), sequence_length=LENGTH), report=lambda line: None)
    with pytest.raises(ValueError, match="--data-file: for causal LMs; preset 'small_cnn_shapes' is a classifier"):
        finetune(FinetuneSettings(data_file=str(data.train_file)))
    with pytest.raises(ValueError, match="^--packing: for causal LMs; preset 'small_cnn_shapes' is a classifier"):
        finetune(FinetuneSettings(packing=True))
    with pytest.raises(ValueError, match="^--remat full: for causal LMs; preset 'small_cnn_shapes' is a classifier"):
        finetune(FinetuneSettings(remat="full"))
    with pytest.raises(ValueError, match="^--precision mixed_bfloat16: for causal LMs; preset 'small_cnn_shapes'"):
        finetune(FinetuneSettings(precision="mixed_bfloat16"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="--output .*full': exists and is not empty"):
        finetune(FinetuneSettings(preset=str(FIXTURE), data_file=str(data.train_file), output=str(tmp_path / "full")))
    distribution = zd.distribution_for(
        GPTCausalLM, "context", "data=2,seq=4", context_attention="ring", balance="zigzag"
    )
    twelve = LMExamples(*(array[:, :12] for array in data.train.arrays()))  # 12 tokens: not 2 x 4 zigzag chunks
    with pytest.raises(ValueError, match="sequence length.*12"):
        token_batches(twelve, batch_size=BATCH, distribution=distribution)


def test_lora_on_a_mixture_of_experts_leaves_the_routers_and_experts_frozen():
    """LoRA adapts attention, the shared expert and its gate; never a router (the MoE layer
    reads its kernel itself, and the routing stays as pretrained) nor the stacked experts."""
    model = GPTCausalLM.from_config_name("gpt_tiny_moe")
    adapted = prepare_causal_lm(model, "lora", lora_rank=2)
    names = {layer_prefix(layer) for layer in adapted}
    assert not [name for name in names if name.endswith("/router")]
    assert {"block_0/attention/query", "block_0/mlp/shared_expert/gate", "block_0/mlp/shared_expert_gate"} <= names
    trainable = {v.path.rsplit("/", 1)[-1] for v in model.trainable_weights}
    assert trainable == {"lora_kernel_a", "lora_kernel_b"}


MIXTRAL = FIXTURE.parent / "mixtral"  # 4 experts (top 2), C 32, 2 layers


@pytest.mark.parametrize(
    "method, layout, mesh",
    [("lora", "expert", "data=2,expert=4"), ("full", "fsdp+expert", "data=2,expert=4")],
    ids=["lora-expert", "full-fsdp+expert"],
)
def test_zoo_finetune_of_a_mixtral_folder_under_an_expert_layout(method, layout, mesh, data, tmp_path):
    """``zoo finetune`` of the Mixtral fixture, its experts split over ``expert``: the held-out
    loss falls, and the folder it writes reloads with the fine-tuned (LoRA merged) weights."""
    output = tmp_path / "tuned"
    argv = ["finetune", str(MIXTRAL), "--data-file", str(data.train_file), "--validation-file", str(data.held_out_file)]
    argv += ["--method", method, "--layout", layout, "--mesh", mesh, "--sequence-length", str(LENGTH)]
    argv += ["--batch-size", "8", "--epochs", "2", "--output", str(output)]
    argv += ["--optimizer", "sgd", "--learning-rate", "1.0"] if method == "lora" else ["--learning-rate", "3e-3"]
    lines = []
    result = finetune(schema.from_args(FinetuneSettings, build_parser().parse_args(argv)), report=lines.append)
    assert result["heldout_loss"] < result["heldout_loss_before"] - 0.02, lines
    model = result["model"]
    tuned = {v.path: np.asarray(v.value) for v in model.weights if "lora" not in v.path}
    if method == "lora":
        tuned.update({f"{layer_prefix(layer)}/kernel": np.asarray(layer.kernel) for layer in result["adapted_layers"]})
    keras.distribution.set_distribution(None)
    saved = {v.path: np.asarray(v.value) for v in GPTCausalLM.from_preset(output).weights}
    assert set(saved) <= set(tuned) and any(path.endswith("mlp/expert_down") for path in saved)
    for path, value in saved.items():
        if not path.endswith("router_statistics"):  # the last step's router counts: state, not a weight
            np.testing.assert_allclose(value, tuned[path], rtol=1e-5, atol=1e-6, err_msg=path)
