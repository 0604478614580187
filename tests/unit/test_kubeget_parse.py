"""Which ``kubectl get`` forms the in-process reader answers, and what it makes of them
(``localcluster/kubeget.py``); the answers themselves are compared with kubectl's on a real API
server in ``tests/cluster/test_kubeget.py``."""

from __future__ import annotations

import pytest

from monarch_operator.localcluster.kubeget import GetQuery, parse_get


@pytest.mark.parametrize(("args", "expected"), [
    (("get", "monarchjob", "demo", "-n", "ns", "-o", "json"),
     GetQuery("monarchjob", "demo", "ns", None, False)),
    (("get", "pods", "-n", "ns", "-l", "a=b,c in (d)", "-o", "json"),
     GetQuery("pods", None, "ns", "a=b,c in (d)", False)),
    (("get", "crd/monarchjobs.monarch-operator.dev", "-o", "json"),
     GetQuery("crd", "monarchjobs.monarch-operator.dev", None, None, False)),
    (("get", "--namespace=ns", "--selector=x", "pods", "--output=json"),
     GetQuery("pods", None, "ns", "x", False)),
    (("get", "pod", "p", "--namespace", "ns", "--ignore-not-found", "-ojson"),
     GetQuery("pod", "p", "ns", None, True)),
    (("get", "pod", "p", "-o=json", "-n=ns"), GetQuery("pod", "p", "ns", None, False)),
])
def test_plain_forms_are_parsed(args, expected):
    assert parse_get(args) == expected


@pytest.mark.parametrize("args", [
    ("get", "pods", "-n", "ns"),                                  # a table, not JSON
    ("get", "pods", "-o", "yaml"),
    ("get", "pods", "-o", "jsonpath={.items}"),
    ("get", "pods,services", "-o", "json"),                       # several kinds
    ("get", "pod", "a", "b", "-o", "json"),                       # several names
    ("get", "pod/a", "b", "-o", "json"),
    ("get", "pod/", "-o", "json"),
    ("get", "pods", "-A", "-o", "json"),                          # a flag it leaves to kubectl
    ("get", "pods", "--field-selector", "x=y", "-o", "json"),
    ("get", "pods", "-w", "-o", "json"),
    ("get", "pods", "-n"),                                        # a flag without its value
    ("get", "-o", "json"),                                        # nothing named
    ("apply", "-f", "x.yaml"),
    (),
])
def test_other_forms_are_left_to_kubectl(args):
    assert parse_get(args) is None
