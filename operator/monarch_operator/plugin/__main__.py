"""``python -m monarch_operator.plugin``: the same as ``kubectl monarch``."""

import sys

from monarch_operator.plugin.cli import main

sys.exit(main())
