"""Keras layers; the only package that calls ``shard_map``."""
