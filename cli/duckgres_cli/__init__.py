"""``duckgres``: the command-line client of the Duckgres Admin API (docs/cli.md).

Its own distribution (``cli/pyproject.toml``, ``pip install ./cli``): it needs click and the
standard library, and imports neither Django, Celery nor any package of the control plane
(import-linter). It talks to the API only over HTTP (``duckgres_cli.client``); it never reads
the config store or Django settings. Exit codes: 0 ok, 1 the API refused (4xx), 2 usage,
3 transport or 5xx, 4 a followed operation ended failed or cancelled, 5 the API does not offer
the command's route yet, 6 ``follow``'s deadline passed with the operation still active.
"""

from __future__ import annotations

import sys

from duckgres_cli.version import __version__

__all__ = ["__version__", "main"]


def main(argv: list[str] | None = None) -> int:
    """The console script (``[project.scripts] duckgres``). The commands are imported here, not
    at package import: the control plane imports this package's transport and scrubber
    (``duckgres_cli.http``, ``duckgres_cli.scrub``) and needs none of click."""
    import click

    from duckgres_cli import store as _store  # noqa: F401  (registers the ``store`` group)
    from duckgres_cli.app import cli
    from duckgres_cli.errors import EXIT_USAGE

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
