"""``python -m replay twin|replay|calibrate ...``: the same commands as ``kvtune twin|replay|calibrate``."""

import sys

from optimizer.cli import main

sys.exit(main())
