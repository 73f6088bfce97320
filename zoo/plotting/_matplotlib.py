"""matplotlib, imported when a chart is drawn (never at import time), on the Agg backend."""

import os

PLOT_INSTALL = 'pip install "keras-zoo[plot]"'


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display); an ImportError
    saying how to install it when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(f"drawing charts needs matplotlib: {PLOT_INSTALL}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(figure, output):
    """Write ``figure`` to ``output`` (a PNG; its folder is created) and close it; returns ``output``."""
    plt = pyplot()
    folder = os.path.dirname(os.path.abspath(output))
    os.makedirs(folder, exist_ok=True)
    figure.tight_layout()
    figure.savefig(output, dpi=100, format="png")
    plt.close(figure)
    return output
