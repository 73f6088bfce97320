"""The ``zoo`` command: thin argument parsing over ``zoo.training`` and ``zoo.bench``."""
