"""Platform metrics that belong to no domain: Celery task outcomes and queue depth, and webhook
deliveries given up (docs/monitoring.md "Platform metrics"). The API's per-route request
metrics come from django-prometheus's middleware (``settings.MIDDLEWARE``)."""
