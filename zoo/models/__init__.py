"""Zoo models; each family ships its own ``get_layout_map``."""

from zoo.models.cnn import SmallCNN

__all__ = ["SmallCNN"]
