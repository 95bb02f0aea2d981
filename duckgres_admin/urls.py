"""URL configuration: the admin, the API under /api/v1/, the OpenAPI schema and probes."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from duckgres_admin.api.health import livez, readyz

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("duckgres_admin.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("livez", livez, name="livez"),
    path("readyz", readyz, name="readyz"),
]
