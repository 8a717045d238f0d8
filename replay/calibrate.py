"""``kvtune calibrate``'s API, kept at its old import path: the code is in the :mod:`replay.calibration` package
(probes, engine timing, loss, solvers, fit, profile files, CLI), re-exported here."""

from replay.calibration import *  # noqa: F401,F403
from replay.calibration import __all__  # noqa: F401
