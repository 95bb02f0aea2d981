"""Fixtures of the reshard tests. Runner fixtures live in ``tests/fixtures/runner.py``, the
pod launcher's Kubernetes seam (``kube``) in ``tests/fixtures/kube.py``."""

from tests.fixtures.kube import kube
from tests.fixtures.runner import claimed_env, cnpg_world, runner_state_dir

__all__ = ["claimed_env", "cnpg_world", "kube", "runner_state_dir"]
