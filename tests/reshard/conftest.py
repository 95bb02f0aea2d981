"""Fixtures of the reshard tests. Runner fixtures live in ``tests/fixtures/runner.py``."""

from tests.fixtures.runner import claimed_env, cnpg_world, runner_state_dir

__all__ = ["claimed_env", "cnpg_world", "runner_state_dir"]
