"""``zoo export MODEL OUTPUT``: a causal LM as a Hugging Face folder ``transformers`` loads.

MODEL is a ``.keras`` file (``zoo train gpt``), a zoo preset or a Hugging Face folder;
``--lora ADAPTER`` first applies a LoRA adapter written by ``zoo finetune`` (or
``save_lora``), which is merged into the exported weights. See docs/checkpoints-hf.md.
"""

from zoo.config.settings import ExportConfig  # noqa: F401 (the settings of this job)
from zoo.training._lora_files import load_lora
from zoo.training.saving import load_causal_lm


def export(config, report=print):
    """Write ``config.model`` (with ``config.lora`` merged) to ``config.output``; returns the folder."""
    model = load_causal_lm(config.model)
    if config.lora:
        adapted = load_lora(model, config.lora)
        report(f"LoRA adapter {config.lora}: {len(adapted)} layers, merged on export")
    max_file_bytes = None if config.max_file_size_mb is None else int(config.max_file_size_mb * 2**20)
    directory = model.save_to_hf(config.output, max_file_bytes=max_file_bytes, dtype=config.dtype)
    report(f"wrote {config.output}: {type(model).__name__}, {model.count_params():,} parameters"
           + (f", {config.dtype}" if config.dtype else ""))  # fmt: skip
    return directory
