"""URL configuration: the admin, the API under /api/v1/ and the OpenAPI schema."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("duckgres_admin.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
]
