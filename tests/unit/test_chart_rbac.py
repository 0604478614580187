"""Least privilege: the chart grants exactly the API calls the operator makes, and no ``*``.

"What the operator uses" is read from the code, not written down a second time:
- the calls in ``controller/k8s/`` (the only layer that talks to the API): each
  ``client.call(verb, apiVersion, resource, ...)`` (``call("list", "v1", "pods", ...)`` is
  ``list`` on ``pods``), and the generic ``read``/``ensure``/``delete`` helpers (a ``call`` whose
  resource is a parameter), whose kinds come from their call sites in the other controller
  modules (a literal ``("apps/v1", "StatefulSet")``, or the ``kind`` a ``build_*`` builder
  returns);
- kopf's own needs, from the handlers it has registered: a list+watch stream (also for each
  index of the cache) and annotation
  patches on each handled resource, Events for ``kopf.event``/``kopf.warn`` and posted logs,
  and (cluster-wide only) a watch on CustomResourceDefinitions.
A new API call without its rule, or a rule no call needs, fails here with the difference.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import kopf
import pytest

from monarch_operator import constants
from monarch_operator.controller.builders.common import owner_reference
from monarch_operator.controller.builders.progress import build_progress_role
from monarch_operator.controller.k8s import client as k8s_client
from monarch_operator.controller.kueue import workload
from monarch_operator.controller.spec.spec import JobSpec
from tests.chart import CHART, by_kind, render

CONTROLLER = Path(__file__).resolve().parents[2] / "operator" / "monarch_operator" / "controller"
# The API layer, one module per concern (the watches' cache in it makes no request).
K8S = CONTROLLER / "k8s"
K8S_PACKAGE = "monarch_operator.controller.k8s"
# Verbs of the typed client's method prefixes (kubernetes-client/python naming): leader
# election's Lease calls (tests/unit/test_chart_ha.py).
CLIENT_VERBS = {"read": "get", "get": "get", "list": "list", "create": "create", "delete": "delete",
                "patch": "patch", "replace": "update"}
# Modules whose constants name an apiVersion or resource at a call site (``constants.PLURAL``).
CONSTANTS = {"constants": constants, "wl": workload}
API_GROUPS = {"CoreV1Api": "", "AppsV1Api": "apps", "BatchV1Api": "batch",
              "NetworkingV1Api": "networking.k8s.io", "CoordinationV1Api": "coordination.k8s.io",
              "RbacAuthorizationV1Api": "rbac.authorization.k8s.io",
              "CustomObjectsApi": constants.GROUP}

# Subresources as the typed client's method names end (`..._pod_log`, `..._object_status`).
SUBRESOURCES = ("log", "status", "scale", "eviction", "binding", "exec", "attach")
# Kinds whose names end like a subresource (``delete_namespaced_role_binding``: rolebindings).
KINDS_LIKE_SUBRESOURCES = {"role_binding", "cluster_role_binding"}
# Cluster-scoped resources, and node Leases (kube-node-lease is never a watched namespace): only
# a ClusterRole grants them, so namespaced mode goes without.
CLUSTER_SCOPED = {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "nodes"),
                  ("coordination.k8s.io", "leases"),
                  ("", "namespaces"), ("kueue.x-k8s.io", "resourceflavors"),
                  ("kueue.x-k8s.io", "workloadpriorityclasses")}

Rule = tuple[str, str, str]  # (apiGroup, resource, verb)


def plural(kind_snake: str) -> str:
    """Resource name of a kind (``stateful_set`` or ``StatefulSet`` -> ``statefulsets``)."""
    word = kind_snake.replace("_", "").lower()
    return word[:-1] + "ies" if word.endswith("y") else word + "s"


def group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def client_method_rule(api_class: str, method: str) -> Rule:
    """``("CoreV1Api", "list_namespaced_pod")`` -> ``("", "pods", "list")``."""
    verb, _, rest = method.partition("_")
    rest = rest.removeprefix("namespaced_")
    base, subresource = rest, ""
    for name in SUBRESOURCES:  # read_namespaced_pod_log: pods/log
        if rest.endswith(f"_{name}") and rest not in KINDS_LIKE_SUBRESOURCES:
            base, subresource = rest.removesuffix(f"_{name}"), f"/{name}"
    resource = constants.PLURAL if api_class == "CustomObjectsApi" else plural(base)
    return API_GROUPS[api_class], resource + subresource, CLIENT_VERBS[verb]


def _value(node: ast.expr | None) -> str | None:
    """A call argument's string: a literal, or a constant of :data:`CONSTANTS`; None else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in CONSTANTS):
        return str(getattr(CONSTANTS[node.value.id], node.attr))
    return None


def request_rule(node: ast.Call) -> tuple[str, Rule | None] | None:
    """For a ``call(verb, apiVersion, resource, ...)`` or ``client.call(...)`` / ``k8s_client.
    call(...)`` node: ``(verb, rule)``, the rule None when the kind is the caller's (its
    apiVersion or resource not a literal nor a constant); None for any other call."""
    func = node.func
    if not ((isinstance(func, ast.Name) and func.id == "call")
            or (isinstance(func, ast.Attribute) and func.attr == "call"
                and isinstance(func.value, ast.Name) and func.value.id.endswith("client"))):
        return None
    verb = _value(node.args[0])
    assert verb in {"get", "list", "create", "update", "patch", "delete"}, ast.unparse(node)
    api_version, resource = _value(node.args[1]), _value(node.args[2])
    subresource = next((_value(keyword.value) for keyword in node.keywords
                        if keyword.arg == "subresource"), "")
    if api_version is None or resource is None:
        assert not subresource, ast.unparse(node)
        return verb, None
    return verb, (group_of(api_version), resource + (f"/{subresource}" if subresource else ""),
                  verb)


def k8s_layer_calls() -> tuple[dict[str, set[str]], dict[str, set[Rule]]]:
    """Per function of the k8s layer: generic verbs (kind chosen by the caller) and fixed rules.

    Its modules call each other's functions as ``module.function`` (``client.plural``) and
    their own by name; function names are unique across the layer."""
    layer = {path.stem: ast.parse(path.read_text()) for path in sorted(K8S.glob("*.py"))
             if path.name != "cache.py"}
    functions = {node.name: node for tree in layer.values() for node in tree.body
                 if isinstance(node, ast.FunctionDef)}
    assert len(functions) == sum(isinstance(node, ast.FunctionDef)
                                 for tree in layer.values() for node in tree.body), (
        "a function name is defined twice in the k8s layer")
    generic: dict[str, set[str]] = {name: set() for name in functions}
    fixed: dict[str, set[Rule]] = {name: set() for name in functions}
    calls: dict[str, set[str]] = {name: set() for name in functions}
    for name, function in functions.items():
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            request = request_rule(node)
            if request is not None:
                verb, rule = request
                if rule is None:
                    generic[name].add(verb)
                else:
                    fixed[name].add(rule)
            elif isinstance(node.func, ast.Name) and node.func.id in functions:
                calls[name].add(node.func.id)
            elif (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                  and node.func.value.id in layer and node.func.attr in functions):
                calls[name].add(node.func.attr)
    changed = True
    while changed:  # what a function calls, it needs
        changed = False
        for name, callees in calls.items():
            for callee in callees:
                if not (generic[callee] <= generic[name] and fixed[callee] <= fixed[name]):
                    generic[name] |= generic[callee]
                    fixed[name] |= fixed[callee]
                    changed = True
    return generic, fixed


def builder_kinds() -> dict[str, tuple[str, str]]:
    """``build_*`` function name -> (apiVersion, kind) of the object it returns."""
    kinds = {}
    for path in (CONTROLLER / "builders").glob("*.py"):
        for function in ast.parse(path.read_text()).body:
            if not (isinstance(function, ast.FunctionDef) and function.name.startswith("build_")):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Dict):
                    entries = {key.value: value for key, value in zip(node.keys, node.values,
                                                                        strict=True)
                               if isinstance(key, ast.Constant)}
                    if isinstance(entries.get("kind"), ast.Constant) and isinstance(
                            entries.get("apiVersion"), ast.Constant):
                        kinds[function.name] = (entries["apiVersion"].value,
                                                entries["kind"].value)
    return kinds


def k8s_names(module: ast.Module) -> set[str]:
    """The names under which ``module`` imported the k8s layer's modules (``from
    monarch_operator.controller.k8s import reads``, ``... import client as k8s_client``, or the
    package itself: ``from monarch_operator.controller import k8s``)."""
    found = set()
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom) and node.module == K8S_PACKAGE:
            found |= {alias.asname or alias.name for alias in node.names if alias.name != "cache"}
        elif isinstance(node, ast.ImportFrom) and node.module == K8S_PACKAGE.rpartition(".")[0]:
            found |= {alias.asname or alias.name for alias in node.names if alias.name == "k8s"}
    return found


def _k8s_calls(function: ast.FunctionDef, layer: set[str]) -> list[ast.Call]:
    return [node for node in ast.walk(function)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id in layer]


def operator_code_rules() -> set[Rule]:
    """Rules for every call of the k8s layer (``reads.read(...)``, ``writes.ensure(...)``) in the
    controller's other modules.

    The kind of a generic call is a literal pair, a ``build_*`` call, the parameters of a
    helper in the same module (such as ``_delete_child(api_version, kind, ...)``; none at
    present) whose own call sites pass literals, or variables set at run time (then every kind
    the layer knows, :data:`.k8s.client._KINDS`).
    """
    generic, fixed = k8s_layer_calls()
    builders = builder_kinds()
    rules: set[Rule] = set()
    for path in CONTROLLER.rglob("*.py"):
        if path.parent == K8S:
            continue
        module = ast.parse(path.read_text())
        layer = k8s_names(module)
        functions = [node for node in ast.walk(module) if isinstance(node, ast.FunctionDef)]
        # helper name -> (verbs, index of its apiVersion parameter, index of its kind parameter)
        helpers: dict[str, tuple[set[str], int, int]] = {}
        for function in functions:
            parameters = [arg.arg for arg in function.args.args]
            for node in _k8s_calls(function, layer):
                name = node.func.attr
                if name[:1].isupper():  # raising one of the layer's errors: no API call
                    continue
                assert name in generic, f"{path.name}: {name} is not in the k8s layer"
                rules |= fixed[name]
                if not generic[name]:
                    continue
                first = node.args[0]
                if isinstance(first, ast.Constant):
                    rules |= {(group_of(first.value), plural(node.args[1].value), verb)
                              for verb in generic[name]}
                elif (isinstance(first, ast.Call) and isinstance(first.func, ast.Name)
                      and first.func.id in builders):
                    # One object, or several (ensure_together(build_a(...), build_b(...))).
                    for argument in node.args:
                        if not (isinstance(argument, ast.Call)
                                and isinstance(argument.func, ast.Name)
                                and argument.func.id in builders):
                            continue  # e.g. the owner's uid
                        api_version, kind = builders[argument.func.id]
                        rules |= {(group_of(api_version), plural(kind), verb)
                                  for verb in generic[name]}
                elif (isinstance(first, ast.Name) and first.id in parameters
                      and isinstance(node.args[1], ast.Name) and node.args[1].id in parameters):
                    verbs, _, _ = helpers.get(function.name, (set(), 0, 0))
                    helpers[function.name] = (verbs | generic[name],
                                              parameters.index(first.id),
                                              parameters.index(node.args[1].id))
                elif isinstance(first, ast.Name) and isinstance(node.args[1], ast.Name):
                    # A kind found at run time (a leftover child of any cached kind): the layer
                    # takes only the kinds it knows (client.plural raises KeyError for others).
                    rules |= {(group_of(api_version), resource, verb)
                              for (api_version, _), resource in k8s_client._KINDS.items()
                              for verb in generic[name]}
                else:
                    pytest.fail(f"{path.name}: cannot tell the kind of {ast.unparse(node)}; "
                                "pass (apiVersion, kind) literals, a build_* call, or the "
                                "parameters of a helper called with literals")
        for node in ast.walk(module):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in helpers):
                verbs, version_at, kind_at = helpers[node.func.id]
                version, kind = node.args[version_at], node.args[kind_at]
                assert isinstance(version, ast.Constant) and isinstance(kind, ast.Constant), (
                    f"{path.name}: {ast.unparse(node)} must pass literals")
                rules |= {(group_of(version.value), plural(kind.value), verb) for verb in verbs}
    return rules | kueue_client_rules()


def kueue_client_rules() -> set[Rule]:
    """Rules for ``controller/kueue/client.py``, the Kueue part of the API layer: each
    ``k8s_client.call(verb, apiVersion, resource, ...)``, and each ``_get(namespace,
    "<resource>", name)`` (a ``get`` of a Kueue object)."""
    module = ast.parse((CONTROLLER / "kueue" / "client.py").read_text())
    rules: set[Rule] = set()
    for node in ast.walk(module):
        if not isinstance(node, ast.Call):
            continue
        request = request_rule(node)
        if request is not None:
            verb, rule = request
            if rule is not None:
                rules.add(rule)
            else:  # only _get's, whose resource its callers name
                assert verb == "get", ast.unparse(node)
        elif isinstance(node.func, ast.Name) and node.func.id == "_get":
            rules.add((workload.GROUP, _value(node.args[1]), "get"))
    return rules


def kopf_rules(clusterwide: bool) -> set[Rule]:
    """What kopf does for the registered handlers (kopf docs, "Deployment": RBAC)."""
    from monarch_operator.controller import handlers  # noqa: F401  (registers the handlers)

    registry = kopf.get_default_registry()
    selectors = {handler.selector for handler in [*registry._changing.get_all_handlers(),
                                                  *registry._spawning.get_all_handlers(),
                                                  *registry._watching.get_all_handlers(),
                                                  *registry._indexing.get_all_handlers()]}
    rules: set[Rule] = set()
    for selector in selectors:
        # The handlers name their resource by its plural (kopf would resolve a kind or short
        # name through discovery). Each is a watch stream: an initial list, then watch.
        resource = selector.plural or selector.any_name
        rules |= {(selector.group, resource, verb) for verb in ("list", "watch")}
    # kopf removes its finalizer from a job that carries one (left by the operator's timer-based
    # versions) when no handler needs it: a patch (test_operator_watches.py, C14). Children never
    # carried kopf's finalizer.
    rules.add((constants.GROUP, constants.PLURAL, "patch"))
    rules.add(("", "events", "create"))  # kopf.event/kopf.warn and log posting
    if clusterwide:  # kopf's scan notices the CRD appearing or going (off with --namespace)
        rules |= {("apiextensions.k8s.io", "customresourcedefinitions", verb)
                  for verb in ("list", "watch")}
    return rules


def admission_rules() -> set[Rule]:
    """What admission asks of the operator past the calls themselves: with the
    OwnerReferencesPermissionEnforcement plugin, an owner reference with ``blockOwnerDeletion``
    needs ``update`` on the owner's ``finalizers`` subresource (field case C24).

    Also RBAC's escalation check: a Role the operator creates (the launcher's, for its job's
    progress ConfigMap) may grant only what the operator holds itself."""
    reference = owner_reference(SimpleNamespace(name="demo", uid="uid"))  # type: ignore[arg-type]
    rules: set[Rule] = set()
    if reference.get("blockOwnerDeletion"):
        rules.add((constants.GROUP, f"{constants.PLURAL}/finalizers", "update"))
    role = build_progress_role(JobSpec.from_body(
        {"metadata": {"name": "demo", "namespace": "team-a"}, "spec": {"image": "img"}}))
    for rule in role["rules"]:
        rules |= {(group, resource, verb) for group in rule["apiGroups"]
                  for resource in rule["resources"] for verb in rule["verbs"]}
    return rules


def granted(rules: list[dict]) -> set[Rule]:
    wildcards = [rule for rule in rules
                 if "*" in [*rule.get("apiGroups", []), *rule.get("resources", []),
                            *rule.get("verbs", [])]]
    assert not wildcards, f"wildcard rules: {wildcards}"
    assert all(set(rule) <= {"apiGroups", "resources", "verbs"} for rule in rules), rules
    return {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def assert_same(granted_rules: set[Rule], used: set[Rule]) -> None:
    unused, missing = sorted(granted_rules - used), sorted(used - granted_rules)
    assert not unused and not missing, (
        f"granted but never used by the operator: {unused}; used but not granted: {missing} "
        "(charts/monarch-operator/templates/_helpers.tpl, monarch-operator.namespacedRules)")


def operator_objects(objects: list[dict], kind: str) -> list[dict]:
    """The objects of ``kind`` granting the reconcile loop's calls: not the helm test hook's,
    nor leader election's (its own Role; tests/unit/test_chart_ha.py)."""
    return [obj for obj in by_kind(objects, kind)
            if "helm.sh/hook" not in obj["metadata"].get("annotations", {})
            and not obj["metadata"]["name"].endswith("-leader-election")]


def test_code_derivation_sees_the_known_calls():
    """The reading of the code finds what reconcile obviously does (guards the reader)."""
    used = operator_code_rules()
    assert ("apps", "statefulsets", "delete") in used
    assert ("", "secrets", "create") in used and ("", "secrets", "get") in used
    assert ("", "pods", "list") in used
    assert (constants.GROUP, f"{constants.PLURAL}/status", "patch") in used
    assert (constants.GROUP, constants.PLURAL, "get") in used  # read_monarchjob
    # Children are created with blockOwnerDeletion: the finalizers permission (C24).
    assert admission_rules() == {(constants.GROUP, "monarchjobs/finalizers", "update"),
                                 ("", "configmaps", "get"), ("", "configmaps", "patch")}
    # Kueue (controller/kueue/client.py): the job's Workload and its status.
    assert ("kueue.x-k8s.io", "workloads", "create") in used
    assert ("kueue.x-k8s.io", "workloads/status", "update") in used


def test_cluster_role_grants_exactly_what_the_operator_uses():
    objects = render()
    [role] = operator_objects(objects, "ClusterRole")
    assert_same(granted(role["rules"]),
                operator_code_rules() | kopf_rules(clusterwide=True) | admission_rules())
    [binding] = operator_objects(objects, "ClusterRoleBinding")
    [account] = operator_objects(objects, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "monarch-system"}]
    assert operator_objects(objects, "Role") == []


def test_namespaced_mode_grants_roles_only_in_the_watched_namespaces():
    objects = render("-f", str(CHART / "ci" / "namespaced-values.yaml"))
    assert operator_objects(objects, "ClusterRole") == []
    assert operator_objects(objects, "ClusterRoleBinding") == []
    roles = operator_objects(objects, "Role")
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["team-a", "team-b"]
    # Without a ClusterRole the operator does without cluster-scoped reads: nodes.node_is_ready
    # takes a 403 on nodes as "no node information" (a lost worker is then told by its pod).
    used = {rule for rule in operator_code_rules() | kopf_rules(clusterwide=False)
            | admission_rules() if rule[:2] not in CLUSTER_SCOPED}
    for role in roles:
        assert_same(granted(role["rules"]), used)


def test_helm_test_hook_role_is_minimal():
    [role] = [role for role in by_kind(render(), "Role")
              if role["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    assert granted(role["rules"]) == {("", "pods", "list")}  # healthcheck.py's only call


def test_a_wildcard_or_an_extra_rule_is_caught():
    """The checks above can fail: a `*` verb and an unused rule are both refused."""
    with pytest.raises(AssertionError, match="wildcard"):
        granted([{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}])
    used = operator_code_rules() | kopf_rules(clusterwide=True)
    with pytest.raises(AssertionError, match="never used"):
        assert_same(used | {("", "pods", "update")}, used)
    with pytest.raises(AssertionError, match="not granted"):
        assert_same(used - {("apps", "statefulsets", "delete")}, used)


def test_network_policy_off_drops_its_rule():
    objects = render("--set", "networkPolicy.enabled=false")
    [role] = operator_objects(objects, "ClusterRole")
    used = operator_code_rules() | kopf_rules(clusterwide=True) | admission_rules()
    policy_rules = {rule for rule in used if rule[1] == "networkpolicies"}
    # list+watch: the cache; delete: a deleted job's leftovers (passes.delete_leftovers)
    assert policy_rules == {("networking.k8s.io", "networkpolicies", verb)
                            for verb in ("get", "create", "list", "watch", "delete")}
    assert_same(granted(role["rules"]), used - policy_rules)
    [deployment] = operator_objects(objects, "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "MONARCH_OPERATOR_NETWORK_POLICY", "value": "false"} in env


def test_kueue_manager_may_read_monarchjobs_when_named():
    """Kueue's manager walks a pod's owners up to its MonarchJob (external framework): the
    chart grants its ServiceAccount read access to MonarchJobs, and nothing else, on request."""
    assert not [role for role in operator_objects(render(), "ClusterRole")
                if role["metadata"]["name"].endswith("-kueue-manager")]
    objects = render("--set", "kueue.managerServiceAccount.name=kueue-controller-manager")
    [role] = [role for role in operator_objects(objects, "ClusterRole")
              if role["metadata"]["name"].endswith("-kueue-manager")]
    assert granted(role["rules"]) == {(constants.GROUP, constants.PLURAL, verb)
                                      for verb in ("get", "list", "watch")}
    [binding] = [binding for binding in operator_objects(objects, "ClusterRoleBinding")
                 if binding["roleRef"]["name"] == role["metadata"]["name"]]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kueue-controller-manager",
                                    "namespace": "kueue-system"}]


def test_a_multikueue_manager_may_copy_the_workers_status_onto_monarchjobs():
    """On a MultiKueue manager Kueue patches each job's status with its worker copy's
    (docs/kueue.md#multikueue): ``kueue.managerServiceAccount.multiKueue`` adds exactly that."""
    objects = render("--set", "kueue.managerServiceAccount.name=kueue-controller-manager",
                     "--set", "kueue.managerServiceAccount.multiKueue=true")
    [role] = [role for role in operator_objects(objects, "ClusterRole")
              if role["metadata"]["name"].endswith("-kueue-manager")]
    assert granted(role["rules"]) == {
        *((constants.GROUP, constants.PLURAL, verb)
          for verb in ("get", "list", "watch", "patch", "update")),
        *((constants.GROUP, f"{constants.PLURAL}/status", verb)
          for verb in ("get", "patch", "update"))}
