"""Runner launchers (spec reshard §4.13): one interface, pod and local-process implementations."""

from __future__ import annotations

from django.conf import settings

from reshard.launchers.base import Launcher, LauncherError, RunnerObject, RunnerStatus


def get_launcher(kind: str | None = None) -> Launcher:
    """The launcher for ``kind`` (an op's ``launcher`` column), default from settings."""
    kind = kind or settings.DUCKGRES_RESHARD_LAUNCHER
    if kind == "local":
        from reshard.launchers.local import LocalLauncher

        return LocalLauncher()
    if kind == "pod":
        from reshard.launchers.pod import PodLauncher

        return PodLauncher()
    raise LauncherError(f"unknown launcher {kind!r}")


__all__ = ["Launcher", "LauncherError", "RunnerObject", "RunnerStatus", "get_launcher"]
