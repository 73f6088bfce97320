#!/usr/bin/env bash
# maxtext_venv.sh [VENV]: MaxText 0.2.5 from PyPI in its own Python 3.12 virtual environment
# (default ./maxtext-venv), installed --no-deps plus the packages its pre-training imports
# ask for (its full requirements pin a GPU/TPU stack). Never a test dependency of the zoo.
set -euo pipefail
venv=${1:-maxtext-venv}
python=${PYTHON312:-python3.12}
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --no-deps maxtext==0.2.5
"$venv/bin/pip" install --quiet jax flax optax orbax-checkpoint absl-py omegaconf pydantic tensorboardx \
    sentencepiece tiktoken jaxtyping etils ml-collections numpy pathwaysutils jinja2 aqtp qwix tokamax \
    huggingface_hub transformers grain drjax pillow sympy
"$venv/bin/python" -c "import maxtext.trainers.pre_train.train, jax; print('MaxText 0.2.5 on JAX', jax.__version__)"
