"""Where this JAX's XLA:CPU cannot show remat in its memory analysis (JAX 0.10), every
memory verdict says what its peak then is, at any depth: never a silent "fits"."""

import pytest

from zoo.measure.compiled_step import memory_analysis_reflects_remat
from zoo.planning import make_plan, verdict
from zoo.planning.plan import Plan, PlanRequest

CONFIG = {"config_name": "gpt_tiny", "num_layers": 2, "sequence_length": 32, "batch_size": 8}


@pytest.mark.parametrize("depth", ["auto", "full"])
def test_the_verdict_says_what_a_remat_peak_is(depth):
    plan = make_plan(PlanRequest("pretrain_gpt", {**CONFIG, "remat": "full"}, devices=8, device="cpu", depth=depth))
    line = verdict(plan)
    if memory_analysis_reflects_remat():
        assert plan.remat_caveat == "" and "remat" not in line, line
    else:
        assert "does not show remat='full'" in line and line.startswith(("fits", "does not fit")), line
        assert ("estimated" in line) == bool(plan.remat_correction), line  # corrected, or an upper bound
        assert any("does not show remat" in note for note in plan.notes), plan.notes
    assert Plan.from_dict(plan.to_dict()).remat_caveat == plan.remat_caveat  # crosses the subprocess boundary


def test_no_caveat_without_remat():
    plan = make_plan(PlanRequest("pretrain_gpt", {**CONFIG, "remat": "none"}, devices=8, device="cpu"))
    assert plan.remat_caveat == "" and "remat" not in verdict(plan)
