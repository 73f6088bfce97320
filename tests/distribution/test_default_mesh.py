"""Every layout's default mesh fits every named GPT config it applies to (8 devices), and a
default that does not fit the model shrinks its split axis until it does."""

import pytest

from zoo.config.choices import EXPERT_LAYOUTS, TRANSFORMER_LAYOUTS
from zoo.distribution import LayoutError, describe_mesh, distribution_for
from zoo.distribution.distributions import default_mesh_candidates
from zoo.models import GPTCausalLM
from zoo.models.gpt.gpt_configs import GPT_CONFIGS


def test_candidates_move_the_split_axis_to_data():
    assert default_mesh_candidates("expert", 8) == [
        "data=1,expert=8",
        "data=2,expert=4",
        "data=4,expert=2",
        "data=8,expert=1",
    ]
    assert default_mesh_candidates("tp", 8) == ["data=2,model=4", "data=4,model=2", "data=8,model=1"]
    assert default_mesh_candidates("fsdp", 8) == ["data=-1"]  # every device on data: nothing to fit


def test_the_issues_example_trains_without_a_mesh():
    """gpt_tiny_moe's 4 experts do not split over expert=8: data=2,expert=4 is the default."""
    config = GPTCausalLM.named_config("gpt_tiny_moe", "expert")
    distribution = distribution_for(GPTCausalLM, "expert", None, config=config)
    assert describe_mesh(distribution.device_mesh) == "data=2,expert=4"
    with pytest.raises(LayoutError, match="num_experts=4 is not divisible by the 'expert' mesh axis of size 8"):
        distribution_for(GPTCausalLM, "expert", "data=1,expert=8", config=config)  # a given mesh is kept


def test_every_layouts_default_mesh_fits_every_named_config():
    failures = []
    for name, entry in GPT_CONFIGS.items():
        for layout in TRANSFORMER_LAYOUTS:
            if layout in EXPERT_LAYOUTS and not entry.get("num_experts"):
                continue  # the expert layouts split experts: MoE configs only
            try:
                distribution_for(GPTCausalLM, layout, None, config=GPTCausalLM.named_config(name, layout))
            except (LayoutError, ValueError) as error:
                failures.append(f"{name} under {layout}: {error}")
    assert not failures, "\n".join(failures)
