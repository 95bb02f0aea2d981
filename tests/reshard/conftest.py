"""Fixtures of the reshard tests. Runner fixtures live in ``runner_fixtures.py``."""

from tests.reshard.runner_fixtures import cnpg_world, runner_state_dir

__all__ = ["cnpg_world", "runner_state_dir"]
