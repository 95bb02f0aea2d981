"""API routes under /api/v1/ (spec reshard §5)."""

from django.urls import URLPattern, URLResolver

urlpatterns: list[URLPattern | URLResolver] = []
