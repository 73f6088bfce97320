"""``zoo bench plan`` (zoo.bench.plan): one recipe planned (in this process: it has the recipe's 8 devices), the table."""

from zoo.bench.plan import run_benchmark
from zoo.config.bench_settings import PlanBenchSettings


def test_a_recipe_row_is_planned_and_tabled(tmp_path):
    output = tmp_path / "plan.md"
    settings = PlanBenchSettings(sections=("recipes",), recipes="recipes/cpu-sim-8/train_cnn.toml", output=str(output))
    results = run_benchmark(settings, report=lambda *_: None)
    (row,) = results["recipes"]
    plan = row["plan"]
    assert plan.fits and plan.step.mesh == "data=2,model=4" and plan.compiled_depths == () and row["seconds"] > 0
    table = output.read_text().splitlines()
    assert table[0] == "### zoo plan on every recipe"
    assert (
        table[4].startswith("| recipes/cpu-sim-8/train_cnn.toml | model data=2,model=4 | 8 x cpu | 0.00 / ")
        and " | yes | " in table[4]
    )
    assert table[4].endswith(" | whole | " + f"{row['seconds']:.0f} |")
