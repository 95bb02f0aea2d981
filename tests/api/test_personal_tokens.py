"""Personal API tokens (django-rest-knox, docs/api.md "Personal tokens"): a token acts as its
person with their operator role, is audited by name (never as ``internal-secret``, never with the
token), is refused at once when revoked, expired or its user deactivated, never falls through to
a session, and is refused on the runner and data-plane routes."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from duckgres_admin.api import auth
from duckgres_admin.models import AuditRecord, Operator, ReshardLogEntry, ReshardOperation
from tests.fixtures.api import error
from tests.fixtures.rows import new_op, new_store, new_warehouse


def person(email: str, *, role: str | None, staff: bool = True, superuser: bool = False):
    user = get_user_model().objects.create_user(
        username=email, email=email, password=None, is_staff=staff, is_superuser=superuser
    )
    if role is not None:
        Operator.objects.create(email=email, role=role)
    return user


def make_token(username: str, *extra: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_token", username, *extra, stdout=out, stderr=err)
    token = out.getvalue().strip()
    assert token.startswith("dgadm_")
    assert len(token) == 6 + 64
    assert token not in err.getvalue()
    return token


def token_client(token: str, **kwargs) -> APIClient:
    client = APIClient(**kwargs)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def unauthenticated_count(reason: str) -> float:
    value = auth.UNAUTHENTICATED.labels(scope="operator", reason=reason)._value.get()
    return float(value)


@pytest.mark.safeguard("reshard-119")
def test_an_admin_token_starts_a_reshard_as_the_person(clients, published, cnpg_source):
    person("ops@example.com", role="admin")
    token = make_token("ops@example.com")
    client = token_client(token, enforce_csrf_checks=True)  # a token needs no CSRF token
    assert client.get("/api/v1/reshards").status_code == 200
    response = client.post(
        cnpg_source.path,
        {"target": {"type": "cnpg", "cnpg_shard": cnpg_source.target_store.name}},
        format="json",
    )
    assert response.status_code == 202, response.content
    op = ReshardOperation.objects.get()
    assert response.json()["created_by"] == "ops@example.com"
    audit = AuditRecord.objects.get(action="reshard.create")
    assert (audit.actor, audit.role, audit.source, audit.status) == (
        "ops@example.com",
        "admin",
        "personal-token",
        202,
    )
    assert not AuditRecord.objects.filter(actor="internal-secret").exists()
    line = ReshardLogEntry.objects.filter(operation_id=op.id).first()
    assert line is not None
    assert "created by ops@example.com" in line.message
    # The token itself is nowhere: not in an audit row, not on the op log.
    for row in AuditRecord.objects.all():
        assert token not in f"{row.actor} {row.source} {row.path} {row.detail}"
    for message in ReshardLogEntry.objects.values_list("message", flat=True):
        assert token not in message


@pytest.mark.safeguard("reshard-119")
def test_a_viewer_token_reads_but_cannot_write(clients):
    person("reader@example.com", role="viewer")
    client = token_client(make_token("reader@example.com"))
    for path in ("/api/v1/reshards", "/api/v1/warehouses", "/api/v1/metadata-stores"):
        assert client.get(path).status_code == 200, path
    assert client.get("/api/schema/", HTTP_ACCEPT="application/json").status_code == 200
    response = client.post("/api/v1/warehouses", {"org_id": "tok-org"}, format="json")
    assert response.status_code == 403
    assert error(response) == "admin role required"
    audit = AuditRecord.objects.get()
    assert (audit.actor, audit.role, audit.source, audit.status) == (
        "reader@example.com",
        "viewer",
        "personal-token",
        403,
    )
    # A staff user without an operator row is a viewer, as with a session.
    person("norow@example.com", role=None)
    response = token_client(make_token("norow@example.com")).post(
        "/api/v1/warehouses", {"org_id": "tok-org"}, format="json"
    )
    assert response.status_code == 403


@pytest.mark.safeguard("reshard-119")
def test_a_revoked_token_is_401_at_once_and_writes_nothing(clients):
    user = person("leaver@example.com", role="admin")
    token = make_token("leaver@example.com")
    kept = make_token("leaver@example.com")  # several tokens per person (laptop, CI job)
    client = token_client(token)
    assert client.get("/api/v1/reshards").status_code == 200
    assert AuthToken.objects.filter(user=user).count() == 2
    AuthToken.objects.get(token_key=token[:15], user=user).delete()
    before = unauthenticated_count("invalid_token")
    response = client.post("/api/v1/warehouses", {"org_id": "revoked"}, format="json")
    assert response.status_code == 401
    assert error(response) == "invalid credentials"
    assert unauthenticated_count("invalid_token") == before + 1
    assert not AuditRecord.objects.exists()  # proved nothing: nothing written
    # The other token of the same person still works.
    assert token_client(kept).get("/api/v1/reshards").status_code == 200


@pytest.mark.safeguard("reshard-119")
def test_expired_inactive_non_staff_and_disabled_tokens_are_refused(clients):
    user = person("old@example.com", role="admin")
    token = make_token("old@example.com", "--days", "1")
    client = token_client(token)
    assert client.get("/api/v1/reshards").status_code == 200
    row = AuthToken.objects.get(user=user)
    AuthToken.objects.filter(pk=row.pk).update(expiry=timezone.now() - timedelta(seconds=1))
    assert client.get("/api/v1/reshards").status_code == 401
    assert AuthToken.objects.filter(pk=row.pk).exists()  # checking a token deletes nothing

    user = person("inactive@example.com", role="admin")
    client = token_client(make_token("inactive@example.com"))
    assert client.get("/api/v1/reshards").status_code == 200
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    assert client.get("/api/v1/reshards").status_code == 401

    user = person("demoted@example.com", role="admin")
    client = token_client(make_token("demoted@example.com"))
    get_user_model().objects.filter(pk=user.pk).update(is_staff=False)
    response = client.get("/api/v1/reshards")
    assert response.status_code == 403
    assert error(response) == "staff user required"

    person("off@example.com", role="admin")
    client = token_client(make_token("off@example.com"))
    Operator.objects.filter(email="off@example.com").update(disabled=True)
    response = client.post("/api/v1/warehouses", {"org_id": "off"}, format="json")
    assert response.status_code == 403
    assert error(response) == "operator disabled"
    audit = AuditRecord.objects.get()  # proved who it is: audited by name
    assert (audit.actor, audit.source) == ("off@example.com", "personal-token")


@pytest.mark.safeguard("reshard-119")
def test_a_wrong_token_never_falls_through_to_the_session(clients):
    clients.admin.credentials(HTTP_AUTHORIZATION="Token dgadm_" + "0" * 64)
    response = clients.admin.get("/api/v1/reshards")
    assert response.status_code == 401
    assert error(response) == "invalid credentials"
    # Another scheme is not a personal token: the session still decides.
    clients.admin.credentials(HTTP_AUTHORIZATION="Basic dXNlcjpwYXNz")
    assert clients.admin.get("/api/v1/reshards").status_code == 200


@pytest.mark.safeguard("reshard-119")
@pytest.mark.parametrize(
    "value",
    ["", "dgadm_\x00abc", "two words", "x" * 129, "dgadm_ñ", "dgadm_" + "0" * 64 + "%00"],
)
def test_malformed_tokens_are_401_never_500(clients, value):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {value}")
    response = client.get("/api/v1/reshards")
    assert response.status_code == 401
    assert error(response) == "invalid credentials"


@pytest.mark.safeguard("reshard-119")
def test_a_token_is_refused_on_the_runner_and_lease_routes(clients):
    person("ops2@example.com", role="admin")
    client = token_client(make_token("ops2@example.com"))
    store = new_store(name="tok-store")
    warehouse = new_warehouse(
        org_id="tok-lease-org",
        store=store,
        metadata_store_database="d",
        metadata_store_user="u",
        metadata_store_password_ref="env:X",
    )
    op = new_op(warehouse, target_endpoint="h", target_port=5432, target_user="u")
    response = client.get(f"/api/v1/reshards/{op.id}/password")
    assert response.status_code == 403
    assert error(response) == "runner secret required"
    line = ReshardLogEntry.objects.get(operation_id=op.id)
    assert "a personal token" in line.message
    response = client.post(
        "/api/v1/warehouses/tok-lease-org/leases",
        {"holder": "h", "purpose": "query"},
        format="json",
    )
    assert response.status_code == 403
    assert error(response) == "data-plane secret required"
    # A wrong token there is also 403 (the answer never depends on its value).
    wrong = token_client("dgadm_" + "1" * 64)
    assert wrong.get(f"/api/v1/reshards/{op.id}/password").status_code == 403


@pytest.mark.safeguard("reshard-119")
def test_the_command_refuses_users_a_token_would_not_serve(db):
    person("nostaff@example.com", role="admin", staff=False)
    inactive = person("asleep@example.com", role="admin")
    get_user_model().objects.filter(pk=inactive.pk).update(is_active=False)
    person("fine@example.com", role="admin")
    cases = [
        (("ghost@example.com",), "no user 'ghost@example.com'"),
        (("nostaff@example.com",), "is not staff"),
        (("asleep@example.com",), "is inactive"),
        (("fine@example.com", "--days", "0"), "--days must be between 1 and 3650"),
    ]
    for args, message in cases:
        with pytest.raises(CommandError, match=message):
            call_command("create_api_token", *args, stdout=io.StringIO(), stderr=io.StringIO())
    assert not AuthToken.objects.exists()
    make_token("fine@example.com")
    row = AuthToken.objects.get()
    assert timedelta(days=89) < row.expiry - timezone.now() <= timedelta(days=90)


@pytest.mark.safeguard("reshard-119")
def test_tokens_are_created_and_revoked_in_the_admin(clients):
    from django.contrib.messages import get_messages

    root = get_user_model().objects.get(email="root@example.com")
    target = person("cli-user@example.com", role="admin")
    admin_client = APIClient()
    admin_client.force_login(root)
    form = admin_client.get("/admin/knox/authtoken/add/")
    assert form.status_code == 200
    assert form.context["adminform"].form.initial["expiry"] > timezone.now() + timedelta(days=89)
    # No expiry is not offered: a token that never expires cannot be made here.
    response = admin_client.post(
        "/admin/knox/authtoken/add/", {"user": target.pk, "expiry_0": "", "expiry_1": ""}
    )
    assert response.status_code == 200
    assert not AuthToken.objects.exists()
    expiry = timezone.now() + timedelta(days=7)
    response = admin_client.post(
        "/admin/knox/authtoken/add/",
        {
            "user": target.pk,
            "expiry_0": expiry.strftime("%Y-%m-%d"),
            "expiry_1": expiry.strftime("%H:%M:%S"),
        },
    )
    assert response.status_code == 302, response.content
    messages = [str(m) for m in get_messages(response.wsgi_request)]
    [token] = [m.removeprefix("TOKEN ") for m in messages if m.startswith("TOKEN ")]
    row = AuthToken.objects.get(user=target)
    assert row.digest != token
    assert token not in row.digest
    client = token_client(token)
    assert client.post("/api/v1/warehouses", {"org_id": "adm-tok"}, format="json").status_code == (
        201
    )
    assert AuditRecord.objects.get().actor == "cli-user@example.com"
    # The page after saving shows the token once (the message); after that the changelist names
    # it by its short key only.
    assert token in admin_client.get("/admin/knox/authtoken/").content.decode()
    listing = admin_client.get("/admin/knox/authtoken/").content.decode()
    assert row.token_key in listing
    assert token not in listing
    response = admin_client.post(f"/admin/knox/authtoken/{row.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert client.get("/api/v1/reshards").status_code == 401
