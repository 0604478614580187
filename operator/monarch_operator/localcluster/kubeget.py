"""``kubectl get ... -o json`` answered in the calling process by the Kubernetes Python client.

The demo's and the tests' waits read an object every half second. Each ``kubectl`` run starts a
Go binary that reads its kubeconfig and discovery cache: about 49 ms of CPU, against a few
milliseconds for the same GET through a client already loaded (docs/development.md, "Where
the CPU goes": 5876 runs in one CI run). :class:`InProcessGet` answers the plain form::

    get RESOURCE[/NAME] [NAME] [-n NS] [-l SELECTOR] [--ignore-not-found] -o json

with what kubectl prints for it (one object, or a ``List`` whose items carry ``apiVersion``
and ``kind``) and kubectl's exit status; anything else (another output format, several kinds,
flags it does not know, an API error other than NotFound, a resource name that discovery does
not make unique) it leaves to the binary by answering None.

Resource names resolve as kubectl resolves them, from the server's discovery (the Python
client's :class:`kubernetes.dynamic.DynamicClient`): plural, singular, short name or kind, each
optionally with ``.group``; the core group wins a tie, as in kubectl's priority order. Reference:
https://kubernetes.io/docs/reference/kubectl/generated/kubectl_get/
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any

# Shown in the API server's audit log for these reads (never a prefix the operator uses).
USER_AGENT = "monarch-localcluster-get"
# Seconds to connect and to read an answer; past them kubectl itself is asked (and says why).
REQUEST_TIMEOUT = (10, 60)


@dataclass(frozen=True)
class GetQuery:
    """One parsed ``kubectl get``: the resource as typed, an object name or None (a list), the
    namespace or None (the kubeconfig's), a label selector or None, and whether a missing
    object is no error."""

    resource: str
    name: str | None
    namespace: str | None
    selector: str | None
    ignore_not_found: bool


def parse_get(args: tuple[str, ...]) -> GetQuery | None:
    """Parse ``args`` (starting with ``get``) into a :class:`GetQuery`.

    Returns:
        None where the form is not the plain one this module answers (not ``-o json``, several
        resources or names, any flag besides ``-n``/``--namespace``, ``-l``/``--selector``,
        ``--ignore-not-found``, ``-o``/``--output``).
    """
    if not args or args[0] != "get":
        return None
    positional: list[str] = []
    options: dict[str, str] = {}
    ignore_not_found = False
    aliases = {"-n": "namespace", "--namespace": "namespace", "-l": "selector",
               "--selector": "selector", "-o": "output", "--output": "output"}
    rest = list(args[1:])
    while rest:
        token = rest.pop(0)
        if token in ("--ignore-not-found", "--ignore-not-found=true"):
            ignore_not_found = True
        elif token in aliases:
            if not rest:
                return None
            options[aliases[token]] = rest.pop(0)
        elif token.startswith("-"):
            flag, equals, value = token.partition("=")
            if equals and flag in aliases:
                options[aliases[flag]] = value
            elif token.startswith("-o") and len(token) > 2 and token[2] != "=":
                options["output"] = token[2:]
            else:
                return None
        else:
            positional.append(token)
    if options.get("output") != "json" or not 1 <= len(positional) <= 2:
        return None
    resource, slash, name = positional[0].partition("/")
    if "," in resource or not resource or (slash and (not name or len(positional) == 2)):
        return None
    if not slash:
        name = positional[1] if len(positional) == 2 else ""
    return GetQuery(resource, name or None, options.get("namespace"), options.get("selector"),
                    ignore_not_found)


def _shown(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as kubectl prints it: without ``metadata.managedFields``
    (``--show-managed-fields=false``, kubectl's default)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        obj = {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    return obj


def _object_not_found(error: Any) -> bool:
    """Whether a 404 is the API server's Status for a missing object (it names the object in
    ``details``), not a path it does not serve (a CRD deleted since discovery)."""
    try:
        body = json.loads(error.body)
    except (TypeError, ValueError):
        return False
    return isinstance(body, dict) and body.get("kind") == "Status" \
        and isinstance(body.get("details"), dict)


class InProcessGet:
    """Answers plain ``kubectl get -o json`` calls against one kubeconfig in this process.

    Thread-safe. Any failure other than NotFound (no API server yet, a refusal, a timeout)
    answers None, so that kubectl runs and words it as it always has.
    """

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self._lock = threading.Lock()
        self._dynamic: Any = None
        self._namespace = "default"
        self._resolved: dict[str, Any] = {}

    def answer(self, args: tuple[str, ...]) -> tuple[int, str, str] | None:
        """Run ``kubectl ARGS`` in this process if it is a form this module answers.

        Returns:
            ``(exit status, stdout, stderr)`` as kubectl gives them, or None: run the binary.
        """
        query = parse_get(args)
        if query is None:
            return None
        try:
            return self._answer(query)
        except Exception:  # noqa: BLE001 - not reachable or not readable: kubectl says why
            with self._lock:  # made again next time (a restarted cluster's new port or CA)
                self._dynamic = None
                self._resolved.clear()
            return None

    def _answer(self, query: GetQuery) -> tuple[int, str, str] | None:
        dynamic = self._client()
        resource = self._resolve(dynamic, query.resource)
        if resource is None:
            return None
        from kubernetes.dynamic.exceptions import NotFoundError
        namespace = (query.namespace or self._namespace) if resource.namespaced else None
        try:
            if query.name is not None:
                found = dynamic.get(resource, name=query.name, namespace=namespace,
                                    label_selector=query.selector,
                                    _request_timeout=REQUEST_TIMEOUT).to_dict()
                return 0, json.dumps(_shown(found), indent=4) + "\n", ""
            listed = dynamic.get(resource, namespace=namespace, label_selector=query.selector,
                                 _request_timeout=REQUEST_TIMEOUT).to_dict()
        except NotFoundError as error:
            if not _object_not_found(error):  # the resource type itself is gone
                self._resolved.pop(query.resource, None)
                return None
            if query.ignore_not_found:
                return 0, "", ""
            group = f".{resource.group}" if resource.group else ""
            return 1, "", (f'Error from server (NotFound): {resource.name}{group} '
                           f'"{query.name}" not found\n')
        items = [_shown({"apiVersion": resource.group_version, "kind": resource.kind, **item})
                 for item in listed.get("items") or []]
        if not items and query.ignore_not_found:
            return 0, "", ""
        return 0, json.dumps({"apiVersion": "v1", "items": items, "kind": "List",
                              "metadata": {"resourceVersion": ""}}, indent=4) + "\n", ""

    def _client(self) -> Any:
        """The dynamic client, made on first use (discovery cached beside the kubeconfig).

        Raises:
            Exception: the kubeconfig unreadable or the API server not answering (the caller
                runs kubectl instead and tries the client again next time).
        """
        with self._lock:
            if self._dynamic is None:
                from kubernetes import config
                from kubernetes.dynamic import DynamicClient
                api = config.new_client_from_config(config_file=self.kubeconfig)
                api.user_agent = USER_AGENT
                _, context = config.list_kube_config_contexts(config_file=self.kubeconfig)
                self._namespace = context.get("context", {}).get("namespace") or "default"
                cache = os.path.join(os.path.dirname(os.path.abspath(self.kubeconfig)),
                                     "discovery-cache.json")
                self._dynamic = DynamicClient(api, cache_file=cache)
            return self._dynamic

    def _resolve(self, dynamic: Any, typed: str) -> Any:
        """The one served resource ``typed`` names, or None (unknown after a fresh discovery,
        or not unique). Resolved names are kept; a name not found makes discovery start over
        once (a CRD installed since the last look)."""
        from kubernetes.dynamic.resource import Resource, ResourceList
        if typed in self._resolved:
            return self._resolved[typed]
        word, _, group = typed.lower().partition(".")
        for attempt in range(2):
            matches: dict[str, Any] = {}
            for entry in dynamic.resources:  # lists of a kind's resources
                for resource in entry if isinstance(entry, list) else [entry]:
                    if (not isinstance(resource, Resource) or isinstance(resource, ResourceList)
                            or not resource.preferred
                            or (group and resource.group != group)):
                        continue
                    names = {resource.name, resource.singular_name or "",
                             resource.kind.lower(), *(resource.short_names or [])}
                    if word in names:
                        matches[resource.group] = resource
            found = matches.get("") if len(matches) > 1 else next(iter(matches.values()), None)
            if found is not None:
                self._resolved[typed] = found
                return found
            if matches or attempt:
                return None
            with self._lock:
                dynamic.resources.invalidate_cache()
        return None
