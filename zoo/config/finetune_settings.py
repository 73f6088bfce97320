"""The settings of the jobs on causal LMs and saved models: ``zoo finetune``, ``zoo generate``
and ``zoo export`` (``zoo.config.schema``: each field a flag and a recipe key). Pure Python."""

import dataclasses

from zoo.config import _job_fields as fields
from zoo.config import choices, types
from zoo.config.schema import SettingError, setting


@dataclasses.dataclass
class FinetuneSettings(fields.CheckpointSettings, fields.Checked):
    """Settings of ``zoo finetune`` (recipe job ``finetune``)."""

    preset: str = setting(
        "small_cnn_shapes",
        "a shipped preset's name (e.g. small_cnn_shapes, gpt_tiny_python_docs), a preset folder (a path with '/'), "
        "or for a causal LM a Hugging Face folder or hf://org/name",
        section="model",
        positional=True,
    )
    method: str = setting(
        "lora",
        "what trains: frozen (a classifier's head), lora (LoRA factors, and a classifier's head), qlora (LoRA "
        "factors over a base stored in int8 or int4: --quantize), full (everything); a causal LM takes lora, qlora "
        "or full",
        section="finetune",
        choices=choices.METHODS,
    )
    lora_rank: int = setting(4, "rank r of the LoRA factors", section="finetune", parse=types.positive_int)
    quantize: str | None = setting(
        None,
        "method qlora: the frozen base's kernels in int8 (one scale per output channel) or int4 (a scale and zero "
        "point per 128 input rows); default int8",
        section="finetune",
        choices=choices.QUANTIZATIONS,
    )
    lora_alpha: float | None = setting(
        None,
        "LoRA scale alpha (the update is scaled by alpha / r); default alpha = r",
        section="finetune",
        parse=types.positive_float,
    )
    layout: str = setting(
        "single",
        fields.LAYOUT_HELP + "; model uses the preset's layout map, the others the Transformer presets'; "
        "tp+sp, fsdp+tp and context are for causal LMs",
        section="parallel",
        choices=choices.LAYOUTS,
    )
    mesh: str | None = fields.mesh()
    context_attention: str | None = fields.context_attention()
    balance: str | None = setting(
        None,
        "layout context: causal load balancing of the sequence order",
        section="parallel",
        choices=choices.BALANCES,
    )
    dataset: str = setting(
        "digits",
        "a classification dataset (zoo data list); a causal LM without --data-file: a language-modelling one",
        section="data",
    )
    data_dir: str | None = fields.data_dir()
    data_file: str | None = setting(
        None,
        'causal LMs: train on this file: .jsonl with {"messages": [...]} a line (through the chat template, '
        'loss on the assistant turns), {"prompt", "completion"} a line (loss on the completion) '
        'or {"text"} a line (packed), or plain text (packed); docs/finetuning.md',
        section="data",
        metavar="FILE",
    )
    chat_template: str | None = setting(
        None,
        'causal LMs: a Jinja chat template file (as chat_template.jinja) for {"messages"} data, '
        "used and saved instead of the tokenizer's own; default: the tokenizer's",
        section="data",
        metavar="FILE",
    )
    validation_file: str | None = setting(
        None,
        "causal LMs: the held-out examples, a file like --data-file; default: the last "
        "--validation-fraction of --data-file",
        section="data",
        metavar="FILE",
    )
    validation_fraction: float = setting(
        0.1,
        "causal LMs without --validation-file: the share of --data-file's examples held out (the last), in [0, 1)",
        section="data",
        parse=types.dropout,
    )
    train_examples: int | None = setting(
        None,
        "use only the first N training examples; default: the whole split",
        section="data",
        parse=types.positive_int,
    )
    test_examples: int | None = setting(
        None, "evaluate on the first N test (held-out) examples; default: all", section="data", parse=types.positive_int
    )
    sequence_length: int | None = setting(
        None,
        "causal LMs: tokens per example T; default: the model's preprocessor's, else min(1024, max_sequence_length)",
        section="train",
        parse=types.sequence_length,
    )
    loss_chunk_size: int | str | None = fields.loss_chunk_size("causal LMs: ")
    remat: str = fields.remat("causal LMs: ")
    scan_layers: bool = fields.scan_layers("causal LMs: ")
    precision: str = setting(
        "float32",
        "causal LMs: the Keras dtype policy the model is built under: float32, or mixed_bfloat16 (bf16 compute, "
        "float32 weights and optimizer; method qlora: the frozen embedding and LM head stored in bf16)",
        section="train",
        choices=choices.PRECISIONS,
    )
    packing: bool = setting(
        False,
        "causal LMs: several examples per row of T tokens (best-fit decreasing), attention and the loss within each "
        "(segment ids); plain text: documents kept apart in its windows; prints the padding before and after",
        section="data",
        store_true=True,
    )
    epochs: int = setting(3, "passes over the training examples", section="train", parse=types.positive_int)
    batch_size: int = setting(32, "global batch, split over the data axis", section="train", parse=types.positive_int)
    optimizer: str = setting(
        "adam",
        "adam, or sgd (w -= lr * gradient: steps that are the gradients, to compare layouts; needs --learning-rate)",
        section="train",
        choices=choices.OPTIMIZERS,
    )
    learning_rate: float | None = setting(
        None,
        "learning rate; default for adam per method: classifiers frozen, lora 1e-2, full 3e-3; "
        "causal LMs lora and qlora 2e-4, full 2e-5",
        section="train",
        parse=types.positive_float,
    )
    moment_dtype: str = fields.moment_dtype_setting("optimizer adam: Adam's")
    second_moment: str = fields.second_moment_setting("optimizer adam: Adam's")
    state_memory: str = fields.state_memory_setting("optimizer adam: Adam's")
    seed: int = fields.seed("LoRA factors' initialisation and shuffling")
    adapter_format: str = setting(
        "zoo",
        "methods lora and qlora: the adapter saved beside the merged model (qlora: alone): zoo (OUTPUT/lora.weights.h5) or peft "
        "(OUTPUT/adapter/: adapter_config.json, adapter_model.safetensors, for peft.PeftModel.from_pretrained)",
        section="finetune",
        choices=choices.ADAPTER_FORMATS,
    )
    output: str | None = setting(
        None,
        "save the fine-tuned model here (LoRA merged; the adapter beside it, --adapter-format; metrics.csv in OUTPUT.run): "
        "a preset, or a Hugging Face folder when the model came from one; method qlora: the adapter alone",
        section="train",
    )
    report_every: int = setting(
        50,
        "print step time and examples/s every N steps (also into the Keras logs)",
        section="logging",
        parse=types.positive_int,
    )

    def __post_init__(self):
        super().__post_init__()
        fields.check_context_settings(self)
        if self.quantize is not None and self.method != "qlora":
            raise SettingError(
                f"FinetuneSettings.quantize (--quantize) = {self.quantize!r} is a setting of method qlora, not of "
                f"method {self.method!r}: leave it out, or use --method qlora"
            )
        fields.check_scan_settings(self)


@dataclasses.dataclass
class GenerateSettings(fields.Checked):
    """Settings of ``zoo generate``."""

    model: str = setting(
        "runs/gpt/gpt.keras",
        "a .keras file saved by zoo train gpt, a shipped preset's name, a preset folder, "
        "or a Hugging Face folder or hf://org/name",
        section="generate",
    )
    prompt: str = setting("def ", "UTF-8 text, at least one character", section="generate", parse=types.text)
    chat: bool = setting(
        False,
        "the prompt is a user's message: through the model's chat template with the generation prompt; "
        "prints the assistant's reply",
        section="generate",
        store_true=True,
    )
    max_new_tokens: int = setting(
        200, "tokens generated after the prompt", section="generate", parse=types.positive_int
    )
    sampler: str = setting(
        "top_k", "greedy (argmax), top_k or top_p sampling", section="generate", choices=choices.SAMPLERS
    )
    temperature: float = setting(
        0.8, "divides the logits before sampling", section="generate", parse=types.positive_float
    )
    top_k: int = setting(
        10, "top_k sampler: sample among the k most likely tokens", section="generate", parse=types.positive_int
    )
    top_p: float = setting(
        0.9,
        "top_p sampler: the smallest set holding this probability, in (0, 1]",
        section="generate",
        parse=types.probability,
    )
    seed: int = setting(0, "sampling is reproducible for a seed", section="generate", parse=types.non_negative_int)
    stop_token_ids: str | None = setting(
        None,
        "comma-separated token ids that end generation, e.g. 2,32000 ('' for none); "
        "default: the tokenizer's stop tokens",
        section="generate",
        metavar="ID,ID",
    )

    def __post_init__(self):
        super().__post_init__()
        self.stop_ids()  # a malformed list is refused here, as the other settings are

    def stop_ids(self):
        """``stop_token_ids`` as ``GPTCausalLM.generate`` takes it: a tuple of ints, or None
        (the tokenizer's stop tokens); ``""`` is ``()``, no stop token."""
        if self.stop_token_ids is None:
            return None
        parts = [part.strip() for part in self.stop_token_ids.split(",") if part.strip()]
        if not all(part.isdigit() for part in parts):
            raise ValueError(
                f"GenerateSettings.stop_token_ids: expected comma-separated token ids >= 0 such as 2,32000 (or '' for none), "
                f"got {self.stop_token_ids!r}"
            )
        return tuple(int(part) for part in parts)


@dataclasses.dataclass
class ExportSettings(fields.Checked):
    """Settings of ``zoo export``."""

    model: str = setting(
        "runs/gpt/gpt.keras",
        "a .keras file, a zoo preset or a Hugging Face folder holding a GPTCausalLM",
        section="export",
        positional=True,
    )
    output: str = setting(
        "runs/gpt/hf",
        "the new Hugging Face folder (config.json, safetensors, tokenizer); must not exist or be empty",
        section="export",
        positional=True,
    )
    lora: str | None = setting(
        None,
        "a LoRA adapter to merge into the exported weights: lora.weights.h5 from zoo finetune, "
        "or a PEFT adapter folder (adapter_config.json, adapter_model.safetensors)",
        section="export",
    )
    dtype: str | None = setting(
        None,
        "store the weights as this dtype; default: as the model holds them",
        section="export",
        choices=choices.EXPORT_DTYPES,
    )
    max_file_size_mb: float | None = setting(
        None,
        "cut the weights into files of at most this many MiB, with an index (transformers' max_shard_size)",
        section="export",
        parse=types.positive_float,
    )
