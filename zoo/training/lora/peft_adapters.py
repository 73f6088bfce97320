"""LoRA adapters in the PEFT format: ``adapter_config.json`` + ``adapter_model.safetensors``,
what ``peft.PeftModel.from_pretrained(transformers_model, folder)`` puts on the
transformers model, written from a zoo ``GPTCausalLM`` with LoRA enabled, and read back
onto a zoo model.

PEFT's LoRA on a module ``W`` (out, in) adds ``(lora_alpha / r) B @ A`` with
``A`` (r, in) and ``B`` (out, r); module names and file shapes are the Hugging Face
ones (``zoo.models.gpt.hf_checkpoints``' weight table). Keras' LoRA (the zoo's) factors
a kernel at its last dimension instead: ``a`` (kernel dims but the last, r) and ``b``
(r, last kernel dim). For a Dense kernel (C, F) and the attention output (H, D, C) the
two are the same factorisation, rank for rank. For a query kernel (C, H, D) (and key,
value: (C, K, D)) Keras' update is per head, ``delta[c, h, :] = a[c, h, :] @ b``: as a
(H*D, C) matrix it is block-diagonal of rank H*r, which PEFT holds exactly with
``A`` = a's H x r rows and ``B`` = b repeated on the diagonal, that module's rank H*r
and alpha H*alpha (``rank_pattern``, ``alpha_pattern``: the same scale alpha / r).

Reading goes the other way only by merging: a PEFT update ``B @ A`` of a q/k/v module is
in general no per-head Keras update of a smaller rank than D (each head's rows span their
own subspace), so ``load_peft_adapter`` adds ``scale * B @ A`` to the kernels (the model's
outputs are then the adapted model's) rather than creating factors of a rank that would
cost as much as the kernel. ``zoo export BASE OUT --lora ADAPTER_FOLDER`` and
``zoo finetune --adapter-format peft`` use these functions.

Why by hand: PEFT itself is a PyTorch library; the format is two files, read and written
here with ``safetensors`` (the zoo's own dependency) and ``json``.
"""

import collections
import json
import math
import os

import numpy as np

from zoo.file_kinds import read_json_file, regular_file
from zoo.models.gpt import check_finite_logits
from zoo.models.gpt.hf_checkpoints import UnsupportedCheckpoint, hf_model_type, weight_views
from zoo.presets import inside_folder
from zoo.presets.safetensors_weights import FLOAT_DTYPES, TensorView, save_tensor_file
from zoo.presets.sharded_weights import assign_from_host
from zoo.training.lora._layers import in_layers_form, kernel_path, lora_layers
from zoo.training.lora._peft_targets import check_targeting, is_targeted

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."  # PEFT's name of the transformers model inside its PeftModel
FACTORS = ("lora_A", "lora_B")
UNSUPPORTED = {  # adapter_config.json key -> the value the zoo reads (another value is refused)
    "peft_type": "LORA",
    "use_dora": False,
    "fan_in_fan_out": False,
    "bias": "none",
    "modules_to_save": None,
    "layer_replication": None,
    "lora_bias": False,
    "trainable_token_indices": None,
    "target_parameters": None,
}

__all__ = [
    "is_peft_adapter",
    "is_targeted",
    "load_peft_adapter",
    "peft_factors",
    "read_peft_adapter",
    "save_peft_adapter",
]


def is_peft_adapter(path):
    """Whether ``path`` is a folder holding a PEFT adapter's ``adapter_config.json`` (any
    kind of file by that name: reading it refuses a FIFO or a link out of the folder)."""
    return os.path.isdir(path) and os.path.lexists(os.path.join(path, CONFIG_FILE))


# --- the factors, zoo <-> PEFT ---------------------------------------------------------------


def peft_factors(a, b, view):
    """PEFT's ``(A (R, in), B (out, R))`` of the Keras LoRA factors ``a``, ``b`` of a kernel
    read from the file as ``view`` describes: ``B @ A`` is ``view.to_file(a @ b)``."""
    if view.split is None:  # Dense (in, out), file (out, in): a (in, r), b (r, out)
        return a.T, b.T
    if view.split_dim == 0:  # q/k/v: kernel (C, N, D) from file (N*D, C); a (C, N, r), b (r, D)
        width, heads, rank = a.shape
        head_dim = b.shape[1]
        factor_a = a.transpose(1, 2, 0).reshape(heads * rank, width)  # (N*r, C): head n's r rows
        factor_b = np.zeros((heads * head_dim, heads * rank), a.dtype)  # (N*D, N*r): b^T on the diagonal
        for head in range(heads):
            factor_b[head * head_dim : (head + 1) * head_dim, head * rank : (head + 1) * rank] = b.T
        return factor_a, factor_b
    # the output: kernel (H, D, C) from file (C, H*D); a (H, D, r), b (r, C)
    return a.reshape(-1, a.shape[-1]).T, b.T


def file_shape(view, kernel_shape):
    """The shape of the file tensor ``view.to_file`` makes of a kernel of ``kernel_shape``."""
    shape = tuple(kernel_shape[axis] for axis in np.argsort(view.axes)) if view.axes else tuple(kernel_shape)
    if view.split is None:
        return shape
    f = view.split_dim
    return shape[:f] + (shape[f] * shape[f + 1],) + shape[f + 2 :]


def peft_delta(factor_a, factor_b, scale, view):
    """The kernel-shaped update ``view.to_weight(scale * B @ A)`` of a PEFT module."""
    return view.to_weight((scale * (factor_b.astype(np.float64) @ factor_a.astype(np.float64))).astype(np.float32))


# --- writing ---------------------------------------------------------------------------------


def save_peft_adapter(model, directory, *, base_model_name_or_path=None):
    """Write the LoRA factors of ``model`` (a ``GPTCausalLM`` with LoRA enabled) into the
    folder ``directory`` as a PEFT adapter (module doc); a stacked GPT's block by block
    (``in_layers_form``). Returns the folder."""
    model = in_layers_form(model)
    layers = lora_layers(model)
    if not layers:
        raise ValueError(f"model {model.name!r} has no LoRA factors to save as a PEFT adapter")
    check_finite_logits(model, directory)
    views = _module_views(model)
    tensors, ranks, alphas = {}, {}, {}
    for layer in layers:
        module, view = _module_of(layer, views)
        factor_a, factor_b = peft_factors(np.asarray(layer.lora_kernel_a), np.asarray(layer.lora_kernel_b), view)
        tensors[f"{PREFIX}{module}.lora_A.weight"] = np.ascontiguousarray(factor_a, np.float32)
        tensors[f"{PREFIX}{module}.lora_B.weight"] = np.ascontiguousarray(factor_b, np.float32)
        ranks[module] = factor_a.shape[0]
        alphas[module] = layer.lora_alpha * factor_a.shape[0] / layer.lora_rank  # the same scale alpha / r
    os.makedirs(directory, exist_ok=True)
    save_tensor_file(tensors, os.path.join(directory, WEIGHTS_FILE), metadata={"format": "pt"})
    config = adapter_config(ranks, alphas, all_modules=list(views), base_model_name_or_path=base_model_name_or_path)
    with open(os.path.join(directory, CONFIG_FILE), "w", encoding="utf-8") as file:
        json.dump(config, file, indent=2)
        file.write("\n")
    return directory


def adapter_config(ranks, alphas, *, all_modules, base_model_name_or_path=None):
    """The ``adapter_config.json`` object: ``r`` / ``lora_alpha`` the most common, the others
    in ``rank_pattern`` / ``alpha_pattern``; modules by their short name (``q_proj``)
    where every module of that name is adapted alike, else by their full name."""
    short = _short_names(ranks, all_modules)
    rank = collections.Counter(ranks.values()).most_common(1)[0][0]
    alpha = collections.Counter(alphas[m] for m in ranks if ranks[m] == rank).most_common(1)[0][0]
    rank_pattern = dict(sorted((short.get(m, m), r) for m, r in ranks.items() if r != rank))
    alpha_pattern = dict(sorted((short.get(m, m), a) for m, a in alphas.items() if a != alpha))
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": rank,
        "lora_alpha": _number(alpha),
        "target_modules": sorted({short.get(m, m) for m in ranks}),
        "rank_pattern": rank_pattern,
        "alpha_pattern": {k: _number(v) for k, v in alpha_pattern.items()},
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "inference_mode": True,
        "revision": None,
    }


def _short_names(ranks, all_modules):
    """``{module: short name}`` for the modules whose short name (last part) names only
    adapted modules of one rank: then ``q_proj`` says what the full names say."""
    by_short = collections.defaultdict(list)
    for module in all_modules:
        by_short[module.rsplit(".", 1)[-1]].append(module)
    short = {}
    for name, modules in by_short.items():
        if all(m in ranks for m in modules) and len({ranks[m] for m in modules}) == 1:
            short.update({m: name for m in modules})
    return short


def _number(value):
    return int(value) if float(value).is_integer() else float(value)


# --- reading ---------------------------------------------------------------------------------


def read_peft_adapter(directory):
    """``(config, {module: (A, B)})`` of the PEFT adapter in ``directory``, checked as a
    Hugging Face model folder is: both files inside the folder (a symlink out of it is
    refused, ``inside_folder``) and regular files (a FIFO or device is refused before it is
    opened), ``adapter_config.json`` a JSON object whose ``r`` and ``lora_alpha`` (and their
    patterns) are finite and positive, every factor stored as floating point (from the
    header, before it is read) and finite; what the zoo does not read (``UNSUPPORTED``) is
    refused with the key and its value. Errors are ``ValueError`` naming the file."""
    from safetensors import SafetensorError, safe_open

    directory = os.fspath(directory)
    if not is_peft_adapter(directory):
        raise ValueError(f"{directory!r} holds no PEFT adapter ({CONFIG_FILE})")
    config_path = inside_folder(directory, CONFIG_FILE, listed_in="the adapter folder", error=ValueError)
    config = read_json_file(config_path, error=ValueError)
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: holds a JSON {type(config).__name__}, not an object of keys")
    for key, expected in UNSUPPORTED.items():
        value = config.get(key, None if key == "peft_type" else expected)
        if value != expected and not (expected is None and value in ([], {})):
            raise ValueError(
                f"{directory}/{CONFIG_FILE}: {key} = {value!r}; the zoo reads PEFT LoRA adapters with {key} = {expected!r}"
            )
    _check_scales(config_path, config)
    check_targeting(config_path, config)
    weights = os.path.join(directory, WEIGHTS_FILE)
    if not os.path.lexists(weights):
        raise ValueError(
            f"{directory!r} has no {WEIGHTS_FILE} (a PyTorch adapter_model.bin is not read: save with safe_serialization)"
        )
    regular_file(
        inside_folder(directory, WEIGHTS_FILE, listed_in="the adapter folder", error=ValueError),
        error=ValueError,
        what="a safetensors file",
    )
    factors = collections.defaultdict(dict)
    try:
        with safe_open(weights, framework="numpy") as file:
            names = list(file.keys())
            for name in names:  # every name and dtype from the header before any tensor is read
                _split_name(directory, name)
                stored = file.get_slice(name).get_dtype()
                if stored not in FLOAT_DTYPES:
                    raise ValueError(
                        f"{weights}: tensor {name!r} is stored as {stored}; LoRA factors are floating point "
                        f"({sorted(FLOAT_DTYPES)})"
                    )
            for name in names:
                array = file.get_tensor(name)
                bad = array.size - np.count_nonzero(np.isfinite(array))
                if bad:
                    raise ValueError(f"{weights}: tensor {name!r} holds {bad} NaN or infinite value(s)")
                module, factor = _split_name(directory, name)
                factors[module][factor] = array
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{weights} is not a readable safetensors file: {error}") from None
    incomplete = sorted(m for m, pair in factors.items() if set(pair) != set(FACTORS))
    if incomplete:
        raise ValueError(f"{weights}: {incomplete[:3]} lack lora_A or lora_B")
    return config, {module: (pair["lora_A"], pair["lora_B"]) for module, pair in factors.items()}


def _check_scales(path, config):
    """``r`` and ``rank_pattern``'s values positive integers, ``lora_alpha`` and
    ``alpha_pattern``'s finite numbers > 0 (an alpha of 1e38 merges to NaN logits)."""
    ranks = [("r", config.get("r"))] + [
        (f"rank_pattern[{k!r}]", v) for k, v in (config.get("rank_pattern") or {}).items()
    ]
    alphas = [("lora_alpha", config.get("lora_alpha"))] + [
        (f"alpha_pattern[{k!r}]", v) for k, v in (config.get("alpha_pattern") or {}).items()
    ]
    for key, value in ranks:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{path}: {key} = {value!r} must be a positive integer")
    for key, value in alphas:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{path}: {key} = {value!r} must be a finite number > 0")


def _split_name(directory, name):
    """``base_model.model.<module>.lora_A.weight`` -> ``(<module>, "lora_A")``."""
    parts = name.split(".")
    if not name.startswith(PREFIX) or len(parts) < 4 or parts[-1] != "weight" or parts[-2] not in FACTORS:
        raise ValueError(
            f"{directory}/{WEIGHTS_FILE}: tensor {name!r} is not a LoRA factor ({PREFIX}<module>.lora_A.weight)"
        )
    return ".".join(parts[2:-2]), parts[-2]


def module_scale(config, module, rank):
    """PEFT's scale of ``module``: its alpha / r (``alpha_pattern``, ``rank_pattern`` by the
    longest key matching the module's name end), alpha / sqrt(r) with ``use_rslora``."""
    expected_rank = _pattern_value(config.get("rank_pattern") or {}, module, config["r"])
    if rank != expected_rank:
        raise ValueError(f"adapter module {module!r} has rank {rank}; adapter_config.json gives it r = {expected_rank}")
    alpha = _pattern_value(config.get("alpha_pattern") or {}, module, config["lora_alpha"])
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def _pattern_value(pattern, module, default):
    matches = [key for key in pattern if module == key or module.endswith("." + key)]
    return pattern[max(matches, key=len)] if matches else default


def load_peft_adapter(model, directory):
    """Merge the PEFT adapter in ``directory`` into ``model``'s kernels (``kernel +=
    scale * B @ A`` in the zoo's layout; module doc: why merged). The kernels keep their
    layout (each is read to the host once and written back shard by shard). Returns the
    adapted modules' names."""
    config, factors = read_peft_adapter(directory)
    model_type = _model_type(model) if config.get("target_modules") is None else None
    where = os.path.join(directory, CONFIG_FILE)
    factors = {  # as PEFT loads them
        module: pair
        for module, pair in factors.items()
        if is_targeted(config, module, model_type=model_type, where=where)
    }
    if not factors:
        raise ValueError(
            f"{directory}/{CONFIG_FILE}: target_modules = {config.get('target_modules')!r} names none of the "
            f"modules {WEIGHTS_FILE} holds factors for: nothing to merge"
        )
    views = _module_views(model)
    weights = {variable.path: variable for variable in model.weights}
    unknown = sorted(set(factors) - set(views))
    if unknown:
        raise ValueError(
            f"{directory}: adapter modules {unknown[:3]} are not weights of this model "
            f"(its modules: {list(views)[:3]} ...)"
        )
    for module, (factor_a, factor_b) in sorted(factors.items()):
        path, view = views[module]
        kernel = weights[path]
        _check_no_lora(model, path, directory)
        expected = file_shape(view, kernel.shape)  # (out, in)
        if (factor_b.shape[0], factor_a.shape[1]) != expected or factor_b.shape[1] != factor_a.shape[0]:
            raise ValueError(
                f"{directory}: adapter module {module!r} has lora_A {factor_a.shape}, lora_B {factor_b.shape}; "
                f"the model's {module} is {expected} (its {path} {tuple(kernel.shape)})"
            )
        delta = peft_delta(factor_a, factor_b, module_scale(config, module, factor_a.shape[0]), view)
        with assign_from_host([kernel]):
            kernel.assign((np.asarray(kernel.value, np.float32) + delta).astype(kernel.dtype))
    return sorted(factors)


def _model_type(model):
    """The Hugging Face ``model_type`` of ``model`` (what a null ``target_modules`` means depends
    on it), or None for a model no Hugging Face type computes."""
    try:
        return hf_model_type(model.backbone.get_config())
    except UnsupportedCheckpoint:
        return None


def _check_no_lora(model, path, directory):
    for layer in lora_layers(model):
        if kernel_path(layer) == path:
            raise ValueError(
                f"{directory}: the model has LoRA enabled on {path}; load the PEFT adapter into a model without LoRA"
            )


# --- the model's modules -----------------------------------------------------------------------


def _module_views(model):
    """``{Hugging Face module name: (zoo kernel path, TensorView)}`` of the model's kernels
    that are one file tensor each (``weight_views``; stacked experts are not Dense layers)."""
    views = weight_views(model.backbone.get_config())
    return {
        view.name.removesuffix(".weight"): (path, view)
        for path, view in views.items()
        if isinstance(view, TensorView) and path.endswith("/kernel")
    }


def _module_of(layer, views):
    path = kernel_path(layer)
    by_path = {kernel_path: (module, view) for module, (kernel_path, view) in views.items()}
    if path not in by_path:
        raise ValueError(
            f"LoRA layer {path!r} has no Hugging Face module (a PEFT adapter covers {sorted(views)[:3]} ...)"
        )
    return by_path[path]
