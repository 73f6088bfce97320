"""``zoo export MODEL OUTPUT``: a causal LM as a Hugging Face folder ``transformers`` loads.

MODEL is a ``.keras`` file (``zoo train gpt``, pipelined or not), a zoo preset or a Hugging
Face folder; ``--lora ADAPTER`` first applies a LoRA adapter written by ``zoo finetune``
(``save_lora``'s ``lora.weights.h5``, or a PEFT adapter folder: ``adapter_config.json``
+ ``adapter_model.safetensors``, the zoo's or one ``peft`` made), which is merged into
the exported weights. A model saved without a
tokenizer whose vocabulary is the 256 bytes (what ``zoo train gpt`` trains on, what
``zoo generate`` assumes) is exported with the ``ByteTokenizer`` as a byte-level
``tokenizer.json``. The folder appears whole or not at all (``save_to_hf``); what a
killed export left beside it is removed and named. See docs/checkpoints-hf.md.
"""

from zoo.config.settings import ExportSettings  # noqa: F401 (the settings of this job)
from zoo.models import GPTCausalLMPreprocessor
from zoo.models.gpt.hf_checkpoints import PREPROCESSOR_LENGTH
from zoo.tokenizers import ByteTokenizer
from zoo.training.lora import (
    check_lora_file,
    is_peft_adapter,
    load_lora,
    load_peft_adapter,
    lora_parameter_count,
)
from zoo.training.paths import resolve_output
from zoo.training.saving import load_causal_lm
from zoo.units import MIB


def export(settings, report=print):
    """Write ``settings.model`` (with ``settings.lora`` merged) to ``settings.output``; returns the folder."""
    settings.output = resolve_output(settings.output)  # where the OS writes; "" and symlinks refused
    if settings.lora and not is_peft_adapter(settings.lora):
        check_lora_file(settings.lora)  # its headers, before the model is loaded
    model = load_causal_lm(settings.model)
    if settings.lora and is_peft_adapter(settings.lora):
        modules = load_peft_adapter(model, settings.lora)
        report(f"PEFT adapter {settings.lora}: {len(modules)} modules, merged on export")
    elif settings.lora:
        adapted = load_lora(model, settings.lora)
        report(f"LoRA adapter {settings.lora}: {len(adapted)} layers, merged on export")
    _attach_tokenizer(model, settings.model, report)
    max_file_bytes = None if settings.max_file_size_mb is None else int(settings.max_file_size_mb * MIB)
    directory = model.save_to_hf(settings.output, max_file_bytes=max_file_bytes, dtype=settings.dtype, report=report)
    report(
        f"wrote {settings.output}: {type(model).__name__}, {exported_parameter_count(model):,} parameters"
        + (f", {settings.dtype}" if settings.dtype else "")
        + (f", {model.backbone.num_layers} stacked blocks as layers" if model.backbone.stacked else "")
    )
    return directory


def exported_parameter_count(model):
    """The parameters the folder holds: the model's, less the LoRA factors (merged into
    the kernels they adapt, not written)."""
    return model.count_params() - lora_parameter_count(model)


def _attach_tokenizer(model, source, report):
    """A model without a preprocessor gets the ``ByteTokenizer``'s when its vocabulary is
    the 256 bytes (``zoo train gpt``'s); another vocabulary is exported without tokenizer
    files, and the report says so."""
    if model.preprocessor is not None:
        return
    vocabulary = model.backbone.vocabulary_size
    if vocabulary != ByteTokenizer.vocabulary_size:
        report(
            f"{source} has no tokenizer and a vocabulary of {vocabulary} (not the 256 bytes): the folder gets no "
            f"tokenizer files; add the tokenizer's tokenizer.json and tokenizer_config.json to it yourself"
        )
        return
    length = min(PREPROCESSOR_LENGTH, model.backbone.max_sequence_length)
    model.preprocessor = GPTCausalLMPreprocessor(ByteTokenizer(), sequence_length=length)
    report(
        f"{source} has no tokenizer: exporting the byte tokenizer it was trained on (byte b = id b, pad id 0) as tokenizer.json"
    )
