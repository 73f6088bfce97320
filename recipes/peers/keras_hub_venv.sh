#!/usr/bin/env bash
# keras_hub_venv.sh [VENV]: keras-hub in its own Python 3.12 virtual environment (default
# ./keras-hub-venv) for zoo bench peers --keras-hub-venv. keras-hub is installed --no-deps:
# its tensorflow-text requirement (its tokenizers only) would bring TensorFlow; the Llama
# layers need none of it. tensorflow-datasets is there because keras_hub_worker.py imports
# the zoo (its compile and HLO-reading code). Never a test dependency of the zoo.
set -euo pipefail
venv=${1:-keras-hub-venv}
python=${PYTHON312:-python3.12}
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --no-deps keras-hub
"$venv/bin/pip" install --quiet jax keras absl-py numpy packaging regex rich kagglehub sentencepiece tokenizers \
    tensorflow-datasets
"$venv/bin/python" -c "import keras_hub, jax; print('keras-hub', keras_hub.__version__, 'on JAX', jax.__version__)"
