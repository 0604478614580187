"""The Helm chart without a cluster: lint, render each ci/ values file, the strict values schema,
documented values, the Deployment's contract, and the CRD copy that must never drift (C15)."""

from __future__ import annotations

import json
import re
import tarfile

import pytest
import yaml

from tests.chart import CHART, CI_VALUES, ROOT, by_kind, helm, render

CRD_FILES = sorted((ROOT / "crds").glob("*.yaml"))
# kubectl's client-side apply stores the whole object in an annotation; the API server refuses
# annotations over 256 KiB in total (kuberay #410, field case C15). "Far below": a quarter.
LAST_APPLIED_BUDGET = 64 * 1024


def test_chart_crds_identical_to_top_level_crds():
    top = sorted(p.name for p in CRD_FILES)
    chart = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert top == chart and top
    for name in top:
        assert (ROOT / "crds" / name).read_bytes() == (CHART / "crds" / name).read_bytes(), (
            f"charts/monarch-operator/crds/{name} differs from crds/{name}: cp crds/{name} "
            "charts/monarch-operator/crds/")
    assert not [p for p in (CHART / "crds").iterdir() if p.is_symlink() or p.is_dir()]


def _null_keys(node, path: str = "") -> list[str]:
    """Paths of the keys whose value is YAML null, anywhere under ``node``."""
    if isinstance(node, dict):
        return [found for key, value in node.items()
                for found in ([f"{path}.{key}"] if value is None else [])
                + _null_keys(value, f"{path}.{key}")]
    if isinstance(node, list):
        return [found for index, item in enumerate(node)
                for found in _null_keys(item, f"{path}[{index}]")]
    return []


def test_crds_have_no_null_keys():
    """No CRD key parses to null: an unquoted comma in a flow mapping's description
    (``{type: string, description: a (b, c)}``) splits it into stray keys, which the API server
    drops, so that every client-side apply re-patches the CRD ("configured", never "unchanged")."""
    for crd in CRD_FILES:
        assert _null_keys(yaml.safe_load(crd.read_text())) == [], crd.name


def test_packaged_chart_carries_the_same_crds(tmp_path):
    helm("package", str(CHART), "--destination", str(tmp_path))
    [package] = tmp_path.glob("monarch-operator-*.tgz")
    with tarfile.open(package) as archive:
        packaged = {member.name.split("/", 1)[1]: archive.extractfile(member).read()
                    for member in archive.getmembers() if member.isfile()}
    for crd in CRD_FILES:
        assert packaged[f"crds/{crd.name}"] == crd.read_bytes(), crd.name
    assert "values.schema.json" in packaged and "templates/tests/operator-healthy.yaml" in packaged


def test_helm_show_crds_gives_the_crd_files():
    """The CRD upgrade step of docs/install.md (`helm show crds CHART | kubectl apply -f -`) applies
    exactly crds/."""
    shown = [doc for doc in yaml.safe_load_all(helm("show", "crds", str(CHART)).stdout) if doc]
    assert shown == [yaml.safe_load(crd.read_text()) for crd in CRD_FILES]


@pytest.mark.parametrize("crd", CRD_FILES, ids=lambda p: p.name)
def test_crd_last_applied_annotation_far_below_the_limit(crd):
    """C15: what `kubectl apply` (client side) stores in last-applied-configuration."""
    stored = json.dumps(yaml.safe_load(crd.read_text()), separators=(",", ":"))
    assert len(stored.encode()) < LAST_APPLIED_BUDGET, (
        f"{crd.name}: {len(stored)} bytes of last-applied-configuration; budget "
        f"{LAST_APPLIED_BUDGET} (the API server refuses 256 KiB of annotations)")


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda p: p.name if p else "defaults")
def test_helm_lint_strict(values):
    args = ["lint", str(CHART), "--strict"] + (["-f", str(values)] if values else [])
    result = helm(*args)
    assert "0 chart(s) failed" in result.stdout
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_each_ci_values_file_renders(values):
    objects = render("-f", str(values))
    settings = yaml.safe_load(values.read_text()) or {}
    kinds = sorted(obj["kind"] for obj in objects)
    assert kinds.count("Deployment") == 1
    rbac = settings.get("rbac", {}).get("create", True)
    namespaces = settings.get("watchNamespaces", [])
    assert len(by_kind(objects, "ClusterRole")) == (1 if rbac and not namespaces else 0)
    assert len(by_kind(objects, "ClusterRoleBinding")) == (1 if rbac and not namespaces else 0)
    expected_roles = sorted(namespaces) if rbac else []
    # The helm test hook brings its own Role in the release's namespace, and so does leader
    # election (tests/unit/test_chart_ha.py).
    def operator_only(kind):
        return [obj for obj in by_kind(objects, kind)
                if "helm.sh/hook" not in obj["metadata"].get("annotations", {})
                and not obj["metadata"]["name"].endswith("-leader-election")]

    assert sorted(role["metadata"]["namespace"]
                  for role in operator_only("Role")) == expected_roles
    assert sorted(binding["metadata"]["namespace"]
                  for binding in operator_only("RoleBinding")) == expected_roles
    election = rbac and settings.get("leaderElection", {}).get("enabled", True)
    assert [role["metadata"]["namespace"] for role in by_kind(objects, "Role")
            if role["metadata"]["name"].endswith("-leader-election")] == (
        ["monarch-system"] if election else [])
    [deployment] = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    account = settings.get("serviceAccount", {})
    service_accounts = [sa["metadata"]["name"] for sa in by_kind(objects, "ServiceAccount")
                        if "helm.sh/hook" not in sa["metadata"].get("annotations", {})]
    if account.get("create", True):
        assert service_accounts == [pod["serviceAccountName"]]
    else:
        assert service_accounts == [] and pod["serviceAccountName"] == account["name"]
    args = pod["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace=")] == [
        f"--namespace={ns}" for ns in namespaces]


def test_image_by_digest_wins_over_tag():
    [deployment] = by_kind(render("--set", "image.digest=sha256:" + "a" * 64,
                                  "--set", "image.tag=9.9"), "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "ghcr.io/monarch-operator/operator@sha256:" + "a" * 64
    [deployment] = by_kind(render(), "Deployment")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"ghcr.io/monarch-operator/operator:{chart['appVersion']}")


@pytest.mark.parametrize(("args", "field"), [
    (["--set", "watchnamespaces[0]=a"], "watchnamespaces"),  # a typo of watchNamespaces
    (["--set", "rbac.create=yes"], "create"),
    (["--set", "watchNamespaces[0]=Team_A"], "watchNamespaces"),
    (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
    (["--set", "image.digest=latest"], "digest"),
    (["--set", "health.port=80"], "port"),
    (["--set", "resyncSeconds=1"], "resyncSeconds"),  # gone: the operator is woken by watches
    (["--set", "resources.requests.gpu=1", "--set", "resources.limit.cpu=1"], "limit"),
    (["--set", "serviceAccount.nmae=x"], "nmae"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_schema_refuses_bad_values_naming_the_field(args, field):
    result = helm("template", "mo", str(CHART), *args, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert field in result.stderr, result.stderr


def test_every_value_is_documented():
    """Each key of values.yaml has a `# --` comment (helm-docs style) above it or above one of
    its parents."""
    undocumented = []
    pending_comment = False
    parents: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    for line in (CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending_comment = True
        if not stripped or stripped.startswith("#"):
            continue
        match = re.match(r"^( *)([A-Za-z][A-Za-z0-9]*):(.*)$", line)
        if not match:
            continue
        indent, key, value = len(match.group(1)), match.group(2), match.group(3).strip()
        parents = [(i, d) for i, d in parents if i < indent]
        documented = pending_comment or any(d for _, d in parents)
        pending_comment = False
        if value == "":
            parents.append((indent, documented))
        elif not documented:
            undocumented.append(key)
    assert not undocumented, f"values without a '# --' comment: {undocumented}"


def _leaf_paths(values: dict, prefix: str = "") -> list[str]:
    """Dotted paths of every leaf of ``values`` (a map with keys is gone into)."""
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        paths.extend(_leaf_paths(value, f"{path}.") if isinstance(value, dict) and value
                     else [path])
    return paths


def test_every_value_is_in_the_install_docs_table():
    """docs/install.md's "Chart values" table names every key of values.yaml (a row may name a
    map whole, e.g. `resources`; `.name` after `serviceAccount.create` is `serviceAccount.name`)."""
    text = (ROOT / "docs" / "install.md").read_text()
    table = text[text.index("## Chart values"):].split("\n## ")[0]
    named: set[str] = set()
    for row in table.splitlines():
        if not row.startswith("| `"):
            continue
        parent = ""
        for token in re.findall(r"`([^`]+)`", row.split("|")[1]):
            if token.startswith("."):
                token = parent + token
            parent = token.rsplit(".", 1)[0] if "." in token else ""
            named.add(token)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [path for path in _leaf_paths(values)
               if not any(path == name or path.startswith(f"{name}.") for name in named)]
    assert not missing, f"values missing from docs/install.md's table: {missing}"


def test_schema_is_strict_at_every_level():
    schema = json.loads((CHART / "values.schema.json").read_text())

    def open_objects(node, path):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                if node.get("additionalProperties") is not False:
                    yield path
            for key, child in node.items():
                yield from open_objects(child, f"{path}.{key}")

    assert schema["additionalProperties"] is False
    assert list(open_objects(schema, "$")) == []
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) == set(schema["properties"]), "values.yaml and the schema list other keys"


def test_deployment_runs_the_operator_with_kopf_health_probes_and_restricted_context():
    [deployment] = by_kind(render(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["monarch-operator"]
    assert "--liveness=http://$(POD_IP):8080/healthz" in container["args"]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in (
        container["env"])
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["ports"] == [{"name": "health", "containerPort": 8080, "protocol": "TCP"}]
    # Pod Security Standards, "restricted" level.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is True
    [account] = [sa for sa in by_kind(render(), "ServiceAccount")
                 if "helm.sh/hook" not in sa["metadata"].get("annotations", {})]
    assert account["automountServiceAccountToken"] is False


def test_helm_test_hook_checks_the_operators_health_endpoint():
    objects = render("-s", "templates/tests/operator-healthy.yaml", release="mo")
    [pod] = by_kind(objects, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    command = pod["spec"]["containers"][0]["command"]
    assert command[:3] == ["python", "-m", "monarch_operator.healthcheck"]
    selector = [arg for arg in command if arg.startswith("--selector=")][0]
    [deployment] = by_kind(render(release="mo"), "Deployment")
    labels = deployment["spec"]["selector"]["matchLabels"]
    assert selector == "--selector=" + ",".join(f"{k}={v}" for k, v in labels.items())
    [role] = by_kind(objects, "Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]


def test_chart_yaml_versions():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE).group(1)
    assert chart["appVersion"] == version
    assert chart["apiVersion"] == "v2"
