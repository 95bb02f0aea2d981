"""``duckgres``: the command-line client of the Duckgres Admin API (docs/cli.md).

It talks to the API only over HTTP (``duckgres_admin.cli.client``); it never reads the config
store or Django settings. Exit codes: 0 ok, 1 the API refused (4xx), 2 usage, 3 transport or
5xx, 4 a followed operation ended failed or cancelled, 5 the API does not offer the command's
route yet, 6 ``follow``'s deadline passed with the operation still active.
"""

from __future__ import annotations

import sys

from duckgres_admin.cli import store as _store  # noqa: F401  (registers the ``store`` group)
from duckgres_admin.cli.app import cli
from duckgres_admin.cli.client import EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    """The console script (``[project.scripts] duckgres``)."""
    import click

    try:
        result = cli.main(args=argv, prog_name="duckgres", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.UsageError as exc:
        exc.show()
        return EXIT_USAGE
    except click.Abort:
        click.echo("aborted", err=True)
        return EXIT_USAGE
    except click.ClickException as exc:
        exc.show()
        return int(exc.exit_code)
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
