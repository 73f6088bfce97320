"""Loading saved zoo models: ``.keras`` files, always in Keras' safe mode, and causal LMs
from any of the places one is kept (``load_causal_lm``)."""

import json
import os
import zipfile
import zlib

import keras

import zoo.models  # noqa: F401  (registers the zoo's serialisable classes)
from zoo.file_kinds import MAX_JSON_BYTES
from zoo.models import GPTCausalLM, GPTCausalLMPreprocessor, layout_overrides
from zoo.models.gpt import check_lengths
from zoo.models.gpt.hf_checkpoints import PREPROCESSOR_LENGTH, backbone_arguments, is_hf_directory
from zoo.models.gpt.hf_checkpoints import read_config as read_hf_config
from zoo.presets import PresetError, check_config_sizes, load_preset_config, load_tokenizer
from zoo.tokenizers import ByteTokenizer, HFTokenizer

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
            declared = archive.getinfo(KERAS_CONFIG).file_size
            if declared > MAX_JSON_BYTES:  # a compressed member can declare gigabytes: refused unread
                raise _not_valid(path, f"its {KERAS_CONFIG} declares {declared:,} bytes, above {MAX_JSON_BYTES:,}")
            config = json.loads(archive.read(KERAS_CONFIG))
    except KeyError:
        raise _not_valid(path, f"the archive has no {KERAS_CONFIG}") from None
    except (
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
        ValueError,
    ) as error:  # a damaged member, a config that is not JSON
        raise _not_valid(path, f"its {KERAS_CONFIG} cannot be read ({error})") from None
    if not isinstance(config, dict):
        raise _not_valid(path, f"its {KERAS_CONFIG} holds a JSON {type(config).__name__}, not a model's config")
    check_config_sizes(repr(path), config, error=ValueError)  # before Keras builds a model of those sizes


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
            model.preprocessor = GPTCausalLMPreprocessor(
                tokenizer, min(PREPROCESSOR_LENGTH, model.backbone.max_sequence_length)
            )
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


def check_prompt_fits(source, prompt, max_new_tokens):
    """Raise the ``ValueError`` ``GPTCausalLM.generate`` would (``prompt length 20 +
    max_new_tokens 100 = 120 exceeds max_sequence_length 64``) when ``prompt`` and
    ``max_new_tokens`` do not fit the causal LM at ``source``, from its config and tokenizer
    alone: no model is built and no weight read, so ``zoo generate`` refuses in a fraction
    of a second what it would otherwise refuse after loading. Reads a zoo preset (name or
    folder), a ``.keras`` file (the config inside the archive) and a Hugging Face folder.
    Returns whether it could tell; False (``hf://``, a ``.keras`` file saved with its own
    preprocessor, anything that does not read as a causal LM) leaves the check to the
    loaded model, and the load names what is wrong."""
    found = _saved_lm_limits(os.fspath(source))
    if found is None:
        return False
    max_sequence_length, vocabulary_size, tokenizer = found
    if tokenizer is None:  # what zoo generate gives a model saved without one: bytes, if its vocabulary is
        if vocabulary_size != ByteTokenizer.vocabulary_size:
            return False
        tokenizer = ByteTokenizer()
    preprocessor = GPTCausalLMPreprocessor(tokenizer, sequence_length=min(PREPROCESSOR_LENGTH, max_sequence_length))
    token_ids, _ = preprocessor.generate_preprocess(
        prompt
    )  # (B, P): the start token and the prompt, as generate has them
    check_lengths(token_ids.shape[1], max_new_tokens, max_sequence_length)
    return True


def _saved_lm_limits(source):
    """``(max_sequence_length, vocabulary_size, tokenizer or None)`` of the causal LM at
    ``source`` as ``load_causal_lm`` would find it, read without building it; None where
    that cannot be told from the files."""
    try:
        if source.endswith(".keras") or os.path.isfile(source):
            with zipfile.ZipFile(source) as archive:
                config = json.loads(archive.read(KERAS_CONFIG))
            return _causal_lm_limits(config, tokenizer=None)
        if is_hf_directory(source):
            arguments = backbone_arguments(read_hf_config(source))
            tokenizer = (
                HFTokenizer.from_directory(source) if os.path.isfile(os.path.join(source, "tokenizer.json")) else None
            )
            return arguments["max_sequence_length"], arguments["vocabulary_size"], tokenizer
        return _causal_lm_limits(load_preset_config(source), tokenizer=load_tokenizer(source))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, ImportError, zipfile.BadZipFile):
        return None  # hf://, no such file, not a causal LM: the load says which, in its own words


def _causal_lm_limits(config, tokenizer):
    """From a serialised ``GPTCausalLM`` config (a preset's ``config.json``, a ``.keras``
    archive's): None for another class or one saved with a preprocessor (its own settings)."""
    if config.get("registered_name") != "zoo>GPTCausalLM" or config["config"].get("preprocessor") is not None:
        return None
    backbone = config["config"]["backbone"]["config"]
    return backbone["max_sequence_length"], backbone["vocabulary_size"], tokenizer
