"""``zoo plan`` of a model whose blocks differ by a periodic pattern (Gemma 2's 1:1 and Gemma
3's 5:1 local/global layers): the two reduced depths hold whole periods, so extrapolating
from them adds what the model's own blocks add (before, gemma2_2b / gemma3_1b failed:
"sliding_window_layers [0, 2, ...] must list block indices in 0..0").

A CPU-sized Gemma-2-style GPT (``GEMMA_TINY``, put into ``GPT_CONFIGS`` for the test)
planned in this process on its 8 simulated devices; the real configs' depth arithmetic
needs no compile. The real gemma2_2b / gemma3_1b / gemma3_4b plans are in docs/planning.md.
"""

import pytest

from zoo.cli import main as cli
from zoo.models.gpt import GPT_CONFIGS
from zoo.planning import PlanRequest, make_plan
from zoo.planning._depth import depth_unit
from zoo.training.recipes import JOBS

GEMMA = {key: GPT_CONFIGS["gemma2_2b"][key] for key in ("mlp", "norm", "post_norms", "scale_embeddings", "head_dim")}
# 10 blocks, local (W = 8 < T = 32) on the even ones, as gemma2_2b: compiled at 2 and 4 blocks
GEMMA_TINY = GEMMA | dict(
    vocabulary_size=256, num_layers=10, num_query_heads=4, num_key_value_heads=2, head_dim=8, hidden_dim=32,
    intermediate_dim=64, max_sequence_length=64, tie_word_embeddings=True, attention_logit_softcap=50.0,
    sliding_window=8, sliding_window_layers=[0, 2, 4, 6, 8],
)  # fmt: skip
FLAGS = ["--device", "cpu", "--layout", "fsdp", "--batch-size", "8", "--sequence-length", "32"]


@pytest.fixture
def gemma_tiny(monkeypatch):
    monkeypatch.setitem(GPT_CONFIGS, "gemma_tiny", GEMMA_TINY)
    return "gemma_tiny"


def test_zoo_plan_of_a_gemma_pattern_compiles_whole_periods(gemma_tiny, capsys):
    assert cli.main(["plan", "--config-name", gemma_tiny, *FLAGS]) == 0
    out = capsys.readouterr().out
    assert "10 blocks (extrapolated from 2 and 4 blocks)" in out
    assert "note: 2 and 4 blocks are whole periods of the 1:1 local/global pattern (2 blocks)" in out


@pytest.mark.parametrize(
    ("name", "period", "depths"), [("gemma2_2b", 2, (2, 4)), ("gemma3_1b", 6, (6, 12)), ("gemma3_4b", 6, (6, 12))]
)
def test_the_real_configs_compile_whole_periods_and_refuse_a_depth_that_cuts_one(name, period, depths):
    from zoo.planning._depth import depths_to_compile

    job = JOBS["pretrain_gpt"]
    settings = job.load()[1](config_name=name)
    request = PlanRequest("pretrain_gpt", {"config_name": name}, devices=8)
    stages, found, unit, why = depth_unit(request, job, settings)
    assert (stages, found, unit) == (1, period, period)
    assert depths_to_compile(request, GPT_CONFIGS[name]["num_layers"], False, unit=unit, why=why) == depths
    with pytest.raises(ValueError, match=rf"depth 3: compile at {2 * period}\.\.\d+ blocks a multiple of {period} "):
        make_plan(PlanRequest("pretrain_gpt", {"config_name": name}, devices=8, depth=3))  # refused before compiling


def test_a_pattern_with_no_period_is_compiled_whole(monkeypatch):
    aperiodic = GEMMA_TINY | dict(sliding_window_layers=[6, 7, 8, 9])  # Qwen2's max_window_layers 6
    monkeypatch.setitem(GPT_CONFIGS, "qwen2_tiny", aperiodic)
    with pytest.raises(ValueError, match="per-layer pattern .* repeats no period"):
        make_plan(PlanRequest("pretrain_gpt", {"config_name": "qwen2_tiny"}, devices=8, depth=4))
    request = PlanRequest("pretrain_gpt", {"config_name": "qwen2_tiny"}, devices=8)
    job = JOBS["pretrain_gpt"]
    assert depth_unit(request, job, job.load()[1](config_name="qwen2_tiny"))[1:3] == (None, 1)


def test_the_search_leaves_the_pipeline_out_for_local_and_global_blocks():
    """``zoo plan --auto``: a pipeline stacks identical blocks, which Gemma's local and global
    ones are not (the backbone refuses it); gemma3_1b cut to 2 blocks, both local, pipelines."""
    from zoo.planning.search import candidates

    def layouts(**config):
        request = PlanRequest("pretrain_gpt", dict(batch_size=32, sequence_length=128) | config, devices=8)
        return {candidate.layout for candidate in candidates(request)}

    assert "pipeline" not in layouts(config_name="gemma2_2b") and "fsdp" in layouts(config_name="gemma2_2b")
    assert "pipeline" in layouts(config_name="gemma3_1b", num_layers=2)
