"""The zoo's vocabulary: choice tuples and the settings schema (pure Python: no Keras, no JAX).

Everything here is imported by the command line before it decides to load anything
heavy, so ``zoo --help`` answers without JAX. Nothing here imports another zoo package.
"""
