"""User-facing jobs (train, verify) callable in-process; ``zoo.cli`` only parses flags."""
