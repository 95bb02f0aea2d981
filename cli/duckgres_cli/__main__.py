"""``python -m duckgres_cli``: the ``duckgres`` console script without installing it."""

import sys

from duckgres_cli import main

sys.exit(main())
