"""User-facing jobs (train, verify, finetune, export) callable in-process; ``zoo.cli`` only
parses flags.

The jobs (``cnn``, ``gpt``, ``classifiers``, ``finetune``, ``lm_finetune``, ``export``) and what
every job shares sit at the top (``job_setup``, ``callbacks``, the checkpointed fit,
``interrupts``, ``paths``, ``saving``; the compiled fit step and MFU are ``zoo.measure``'s); beside them
``checkpoints/`` (Orbax checkpoints that resume exactly), ``lora/`` (adapters, their files,
PEFT's format), ``recipes/`` (recipe files read, checked, compiled and run) and ``logs/``
(what a run prints and writes).
"""
