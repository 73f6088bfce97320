"""Names of mesh axes and logical axes, in one place.

Mesh axes are the named dimensions of a ``keras.distribution.DeviceMesh``. Logical
axes name what a tensor dimension *means*; rule tables (per model family) map them
to mesh axes, so a layout can be changed without touching model code.
"""

# Mesh axis names used by the built-in layouts.
DATA = "data"  # splits the batch: data parallelism
MODEL = "model"  # splits features / channels / heads: model (tensor) parallelism
SEQ = "seq"  # splits the sequence: context parallelism
STAGE = "stage"  # splits the stack of blocks: pipeline parallelism
EXPERT = "expert"  # splits the experts of Mixture-of-Experts layers (and the batch): expert parallelism

# Logical axis names for tensor dimensions.
BATCH = "batch"
SEQUENCE = "sequence"
HEADS = "heads"
EMBED = "embed"
MLP = "mlp"
VOCAB = "vocab"
CHANNELS = "channels"
