#!/usr/bin/env bash
# Run a recipe on every worker of a Cloud TPU slice at once (JAX's multi-controller model:
# the same command in every process; Cloud TPU tells JAX the coordinator and process ids).
# Needs on every worker: this checkout at ~/keras-zoo and `pip install -e ".[tpu]"`.
# Usage: bash recipes/tpu-multihost/launch.sh TPU_NAME ZONE [RECIPE] [--set section.key=value ...]
set -euo pipefail
tpu=${1:?usage: launch.sh TPU_NAME ZONE [RECIPE] [--set ...]}
zone=${2:?usage: launch.sh TPU_NAME ZONE [RECIPE] [--set ...]}
recipe=${3:-recipes/tpu-multihost/pretrain_gpt.toml}
shift $(( $# < 3 ? $# : 3 ))
gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all \
  --command "cd ~/keras-zoo && zoo recipe run $recipe $*"
