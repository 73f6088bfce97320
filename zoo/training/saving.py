"""Loading saved zoo models: ``.keras`` files, always in Keras' safe mode, and causal LMs
from any of the places one is kept (``load_causal_lm``)."""

import json
import os
import zipfile
import zlib

import keras

import zoo.models  # noqa: F401  (registers the zoo's serialisable classes)
from zoo.models import GPTCausalLM, GPTCausalLMPreprocessor, layout_overrides
from zoo.models.gpt.hf_checkpoints import PREPROCESSOR_LENGTH
from zoo.presets import PresetError, load_tokenizer

KERAS_CONFIG = "config.json"  # the member every .keras archive holds (Keras' saving_lib)


def load_zoo_model(path):
    """Load a ``.keras`` file with ``safe_mode=True``: a file carrying Python code (a
    ``Lambda`` layer's bytecode, say) is refused, never executed.

    Raises:
        FileNotFoundError: nothing at ``path`` (or a folder).
        ValueError: ``path`` does not end in ``.keras``, or the file is not a valid
            ``.keras`` file (empty, truncated, not a zip archive, no readable model
            config); Keras itself says "File not found" for all of these.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no saved model at {path!r}; train one first (e.g. zoo train gpt --output {path})")
    if not path.endswith(".keras"):
        raise ValueError(f"model path must end in .keras, got {path!r}")
    _check_keras_archive(path)
    try:
        return keras.saving.load_model(path, safe_mode=True)
    except (zipfile.BadZipFile, zlib.error, EOFError, KeyError) as error:  # a damaged weights member
        raise _not_valid(path, f"{type(error).__name__}: {error}") from error


def _check_keras_archive(path):
    """A ``.keras`` file is a zip archive holding a readable ``config.json``."""
    size = os.path.getsize(path)
    if size == 0:
        raise _not_valid(path, "the file is empty")
    if not zipfile.is_zipfile(path):
        raise _not_valid(path, f"{size:,} bytes that are not a zip archive (truncated, or another format)")
    try:
        with zipfile.ZipFile(path) as archive:
            json.loads(archive.read(KERAS_CONFIG))
    except KeyError:
        raise _not_valid(path, f"the archive has no {KERAS_CONFIG}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as error:  # a damaged member, a config that is not JSON
        raise _not_valid(path, f"its {KERAS_CONFIG} cannot be read ({error})") from None


def _not_valid(path, why):
    return ValueError(f"{path!r} is not a valid .keras file: {why}; save it again (zoo train ... --output {path})")


def load_causal_lm(source, layout=None, **overrides):
    """A ``GPTCausalLM`` from a ``.keras`` file, a zoo preset (name or folder), a Hugging
    Face folder or ``hf://org/name``, under the current distribution; the one loader of
    ``zoo generate``, ``zoo finetune`` and ``zoo export``.

    ``layout`` adds what it needs (``tp+sp``: ``megatron_sp``) and ``overrides`` replace
    ``GPTBackbone`` arguments (presets and Hugging Face folders only). A model saved
    without a preprocessor whose preset ships a tokenizer gets a
    ``GPTCausalLMPreprocessor`` on it. Anything but a causal LM raises naming ``source``.
    """
    source = os.fspath(source)
    changes = {**layout_overrides(layout), **overrides}
    if source.endswith(".keras") or os.path.isfile(source):  # load_zoo_model names a file that is no .keras
        if changes:
            raise ValueError(f"{source}: a .keras file is loaded as saved; it cannot take {sorted(changes)}")
        model = load_zoo_model(source)
    else:
        model = GPTCausalLM.from_preset(source, **changes)
    if not isinstance(model, GPTCausalLM):
        raise ValueError(f"{source} holds a {type(model).__name__}, not a GPTCausalLM")
    if model.preprocessor is None:
        tokenizer = _preset_tokenizer(source)
        if tokenizer is not None:
            model.preprocessor = GPTCausalLMPreprocessor(tokenizer, min(PREPROCESSOR_LENGTH, model.backbone.max_sequence_length))
    return model


def _preset_tokenizer(source):
    """A zoo preset's ``tokenizer.json``, or None (no preset: a ``.keras`` file or a
    Hugging Face folder without one)."""
    if os.path.isfile(source):
        return None
    try:
        return load_tokenizer(source)
    except PresetError:
        return None
