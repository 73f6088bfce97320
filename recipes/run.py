#!/usr/bin/env python
"""Check or run a recipe: the same as ``zoo recipe check|run RECIPE``, usable from a checkout.

    python recipes/run.py check recipes/gpu-8/pretrain_gpt.toml
    python recipes/run.py run recipes/cpu-sim-8/pretrain_gpt.toml --set train.epochs=1

Everything happens in ``zoo.cli.recipe`` / ``zoo.training.recipes``; see recipes/README.md.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's zoo

from zoo.cli.recipe import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
