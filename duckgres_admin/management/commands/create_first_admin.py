"""``manage.py create_first_admin --username U --email E --password-stdin``: the first superuser.

Run in the API's own pod (``kubectl exec -i deploy/duckgres-admin-api -- …``), so it always
runs the image and the settings the installation runs; the password comes on standard input,
never in an argument, an environment variable or a Secret of its own (docs/kubernetes.md step 5).

Refused, naming the fix and changing nothing: a username that exists (this never resets a
password; manage users in the admin), an empty password, one Django's password validators
reject, and a password that is not one line.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError, transaction

MAX_PASSWORD_BYTES = 4096


def read_password(stream: TextIO) -> str:
    """One line from ``stream``, its line end removed; anything after it is an error."""
    raw = stream.read(MAX_PASSWORD_BYTES + 1)
    if len(raw) > MAX_PASSWORD_BYTES:
        raise CommandError(f"the password on standard input is over {MAX_PASSWORD_BYTES} bytes")
    password = raw[:-1] if raw.endswith("\n") else raw
    password = password[:-1] if password.endswith("\r") else password
    if "\n" in password or "\r" in password:
        raise CommandError("the password on standard input must be one line")
    if not password:
        raise CommandError("no password on standard input: pipe it in, e.g. < ./admin-password")
    return password


class Command(BaseCommand):
    help = "Create the first superuser; the password is read from standard input."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", required=True)
        parser.add_argument("--email", required=True)
        parser.add_argument(
            "--password-stdin",
            action="store_true",
            required=True,
            help="read the password from standard input (the only way it is accepted)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        username = str(options["username"]).strip()
        email = str(options["email"]).strip()
        if not username:
            raise CommandError("--username is empty: name the first admin")
        model = get_user_model()
        if model.objects.filter(**{model.USERNAME_FIELD: username}).exists():
            raise CommandError(
                f"user {username!r} already exists: this command never changes an existing "
                "user's password; manage users in the admin"
            )
        password = read_password(sys.stdin)
        candidate = model(**{model.USERNAME_FIELD: username, "email": email})
        try:
            validate_password(password, candidate)
        except ValidationError as exc:
            raise CommandError("the password is refused: " + " ".join(exc.messages)) from None
        try:
            with transaction.atomic():
                model.objects.create_superuser(username, email, password)
        except IntegrityError:
            raise CommandError(
                f"user {username!r} already exists (created meanwhile): nothing was changed"
            ) from None
        self.stdout.write(f"first admin {username} created; log in at /admin/")
