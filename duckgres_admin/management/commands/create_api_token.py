"""``manage.py create_api_token USERNAME [--days N]``: a personal API token (docs/api.md).

The token is printed once, alone on stdout (for ``> file`` or a password manager); the config
store keeps only its SHA-512 digest (django-rest-knox), so it cannot be shown again. It
authenticates as USERNAME with that person's operator role, exactly as their session would, and
expires after ``--days`` (default ``DUCKGRES_API_TOKEN_TTL_DAYS``). Revoke it by deleting its row
in the Django admin (Knox > Auth tokens); deactivating the user refuses all their tokens.

Refused, naming the fix: an unknown user, an inactive one, one without ``is_staff`` (the API
answers 403 to a non-staff user's token, so such a token would be useless).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from knox.models import AuthToken

MAX_DAYS = 3650


class Command(BaseCommand):
    help = "Create a personal API token for a staff user and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", help="the Django username of the token's owner")
        parser.add_argument(
            "--days",
            type=int,
            default=None,
            help="lifetime in days (default DUCKGRES_API_TOKEN_TTL_DAYS)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["days"]
        if days is None:
            days = int(settings.DUCKGRES_API_TOKEN_TTL_DAYS)
        if not 1 <= days <= MAX_DAYS:
            raise CommandError(f"--days must be between 1 and {MAX_DAYS}, not {days}")
        username = str(options["username"])
        model = get_user_model()
        user = model.objects.filter(**{model.USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(
                f"no user {username!r}: create it first (manage.py createsuperuser or the admin)"
            )
        if not user.is_active:
            raise CommandError(f"user {username!r} is inactive: activate it in the admin first")
        if not user.is_staff:
            raise CommandError(
                f"user {username!r} is not staff: the API refuses non-staff users; set "
                "is_staff in the admin first"
            )
        row, token = AuthToken.objects.create(user=user, expiry=timedelta(days=days))
        self.stderr.write(
            f"token for {username} (expires {row.expiry:%Y-%m-%d %H:%M} UTC); shown only now:"
        )
        self.stdout.write(token)
