"""``python -m pysharp``: the ``pysharp`` command line."""

import sys

from .cli import main

sys.exit(main())
