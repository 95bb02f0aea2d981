"""Warehouses: the rules and writes of a warehouse row and its metadata store (spec reshard
§2.3, §5.5).

``rules`` (guarded columns, binding fields, binding validation: below every writer),
``writes`` (the API's warehouse and store writes), ``binding_catalog`` (a repoint's catalog
check), ``selectors`` (reads), ``vetting`` (host denylist and secret references), ``store_tls``
(explicit weaker-sslmode opt-ins) and ``drain_guard`` (a store being drained takes no new
warehouse).
"""
