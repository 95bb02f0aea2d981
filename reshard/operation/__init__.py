"""What every layer of the reshard domain may know about an operation row: its stamped step
names and sequences (``sequences``), the one ownership rule (``ownership``) and direct op-log
appends (``oplog``). Imports nothing else of the domain.
"""
