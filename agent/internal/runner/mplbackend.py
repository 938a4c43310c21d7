# codemode's matplotlib backend, lent to user code through MPLBACKEND
# ("module://codemode_mpl") and PYTHONPATH. It draws with Agg, and its show()
# saves every open figure as a PNG into the workspace's outputs directory,
# as figure-N.png with the first N not taken, then closes them, so that
# plt.show() in a sandbox gives the run's caller an artifact where a desktop
# would open a window. The runner writes this file with OUTPUTS filled in.
import os

from matplotlib._pylab_helpers import Gcf
from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

OUTPUTS = {{OUTPUTS}}

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def _create(n):
    while True:
        path = os.path.join(OUTPUTS, "figure-%d.png" % n)
        try:
            return n, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            n += 1


def show(*args, **kwargs):
    managers = Gcf.get_all_fig_managers()
    if not managers:
        return
    os.makedirs(OUTPUTS, exist_ok=True)
    n = 1
    for manager in managers:
        n, fd = _create(n)
        with os.fdopen(fd, "wb") as f:
            manager.canvas.figure.savefig(f, format="png")
    Gcf.destroy_all()
