"""Names of the mesh axes, in one place.

Mesh axes are the named dimensions of a ``keras.distribution.DeviceMesh``. Each model
family's layout map (a Keras ``LayoutMap``: variable-path regexes -> these names) says
which weight dimension splits over which axis; there are no logical axis names between
the two, so a layout changes in the family's layout map, not in model code.
"""

# Mesh axis names used by the built-in layouts (defined with the layout table, which names them).
from zoo.config.layouts import DATA, EXPERT, MODEL, SEQ, STAGE  # noqa: F401
