"""Control: what acts on operations from above the runner (docs/architecture.md "Reshard by role").

``launch`` (the launch task's service), ``janitor`` (the leader-only reconciler), ``drains`` (store
drains through ordinary operations), ``recovery`` (operator recovery of a force-failed
operation), ``metrics`` and ``worker`` (the control worker's exporter and start-up). Above the
start, the kinds, the launchers and the runner; imported only by the Celery face and the faces.
"""
