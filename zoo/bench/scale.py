"""``zoo bench scale``: the real-size plan, compile-only, per device.

Nothing here runs a step: every figure comes from a program compiled for the target's
device count on simulated CPU devices (one subprocess per device count, since JAX
fixes the count at start-up), read with ``memory_analysis()`` and
``zoo.measure.comms_report``. Four tables:

1. **Recipes**: each GPU/TPU ``pretrain_gpt`` recipe's training step (Keras'
   ``train_step``, what ``fit`` jits) at full depth on its target's device count, with
   the recipe's precision, remat and batch: weights, gradients, optimizer state and
   temporaries per device, the step's peak against ``[target] device_memory_gib``.
2. **Attention**: forward + backward temporaries of one attention call at gpt_1b's
   per-device shape (B=4, T=2048, H=32, K=4, D=64, bf16) on each path: the
   materialising reference, the blockwise kernel (the plain path), and the
   sequence-parallel kernels with T split over ``seq``.
3. **fsdp+tp weights**: gpt_1b's weight bytes per device under ``fsdp+tp`` at 64 and
   256 devices against params x bytes / devices.
4. **Tensor-parallel bytes**: what each device sends over ``model`` in one GPT training
   step under ``tp`` and ``tp+sp`` (loop trip counts included) against Megatron's
   minimum, (4L + 2) activation all-reduces of (B/dp, T, C): per block the attention
   and MLP outputs forward and their input gradients backward, plus the vocab-parallel
   embedding's output forward and the LM head's input gradient backward.
"""

import json
import math
import os
import subprocess
import sys

from zoo.bench._output import publish
from zoo.config.bench_settings import ScaleBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.config.choices import CONTEXT_ATTENTIONS
from zoo.config.layouts import FSDP_TP, TP, TP_SP
from zoo.distribution.axes import DATA, MODEL, SEQ
from zoo.models.dtype_policy import dtype_policy_scope
from zoo.units import GIB, MIB, format_bytes_in

ROW = "ROW "  # prefix of a worker's result lines on stdout


# --- the parent: one worker process per device count ------------------------------------


def tasks(settings):
    """``[(device count, task dict)]`` of every measurement the sections ask for."""
    from zoo.training.recipes import load_recipe

    work = []
    if "recipes" in settings.sections:
        work += [(load_recipe(path).target.devices, {"kind": "recipe", "path": path}) for path in settings.recipes]
    if "attention" in settings.sections:
        work.append((settings.attention_seq, {"kind": "attention", "seq": settings.attention_seq}))
    if FSDP_TP in settings.sections:
        work += [(_devices(mesh), {"kind": FSDP_TP, "mesh": mesh}) for mesh in settings.fsdp_tp_meshes]
    if TP in settings.sections:
        tp_fields = {k: getattr(settings, k) for k in ("tp_mesh", "tp_layers", "tp_width", "tp_length", "tp_batch")}
        work += [(_devices(settings.tp_mesh), {"kind": TP, "layout": layout, **tp_fields}) for layout in (TP, TP_SP)]
    return work


def _devices(mesh):
    return math.prod(int(part.split("=")[1]) for part in mesh.split(","))


def run_worker_process(devices, task):
    """Runs ``task`` in a fresh process with ``devices`` simulated CPU devices; its rows."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "zoo.bench.scale", json.dumps(task)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    rows = [json.loads(line[len(ROW) :]) for line in done.stdout.splitlines() if line.startswith(ROW)]
    if done.returncode or not rows:
        tail = [line[:300] for line in (done.stderr or done.stdout).strip().splitlines()[-3:]]
        return [{"kind": task["kind"], "task": task, "error": " | ".join(tail)}]
    return rows


def run_benchmark(settings, report=print):
    """Every table of the benchmark (``settings``: ``zoo.config.bench_settings.ScaleBenchSettings``);
    returns the rows (also written to ``settings.output``)."""
    rows = []
    for devices, task in tasks(settings):
        report(f"compiling {task} on {devices} simulated device(s) ...")
        rows += run_worker_process(devices, task)
    text = "\n".join(format_report(rows, settings))
    publish(text, settings, report)
    return rows


# --- the worker: one task, in a process with the right device count ----------------------


def measure(task):
    """The rows of one task (run in a process whose device count the task needs)."""
    kind = task["kind"]
    if kind == "recipe":
        return [recipe_row(task["path"])]
    if kind == "attention":
        return attention_rows(task["seq"])
    if kind == FSDP_TP:
        return [fsdp_tp_row(task["mesh"])]
    if kind == TP:
        return [tp_bytes_row(task)]
    raise ValueError(f"unknown task kind {kind!r}")


def recipe_row(path):
    from zoo.measure.comms_report import FAST_COMPILE
    from zoo.training.recipes import compile_recipe_step, load_recipe

    recipe = load_recipe(path)
    step = compile_recipe_step(recipe, compiler_options=FAST_COMPILE)
    config = recipe.job_config()
    memory = step.memory
    return {
        "kind": "recipe",
        "path": path,
        "layout": config.layout,
        "mesh": step.mesh or "one device",
        "precision": config.precision,
        "remat": str(config.remat),
        "batch_per_device": _batch_per_device(step, config),
        "weights": memory.weights,
        "gradients": memory.gradients,
        "optimizer": memory.optimizer,
        "temp": memory.temp,
        "peak": memory.peak,
        "target": int(recipe.target.device_memory_gib * GIB),
    }


def _batch_per_device(step, config):
    if not step.mesh:
        return step.batch_size
    sizes = {part.split("=")[0]: int(part.split("=")[1]) for part in step.mesh.split(",")}
    return step.batch_size // sizes.get(DATA, 1)


def attention_rows(seq):
    """Forward + backward temporaries at gpt_1b's per-device shape, per attention path."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from zoo import kernels
    from zoo.distribution import make_mesh
    from zoo.layers import plain_attention

    batch, length, heads, kv_heads, head_dim = 4, 2048, 32, 4, 64
    rows = []

    def temp(fn, sharding=None):
        q = jax.ShapeDtypeStruct((batch, length, heads, head_dim), jnp.bfloat16, sharding=sharding)
        kv = jax.ShapeDtypeStruct((batch, length, kv_heads, head_dim), jnp.bfloat16, sharding=sharding)

        def step(q, k, v, d_out):
            return jax.vjp(fn, q, k, v)[1](d_out)

        compiled = jax.jit(step).lower(q, kv, kv, q).compile()
        return int(compiled.memory_analysis().temp_size_in_bytes)

    causal = kernels.AttentionSpec(causal=True)  # tiles of 512, every kernel's default
    plain = {"spec": causal, "key_mask": None, "balance": None, "rope": None, "axis_size": 1, "axis_name": SEQ}
    rows.append(
        {
            "kind": "attention",
            "path": "reference (materialised scores), one device",
            "temp": temp(lambda q, k, v: kernels.attention_reference(q, k, v, causal=True)),
        }
    )
    rows.append(
        {
            "kind": "attention",
            "path": f"plain path ({_describe(None)}), one device",
            "temp": temp(lambda q, k, v: plain_attention(q, k, v, **plain)),
        }
    )
    mesh = make_mesh(f"{SEQ}={seq}", devices=jax.devices()[:seq])
    sharding = NamedSharding(mesh.backend_mesh, P(None, SEQ))
    for kernel in CONTEXT_ATTENTIONS:
        fn = _sharded(mesh, kernel)
        rows.append({"kind": "attention", "path": f"{kernel}, T split over seq={seq}", "temp": temp(fn, sharding)})
    return rows


def _describe(kernel):
    """The attention implementation the layer would choose on this host, in words."""
    from zoo.layers import describe_attention

    return describe_attention(seq_len=2048, head_dim=64, dtype="bfloat16", causal=True, context_attention=kernel)


def _sharded(mesh, kernel):
    from zoo import kernels
    from zoo.layers import sharded_attention

    def fn(q, k, v):
        return sharded_attention(
            q,
            k,
            v,
            mesh=mesh,
            spec=kernels.AttentionSpec(causal=True),  # tiles of 512
            key_mask=None,
            context_attention=kernel,
            balance=None,
            rope=None,
            sequence_axis=SEQ,
            batch_axis=None,
        )

    return fn


def fsdp_tp_row(mesh):
    """gpt_1b's weights per device under fsdp+tp on ``mesh``, from the variables' shardings."""

    from zoo import distribution as zd
    from zoo.measure.compiled_step import (
        abstract_build,
        analytic_weight_bytes,
        state_bytes,
        state_shardings,
    )
    from zoo.models import GPTCausalLM
    from zoo.training.gpt import compile_gpt

    distribution = zd.distribution_for(GPTCausalLM, FSDP_TP, mesh)
    with dtype_policy_scope("mixed_bfloat16"):  # as the recipes train it: float32 weights
        model = abstract_build(
            lambda: GPTCausalLM.from_config_name("gpt_1b", FSDP_TP),
            lambda m: compile_gpt(m, 3e-4, 1, 0.1, 1),
            distribution,
        )
    weights, _, _ = state_bytes(model, state_shardings(model, distribution))
    devices = _devices(mesh)
    return {
        "kind": FSDP_TP,
        "mesh": mesh,
        "devices": devices,
        "weights": weights,
        "analytic": analytic_weight_bytes(model, devices),
    }


def tp_bytes_row(task):
    """Bytes each device sends over ``model`` in one GPT training step, vs Megatron's minimum."""
    import keras

    from zoo import distribution as zd
    from zoo.distribution.mesh import mesh_axis_size
    from zoo.measure.comms_report import FAST_COMPILE, compiled_report
    from zoo.measure.compiled_step import abstract_build, compile_fit_step
    from zoo.models import GPTBackbone, GPTCausalLM, layout_overrides

    layout, mesh = task["layout"], task["tp_mesh"]
    config = dict(
        vocabulary_size=256,
        num_layers=task["tp_layers"],
        num_query_heads=8,
        hidden_dim=task["tp_width"],
        intermediate_dim=4 * task["tp_width"],
        max_sequence_length=task["tp_length"],
        tie_word_embeddings=False,
        **layout_overrides(layout),
    )
    distribution = zd.distribution_for(GPTCausalLM, layout, mesh, config=config)
    model = abstract_build(
        lambda: GPTCausalLM(backbone=GPTBackbone(**config)),
        lambda m: m.compile(
            optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        ),
        distribution,
    )
    tokens = ((task["tp_batch"], task["tp_length"]), "int32")
    compiled, _ = compile_fit_step(model, distribution, tokens, tokens, compiler_options=FAST_COMPILE)
    report = compiled_report(compiled, distribution.device_mesh)
    model_size, data_size = (mesh_axis_size(distribution.device_mesh, axis) for axis in (MODEL, DATA))
    activation = task["tp_batch"] // data_size * task["tp_length"] * task["tp_width"] * 4
    minimum = (4 * task["tp_layers"] + 2) * 2 * (model_size - 1) / model_size * activation
    sent = report.sent_bytes(axes=MODEL)  # loop trip counts included
    return {
        "kind": "tp",
        "layout": layout,
        "mesh": mesh,
        "sent": sent,
        "minimum": minimum,
        "collectives": _count_over(report, MODEL),
        "layers": task["tp_layers"],
    }


def _count_over(report, axis):
    """{kind: executions per step} of the collectives over ``axis`` alone."""
    return {row["kind"]: row["count"] for row in report.per_axis() if row["axes"] == (axis,)}


# --- the report ---------------------------------------------------------------------------


def _gib(count):
    """The recipe table's cells: GiB, two decimals (the header names the unit)."""
    return format_bytes_in(count, GIB, 2)


def _mib(count):
    """The fsdp+tp and tp tables' cells: MiB, one decimal, thousands grouped."""
    return format_bytes_in(count, MIB, 1, grouping=True)


def format_report(rows, settings):
    """The markdown report: one table per section asked for, then any worker's error."""
    tables = {"recipes": _recipe_table, "attention": _attention_table, FSDP_TP: _fsdp_tp_table, TP: _tp_table}
    lines = []
    for section in settings.sections:
        lines += tables[section](
            [row for row in rows if row["kind"] == _KINDS[section] and "error" not in row], settings
        ) + [""]
    lines += [f"- error in {row['task']}: {row['error']}" for row in rows if "error" in row]
    return lines


_KINDS = {"recipes": "recipe", "attention": "attention", FSDP_TP: FSDP_TP, TP: TP}


def _recipe_table(rows, settings):
    lines = ["### Recipes: the gpt_1b training step per device (GiB), compiled at full depth", ""]
    lines += [
        "| recipe | layout, mesh | precision, remat | batch/device | weights | gradients | optimizer | temp | peak | target | fits |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {row['path']} | {row['layout']}, {row['mesh']} | {row['precision']}, {row['remat']} | {row['batch_per_device']} | "
            f"{_gib(row['weights'])} | {_gib(row['gradients'])} | {_gib(row['optimizer'])} | {_gib(row['temp'])} | "
            f"{_gib(row['peak'])} | {_gib(row['target'])} | {'yes' if row['peak'] <= row['target'] else 'NO'} |"
        )
    return lines


def _attention_table(rows, settings):
    lines = [
        "### Attention at gpt_1b's per-device shape (B=4, T=2048, H=32, K=4, D=64, bf16, causal), forward + backward",
        "",
    ]
    return (
        lines
        + ["| path | temp (MiB) |", "| --- | ---: |"]
        + [f"| {row['path']} | {format_bytes_in(row['temp'], MIB, 0, grouping=True)} |" for row in rows]
    )


def _fsdp_tp_table(rows, settings):
    lines = [
        "### gpt_1b weights per device under fsdp+tp",
        "",
        "| mesh | devices | weights (MiB) | analytic (MiB) | ratio |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    return lines + [
        f"| {row['mesh']} | {row['devices']} | {_mib(row['weights'])} | {_mib(row['analytic'])} | {row['weights'] / row['analytic']:.2f}x |"
        for row in rows
    ]


def _tp_table(rows, settings):
    title = f"### Bytes sent over 'model' per GPT training step ({settings.tp_layers} layers, C={settings.tp_width}, T={settings.tp_length}, B={settings.tp_batch}, {settings.tp_mesh}, f32)"
    lines = [
        title,
        "",
        "| layout | model-axis collectives | sent (MiB) | Megatron minimum (MiB) | ratio |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(row["collectives"].items()))
        lines.append(
            f"| {row['layout']} | {kinds} | {_mib(row['sent'])} | {_mib(row['minimum'])} | {row['sent'] / row['minimum']:.2f}x |"
        )
    return lines


def main(argv):
    """Worker entry: ``python -m zoo.bench.scale '<task json>'`` prints its rows."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    for row in measure(json.loads(argv[0])):
        print(ROW + json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
