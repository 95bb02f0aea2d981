"""``python manage.py reshard_recover <id> [--execute] [--force]`` (spec reshard §4.16).

Thin: the logic is in ``reshard.control.recovery``. Without ``--execute`` it prints the durable
progress and the plan and changes nothing. Exit codes: 0 done (or plan printed), 1 refused (the
message says what to do), 2 the recovery claim was lost to a ``--force`` takeover, 3 the recovery
ended ``left_blocked`` (the warehouse stays ``resharding``; fix the cause and run it again).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from reshard.control import recovery
from reshard.runner.errors import Fenced

EXIT_REFUSED = 1
EXIT_FENCED = 2
EXIT_LEFT_BLOCKED = 3


class Command(BaseCommand):
    help = "Recover a force-failed reshard operation (dry run unless --execute)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("op_id", type=int)
        parser.add_argument(
            "--execute", action="store_true", help="claim the recovery and run the plan"
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help=f"take over a recovery claim older than {recovery.TAKEOVER_MINUTES} minutes",
        )
        parser.add_argument(
            "--as", dest="owner", default="", help="operator name recorded as recovery_owner"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        op_id = int(options["op_id"])
        try:
            op = recovery.check_preconditions(op_id)
            if not options["execute"]:
                for line in recovery.describe(op):
                    self.stdout.write(line)
                self.stdout.write("dry run: nothing changed; re-run with --execute to apply")
                return
            me = recovery.default_owner(options["owner"])
            result = recovery.execute(
                op_id, me, force=bool(options["force"]), echo=self.stdout.write
            )
        except recovery.RecoveryRefused as exc:
            raise CommandError(str(exc), returncode=EXIT_REFUSED) from None
        except Fenced:
            raise CommandError(recovery.FENCED_MESSAGE, returncode=EXIT_FENCED) from None
        if result.outcome == "left_blocked":
            raise CommandError(
                f"recovery left the warehouse blocked: {result.reason}; fix it and run "
                f"reshard_recover {op_id} --execute again",
                returncode=EXIT_LEFT_BLOCKED,
            )
