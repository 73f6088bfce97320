"""Plans from compiled programs: will a training step fit a target, how fast, and which layout to pick.

``make_plan(PlanRequest(...))`` compiles (never runs) the exact step ``model.fit`` runs
for a target's device count and kind and reports per-device memory, collectives and a
roofline step time (docs/planning.md). ``zoo plan`` is its command line.
``zoo.planning.comms`` is ``zoo comms``' work: every collective of one compiled step (a
tensor-parallel MLP block, or ``SmallCNN`` under a layout) with its bytes.
"""

from zoo.measure.hardware import DEVICES, DeviceSpec, UnknownDeviceError, device_spec
from zoo.planning.plan import Plan, PlanRequest, make_plan, plan_in_process
from zoo.planning.report import format_plan, verdict

__all__ = [
    "DEVICES",
    "DeviceSpec",
    "Plan",
    "PlanRequest",
    "UnknownDeviceError",
    "device_spec",
    "format_plan",
    "make_plan",
    "plan_in_process",
    "verdict",
]
