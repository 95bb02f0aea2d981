"""Refresh a pool's desired configuration (spec trino-pools §4.4 step 1, §6.1, invariant 10).

Invariants:

- **One read, one snapshot.** Each call reads exactly one ConfigMap, the pool's own
  ``<prefix>-<public id>`` (``TrinoSettings.configmap_name``), in
  ``DUCKGRES_TRINO_POOL_CONFIG_NAMESPACE`` or else the cell's namespace. The registry (key
  ``DUCKGRES_TRINO_POOL_CONFIG_REGISTRY_KEY``) and the blueprint (key = basename of the
  ``blueprint_file`` of this pool's entry *in that same registry*) both come from that read,
  so a tick never combines a registry and a blueprint from two versions of the map. Pools
  never read each other's maps.
- **Missing configuration is never "desired zero".** Every failure — the map or a key is
  missing or unreadable, the registry in the map is invalid, the pool vanished from it, the
  map resolves this pool to a different one, the blueprint is invalid or targets another
  namespace — returns a ``Desired`` with ``frozen_reason`` set and ``blueprint`` ``None``.
  This function never raises for bad configuration.
- **Bounded.** The read has a 10 s budget (the client call timeout).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from duckgres_admin.lib import k8s
from trino_pools.blueprint import Blueprint, BlueprintError, parse_blueprint
from trino_pools.config import TrinoSettings
from trino_pools.registry import Cell, RegistryError, parse_registry

READ_BUDGET_SECONDS = 10.0
UNREADABLE = "desired configuration is unreadable: "


@dataclass(frozen=True)
class Desired:
    """This tick's desired configuration of one pool, or why the pool is frozen.

    ``cell`` is this pool's entry in the ConfigMap's registry when it could be resolved, else
    the process's own cell. ``blueprint`` is set iff ``frozen_reason`` is empty.
    """

    cell: Cell
    blueprint: Blueprint | None
    frozen_reason: str = ""
    source: str = ""

    @property
    def frozen(self) -> bool:
        return bool(self.frozen_reason)


def config_map_location(settings: TrinoSettings, cell: Cell) -> tuple[str, str]:
    """(namespace, name) of the pool's own ConfigMap."""
    return settings.config_namespace or cell.namespace, settings.configmap_name(cell)


def _same_pool(process_cell: Cell, map_cell: Cell) -> str:
    """Why ``map_cell`` names a different pool than ``process_cell`` ('' when it does not)."""
    for attribute, what in (
        ("stored_id", "stored id"),
        ("namespace", "namespace"),
        ("routing_group", "routing group"),
    ):
        ours, theirs = getattr(process_cell, attribute), getattr(map_cell, attribute)
        if ours != theirs:
            return (
                f"desired configuration names a different pool: {what} {theirs!r} in the "
                f"ConfigMap, {ours!r} in this process's registry (adding, removing or "
                "re-pointing pools needs a restart with the new registry)"
            )
    return ""


def read_desired(settings: TrinoSettings, cell: Cell) -> Desired:
    namespace, name = config_map_location(settings, cell)
    where = f"ConfigMap {namespace}/{name}"
    try:
        config_map = k8s.read_config_map(namespace, name, timeout=READ_BUDGET_SECONDS)
    except k8s.KubeError as exc:
        return Desired(cell, None, f"{UNREADABLE}{where}: {exc}", where)
    data = config_map.get("data") or {}
    registry_key = settings.config_registry_key
    registry_text = data.get(registry_key)
    if not isinstance(registry_text, str):
        return Desired(
            cell,
            None,
            f"{UNREADABLE}{where} has no key {registry_key!r} (the registry); add it",
            where,
        )
    try:
        cells = parse_registry(registry_text, f"{where} key {registry_key}")
    except RegistryError as exc:
        reason = f"{UNREADABLE}{'; '.join(exc.problems)}"
        return Desired(cell, None, reason, where)
    map_cell = next((c for c in cells if c.id == cell.id), None)
    if map_cell is None:
        reason = f"pool {cell.id} vanished from the desired registry ({where} key {registry_key})"
        return Desired(cell, None, reason, where)
    different = _same_pool(cell, map_cell)
    if different:
        return Desired(cell, None, different, where)
    blueprint_key = os.path.basename(map_cell.pool.blueprint_file)
    blueprint_text = data.get(blueprint_key)
    if not isinstance(blueprint_text, str):
        return Desired(
            map_cell,
            None,
            f"{UNREADABLE}{where} has no key {blueprint_key!r} (the blueprint of pool "
            f"{cell.id}); add it",
            where,
        )
    try:
        blueprint = parse_blueprint(
            blueprint_text, source=f"{where} key {blueprint_key}", cell_namespace=map_cell.namespace
        )
    except BlueprintError as exc:
        return Desired(map_cell, None, str(exc), where)
    return Desired(map_cell, blueprint, "", where)
