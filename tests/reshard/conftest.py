"""Fixtures of the reshard tests. Runner fixtures live in ``runner_fixtures.py``."""

from tests.reshard.runner_fixtures import claimed_env, cnpg_world, runner_state_dir

__all__ = ["claimed_env", "cnpg_world", "runner_state_dir"]
