"""The GPU/TPU GPT recipes' fits, compiled in a fresh process (``tests/recipes/test_fit.py``):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.recipes._fit_worker PATH...

Prints one JSON line: ``[RecipeFit fields, steps as their block counts, ...]``. A fresh process with XLA's own flags: under the suite's, the
memory analysis shows remat only in part (tests/_remat.py says why), too little for the
remat recipes' budgets; these steps are compiled, never run, so the deadlock those flags
avoid cannot happen here.
"""

import dataclasses
import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")


def main(paths):
    from zoo.measure.comms_report import FAST_COMPILE
    from zoo.training.recipes import load_recipe
    from zoo.training.recipes._compile import recipe_fit

    fits = []
    for path in paths:
        fit = recipe_fit(load_recipe(path), num_layers=2, compiler_options=FAST_COMPILE)
        fields = {f.name: getattr(fit, f.name) for f in dataclasses.fields(fit) if f.name != "steps"}
        fits.append(dict(fields, steps=[step.num_layers for step in fit.steps]))
    print(json.dumps(fits))


if __name__ == "__main__":
    main(sys.argv[1:])
