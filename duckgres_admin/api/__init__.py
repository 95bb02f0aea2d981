"""The REST API (faces only: views parse, call one domain service and shape the answer; spec
reshard §5, trino-pools §5). One module of views per resource: ``reshard_views`` (operations,
restores), ``warehouse_views`` (warehouses, backups, restore tests), ``store_views``,
``lease_views`` (the data plane's hot path), ``drain_views``, ``trino_views``; what they share is
``base`` (the view classes, identity and audit) and ``common`` (schema shapes, paging)."""
