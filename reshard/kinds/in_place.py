"""The in-place restore: a backup restored into a sibling database on the store the warehouse
is on (docs/restore.md "Onto the current store"; the steps' own text is
``reshard.runner.steps.inplace``).

A restore (``RestoreKind``) whose ``cutover`` renders the login role and the sibling instead of
a tenant on another store, whose restore writes as that login role, whose cleanup gives the
tenant role LOGIN back after the drop of the replaced catalog (a roll-forward too), whose
rollback drops the sibling and gives LOGIN back only once the binding names the source, and
whose takeover at ``cleaning_up`` runs the cleanup again.
"""

from __future__ import annotations

from duckgres_admin.models import OpKind
from reshard.kinds.restore import RestoreKind
from reshard.runner import binding
from reshard.runner.env import StepEnv
from reshard.runner.steps import inplace, restoring


class InPlaceRestoreKind(RestoreKind):
    def after_source_drop(self, env: StepEnv) -> None:
        inplace.open_tenant(env)

    def rollback_target(self, env: StepEnv) -> bool | None:
        return inplace.drop_sibling(env)

    def may_give_source_login(self, env: StepEnv) -> bool:
        # One role, two catalogs: never LOGIN while the binding may name the sibling.
        return binding.names_source(env.op)


IN_PLACE_RESTORE = InPlaceRestoreKind(
    key=(OpKind.RESTORE.value, True, "offline"),
    label="in-place restore",
    where="in place",
    overrides={**restoring.step_functions(inplace.RESTORE_TARGET), "cutover": inplace.run_cutover},
    reruns_cleanup_on_takeover=True,
    source_role_after_drop="logs in again to the restored catalog next",
)
