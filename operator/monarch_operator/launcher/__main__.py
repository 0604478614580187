"""``python -m monarch_operator.launcher``: same as the ``monarch-launch`` console script."""

import sys

from monarch_operator.launcher.cli import main

sys.exit(main())
