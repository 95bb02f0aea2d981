"""The strict pool blueprint (spec trino-pools §6.3): one pinned blueprint per pool.

Invariants this parser protects:

- **Strict, single document.** JSON ≤ 1 MiB; ``json.JSONDecoder().raw_decode`` followed by a
  whitespace-only remainder check (a second document is refused: ``trino_pools.strictjson``,
  shared with the registry); duplicate keys and unknown
  fields are refused at every level the blueprint itself defines (the pod templates'
  ``spec`` is Kubernetes' PodSpec: the rules of §6.3 are checked on it, the rest is the API
  server's business).
- **Instances are immutable and self-contained.** A valid blueprint carries everything an
  instance needs; the operator stores ``Blueprint.raw`` in the instance's snapshot and builds
  every Kubernetes object from that snapshot alone (``trino_pools.instantiate``).
- **The operator owns identity.** Pod templates cannot set a name, namespace, owner
  references, the instance/component labels or the injected environment variables, cannot
  use the host's network/PID/IPC namespaces or pin a node, and run exactly one main container
  with the release image; every image is digest-pinned.
- **An invalid blueprint freezes its pool; it never stops the process** (§1 invariant 1). A
  namespace that differs from the cell namespace is reported with its own message
  (``BlueprintError.namespace_mismatch``).

``digest`` is the SHA-256 (hex) of the canonical JSON encoding of the document
(``sort_keys=True``, separators ``(",", ":")``).

Decisions where the specification is silent (also in ``docs/trino-instances.md``):
every top-level field is required except ``shared_resources`` (whose two lists default to
empty); the 32-name cap counts both lists together; file contents may contain newlines, tabs
and carriage returns but no other control character; shared resource names may not look like
an instance object (``cell-<8 hex>…``), so instance deletion can never reach one; the volume
name ``trino-instance-config`` is reserved for the injected per-instance ConfigMap, whose files
are mounted one by one (``subPath``) at ``/etc/trino/<file>`` in the main container, so the
main container may not mount a volume at ``/etc/trino`` itself or at one of those file paths.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from duckgres_admin.lib import k8s
from trino_pools import strictjson

MAX_BLUEPRINT_BYTES = 1024 * 1024
MAX_FILE_BYTES = 256 * 1024
MAX_FILES_TOTAL_BYTES = 768 * 1024
MAX_SHARED_NAMES = 32
MAX_CONTAINERS = 8
MAX_WORKER_REPLICAS = 100
MAX_NAMESPACE_LENGTH = 63

# Labels the operator injects (spec §4.13); pod templates may not set them.
INSTANCE_LABEL = "posthog.com/trino-instance"
POOL_LABEL = "posthog.com/trino-pool"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "duckgres-trino-pool"
SPEC_DIGEST_ANNOTATION = "posthog.com/trino-spec-digest"
EPOCH_ANNOTATION = "posthog.com/trino-authority-epoch"
RELEASE_ANNOTATION = "posthog.com/trino-release-id"
CONFIG_VOLUME = "trino-instance-config"
CONFIG_MOUNT_PATH = "/etc/trino"
ROLES = ("coordinator", "worker")

RELEASE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}$")
DIGEST_PINNED_RE = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PORT_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
FILE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
INSTANCE_NAME_RE = re.compile(r"^cell-[0-9a-f]{8}($|-)")
_ALLOWED_CONTROL = frozenset("\n\t\r")

TOP_FIELDS = frozenset(
    {
        "blueprint_version",
        "generation",
        "release_id",
        "chart_version",
        "image",
        "namespace",
        "service_account_name",
        "coordinator",
        "worker",
        "config_files",
        "shared_resources",
        "identity_binding",
    }
)
REQUIRED_TOP = TOP_FIELDS - {"shared_resources"}
IDENTITY_FIELDS = (
    "instance_label",
    "component_label",
    "discovery_uri_env",
    "node_environment_env",
    "instance_id_env",
    "coordinator_http_port_name",
    "coordinator_container_name",
    "worker_container_name",
)


class BlueprintError(ValueError):
    """The blueprint cannot be used; the pool freezes with ``str(error)`` as its reason."""

    def __init__(self, source: str, problems: list[str], *, namespace_mismatch: bool = False):
        self.source = source
        self.problems = problems
        self.namespace_mismatch = namespace_mismatch
        if namespace_mismatch and len(problems) == 1:
            super().__init__(problems[0])
        else:
            listing = "; ".join(problems)
            super().__init__(f"invalid Trino blueprint {source}: {listing}")


@dataclass(frozen=True)
class IdentityBinding:
    instance_label: str
    component_label: str
    discovery_uri_env: str
    node_environment_env: str
    instance_id_env: str
    coordinator_http_port_name: str
    coordinator_container_name: str
    worker_container_name: str

    def main_container(self, role: str) -> str:
        return (
            self.coordinator_container_name if role == "coordinator" else self.worker_container_name
        )

    @property
    def injected_env(self) -> tuple[str, str, str]:
        return (self.discovery_uri_env, self.node_environment_env, self.instance_id_env)


@dataclass(frozen=True, eq=False)
class Blueprint:
    """A validated blueprint. ``raw`` is the parsed document; treat it as read-only."""

    blueprint_version: int
    generation: int
    release_id: str
    chart_version: str
    image: str
    namespace: str
    service_account_name: str
    coordinator_template: Mapping[str, Any]
    worker_template: Mapping[str, Any]
    worker_replicas: int
    config_files: Mapping[str, Mapping[str, str]]
    shared_secrets: tuple[str, ...]
    shared_config_maps: tuple[str, ...]
    identity: IdentityBinding
    raw: Mapping[str, Any]
    digest: str

    def template(self, role: str) -> Mapping[str, Any]:
        return self.coordinator_template if role == "coordinator" else self.worker_template

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Blueprint) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)


def canonical_json(document: Any) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def digest_of(document: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(document).encode("utf-8")).hexdigest()


class _Checker(strictjson.Problems):
    """Problems are ``<path>: <problem>; <fix>``; ``BlueprintError`` names the source once."""

    def obj(self, value: object, path: str) -> dict[str, Any] | None:
        if not isinstance(value, dict):
            self.fail(path, "must be an object", "write it as a JSON object")
            return None
        return value

    def string(
        self, obj: Mapping[str, Any], path: str, key: str, pattern: re.Pattern[str], what: str
    ) -> str:
        where = f"{path}.{key}"
        value = obj.get(key)
        if not isinstance(value, str) or not value:
            self.fail(
                where, f"{key} is required and must be a non-empty string", f"set it to {what}"
            )
            return ""
        if not pattern.match(value):
            self.fail(where, f"{value!r} is not {what}", f"set it to {what}")
            return ""
        return value


def _check_identity(check: _Checker, raw: object) -> IdentityBinding | None:
    path = "$.identity_binding"
    obj = check.obj(raw, path)
    if obj is None:
        return None
    check.keys(obj, path, frozenset(IDENTITY_FIELDS))
    patterns: dict[str, tuple[re.Pattern[str], str]] = {
        "instance_label": (LABEL_KEY_RE, "a Kubernetes label key"),
        "component_label": (LABEL_KEY_RE, "a Kubernetes label key"),
        "discovery_uri_env": (ENV_NAME_RE, "an environment variable name"),
        "node_environment_env": (ENV_NAME_RE, "an environment variable name"),
        "instance_id_env": (ENV_NAME_RE, "an environment variable name"),
        "coordinator_http_port_name": (PORT_NAME_RE, "a port name (≤ 15 lowercase characters)"),
        "coordinator_container_name": (DNS_LABEL_RE, "a DNS-1123 label (a container name)"),
        "worker_container_name": (DNS_LABEL_RE, "a DNS-1123 label (a container name)"),
    }
    values = {k: check.string(obj, path, k, *patterns[k]) for k in IDENTITY_FIELDS}
    port_name = values["coordinator_http_port_name"]
    if port_name and (len(port_name) > 15 or not re.search(r"[a-z]", port_name)):
        check.fail(
            f"{path}.coordinator_http_port_name",
            f"{port_name!r} is not a valid port name",
            "use at most 15 lowercase letters, digits and '-', with at least one letter",
        )
        values["coordinator_http_port_name"] = ""
    for group in (("instance_label", "component_label"), IDENTITY_FIELDS[2:5]):
        seen = [values[k] for k in group if values[k]]
        if len(seen) != len(set(seen)):
            check.fail(path, f"{' and '.join(group)} must be distinct", "give each its own name")
            return None
    if values["instance_label"] in (POOL_LABEL, MANAGED_BY_LABEL) or values["component_label"] in (
        INSTANCE_LABEL,
        POOL_LABEL,
        MANAGED_BY_LABEL,
    ):
        check.fail(
            path,
            "instance_label/component_label collide with an operator label",
            f"use other keys than {POOL_LABEL} and {MANAGED_BY_LABEL} "
            f"(instance_label may be {INSTANCE_LABEL})",
        )
        return None
    if not all(values.values()):
        return None
    return IdentityBinding(**values)


def _check_config_file(check: _Checker, where: str, name: str, content: object) -> int | None:
    """Check one file's name, content type, size and characters; its size, or None if unusable."""
    if not FILE_NAME_RE.match(name) or len(name) > 253:
        check.fail(
            where,
            f"{name!r} is not a plain file name",
            "use letters, digits, '.', '_' and '-' only (no directories)",
        )
        return None
    if not isinstance(content, str):
        check.fail(where, "the file content must be a string", "write the file as a JSON string")
        return None
    size = len(content.encode("utf-8"))
    if size > MAX_FILE_BYTES:
        check.fail(where, f"the file is {size} bytes", "keep each file at most 256 KiB")
    bad = next(
        (c for c in content if (ord(c) < 32 or ord(c) == 127) and c not in _ALLOWED_CONTROL),
        None,
    )
    if bad is not None:
        check.fail(
            where,
            f"the file contains the control character U+{ord(bad):04X}",
            "remove it (only newlines, tabs and carriage returns are allowed)",
        )
    return size


def _check_file_references(
    check: _Checker, role: str, files: Mapping[str, Any], identity: IdentityBinding
) -> None:
    """Check the role's config.properties and node.properties reference the injected env."""
    required = (
        ("config.properties", identity.discovery_uri_env),
        ("node.properties", identity.node_environment_env),
    )
    for name, env in required:
        reference = "${ENV:" + env + "}"
        content = files.get(name)
        where = f"$.config_files.{role}[{json.dumps(name)}]"
        if not isinstance(content, str):
            check.fail(where, f"the {role} needs {name}", f"add it, referencing {reference}")
        elif reference not in content:
            check.fail(
                where,
                f"{name} does not reference {reference}",
                f"take the value from {reference} (the operator injects {env})",
            )


def _check_config_files(
    check: _Checker, raw: object, identity: IdentityBinding | None
) -> dict[str, dict[str, str]]:
    """Check both roles' configuration files and their total size; returns the usable files."""
    path = "$.config_files"
    obj = check.obj(raw, path)
    if obj is None:
        return {}
    check.keys(obj, path, frozenset(ROLES))
    result: dict[str, dict[str, str]] = {}
    total = 0
    for role in ROLES:
        role_path = f"{path}.{role}"
        files = obj.get(role)
        if files is None:
            check.fail(
                role_path,
                f"the {role} files are required",
                "add config.properties and node.properties",
            )
            continue
        if not isinstance(files, dict):
            check.fail(
                role_path, "must be an object of file name to content", "write it as a JSON object"
            )
            continue
        result[role] = {}
        for name, content in files.items():
            size = _check_config_file(check, f"{role_path}[{json.dumps(name)}]", name, content)
            if size is not None:
                total += size
                result[role][name] = content
        if identity is not None:
            _check_file_references(check, role, files, identity)
    if total > MAX_FILES_TOTAL_BYTES:
        check.fail(
            path, f"the files total {total} bytes", "keep all files together at most 768 KiB"
        )
    return result


def _check_shared(check: _Checker, raw: object) -> tuple[tuple[str, ...], tuple[str, ...]]:
    path = "$.shared_resources"
    if raw is None:
        return (), ()
    obj = check.obj(raw, path)
    if obj is None:
        return (), ()
    check.keys(obj, path, frozenset({"secrets", "config_maps"}))
    lists: list[tuple[str, ...]] = []
    for key in ("secrets", "config_maps"):
        names = obj.get(key, [])
        where = f"{path}.{key}"
        if not isinstance(names, list):
            check.fail(where, "must be a list of names", "write it as a JSON list of strings")
            lists.append(())
            continue
        good: list[str] = []
        for index, name in enumerate(names):
            if not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN_RE.match(name):
                check.fail(
                    f"{where}[{index}]",
                    f"{name!r} is not a Kubernetes object name",
                    "use a DNS-1123 subdomain",
                )
            elif INSTANCE_NAME_RE.match(name):
                check.fail(
                    f"{where}[{index}]",
                    f"{name!r} looks like an instance object name (cell-<8 hex>…)",
                    "rename the shared resource; instance objects are deleted with their instance",
                )
            elif name in good:
                check.fail(f"{where}[{index}]", f"duplicate name {name!r}", "list each name once")
            else:
                good.append(name)
        lists.append(tuple(good))
    count = sum(len(x) for x in lists)
    if count > MAX_SHARED_NAMES:
        check.fail(path, f"{count} shared resources are listed", "list at most 32 names")
    return lists[0], lists[1]


def _images(spec: Mapping[str, Any], key: str) -> list[tuple[int, dict[str, Any]]]:
    items = spec.get(key)
    if not isinstance(items, list):
        return []
    return [(i, c) for i, c in enumerate(items) if isinstance(c, dict)]


_OPERATOR_METADATA = ("name", "namespace", "ownerReferences", "generateName")
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def _check_template_metadata(
    check: _Checker, path: str, template: Mapping[str, Any], identity: IdentityBinding | None
) -> None:
    """Check the pod template's metadata: no operator-owned fields, string maps, no own labels."""
    metadata = template.get("metadata", {})
    if not isinstance(metadata, dict):
        check.fail(f"{path}.metadata", "must be an object", "write it as a JSON object")
        metadata = {}
    for key in _OPERATOR_METADATA:
        if key in metadata:
            check.fail(
                f"{path}.metadata.{key}",
                f"a pod template must not set {key}",
                "remove it: the operator names and places every instance object",
            )
    check.keys(
        {k: v for k, v in metadata.items() if k not in _OPERATOR_METADATA},
        f"{path}.metadata",
        frozenset({"labels", "annotations"}),
    )
    reserved_labels = {INSTANCE_LABEL, POOL_LABEL, MANAGED_BY_LABEL}
    if identity is not None:
        reserved_labels |= {identity.instance_label, identity.component_label}
    for key in ("labels", "annotations"):
        value = metadata.get(key, {})
        where = f"{path}.metadata.{key}"
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            check.fail(where, f"{key} must map strings to strings", "quote every value")
            continue
        if key == "labels":
            for label in sorted(set(value) & reserved_labels):
                check.fail(
                    f"{where}[{json.dumps(label)}]",
                    f"the label {label} is set by the operator",
                    "remove it from the pod template",
                )


def _check_pod_fields(check: _Checker, path: str, template: dict[str, Any]) -> None:
    """Report every field Kubernetes would reject in the pod template."""
    for problem in k8s.pod_template_problems(template):
        where, _, message = problem.partition(": ")
        check.fail(
            f"{path}.{where}" if where else path,
            f"not a valid Kubernetes pod template field ({message})",
            "fix or remove it (field names are camelCase as in Kubernetes manifests)",
        )


def _check_pod_placement(
    check: _Checker, path: str, spec: Mapping[str, Any], service_account: str
) -> None:
    """Check host namespaces, node pinning, the service account and the reserved volume name."""
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key) not in (None, False):
            check.fail(f"{path}.spec.{key}", f"{key} is not allowed", f"remove {key}")
    if spec.get("nodeName") not in (None, ""):
        check.fail(
            f"{path}.spec.nodeName",
            "pinning a node is not allowed",
            "remove nodeName (use nodeSelector or affinity)",
        )
    for key in ("serviceAccountName", "serviceAccount"):
        if key in spec and spec[key] != service_account:
            check.fail(
                f"{path}.spec.{key}",
                f"{spec[key]!r} does not match service_account_name {service_account!r}",
                "remove it or set it to service_account_name",
            )
    for index, volume in _images(spec, "volumes"):
        if volume.get("name") == CONFIG_VOLUME:
            check.fail(
                f"{path}.spec.volumes[{index}]",
                f"the volume name {CONFIG_VOLUME} is reserved",
                "rename the volume (the operator mounts the instance's ConfigMap under it)",
            )


def _pod_containers(check: _Checker, path: str, spec: Mapping[str, Any]) -> list[Any]:
    """The pod's containers, reporting a list that is missing or not 1 to 8 long."""
    containers = spec.get("containers")
    if not isinstance(containers, list) or not 1 <= len(containers) <= MAX_CONTAINERS:
        check.fail(
            f"{path}.spec.containers",
            "a pod template needs 1 to 8 containers",
            "fix the container list",
        )
        containers = containers if isinstance(containers, list) else []
    return containers


def _check_container(
    check: _Checker, where: str, container: object, identity: IdentityBinding | None
) -> None:
    """Check one container: an object with a name, a digest-pinned image, no injected env."""
    if not isinstance(container, dict):
        check.fail(where, "must be an object", "write the container as a JSON object")
        return
    if not isinstance(container.get("name"), str) or not container.get("name"):
        check.fail(f"{where}.name", "every container needs a name", "set name")
    ref = container.get("image")
    if not isinstance(ref, str) or not DIGEST_PINNED_RE.match(ref):
        check.fail(
            f"{where}.image",
            f"{ref!r} is not digest-pinned",
            "pin it as <repository>@sha256:<64 hex>",
        )
    env = container.get("env", [])
    if not isinstance(env, list):
        check.fail(f"{where}.env", "must be a list", "write env as a JSON list")
        return
    if identity is None:
        return
    for env_index, item in enumerate(env):
        name = item.get("name") if isinstance(item, dict) else None
        if name in identity.injected_env:
            check.fail(
                f"{where}.env[{env_index}]",
                f"{name} is injected by the operator",
                "remove it from the pod template",
            )


def _check_container_lists(
    check: _Checker, path: str, spec: Mapping[str, Any], identity: IdentityBinding | None
) -> None:
    """Check every container of the regular, init and ephemeral container lists."""
    for key in _CONTAINER_LISTS:
        items = spec.get(key)
        if items is not None and not isinstance(items, list):
            check.fail(f"{path}.spec.{key}", "must be a list", "write it as a JSON list")
            continue
        for index, container in enumerate(items or []):
            _check_container(check, f"{path}.spec.{key}[{index}]", container, identity)


def _check_main_container(
    check: _Checker,
    role: str,
    path: str,
    containers: list[Any],
    *,
    identity: IdentityBinding,
    image: str,
) -> None:
    """Check the role's single main container: release image, mounts and coordinator port."""
    main_name = identity.main_container(role)
    mains = [
        (i, c)
        for i, c in enumerate(containers)
        if isinstance(c, dict) and c.get("name") == main_name
    ]
    if len(mains) != 1:
        check.fail(
            f"{path}.spec.containers",
            f"exactly one main container named {main_name!r} is required (found {len(mains)})",
            f"name the Trino container {main_name!r} (identity_binding.{role}_container_name)",
        )
        return
    index, main = mains[0]
    where = f"{path}.spec.containers[{index}]"
    if image and main.get("image") != image:
        check.fail(
            f"{where}.image",
            "the main container does not run the release image",
            f"set it to {image}",
        )
    # A volumeMounts that is not a list is reported by _check_pod_fields (Kubernetes' type).
    mounts = main.get("volumeMounts")
    for mount_index, mount in enumerate(mounts if isinstance(mounts, list) else []):
        if isinstance(mount, dict) and mount.get("mountPath") == CONFIG_MOUNT_PATH:
            check.fail(
                f"{where}.volumeMounts[{mount_index}]",
                f"a volume over {CONFIG_MOUNT_PATH} would hide the instance configuration files",
                f"mount it elsewhere or below {CONFIG_MOUNT_PATH}/",
            )
    if role == "coordinator":
        _check_coordinator_port(check, where, main, identity)


def _check_coordinator_port(
    check: _Checker, where: str, main: Mapping[str, Any], identity: IdentityBinding
) -> None:
    """Check the coordinator's main container declares the HTTP port the Service targets."""
    ports = main.get("ports") or []
    names = [p.get("name") for p in ports if isinstance(p, dict)] if isinstance(ports, list) else []
    if identity.coordinator_http_port_name not in names:
        check.fail(
            f"{where}.ports",
            f"the coordinator has no port named {identity.coordinator_http_port_name!r}",
            "declare the HTTP containerPort with that name (the Service targets it)",
        )


def _check_template(
    check: _Checker,
    role: str,
    raw: object,
    *,
    identity: IdentityBinding | None,
    image: str,
    service_account: str,
) -> dict[str, Any]:
    """Check one role's pod template against the rules of §6.3; returns it (``{}`` if absent)."""
    path = f"$.{role}.pod_template"
    template = check.obj(raw, path)
    if template is None:
        return {}
    check.keys(template, path, frozenset({"metadata", "spec"}))
    _check_template_metadata(check, path, template, identity)
    spec = template.get("spec")
    if not isinstance(spec, dict):
        check.fail(f"{path}.spec", "the pod spec is required", "add spec with the containers")
        return template
    _check_pod_fields(check, path, template)
    _check_pod_placement(check, path, spec, service_account)
    containers = _pod_containers(check, path, spec)
    _check_container_lists(check, path, spec, identity)
    if identity is not None:
        _check_main_container(check, role, path, containers, identity=identity, image=image)
    return template


def _check_file_mounts(
    check: _Checker,
    role: str,
    template: Mapping[str, Any],
    identity: IdentityBinding,
    files: Mapping[str, str],
) -> None:
    """The main container must not mount anything where a configuration file goes."""
    spec = template.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    for index, container in enumerate(containers if isinstance(containers, list) else []):
        if not isinstance(container, dict) or container.get("name") != identity.main_container(
            role
        ):
            continue
        mounts = container.get("volumeMounts")
        for mount_index, mount in enumerate(mounts if isinstance(mounts, list) else []):
            target = mount.get("mountPath") if isinstance(mount, dict) else None
            if isinstance(target, str) and target.rstrip("/") in {
                f"{CONFIG_MOUNT_PATH}/{name}" for name in files
            }:
                check.fail(
                    f"$.{role}.pod_template.spec.containers[{index}].volumeMounts[{mount_index}]",
                    f"{target} is where the operator mounts the {role} file of that name",
                    "mount it elsewhere or rename the file in config_files",
                )


def parse_blueprint(text: str, *, source: str, cell_namespace: str) -> Blueprint:
    """Parse and validate one blueprint document; every problem names its field path and fix."""
    if len(text.encode("utf-8")) > MAX_BLUEPRINT_BYTES:
        raise BlueprintError(source, ["$: the blueprint is larger than 1 MiB; shrink it"])
    try:
        document = strictjson.decode_document(text)
    except strictjson.StrictJSONError as exc:
        raise BlueprintError(source, [str(exc)]) from None
    return validate_blueprint(document, source=source, cell_namespace=cell_namespace)


_RELEASE_WHAT = "[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}"
# (top-level field, pattern, what it must be), checked in this order.
_TOP_STRINGS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("release_id", RELEASE_RE, _RELEASE_WHAT),
    ("chart_version", RELEASE_RE, _RELEASE_WHAT),
    ("image", DIGEST_PINNED_RE, "a digest-pinned image (<repository>@sha256:<64 hex>)"),
    ("namespace", DNS_LABEL_RE, "a DNS-1123 label"),
    ("service_account_name", DNS_SUBDOMAIN_RE, "a service account name"),
)


def _check_top_fields(check: _Checker, top: Mapping[str, Any]) -> None:
    """Check the top level has only known fields and every required one."""
    check.keys(top, "$", TOP_FIELDS)
    for key in sorted(REQUIRED_TOP - set(top)):
        check.fail(f"$.{key}", f"{key} is required", "add it (see docs/trino-instances.md)")


def _check_generation(check: _Checker, top: Mapping[str, Any]) -> int:
    """Check blueprint_version is 1; returns the generation (0 unless an integer >= 0)."""
    version = top.get("blueprint_version")
    if "blueprint_version" in top and (not strictjson.is_int(version) or version != 1):
        check.fail(
            "$.blueprint_version",
            f"unsupported blueprint_version {json.dumps(version)}",
            "set it to 1",
        )
    generation = top.get("generation", 0)
    if "generation" in top and (not strictjson.is_int(generation) or generation < 0):
        check.fail(
            "$.generation",
            f"generation must be an integer >= 0 (got {json.dumps(generation)})",
            "fix it",
        )
        return 0
    return int(generation)


def _top_strings(check: _Checker, top: Mapping[str, Any]) -> dict[str, str]:
    """The top-level string fields (``""`` when invalid), each checked against its pattern."""
    values: dict[str, str] = {}
    for key, pattern, what in _TOP_STRINGS:
        values[key] = check.string(top, "$", key, pattern, what)
        if key == "namespace" and len(values[key]) > MAX_NAMESPACE_LENGTH:
            check.fail("$.namespace", "namespace is longer than 63 characters", "shorten it")
    return values


def _worker_replicas(check: _Checker, block: Mapping[str, Any]) -> int:
    """The worker replica count; one outside 1..100 is reported (and counts as 0)."""
    value = block.get("replicas")
    if (
        not isinstance(value, int)
        or not strictjson.is_int(value)
        or not 1 <= value <= MAX_WORKER_REPLICAS
    ):
        check.fail(
            "$.worker.replicas",
            f"replicas must be 1..100 (got {json.dumps(value)})",
            "fix it",
        )
        return 0
    return int(value)


def _check_roles(
    check: _Checker,
    top: Mapping[str, Any],
    *,
    identity: IdentityBinding | None,
    image: str,
    service_account: str,
) -> tuple[dict[str, dict[str, Any]], int]:
    """Check the coordinator and worker blocks; returns their pod templates and worker replicas."""
    templates: dict[str, dict[str, Any]] = {}
    replicas = 0
    for role in ROLES:
        if role not in top:
            continue
        block = check.obj(top[role], f"$.{role}")
        if block is None:
            continue
        allowed = frozenset({"pod_template", "replicas"} if role == "worker" else {"pod_template"})
        check.keys(block, f"$.{role}", allowed)
        if "pod_template" not in block:
            check.fail(f"$.{role}.pod_template", "pod_template is required", "add the pod template")
            continue
        templates[role] = _check_template(
            check,
            role,
            block["pod_template"],
            identity=identity,
            image=image,
            service_account=service_account,
        )
        if role == "worker":
            replicas = _worker_replicas(check, block)
    return templates, replicas


def validate_blueprint(document: object, *, source: str, cell_namespace: str) -> Blueprint:
    """Validate an already-decoded blueprint (for instance a stored snapshot)."""
    check = _Checker(source)
    top = check.obj(document, "$")
    if top is None:
        raise BlueprintError(source, check.problems)
    _check_top_fields(check, top)
    generation = _check_generation(check, top)
    strings = _top_strings(check, top)
    image, namespace = strings["image"], strings["namespace"]
    account = strings["service_account_name"]
    identity = (
        _check_identity(check, top.get("identity_binding")) if "identity_binding" in top else None
    )
    templates, replicas = _check_roles(
        check, top, identity=identity, image=image, service_account=account
    )
    files = (
        _check_config_files(check, top["config_files"], identity) if "config_files" in top else {}
    )
    secrets, config_maps = _check_shared(check, top.get("shared_resources"))
    if identity is not None:
        for role, template in templates.items():
            _check_file_mounts(check, role, template, identity, files.get(role, {}))
    if check.problems:
        raise BlueprintError(source, check.problems)
    if namespace != cell_namespace:
        raise BlueprintError(
            source,
            [
                f"blueprint {source} targets namespace {namespace!r} but the cell's namespace is "
                f"{cell_namespace!r}; the pool stays frozen until the blueprint's namespace "
                "matches the registry"
            ],
            namespace_mismatch=True,
        )
    assert identity is not None
    return Blueprint(
        blueprint_version=1,
        generation=generation,
        release_id=strings["release_id"],
        chart_version=strings["chart_version"],
        image=image,
        namespace=namespace,
        service_account_name=account,
        coordinator_template=templates["coordinator"],
        worker_template=templates["worker"],
        worker_replicas=replicas,
        config_files=files,
        shared_secrets=secrets,
        shared_config_maps=config_maps,
        identity=identity,
        raw=top,
        digest=digest_of(top),
    )
