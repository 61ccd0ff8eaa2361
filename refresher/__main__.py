"""``python -m refresher``: the same as the ``refresher`` command."""

import sys

from refresher.ops._cli import main

sys.exit(main())
