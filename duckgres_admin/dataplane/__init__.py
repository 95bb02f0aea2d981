"""The data plane's own path into the control plane: connection leases (``leases``), the
grant every Duckgres server asks for before it opens a tenant's catalog. A domain of its own:
it reads warehouses and stores and takes the per-org lock, and knows nothing of operations.
"""
