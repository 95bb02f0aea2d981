"""This installation's identity (issue 25 item 8; docs/restore.md "Names on a shared store").

One row (``id`` = 1) holding a tag drawn at random when the schema is created: the names a
restore or a restore test creates on a metadata store (``duckgres_restore_<tag>_op<id>``,
``duckgres_restore_test_<tag>_op<id>``) carry it, so two installations sharing a store never
take, or sweep, each other's — even when their config stores have the same host, port and
database name (the tag used to be derived from those, so two such installations collided).

``previous_tag`` is the address-derived tag an installation used before the row existed
(empty for a new installation): operations created before ``created_at`` keep their names
under it, and the restore test's sweep still recognises leftovers named with it.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

TAG_PATTERN = r"^[0-9a-f]{12}$"


class Installation(models.Model):
    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    tag = models.TextField()
    previous_tag = models.TextField(default="", blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "duckgres_installation"
        constraints = [
            models.CheckConstraint(condition=models.Q(id=1), name="installation_one_row"),
            models.CheckConstraint(
                condition=models.Q(tag__regex=TAG_PATTERN), name="installation_tag_hex12"
            ),
        ]

    def __str__(self) -> str:
        return f"installation {self.tag}"
