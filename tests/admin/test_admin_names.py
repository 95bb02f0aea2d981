"""The admin's index and sidebar name every registered model with a correct plural
("Reshard log entries", never "Reshard log entrys"): ``verbose_name``/``verbose_name_plural``
on the models (migration 0009)."""

from __future__ import annotations

import re

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model

pytestmark = pytest.mark.django_db

EXPECTED = {
    "auth": ["Groups", "Users"],
    "duckgres_admin": [
        "Audit records",
        "Connection leases",
        "Leases",
        "Metadata stores",
        "Operators",
        "Reshard log entries",
        "Reshard operations",
        "Reshard step timings",
        "Store drains",
        "Trino pool instances",
        "Trino pools",
        "Warehouse Trino rows",
        "Warehouses",
    ],
    "django_celery_beat": ["Clocked", "Crontabs", "Intervals", "Periodic tasks", "Solar events"],
    "knox": ["Auth tokens"],  # personal API tokens (docs/api.md "Personal tokens")
}
# A plural Django made by appending "s" to a word ending in consonant + "y".
BAD_PLURAL = re.compile(r"[^aeiou\W]ys\b", re.IGNORECASE)


@pytest.fixture
def superuser_client(client):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests")
    client.force_login(user)
    return client


def test_the_admin_index_and_sidebar_show_correct_plurals(superuser_client):
    response = superuser_client.get("/admin/")
    assert response.status_code == 200
    shown = {
        app["app_label"]: [m["name"] for m in app["models"]] for app in response.context["app_list"]
    }
    assert shown == EXPECTED
    html = response.content.decode()
    # The sidebar (nav_sidebar.html, on every admin page but the index) lists the same names.
    sidebar = superuser_client.get("/admin/duckgres_admin/reshardlogentry/").content.decode()
    assert 'id="nav-sidebar"' in sidebar
    for name in (n for names in EXPECTED.values() for n in names):
        assert f">{name}</a>" in html, name
        assert f">{name}</a>" in sidebar, name
    assert "entrys" not in html.lower()
    assert "entrys" not in sidebar.lower()


def test_no_model_has_a_consonant_y_plus_s_plural():
    models = {*admin.site._registry, *apps.get_app_config("duckgres_admin").get_models()}
    bad = sorted(
        f"{m._meta.label}: {m._meta.verbose_name_plural}"
        for m in models
        if BAD_PLURAL.search(str(m._meta.verbose_name_plural))
    )
    assert bad == []
    assert BAD_PLURAL.search("reshard log entrys")  # the rule catches the old name
