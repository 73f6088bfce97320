"""Where a plan's step is compiled, and what that compiler can and cannot see.

A plan compiles in this process when it has the target's devices: simulated CPU devices
of the target's count, or accelerators of the target's own kind (``compiles_here``). An
accelerator's compiler lays out the step's memory as the chip will, but its cost analysis
does not see inside Pallas kernels, so such a plan takes its FLOPs and bytes from an
XLA:CPU compile of the same step (``with_simulated_cost``). Where XLA:CPU compiles a TPU's
step, its peak is XLA:CPU's, not the TPU compiler's, and the verdict says so (``compiler_caveat``); with the
optimizer's state in host memory a note says what a TPU's compiler did with it
(``host_state_note``).
"""

import dataclasses

from zoo.measure.hardware import device_spec, platform_of

__all__ = ["compiler_caveat", "compiles_here", "host_state_note", "with_simulated_cost"]


def compiles_here(request):
    """Whether this process has exactly ``request.devices`` devices that can compile its step:
    simulated CPU devices (any target), or accelerators of the target's own kind (a plan for
    one ``tpu-v5e`` made on a v5e chip is the TPU compiler's step, temporaries as it lays them
    out, not XLA:CPU's upper bound)."""
    import jax

    from zoo.measure.hardware import UnknownDeviceError, local_device

    if len(jax.devices()) != request.devices:
        return False
    if jax.default_backend() == "cpu":
        return True
    try:
        return local_device()[0] == device_spec(request.device).name
    except UnknownDeviceError:
        return False


def with_simulated_cost(device_plan, cpu_plan):
    """``device_plan`` (compiled by an accelerator's own compiler: its memory as that
    compiler lays the step out) with the FLOPs and bytes of ``cpu_plan``, the same request
    compiled on simulated CPU devices. An accelerator's cost analysis does not see inside
    Pallas kernels: on a TPU v5e it counted none of gpt_1b's attention FLOPs, and its
    roofline came out 34% under the measured step; XLA:CPU compiles the same attention as
    XLA ops and counts them (docs/planning.md)."""
    step = dataclasses.replace(device_plan.step, flops=cpu_plan.step.flops, bytes_accessed=cpu_plan.step.bytes_accessed)
    note = (
        "memory as this device's compiler lays the step out; FLOPs and bytes from an XLA:CPU compile of the same "
        "step (this device's cost analysis does not count inside Pallas kernels)"
    )
    return dataclasses.replace(device_plan, step=step, notes=(*device_plan.notes, note))


def compiler_caveat(device):
    """The verdict's qualifier where a TPU's step is compiled here by XLA:CPU: the TPU
    compiler schedules (and rematerialises) temporaries to fit its HBM, which XLA:CPU does
    not, and it pads small dimensions to its tiles: on a v5e chip gpt_1b's step needed
    about half the planned peak, a 70B QLoRA's on a v5e-8 1.56x (docs/planning.md)."""
    if not _xla_cpu_compiles_a_tpu_step(device):
        return ""
    return (
        "XLA:CPU's figure for a TPU: its compiler fits temporaries to HBM and pads to its tiles, 0.5x to 1.6x this "
        "so far; recipes/tpu-v5e-8/tpu_compile.py gets its own figure with no TPU, zoo bench step on the chip"
    )


def host_state_note(device, state_memory):
    """A note where XLA:CPU compiles a TPU's step with the optimizer state in host memory:
    XLA:CPU counts that state outside the device's peak, and a TPU v5e's compiler did not
    lower its step's footprint for it (docs/performance.md, "Sixth session"); else ""."""
    if state_memory != "host" or not _xla_cpu_compiles_a_tpu_step(device):
        return ""
    return (
        "the optimizer state in host memory is outside this peak as XLA:CPU compiles the step; on a TPU v5e the TPU "
        "compiler's footprint did not shrink for it (llama_3_2_1b full fine-tune: 15.56 GiB with the moments in host "
        "memory, 14.97 GiB on the device) and a step took 516 ms against 324: docs/performance.md"
    )


def _xla_cpu_compiles_a_tpu_step(device):
    """Whether a plan for ``device`` is a TPU's step compiled here, off a TPU, by XLA:CPU."""
    import jax

    return platform_of(device) == "tpu" and jax.default_backend() != "tpu"
