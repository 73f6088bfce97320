"""A recipe as a plan request: its job, its settings, its target's devices and kind."""

import dataclasses

from zoo.planning.plan import PlanRequest

__all__ = ["DEFAULT_DEVICES", "request_from_recipe"]

DEFAULT_DEVICES = {"gpu": "h100", "tpu": "tpu-v5e", "cpu": "cpu"}  # [target] device left out


def request_from_recipe(recipe, *, devices=None, device=None, device_memory_gib=None, depth="auto"):
    """``PlanRequest`` for ``recipe`` on its ``[target]`` (``devices``/``device``/memory override it)."""
    target = recipe.target
    return PlanRequest(
        job=recipe.job.name,
        config=dataclasses.asdict(recipe.job_config()),
        devices=devices or target.devices,
        device=device or target.device or DEFAULT_DEVICES[target.platform],
        device_memory_gib=device_memory_gib or target.device_memory_gib,
        hosts=target.hosts,
        depth=depth,
        label=str(recipe.path),
    )
