"""A causal language model made ready to fine-tune: where it comes from (a preset, a
Hugging Face folder), its config read without building it, its preprocessor, which of its
weights train under each method (``prepare_causal_lm``: the module doc of
``zoo.training.lm_finetune`` has the table), its optimizer, loss and build policy.
``zoo.training.lm_finetune`` runs the job on these."""

import os

import keras

from zoo.config.choices import METHODS
from zoo.models import GPTCausalLM, GPTCausalLMPreprocessor, layout_overrides
from zoo.models.gpt import hf_checkpoints
from zoo.models.gpt.gpt_configs import backbone_config
from zoo.presets import hf_hub, load_preset_config, load_preset_metadata
from zoo.tokenizers import Tokenizer
from zoo.training import optimizers
from zoo.training.lora import (
    enable_lora,
)
from zoo.training.lora.quantized import quantize_frozen, quantized_policy

# Adam learning rates per method: the usual ones for Llama-family checkpoints (LoRA as in
# QLoRA, Dettmers et al. 2023; full fine-tuning an order of magnitude below pre-training).
LM_LEARNING_RATES = {"lora": 2e-4, "qlora": 2e-4, "full": 2e-5}
FROZEN_REFUSED = (
    "method 'frozen' trains only a classifier's new head, and a causal LM has none; "
    "choose lora (LoRA factors on the attention and MLP layers) or full"
)


# --- the model -------------------------------------------------------------------------


def local_preset(preset):
    """The local folder or shipped name of ``preset``: ``hf://org/name`` is downloaded
    (once, into the Hugging Face cache); anything else is returned as given."""
    return hf_hub.local_directory(preset) if hf_hub.is_hub_name(preset) else preset


def is_hf_folder(preset):
    return isinstance(preset, (str, os.PathLike)) and hf_checkpoints.is_hf_directory(os.fspath(preset))


def is_causal_lm(preset):
    """Whether ``preset`` holds a causal LM: ``hf://...``, a Hugging Face folder, or a zoo
    preset of a ``GPTCausalLM``. An unknown preset raises (``zoo.presets.PresetError``)."""
    if hf_hub.is_hub_name(preset) or is_hf_folder(preset):
        return True
    return load_preset_metadata(preset)["class_name"] == GPTCausalLM.__name__


def causal_lm_config(preset, layout=None, *, scan_layers=False):
    """The ``GPTBackbone`` arguments of a local ``preset`` (zoo preset or Hugging Face
    folder), read without building the model, with what ``layout`` needs (``tp+sp``:
    ``megatron_sp``) and ``scan_layers`` when set: what ``get_layout_map`` checks against
    the mesh (``config=``), and what the job builds."""
    config = hf_checkpoints.read_config(os.fspath(preset)) if is_hf_folder(preset) else load_preset_config(preset)
    return {**backbone_config(config), **layout_overrides(layout), **({"scan_layers": True} if scan_layers else {})}


def lm_preprocessor(model, sequence_length=None, tokenizer=None):
    """A ``GPTCausalLMPreprocessor`` of ``sequence_length`` tokens (default: the model's
    preprocessor's, else ``min(1024, max_sequence_length)``) on ``tokenizer`` (default:
    the model's preprocessor's)."""
    own = model.preprocessor
    tokenizer = tokenizer or (own if isinstance(own, Tokenizer) else getattr(own, "tokenizer", None))
    if tokenizer is None:
        raise ValueError(f"model {model.name!r} has no tokenizer (its preprocessor is None); pass tokenizer=")
    limit = model.backbone.max_sequence_length
    if sequence_length is None:
        sequence_length = getattr(own, "sequence_length", None) or min(hf_checkpoints.PREPROCESSOR_LENGTH, limit)
    if sequence_length > limit:
        raise ValueError(f"sequence length {sequence_length} is above the model's max_sequence_length {limit}")
    if tokenizer.vocabulary_size > model.backbone.vocabulary_size:
        raise ValueError(
            f"the tokenizer's {tokenizer.vocabulary_size} ids do not fit the model's vocabulary of {model.backbone.vocabulary_size}"
        )
    return GPTCausalLMPreprocessor(tokenizer, sequence_length)


def prepare_causal_lm(model, method, *, lora_rank=4, lora_alpha=None, quantize=None):
    """Set which weights train under ``method`` (the module doc's table); call once, on a
    freshly loaded model, under its distribution. ``quantize`` (``qlora``): ``"int8"`` (the
    default) or ``"int4"``. Returns the LoRA layers (empty for ``full``)."""
    if method == "frozen":
        raise ValueError(FROZEN_REFUSED)
    if method not in METHODS:
        raise ValueError(f"unknown fine-tuning method {method!r}; choose lora, qlora or full")
    if quantize is not None and method != "qlora":
        raise ValueError(f"quantize={quantize!r} is a setting of method qlora, not of method {method!r}")
    if method == "full":
        return []
    if method == "qlora" and model.backbone.stacked:
        _check_quantized_stack(model.backbone.pipelined_blocks, quantize or "int8")
    elif method == "qlora":  # before the weights are listed: the list would keep every float kernel alive
        quantize_frozen(model.backbone, quantize or "int8")
    trainable = list(model.trainable_weights)
    adapted = enable_lora(model.backbone, lora_rank, alpha=lora_alpha)  # the backbone's layers: not lm_head
    for variable in trainable:
        variable.trainable = False
    return adapted


def _check_quantized_stack(stack, mode):
    """A stacked GPT's QLoRA base is quantized as it is built (``quantized_policy``: its
    template's layers int8 / int4, the stack made in that form); raise naming what is not."""
    modes = sorted({layer.quantization_mode for layer in stack.quantized_layers().values()})
    if modes != [mode]:
        raise ValueError(
            f"method qlora on a GPT whose blocks are stacked ({stack.name}: quantized {modes or 'not at all'}) needs "
            f"them built in {mode}: load or build it under zoo.training.lora.quantized.quantized_policy(precision, "
            f"{mode!r}) (zoo finetune does), or use method lora"
        )


def make_optimizer(name="adam", learning_rate=None, method="lora", **state):
    """``zoo.training.optimizers.make_optimizer``: ``adam``, its learning rate by default
    ``LM_LEARNING_RATES[method]``, its state shaped by ``state`` (``state_options``), or
    ``sgd`` (needs ``learning_rate``)."""
    if name == "adam":
        learning_rate = learning_rate or LM_LEARNING_RATES[method]
    return optimizers.make_optimizer(name, learning_rate, **state)


def compile_causal_lm(model, optimizer, loss_chunk_size=None):
    """Next-token cross-entropy, the mean over the labels that count (sample weight 1).

    ``loss_chunk_size`` t (default: the model's own ``loss_chunk_size``, None unless set):
    ``fit`` and ``evaluate`` (so ``heldout_loss``) compute the same loss from the hidden
    states, the head on t positions of every row at a time, without the whole (B, T, V)
    float32 logits (``GPTCausalLM(loss_chunk_size=...)``; docs/finetuning.md)."""
    if loss_chunk_size is not None:
        model.loss_chunk_size = loss_chunk_size  # checked by the model
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
    model.compile(optimizer=optimizer, loss=loss)


def base_policy(settings):
    """The dtype policy a causal LM's fine-tune builds it under: ``settings.precision``;
    ``--method qlora``: its ``quantized_policy`` (the base built quantized, each kernel
    quantized as it is read: never the whole model in float)."""
    if settings.method == "qlora":
        return quantized_policy(settings.precision, settings.quantize or "int8")
    return settings.precision
