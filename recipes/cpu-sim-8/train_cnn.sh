#!/usr/bin/env bash
# Train the small CNN on 8 simulated CPU devices under each layout, then check parity.
# Usage: bash recipes/cpu-sim-8/train_cnn.sh [output-folder]
set -euo pipefail
out=${1:-runs/cpu-sim-8}
devices=8          # simulated CPU devices
epochs=5           # ~90% held-out accuracy on the shapes dataset at 32x32
for layout in "data data=8" "model data=2,model=4" "model data=1,model=8"; do
  set -- $layout
  zoo train cnn --simulate-devices "$devices" --layout "$1" --mesh "$2" \
    --epochs "$epochs" --output "$out/cnn-$1-${2//[=,]/_}.keras"
  zoo verify cnn --simulate-devices "$devices" --layout "$1" --mesh "$2"
done
