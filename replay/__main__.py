"""``python -m replay twin|replay|calibrate ...``"""

import sys

from replay.cli import main

sys.exit(main())
