from zoo.models.cnn.small_cnn import SmallCNN

__all__ = ["SmallCNN"]
