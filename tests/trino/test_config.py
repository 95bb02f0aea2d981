"""Startup validation of the Trino environment (spec trino-pools §4.1, §6.1; safeguards 3-6).

Every valid and invalid combination of spec §6.1's outcome table, with the exact error text.
``load`` is pure (environment mapping + local files), so these tests need no database.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.fixtures.manifests import one
from tests.trino.helpers import DSN, TOKEN, cell, full_env, registry, with_pool, write
from trino_pools import config
from trino_pools.config import ACCEPTED_BOOLEANS, BOOLEAN_VARIABLES, RETIRED_VARIABLES, load

NO_SA = "/nonexistent/serviceaccount/token"


def errors_of(env: dict[str, str]) -> list[str]:
    with pytest.raises(ImproperlyConfigured) as info:
        load(env, service_account_token=NO_SA)
    text = str(info.value)
    assert text.startswith("invalid Trino configuration:\n  - ")
    return text.split("\n  - ")[1:]


def test_unwired_environment_is_valid_and_off():
    loaded = load({}, service_account_token=NO_SA)
    assert not loaded.wired
    assert loaded.cells == ()
    assert loaded.operator_pools() == ()
    assert loaded.metrics_port == 9109


def test_full_operator_environment_is_valid(tmp_path):
    loaded = load(full_env(tmp_path), service_account_token=NO_SA)
    assert loaded.wired
    assert loaded.operator_enabled
    assert loaded.catalog_writer_enabled
    assert [c.stored_id for c in loaded.operator_pools()] == ["registered:pool-a"]
    assert loaded.default_stored_id == "registered:pool-a"
    assert loaded.configmap_name(loaded.cells[0]) == "duckgres-trino-pool-pool-a"
    # Secrets are validated but never kept.
    assert TOKEN not in repr(loaded)
    assert "pw-never-logged" not in repr(loaded)


@pytest.mark.safeguard("trino-6")
def test_pool_configured_operator_disabled_is_a_read_only_operator(tmp_path):
    env = full_env(
        tmp_path,
        DUCKGRES_TRINO_DEFAULT_CELL=None,
        DUCKGRES_TRINO_POOL_OPERATOR_ENABLED=None,
        DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED=None,
        DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE=None,
        DUCKGRES_TRINO_POOL_CATALOG_SCHEMA=None,
        DUCKGRES_TRINO_POOL_GATEWAY_URL=None,
        DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE=None,
    )
    loaded = load(env, service_account_token=NO_SA)
    assert loaded.wired
    assert not loaded.operator_enabled
    assert loaded.operator_pools() == ()  # exports no pool metrics, not even `configured`


@pytest.mark.safeguard("trino-4")
@pytest.mark.parametrize("name", sorted(RETIRED_VARIABLES))
def test_each_retired_variable_refuses_to_start_naming_it_and_its_step(tmp_path, name):
    value = "https://secret-looking-value.example.com:8443"
    found = errors_of(full_env(tmp_path, **{name: value}))
    assert found == [f"{name} is retired and must not be set: {RETIRED_VARIABLES[name]}"]
    assert value not in "\n".join(found)
    # Unwired processes refuse too: a mis-ordered deploy never comes up silently with Trino off.
    assert errors_of({name: value}) == found


def test_retired_messages_match_the_spec_table():
    assert RETIRED_VARIABLES == {
        "DUCKGRES_TRINO_COORDINATOR_URL": "declare the cell in DUCKGRES_TRINO_CELLS_FILE as a "
        "shared-pool cell with its client_url, then remove the variable",
        "DUCKGRES_TRINO_COORDINATOR_SERVER_NAME": "put the Gateway TLS name in "
        "DUCKGRES_TRINO_MANAGED_GATEWAY_SERVER_NAME, then remove the variable",
        "DUCKGRES_TRINO_CELL_ID": "cell ids come from the registry id; use "
        "DUCKGRES_TRINO_DEFAULT_CELL for default placement; remove the variable",
        "DUCKGRES_TRINO_NAMESPACE": "set the cell's namespace in the registry, then remove the "
        "variable",
        "DUCKGRES_TRINO_REGISTRY_ONLY": "the registry is the only mode; remove the variable",
    }


GATEWAY_USERNAME = "DUCKGRES_TRINO_MANAGED_GATEWAY_USERNAME"


@pytest.mark.safeguard("trino-47")
def test_the_gateway_username_is_refused_naming_the_setting_and_the_fix(tmp_path):
    """The Gateway protocol authenticates with the admin token only: a user name would be
    silently ignored, so setting one stops every process, wired or not."""
    value = "duckgres-admin-looks-like-a-login"
    expected = [
        f"{GATEWAY_USERNAME} is not supported and must not be set: the Gateway pooled-member "
        "protocol v1 has no user name: the shared-pool client authenticates with the admin "
        "token of DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE alone (docs/gateway-protocol.md §1); "
        "remove the variable"
    ]
    assert errors_of(full_env(tmp_path, **{GATEWAY_USERNAME: value})) == expected
    assert errors_of({GATEWAY_USERNAME: value}) == expected
    assert value not in "\n".join(expected)
    # Blank (a chart clearing the value first) starts, and nothing keeps a user name.
    loaded = load(full_env(tmp_path, **{GATEWAY_USERNAME: ""}), service_account_token=NO_SA)
    assert loaded.operator_enabled
    assert not any("username" in name for name in vars(loaded))


@pytest.mark.safeguard("trino-4")
def test_retired_variables_set_empty_start_and_older_names_only_warn(tmp_path):
    env = full_env(tmp_path, **dict.fromkeys(RETIRED_VARIABLES, ""))
    env["TRINO_MULTICELL_ENABLED"] = "true"
    env["DUCKGRES_TRINO_ADMIN_PASSWORD"] = "old-password-value"
    loaded = load(env, service_account_token=NO_SA)
    assert loaded.warnings == (
        "DUCKGRES_TRINO_ADMIN_PASSWORD is retired and ignored; remove it",
        "TRINO_MULTICELL_ENABLED is retired and ignored; remove it",
    )
    assert loaded.cells[0].stored_id == "registered:pool-a"


@pytest.mark.safeguard("trino-5")
@pytest.mark.parametrize("name", BOOLEAN_VARIABLES)
@pytest.mark.parametrize("value", ["yes", "ture", "on", " true", "TRUE "])
def test_an_unparsable_boolean_is_a_parse_error_naming_variable_and_value(tmp_path, name, value):
    found = errors_of(full_env(tmp_path, **{name: value}))
    assert found == [f"{name}: cannot parse {value!r} as a boolean (accepted: {ACCEPTED_BOOLEANS})"]
    assert not any("requires" in line for line in found)


@pytest.mark.safeguard("trino-5")
def test_parse_error_wins_over_the_default_cell_dependency(tmp_path):
    # The default cell depends on all three flags; an unparsable one is never "requires X".
    env = full_env(tmp_path, DUCKGRES_TRINO_POOL_OPERATOR_ENABLED="yes")
    assert errors_of(env) == [
        "DUCKGRES_TRINO_POOL_OPERATOR_ENABLED: cannot parse 'yes' as a boolean "
        "(accepted: 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False)"
    ]


@pytest.mark.parametrize("value", ["1", "t", "T", "TRUE", "true", "True"])
def test_every_accepted_true_spelling(tmp_path, value):
    env = full_env(
        tmp_path,
        DUCKGRES_TRINO_POOL_ENABLED=value,
        DUCKGRES_TRINO_POOL_OPERATOR_ENABLED=value,
        DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED=value,
    )
    assert load(env, service_account_token=NO_SA).operator_enabled


@pytest.mark.parametrize("value", ["0", "f", "F", "FALSE", "false", "False", ""])
def test_every_accepted_false_spelling(value):
    assert not load(
        {"DUCKGRES_TRINO_POOL_OPERATOR_ENABLED": value}, service_account_token=NO_SA
    ).operator_enabled


# (overrides applied to the full environment, the exact error lines)
INVALID = [
    pytest.param(
        {"DUCKGRES_TRINO_CELLS_FILE": None},
        ["DUCKGRES_TRINO_CELLS_FILE is required for Trino provisioning"],
        id="default-cell-without-cells-file",
        marks=pytest.mark.safeguard("trino-3"),
    ),
    pytest.param(
        {"DUCKGRES_TRINO_POOL_ENABLED": "false"},
        [
            "DUCKGRES_TRINO_CELLS_FILE: cell 'pool-a' declares shared-pool mode but "
            "DUCKGRES_TRINO_POOL_ENABLED is not enabled; set it to true or remove the cell",
            "DUCKGRES_TRINO_DEFAULT_CELL requires DUCKGRES_TRINO_POOL_ENABLED=true",
        ],
        id="pool-flag-off",
    ),
    pytest.param(
        {"DUCKGRES_TRINO_POOL_CONFIG_CONFIGMAP": None},
        [
            "DUCKGRES_TRINO_POOL_CONFIG_CONFIGMAP is required when a Trino pool is configured: "
            "set the name prefix of each pool's ConfigMap (<prefix>-<pool>)"
        ],
        id="configmap-prefix-missing",
    ),
    pytest.param(
        {"DUCKGRES_TRINO_POOL_CONFIG_CONFIGMAP": "Bad_Prefix"},
        [
            "DUCKGRES_TRINO_POOL_CONFIG_CONFIGMAP='Bad_Prefix': the ConfigMap name "
            "'Bad_Prefix-pool-a' of pool 'pool-a' is not a DNS-1123 subdomain (lowercase "
            "letters, digits, '-' and '.', at most 253 characters)"
        ],
        id="configmap-prefix-invalid",
    ),
    pytest.param(
        {"DUCKGRES_KUBE_API_URL": None},
        [
            "no Kubernetes client configuration for the Trino pools: set DUCKGRES_KUBE_API_URL "
            "or run in a pod with a service-account token"
        ],
        id="no-kube-client",
    ),
    pytest.param(
        {
            "DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED": "false",
            "DUCKGRES_TRINO_DEFAULT_CELL": None,
        },
        [
            "DUCKGRES_TRINO_POOL_OPERATOR_ENABLED requires "
            "DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED=true"
        ],
        id="operator-without-writer",
        marks=pytest.mark.safeguard("trino-6"),
    ),
    pytest.param(
        {"DUCKGRES_TRINO_POOL_GATEWAY_URL": None, "DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE": None},
        [
            "DUCKGRES_TRINO_POOL_OPERATOR_ENABLED requires DUCKGRES_TRINO_POOL_GATEWAY_URL "
            "(or DUCKGRES_TRINO_MANAGED_GATEWAY_URL)"
        ],
        id="operator-without-gateway",
        marks=pytest.mark.safeguard("trino-6"),
    ),
    pytest.param(
        {"DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE": None},
        [
            "DUCKGRES_TRINO_POOL_GATEWAY_URL requires DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE "
            "(the Gateway admin token file)"
        ],
        id="gateway-without-token",
    ),
    pytest.param(
        {"DUCKGRES_TRINO_POOL_GATEWAY_URL": "http://gateway.example.com"},
        [
            "DUCKGRES_TRINO_POOL_GATEWAY_URL must use https; use an https origin such as "
            "https://gateway.example.com[:port]"
        ],
        id="gateway-not-https",
    ),
    pytest.param(
        {"DUCKGRES_TRINO_POOL_GATEWAY_URL": "https://user:pw@gateway.example.com"},
        [
            "DUCKGRES_TRINO_POOL_GATEWAY_URL must not carry credentials; use an https origin "
            "such as https://gateway.example.com[:port]"
        ],
        id="gateway-with-credentials",
    ),
    pytest.param(
        {"DUCKGRES_TRINO_POOL_GATEWAY_URL": "https://gateway.example.com/v1"},
        [
            "DUCKGRES_TRINO_POOL_GATEWAY_URL must be an origin (no path, query or fragment); "
            "use an https origin such as https://gateway.example.com[:port]"
        ],
        id="gateway-with-path",
    ),
    pytest.param(
        {
            "DUCKGRES_TRINO_POOL_GATEWAY_URL": None,
            "DUCKGRES_TRINO_MANAGED_GATEWAY_URL": "https://gw.example.com?x",
        },
        [
            "DUCKGRES_TRINO_MANAGED_GATEWAY_URL must be an origin (no path, query or "
            "fragment); use an https origin such as https://gateway.example.com[:port]"
        ],
        id="managed-gateway-fallback-validated",
    ),
    pytest.param(
        {"DUCKGRES_TRINO_POOL_CATALOG_SCHEMA": None},
        ["DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED requires DUCKGRES_TRINO_POOL_CATALOG_SCHEMA"],
        id="writer-without-schema",
    ),
    pytest.param(
        {"DUCKGRES_TRINO_POOL_CATALOG_SCHEMA": "Public-Schema"},
        [
            "DUCKGRES_TRINO_POOL_CATALOG_SCHEMA='Public-Schema' is not a valid schema name "
            "(^[a-z_][a-z0-9_]{0,62}$)"
        ],
        id="writer-bad-schema",
    ),
    pytest.param(
        {"DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE": None},
        [
            "DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED requires "
            "DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE"
        ],
        id="writer-without-dsn",
    ),
    pytest.param(
        {"DUCKGRES_TRINO_DEFAULT_CELL": "pool-z"},
        [
            "DUCKGRES_TRINO_DEFAULT_CELL='pool-z' does not name a registered cell "
            "(registered: pool-a)"
        ],
        id="default-cell-unknown",
    ),
    pytest.param(
        {"DUCKGRES_TRINO_DEFAULT_CELL": "registered:pool-a"},
        [
            "DUCKGRES_TRINO_DEFAULT_CELL='registered:pool-a' does not name a registered cell "
            "(registered: pool-a)"
        ],
        id="default-cell-stored-form",
    ),
    pytest.param(
        {
            "DUCKGRES_TRINO_POOL_OPERATOR_ENABLED": "false",
            "DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED": "false",
        },
        [
            "DUCKGRES_TRINO_DEFAULT_CELL requires DUCKGRES_TRINO_POOL_OPERATOR_ENABLED=true",
            "DUCKGRES_TRINO_DEFAULT_CELL requires DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED=true",
        ],
        id="default-cell-needs-the-flags",
        marks=pytest.mark.safeguard("trino-7"),
    ),
    pytest.param(
        {"DUCKGRES_TRINO_POOL_PUBLISHER_IMAGE": "ghcr.io/x/publisher:latest"},
        [
            "DUCKGRES_TRINO_POOL_PUBLISHER_IMAGE='ghcr.io/x/publisher:latest' is not "
            "digest-pinned; use <image>@sha256:<64 hex>"
        ],
        id="publisher-image-not-pinned",
    ),
    pytest.param(
        {"DUCKGRES_TRINO_METRICS_PORT": "http"},
        ["DUCKGRES_TRINO_METRICS_PORT: 'http' is not a port number (0..65535)"],
        id="metrics-port",
    ),
    pytest.param(
        {"DUCKGRES_TRINO_HOGLAKE_NAMESPACE": "lake"},
        [
            "DUCKGRES_TRINO_MANAGED_HOGLAKE_URI is required when any managed Hoglake "
            "variable is set",
            "DUCKGRES_TRINO_HOGLAKE_DATA_PATH is required when any managed Hoglake variable is set",
        ],
        id="hoglake-partial",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), INVALID)
def test_invalid_combinations(tmp_path, overrides, expected):
    assert errors_of(full_env(tmp_path, **overrides)) == expected


@pytest.mark.safeguard("trino-7")
def test_default_cell_whose_pool_lacks_tenant_admission(tmp_path):
    cells = write(tmp_path, "c.json", registry(with_pool(cell(), tenant_admission=False)))
    assert errors_of(full_env(tmp_path, DUCKGRES_TRINO_CELLS_FILE=cells)) == [
        "DUCKGRES_TRINO_DEFAULT_CELL='pool-a' requires a registered shared-pool cell with "
        "tenant_admission enabled"
    ]


def test_registry_errors_are_startup_errors(tmp_path):
    cells = write(tmp_path, "c.json", registry(cell(backends=[])))
    found = errors_of(full_env(tmp_path, DUCKGRES_TRINO_CELLS_FILE=cells))
    assert found[0].startswith(
        f'DUCKGRES_TRINO_CELLS_FILE {cells!r}: $.cells[0].backends: unknown field "backends"'
    )


@pytest.mark.safeguard("trino-3")
def test_wiring_is_keyed_on_cells_file_or_default_cell(tmp_path):
    env = full_env(tmp_path, DUCKGRES_TRINO_DEFAULT_CELL=None)
    assert load(env, service_account_token=NO_SA).wired
    flags_only = {
        "DUCKGRES_TRINO_POOL_ENABLED": "true",
        "DUCKGRES_TRINO_POOL_OPERATOR_ENABLED": "true",
    }
    loaded = load(flags_only, service_account_token=NO_SA)
    assert not loaded.wired
    assert not loaded.operator_enabled
    assert loaded.warnings[0].startswith(
        "DUCKGRES_TRINO_POOL_ENABLED is true but Trino is not wired"
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("tok-9q8w7e", "the Gateway admin token in {path!r} is shorter than 32 characters"),
        ("x" * 40 + "\x01", "the Gateway admin token in {path!r} contains control characters"),
        ("x" * 5000, "{path!r} is larger than 4096 bytes"),
    ],
)
def test_token_file_problems_never_echo_the_token(tmp_path, content, expected):
    path = write(tmp_path, "tok", content)
    found = errors_of(full_env(tmp_path, DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE=path))
    assert found == ["DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE: " + expected.format(path=path)]
    if len(content) < 100:
        assert content not in found[0]


def test_unreadable_token_file(tmp_path):
    path = str(tmp_path / "missing")
    found = errors_of(full_env(tmp_path, DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE=path))
    assert found == [
        f"DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE: cannot read {path!r} (No such file or directory)"
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            "host=db user=x password=pw-secret-000",
            "{path!r} must hold a postgres:// or postgresql:// URL",
        ),
        ("x" * 9000, "{path!r} is larger than 8192 bytes"),
        (
            DSN + "&options=-c%20search_path%3Dpublic",
            "the DSN pins another search_path; remove it from the DSN "
            "(DUCKGRES_TRINO_POOL_CATALOG_SCHEMA=trino_catalogs is pinned by the writer)",
        ),
    ],
)
def test_dsn_file_problems_never_echo_the_dsn(tmp_path, content, expected):
    path = write(tmp_path, "dsn2", content)
    found = errors_of(full_env(tmp_path, DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE=path))
    assert found == ["DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE: " + expected.format(path=path)]
    assert "pw-secret-000" not in found[0]
    assert "pw-never-logged" not in found[0]


def test_dsn_pinning_the_same_schema_is_accepted(tmp_path):
    path = write(tmp_path, "dsn3", DSN + "&options=-c%20search_path%3Dtrino_catalogs")
    assert load(
        full_env(tmp_path, DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE=path),
        service_account_token=NO_SA,
    ).catalog_writer_enabled


def test_in_cluster_kube_configuration_counts(tmp_path):
    token = write(tmp_path, "sa-token", "token")
    env = full_env(
        tmp_path,
        DUCKGRES_KUBE_API_URL=None,
        KUBERNETES_SERVICE_HOST="10.0.0.1",
        KUBERNETES_SERVICE_PORT="443",
    )
    assert load(env, service_account_token=token).wired


def test_every_problem_is_reported_in_one_pass(tmp_path):
    env = full_env(
        tmp_path,
        DUCKGRES_TRINO_POOL_CONFIG_CONFIGMAP=None,
        DUCKGRES_TRINO_POOL_CATALOG_SCHEMA=None,
        DUCKGRES_TRINO_DEFAULT_CELL="pool-z",
    )
    assert len(errors_of(env)) == 3


def test_lenient_s3_max_connections():
    for raw, expected in (("", 50), ("abc", 50), ("-3", 50), ("7", 7)):
        assert load({"DUCKGRES_TRINO_S3_MAX_CONNECTIONS": raw}).s3_max_connections == expected


def test_validate_process_logs_warnings_once(caplog):
    config.install_for_tests(None)
    try:
        with caplog.at_level("WARNING", logger="duckgres.trino.config"):
            config.validate_process({"TRINO_SHARED_CATALOGS_ENABLED": "1"})
            config.validate_process({"TRINO_SHARED_CATALOGS_ENABLED": "1"})
        hits = [r for r in caplog.records if "TRINO_SHARED_CATALOGS_ENABLED" in r.getMessage()]
        assert len(hits) == 1
    finally:
        config.install_for_tests(None)


@pytest.mark.parametrize("as_file", [False, True])
def test_service_auth_secret_must_differ_from_the_shared_secrets(tmp_path, as_file):
    secret = "shared-secret-" + "s" * 40
    path = write(tmp_path, "svc", secret + "\n")
    shared = (
        {"DUCKGRES_DATAPLANE_SECRET_FILE": write(tmp_path, "dp", secret + "\n")}
        if as_file
        else {"DUCKGRES_DATAPLANE_SECRET": secret}
    )
    env = full_env(tmp_path, DUCKGRES_TRINO_SERVICE_AUTH_SECRET_FILE=path, **shared)
    assert errors_of(env) == [
        "DUCKGRES_TRINO_SERVICE_AUTH_SECRET_FILE must differ from DUCKGRES_DATAPLANE_SECRET"
    ]
    other = write(tmp_path, "svc2", "another-secret-" + "o" * 40)
    assert (
        load(
            full_env(tmp_path, DUCKGRES_TRINO_SERVICE_AUTH_SECRET_FILE=other, **shared),
            service_account_token=NO_SA,
        ).service_auth_secret_file
        == other
    )


def test_a_process_declared_without_kubernetes_access_needs_no_client_configuration(tmp_path):
    """Beat holds no token by design: with Trino wired it must still start (it never builds a
    Kubernetes client), while every other process keeps the fail-loud check."""
    env = full_env(tmp_path, DUCKGRES_KUBE_API_URL=None)
    assert errors_of(env) == [
        "no Kubernetes client configuration for the Trino pools: set DUCKGRES_KUBE_API_URL "
        "or run in a pod with a service-account token"
    ]
    loaded = load({**env, config.KUBE_ACCESS_VAR: "none"}, service_account_token=NO_SA)
    assert loaded.wired


def test_the_shipped_beat_declares_it_has_no_kubernetes_access_in_every_container():

    beat = one("Deployment", "duckgres-admin-beat")
    spec = beat["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        env = {e["name"]: e for e in container.get("env", [])}
        assert env[config.KUBE_ACCESS_VAR] == {"name": config.KUBE_ACCESS_VAR, "value": "none"}
