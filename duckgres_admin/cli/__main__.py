"""``python -m duckgres_admin.cli``: the ``duckgres`` console script without installing it."""

import sys

from duckgres_admin.cli import main

sys.exit(main())
