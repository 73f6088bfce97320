"""``zoo bench peers``: the zoo and MaxText on the same Llama-style model, side by side.

Each side runs in its own process (``zoo.bench._peer_workers``): the zoo's
(``zoo.bench._peers_zoo``, this Python or ``--zoo-python``) and MaxText 0.2.5's
(``recipes/peers/maxtext_worker.py`` in its own virtual environment, created by
``recipes/peers/maxtext_venv.sh`` when missing: never a dependency of the zoo), both on 8
simulated CPU devices. The parameter counts of the two sides must be equal, else
``ParameterMismatch``.

- memory (compile-only, nothing allocated): Llama-3.2-1B (the zoo's ``llama_3_2_1b``:
  16 blocks, C=2048, 32/8 heads of 64, F=8192, V=128,256 tied; MaxText's ``base.yml``
  with the same sizes), T=2048, global batch 8 b, remat full, bf16 compute / f32 weights,
  AdamW + global-norm clip. Per device: ``memory_analysis()`` (arguments = weights +
  optimizer state + batch, temporaries, peak), bytes sent per step per mesh axis (both
  HLOs read by the zoo's parser, ``zoo.measure.hlo``, loop trip counts included; MaxText's
  axes named in the zoo's words by ``ZOO_AXIS``), compiled FLOPs (``cost_analysis`` plus
  the dots of loop bodies beyond their first trip, ``zoo.planning.measure.loop_dot_flops``).
- time: the timing model (``TIMING_MODEL``), each side's real step (the zoo: ``model.fit``
  as ``zoo train gpt`` compiles it; MaxText: ``train.train_step`` on its synthetic batch),
  run N steps at a time, alternating zoo, MaxText, zoo, ... ``repeats`` times; medians of
  wall and process CPU seconds per step, and their ratio zoo / MaxText. With ``--profile
  DIR`` each side then runs one step under the JAX profiler, XLA writing its optimised
  HLO, and ``zoo.bench._step_profile`` reads the two into where each step's time goes.

With ``--keras-hub-venv DIR`` the memory table also holds keras-hub's Llama under
fsdp+tp (``LlamaBackbone`` with the same sizes and its own ``get_layout_map``, compiled by the
zoo's ``compile_fit_step`` in keras-hub's environment, ``recipes/peers/keras_hub_worker.py``;
without remat: ``keras.RematScope`` fails inside keras-hub 0.32's attention).

Layouts: fsdp = the zoo's ``data=8`` / MaxText's ``ici_fsdp_parallelism=8``; tp =
``data=2,model=4`` / ``ici_data_parallelism=2 ici_tensor_parallelism=4``; fsdp+tp =
``data=2,model=4`` / ``ici_fsdp_parallelism=2 ici_tensor_parallelism=4``.
"""

import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from zoo.bench import _step_profile as step_profile
from zoo.bench._output import publish
from zoo.bench._peer_workers import Worker, interleave, run_worker
from zoo.bench._peers_report import (
    MEMORY_CONFIG,
    MEMORY_LENGTH,
    TIMING_BATCH,
    format_memory_row,
    format_memory_table,
    format_time_row,
    format_time_table,
)
from zoo.config import choices
from zoo.config.bench_peers_settings import PEERS_LAYOUTS, PeersBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.config.layouts import FSDP, FSDP_TP, TP

DEVICES = 8
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds zoo/ and recipes/
RECIPES = os.path.join(REPOSITORY, "recipes", "peers")
ZOO_MESH = {FSDP: "data=8", TP: "data=2,model=4", FSDP_TP: "data=2,model=4"}
MAXTEXT_MESH = {
    FSDP: ("ici_fsdp_parallelism=8",),
    TP: ("ici_data_parallelism=2", "ici_tensor_parallelism=4"),
    FSDP_TP: ("ici_fsdp_parallelism=2", "ici_tensor_parallelism=4"),
}
ZOO_AXIS = {"data": "data", "fsdp": "data", "fsdp_transpose": "data", "tensor": "model"}  # MaxText axis -> zoo's word
# the timing model: C=512, L=4, 8/4 heads of 64, F=2048, V=32,000 tied, T=512, global batch 8
TIMING_MODEL = dict(
    vocabulary_size=32000,
    num_layers=4,
    hidden_dim=512,
    num_query_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    intermediate_dim=2048,
    max_sequence_length=512,
    tie_word_embeddings=True,
    remat="full",
)
PRECISION = "mixed_bfloat16"  # MaxText: dtype=bfloat16 weight_dtype=float32
# compile-only on both sides: the HLO passes (partitioning, buffer assignment) all run, LLVM's are skipped
COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


class ParameterMismatch(ValueError):
    """The zoo and MaxText built models of different sizes: the comparison is void."""


class PeerSetupError(RuntimeError):
    """A peer's virtual environment is missing and cannot be created."""


def check_parameters(zoo, maxtext, what):
    """Raise ``ParameterMismatch`` naming both counts unless they are equal."""
    if zoo != maxtext:
        raise ParameterMismatch(
            f"{what}: the zoo's model has {zoo:,} parameters but MaxText's has {maxtext:,} "
            f"(difference {zoo - maxtext:+,}): the two sides do not build the same model"
        )


def run_benchmark(settings, report=print):
    """Both tables (``settings.sections``); the markdown also to ``settings.output``.
    Returns ``{"memory": [row dicts], "time": [row dicts]}``."""
    python = maxtext_python(settings.maxtext_venv)
    results, parts = {"memory": [], "time": []}, [header(settings)]
    with tempfile.TemporaryDirectory(prefix="zoo-peers-") as scratch:
        if "memory" in settings.sections:
            for layout in settings.layouts:
                for b in settings.per_device_batches:
                    rows = memory_rows(settings, python, layout, b, scratch)
                    report("\n".join(format_memory_row(row) for row in rows))
                    results["memory"] += rows
            parts.append(format_memory_table(results["memory"]))
        if "time" in settings.sections:
            for layout in settings.layouts:
                row = time_row(settings, python, layout, scratch)
                report(format_time_row(row))
                results["time"].append(row)
            parts.append(format_time_table(settings, results["time"]))
            parts += [row["profile"] for row in results["time"] if "profile" in row]
    text = "\n\n".join(parts)
    publish(text, settings, report)
    return results


# --- the peers' environments and commands ----------------------------------------------


def maxtext_python(venv):
    """``venv``'s python, the venv created by ``recipes/peers/maxtext_venv.sh`` when missing."""
    return peer_python(venv, "maxtext_venv.sh", "MaxText")


def peer_python(venv, script_name, peer):
    """``venv``'s python, the venv created by ``recipes/peers/<script_name>`` when missing."""
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(python):
        return python
    script = os.path.join(RECIPES, script_name)
    python312 = find_python312()
    if not os.path.exists(script) or python312 is None:
        raise PeerSetupError(
            f"no {peer} virtual environment at {venv!r} and cannot create one: "
            + (f"{script} is missing" if not os.path.exists(script) else "no Python 3.12 found ($PYTHON312, "
               "python3.12 on PATH, pyenv's versions)")
            + f"; pass --{'maxtext' if peer == 'MaxText' else 'keras-hub'}-venv DIR of an existing one"
        )  # fmt: skip
    done = subprocess.run(
        ["bash", script, venv], env=dict(os.environ, PYTHON312=python312), capture_output=True, text=True
    )
    if done.returncode or not os.path.exists(python):
        tail = "\n".join(done.stderr.strip().splitlines()[-10:])
        raise PeerSetupError(f"creating {peer}'s virtual environment at {venv!r} failed ({script}):\n{tail}")
    return python


def find_python312():
    """A Python 3.12 that runs (MaxText 0.2.5's): ``$PYTHON312``, ``python3.12`` on PATH
    (a pyenv shim there runs only where pyenv selects a 3.12), pyenv's 3.12 installs; None."""
    candidates = [os.environ.get("PYTHON312"), shutil.which("python3.12")]
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(os.path.join(pyenv_root, "versions", "3.12*", "bin", "python3.12")), reverse=True)
    for candidate in filter(None, candidates):
        check = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
        )
        if check.returncode == 0 and check.stdout.strip() == "(3, 12)":
            return candidate
    return None


def worker_env(pythonpath=None, profile_folder=None):
    """8 simulated CPU devices, Keras on JAX; ``pythonpath`` put first on the path; with a
    ``profile_folder``, XLA also writes the train step's optimised HLO to its ``hlo/``."""
    flags = [f"--xla_force_host_platform_device_count={DEVICES}"]
    if profile_folder:
        hlo = os.path.join(profile_folder, "hlo")
        flags += [f"--xla_dump_to={hlo}", "--xla_dump_hlo_as_text", "--xla_dump_hlo_module_re=.*train_step.*"]
    env = dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu", KERAS_BACKEND="jax")
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH")) if p)
    return env


def zoo_command(settings, mode, spec):
    return [settings.zoo_python or sys.executable, "-m", "zoo.bench._peers_zoo", mode, json.dumps(spec)]


def maxtext_command(python, mode, spec):
    return [python, os.path.join(RECIPES, "maxtext_worker.py"), mode, json.dumps(spec)]


# the peers' layouts a scanned zoo GPT runs under (all of fsdp, tp and fsdp+tp)
SCAN_LAYOUTS = tuple(layout for layout in PEERS_LAYOUTS if layout in choices.SCANNED_LAYOUTS)


def zoo_options(settings, layout=None):
    """The zoo settings passed through (those a user changes from the default);
    ``scan_layers`` only under the layouts that take it (None: every option asked for)."""
    options = {}
    if settings.loss_chunk_size is not None:
        options["loss_chunk_size"] = settings.loss_chunk_size
    if settings.scan_layers and (layout is None or layout in SCAN_LAYOUTS):
        options["scan_layers"] = True
    return options


def maxtext_overrides(model, layout, per_device_batch, length, scratch, scan_layers=True):
    """MaxText ``base.yml`` overrides building ``model`` (``GPTBackbone`` arguments) under ``layout``."""
    return [
        f"run_name=peers_{layout.replace('+', '_')}",
        f"base_output_directory={scratch}",
        "hardware=cpu",
        "skip_jax_distributed_system=true",
        "dataset_type=synthetic",
        "enable_checkpointing=false",
        "attention=dot_product",
        f"base_emb_dim={model['hidden_dim']}",
        f"base_num_decoder_layers={model['num_layers']}",
        f"base_num_query_heads={model['num_query_heads']}",
        f"base_num_kv_heads={model['num_key_value_heads']}",
        f"head_dim={model['head_dim']}",
        f"base_mlp_dim={model['intermediate_dim']}",
        f"vocab_size={model['vocabulary_size']}",
        f"max_target_length={length}",
        f"logits_via_embedding={str(bool(model.get('tie_word_embeddings'))).lower()}",
        f"rope_max_timescale={int(model.get('rope_max_wavelength', 10000))}",
        "remat_policy=full",
        "dtype=bfloat16",
        "weight_dtype=float32",
        f"per_device_batch_size={per_device_batch}",
        f"scan_layers={str(scan_layers).lower()}",
        *MAXTEXT_MESH[layout],
    ]


# --- memory, bytes and FLOPs: compile-only --------------------------------------------


def memory_rows(settings, python, layout, per_device_batch, scratch):
    """Row dicts for (layout, b): the zoo's, MaxText's (and MaxText unrolled); counts checked."""
    from zoo.models.gpt.gpt_configs import config_by_name

    config = dict(
        config_name=MEMORY_CONFIG,
        layout=layout,
        mesh=ZOO_MESH[layout],
        batch_size=DEVICES * per_device_batch,
        sequence_length=MEMORY_LENGTH,
        remat="full",
        precision=PRECISION,
        **zoo_options(settings, layout),
    )
    spec = {"config": config, "devices": DEVICES}
    zoo = run_worker("zoo", zoo_command(settings, "compile", spec), worker_env(REPOSITORY))
    rows = [zoo_memory_row(zoo, layout, per_device_batch)]
    scans = (True, False) if settings.maxtext_unscanned else (True,)
    for scan in scans:
        overrides = maxtext_overrides(
            config_by_name(MEMORY_CONFIG), layout, per_device_batch, MEMORY_LENGTH, scratch, scan
        )
        rows.append(maxtext_memory_row(python, overrides, layout, per_device_batch, scan, scratch))
        check_parameters(rows[0]["parameters"], rows[-1]["parameters"], f"{MEMORY_CONFIG} under {layout}")
    if settings.keras_hub_venv and layout in KERAS_HUB_LAYOUTS:
        rows.append(keras_hub_memory_row(settings.keras_hub_venv, layout, per_device_batch))
        check_parameters(rows[0]["parameters"], rows[-1]["parameters"], f"keras-hub's Llama under {layout}")
    return rows


KERAS_HUB_LAYOUTS = (FSDP_TP,)  # LlamaBackbone.get_layout_map splits every weight over model and data


def keras_hub_memory_row(venv, layout, per_device_batch):
    """keras-hub's ``LlamaBackbone`` of the same sizes under its own layout map, compiled by
    the zoo's ``compile_fit_step`` in keras-hub's environment (``keras_hub_worker.py``).
    No remat: ``keras.RematScope(mode="full")`` fails inside keras-hub 0.32's
    ``LlamaAttention`` (its ``training`` arrives as a traced bool)."""
    from zoo.models.gpt.gpt_configs import config_by_name

    spec = dict(
        model=config_by_name(MEMORY_CONFIG),
        mesh=ZOO_MESH[layout],
        batch=DEVICES * per_device_batch,
        sequence_length=MEMORY_LENGTH,
        precision=PRECISION,
        remat=None,
    )
    command = [peer_python(venv, "keras_hub_venv.sh", "keras-hub"), os.path.join(RECIPES, "keras_hub_worker.py")]
    result = run_worker("keras-hub", [*command, "compile", json.dumps(spec)], worker_env(REPOSITORY))
    return memory_row(
        "keras-hub (no remat)", layout, ZOO_MESH[layout], per_device_batch, result,
        result["memory"], _sent_per_axis(result["collectives"]), result["flops"], result["compile_s"],
    )  # fmt: skip


def zoo_memory_row(result, layout, per_device_batch):
    step = result["plan"]["step"]
    row = memory_row(
        "zoo", layout, step["mesh"], per_device_batch, result,
        step["memory"], _sent_per_axis(step["collectives"]), step["flops"], step["compile_s"],
    )  # fmt: skip
    return row | {"notes": tuple(result["plan"].get("notes", ()))}  # the plan's caveats (JAX 0.10: remat unseen)


def memory_row(side, layout, mesh, per_device_batch, result, memory, sent, flops, compile_s):
    """One side's row of the memory table; ``memory``: the compiler's argument, output,
    alias and temp bytes per device; ``result``: the worker's reply (parameters, jax)."""
    return dict(
        side=side,
        layout=layout,
        mesh=mesh,
        per_device_batch=per_device_batch,
        parameters=result["parameters"],
        argument=memory["argument"],
        temp=memory["temp"],
        peak=memory["argument"] + memory["output"] - memory["alias"] + memory["temp"],
        sent=sent,
        flops=flops,
        compile_s=compile_s,
        jax=result["jax"],
    )


def _sent_per_axis(collectives):
    """{"data": bytes, "model": ..., "data,model": ...} sent per device per step from
    ``CommsReport.per_axis()`` rows."""
    sent = {}
    for row in collectives:
        if row["axes"]:
            key = ",".join(row["axes"])
            sent[key] = sent.get(key, 0.0) + row["sent_bytes"]
    return sent


def maxtext_memory_row(python, overrides, layout, per_device_batch, scan, scratch):
    hlo = os.path.join(scratch, "maxtext.hlo.txt")
    spec = {"overrides": overrides, "hlo": hlo, "compiler_options": COMPILER_OPTIONS}
    result = run_worker("MaxText", maxtext_command(python, "compile", spec), worker_env())
    with open(hlo) as handle:
        text = handle.read()
    os.unlink(hlo)
    mesh = result["mesh"]
    return memory_row(
        "MaxText" + ("" if scan else " scan_layers=false"), layout, maxtext_mesh_text(mesh), per_device_batch, result,
        result["memory"], sent_per_zoo_axis(text, mesh), result["flops"] + _loop_flops(text), result["compile_s"],
    )  # fmt: skip


class NamedMesh:
    """Axis names and sizes of a mesh (all ``zoo.measure.hlo`` needs to name replica groups:
    their ids are positions in the mesh, whatever the devices' own ids)."""

    def __init__(self, axis_names, axis_sizes):
        self.axis_names, self.shape = tuple(axis_names), tuple(axis_sizes)


def sent_per_zoo_axis(hlo_text, mesh):
    """``{"data": bytes, "model": ..., "data,model": ...}`` one device sends per step, from
    the HLO of a program partitioned for ``mesh`` (``{"axis_names", "axis_sizes"}``, a peer's
    own axis names), read by the zoo's parser and named in the zoo's words (``ZOO_AXIS``)."""
    from zoo.measure.hlo import parse_collectives

    sent = {}
    for op in parse_collectives(hlo_text, NamedMesh(mesh["axis_names"], mesh["axis_sizes"])):
        words = sorted({ZOO_AXIS.get(axis, axis) for axis in op.axes or ()}, key=_axis_order)
        if words:
            key = ",".join(words)
            sent[key] = sent.get(key, 0.0) + op.sent_bytes * op.executions
    return sent


def _axis_order(word):
    return ("data", "model").index(word) if word in ("data", "model") else 2


def maxtext_mesh_text(mesh):
    """``"fsdp=8"``: the axes of size > 1, MaxText's names."""
    return ",".join(f"{n}={s}" for n, s in zip(mesh["axis_names"], mesh["axis_sizes"]) if s > 1)


def _loop_flops(hlo_text):
    from zoo.measure.hlo import loop_multiplicities
    from zoo.planning.measure import loop_dot_flops

    return loop_dot_flops(hlo_text, loop_multiplicities(hlo_text)[0])


# --- step time: interleaved -------------------------------------------------------------


def time_row(settings, python, layout, scratch):
    """Row dict of the timing model under ``layout``: medians per step and their ratios."""
    spec = dict(
        model=TIMING_MODEL,
        layout=layout,
        mesh=ZOO_MESH[layout],
        batch=TIMING_BATCH,
        sequence_length=TIMING_MODEL["max_sequence_length"],
        precision=PRECISION,
        loss_chunk_size=settings.loss_chunk_size,
    )
    if zoo_options(settings, layout).get("scan_layers"):
        spec["model"] = dict(TIMING_MODEL, scan_layers=True)
    overrides = maxtext_overrides(
        TIMING_MODEL, layout, TIMING_BATCH // DEVICES, TIMING_MODEL["max_sequence_length"], scratch
    )
    folders = {side: profile_folder(settings, layout, side) for side in ("zoo", "MaxText")}
    workers = [
        Worker("zoo", zoo_command(settings, "serve", spec), worker_env(REPOSITORY, folders["zoo"])),
        Worker(
            "MaxText", maxtext_command(python, "serve", {"overrides": overrides}), worker_env(None, folders["MaxText"])
        ),
    ]
    try:
        counts = [worker.wait_ready()["parameters"] for worker in workers]
        check_parameters(*counts, "the timing model under " + layout)
        times = interleave(workers, settings.steps, settings.repeats)
        if settings.profile:  # after the timed runs, so tracing never touches them
            for worker in workers:
                worker.profile(os.path.join(folders[worker.name], "trace"))
    finally:
        for worker in workers:
            worker.close()
    row = dict(layout=layout, parameters=counts[0], **step_medians(times, settings.steps))
    if settings.profile:
        row["profile"] = step_profile.format_profiles(layout, {side: side_profile(f) for side, f in folders.items()})
    return row


def profile_folder(settings, layout, side):
    """``DIR/<layout>/<side>`` of ``--profile DIR`` (None without it): the worker's XLA dump
    (``hlo/``) and profiler trace (``trace/``)."""
    return os.path.join(settings.profile, layout, side) if settings.profile else None


def side_profile(folder):
    """``step_profile.StepProfile`` of one side's profiled step (``profile_folder``)."""
    times = step_profile.thunk_times(os.path.join(folder, "trace"))
    return step_profile.step_profile(times, step_profile.find_hlo(os.path.join(folder, "hlo")), DEVICES)


def step_medians(times, steps):
    """``{"zoo_wall", "maxtext_wall", "zoo_cpu", "maxtext_cpu", "wall_ratio", "cpu_ratio"}``:
    medians of seconds per step over the runs (``times``: ``interleave``'s), ratios zoo / MaxText."""
    medians = {}
    for name, key in (("zoo", "zoo"), ("MaxText", "maxtext")):
        medians[f"{key}_wall"] = statistics.median(wall for wall, _ in times[name]) / steps
        medians[f"{key}_cpu"] = statistics.median(cpu for _, cpu in times[name]) / steps
    medians["wall_ratio"] = medians["zoo_wall"] / medians["maxtext_wall"]
    medians["cpu_ratio"] = medians["zoo_cpu"] / medians["maxtext_cpu"]
    return medians


# --- the report --------------------------------------------------------------------------


def header(settings):
    options = ", ".join(f"{k}={v}" for k, v in zoo_options(settings).items()) or "the defaults"
    if settings.scan_layers:
        options += f" (scan_layers under {', '.join(SCAN_LAYOUTS)} only)"
    return (
        f"{DEVICES} simulated CPU devices. zoo options: {options} (remat full, {PRECISION}, AdamW + global-norm clip, "
        "as `zoo train gpt` compiles). MaxText 0.2.5: base.yml with the same sizes, remat_policy=full, "
        "dtype=bfloat16 weight_dtype=float32, attention=dot_product, its AdamW + clip. MaxText's mesh axes in the "
        "zoo's words: fsdp and data -> data, tensor -> model."
    )
