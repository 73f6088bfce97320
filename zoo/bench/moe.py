"""``zoo bench moe``: what the expert-parallel MoE moves, holds and costs, read from its own code path.

Exchange (section ``exchange``): a GPT whose every block is a Mixture-of-Experts block
(``MoEFeedForward``, E experts of width F, top k), built for real and compiled as
``fit`` compiles it (``compiled_step.compile_fit_step``: Keras' ``train_step``, state
donated) under layout ``expert`` on each mesh (``data=2,expert=4``, ``data=1,expert=8``)
and capacity factor (1.0, 1.25, dropless), remat none, FAST_COMPILE (the HLO passes
run; only LLVM's are skipped). From the compiled HLO (``comms_report``, loop trip
counts included): the all-to-alls over ``expert`` and the bytes each device sends in
them, against the analytic minimum ``4 x L x minimum_exchange_bytes`` (dispatch and
combine, forward and backward, per MoE block: N x k x C x itemsize x (E_p - 1) / E_p
each, N the tokens per device); the all-gathers of expert weights (any all-gather whose
buffer has an expert weight's (C, F) or (F, C) trailing dims, and any over ``expert``);
the all-reduces of expert gradients over ``data``. From the variables' shardings: the
expert weights each device holds against 1/E_p of the model's. The compiled step is then
run once on random tokens: the router statistics in its logs give the assignments the
capacity dropped and the busiest expert's load (the router at its initial weights).

Memory (section ``memory``): ``mixtral_8x7b`` (or another named MoE size) at real size,
built abstractly (``abstract_build``: nothing allocated) and its fit step compiled for
each ``<method>:<layout>:<mesh>`` run: ``lora`` (LoRA of rank r on every Dense /
EinsumDense but the routers: attention, LM head; the experts and the rest frozen) or ``full``
(every weight trained, AdamW), one sequence of T tokens per device of data x expert,
remat and precision as set, traced for the target device (``moe.compile_for``: an
H100's grouped matmul ``ragged_dot``, not XLA:CPU's block loop). Per device
(``memory_analysis``): arguments, temporaries, total = arguments + outputs - donated +
temporaries, against 80 GiB (H100); expert weights per device; the exchange's bytes per
all-to-all against the minimum. Rows of fewer blocks than the model has are flagged
partial; the whole depth is always compiled (the figure that counts).

Time (section ``time``, ``zoo.bench._moe_time``): on one device, the sparse layer's
forward + backward through each grouped matmul against the dense-masked computation
(every expert on every token, keras-hub's way), results checked equal, timed in turns.
"""

import jax

from zoo import distribution as zd
from zoo.bench._moe_common import batch_split, mesh_devices
from zoo.bench._moe_exchange import (  # noqa: F401 (the exchange section's parts, read by its tests)
    compile_exchange,
    exchange_rows,
    format_exchange,
    format_topology_exchange,
    measure_exchange,
    ragged_rows_sent,
    recorded_routing,
    routed_exchange_bytes,
)
from zoo.bench._moe_memory import format_memory, memory_rows, parse_run
from zoo.bench._moe_time import TimingMismatch, check_agreement, format_time, time_rows  # noqa: F401 (the time section)
from zoo.bench._output import publish
from zoo.config.bench_moe_settings import MOE_SECTIONS, MoEBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.distribution.axes import DATA, EXPERT
from zoo.measure.hardware import device_spec
from zoo.models.gpt.gpt_configs import config_by_name

# --- the command ----------------------------------------------------------------------


def check_settings(settings):
    """Refuse, before compiling anything, numbers the meshes, the model or the devices cannot take."""
    if not settings.sections or any(section not in MOE_SECTIONS for section in settings.sections):
        raise ValueError(f"sections must name some of {list(MOE_SECTIONS)}, got {settings.sections!r}")
    meshes = []
    if "exchange" in settings.sections:
        meshes += list(settings.meshes)
        for spec in settings.meshes:
            axes = dict(zd.parse_mesh_spec(spec))
            if set(axes) != {DATA, EXPERT} or min(axes.values()) < 1 or axes[EXPERT] < 2:
                raise ValueError(
                    f"mesh {spec!r}: the exchange rows run layout expert on a mesh 'data=D,expert=P' with P >= 2 (sizes given, no -1)"
                )
            if settings.num_experts % axes[EXPERT]:
                raise ValueError(
                    f"num_experts {settings.num_experts} is not divisible by the 'expert' axis of size {axes[EXPERT]} of mesh {spec!r}"
                )
            if settings.batch_size % batch_split(spec):
                raise ValueError(
                    f"batch_size {settings.batch_size} is not divisible by data x expert = {batch_split(spec)} of mesh {spec!r}"
                )
        if settings.num_experts_per_token > settings.num_experts:
            raise ValueError(
                f"num_experts_per_token {settings.num_experts_per_token} exceeds num_experts {settings.num_experts}"
            )
    if "memory" in settings.sections:
        model = config_by_name(settings.memory_config)
        if not model.get("num_experts"):
            raise ValueError(
                f"memory_config {settings.memory_config!r} has no experts (num_experts={model.get('num_experts')}); name a MoE size"
            )
        deeper = [n for n in settings.memory_partial_layers if n >= model["num_layers"]]
        if deeper:
            raise ValueError(
                f"memory_partial_layers {deeper} are not fewer than the {model['num_layers']} blocks of {settings.memory_config!r}"
            )
        device_spec(settings.memory_target)  # an unknown kind raises naming the known ones
        for run in settings.memory_runs:
            spec = parse_run(run)[2]
            if (
                dict(zd.parse_mesh_spec(spec)).get(EXPERT, 1) < 2
                or min(size for _, size in zd.parse_mesh_spec(spec)) < 1
            ):
                raise ValueError(
                    f"memory run {run!r}: its mesh needs an 'expert' axis of size >= 2, every size given (no -1)"
                )
            meshes.append(spec)
    if "time" in settings.sections and settings.time_experts_per_token > settings.time_experts:
        raise ValueError(
            f"time_experts_per_token {settings.time_experts_per_token} exceeds time_experts {settings.time_experts}"
        )
    needed = max((mesh_devices(spec) for spec in meshes), default=1)
    if needed > len(jax.devices()):
        raise ValueError(
            f"the meshes need {needed} devices but JAX has {len(jax.devices())}; run with --simulate-devices {needed}"
        )


def run_benchmark(settings, report=print):
    """The tables of ``settings.sections``, printed as markdown (``report``) and written to
    ``settings.output``. Returns ``{"exchange": [ExchangeRow], "memory": [MemoryRow], "time": [TimeRow]}``."""
    check_settings(settings)
    results, lines = {}, []
    if "exchange" in settings.sections:
        results["exchange"] = exchange_rows(settings, report)
        lines += format_exchange(settings, results["exchange"])
    if "memory" in settings.sections:
        results["memory"] = memory_rows(settings, report)
        lines += ([""] if lines else []) + format_memory(settings, results["memory"])
    if "time" in settings.sections:
        results["time"] = time_rows(settings, report)
        lines += ([""] if lines else []) + format_time(settings, results["time"])
    text = "\n".join(lines)
    publish(text, settings, report)
    return results
