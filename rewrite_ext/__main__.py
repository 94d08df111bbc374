"""``python -m rewrite_ext``: the same as the ``rewrite-ext`` console script."""

import sys

from .cli import main

sys.exit(main())
