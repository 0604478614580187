"""Service-account tokens and the API server's address for pods of the local cluster."""

from __future__ import annotations

import datetime as dt
import stat
from types import SimpleNamespace

import pytest

from monarch_operator.localcluster import serviceaccount

POD = {"metadata": {"name": "p", "namespace": "team-a", "uid": "u-1"},
       "spec": {"serviceAccountName": "lister"}}


def test_api_server_env_is_the_real_loopback_address():
    assert serviceaccount.api_server_env("https://127.0.0.1:40123") == {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "40123",
        "KUBERNETES_SERVICE_PORT_HTTPS": "40123"}
    with pytest.raises(ValueError, match="no host and port"):
        serviceaccount.api_server_env("https://127.0.0.1")


def test_token_request_is_bound_to_the_pod():
    body = serviceaccount.token_request(POD, {"path": "token", "audience": "vault",
                                              "expirationSeconds": 600})
    assert body["spec"] == {"audiences": ["vault"], "expirationSeconds": 600,
                            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                               "name": "p", "uid": "u-1"}}
    # no audience: the API server's own; no lifetime: one hour
    assert serviceaccount.token_request(POD, {"path": "t"})["spec"].keys() == {
        "expirationSeconds", "boundObjectRef"}
    assert serviceaccount.token_request(POD, {"path": "t"})["spec"]["expirationSeconds"] == 3600


@pytest.mark.parametrize(("lifetime", "renew_after"), [
    (3607, 3607 * 0.8),       # the kube-api-access token: at 80% of its lifetime
    (600, 480),
    (7 * 24 * 3600, 24 * 3600),  # long tokens: when a day old
])
def test_refresh_at_80_percent_or_a_day(lifetime, renew_after):
    expires = 1_000_000.0 + lifetime
    assert serviceaccount.refresh_at(expires, lifetime) == pytest.approx(1_000_000 + renew_after)


class FakeCore:
    """Answers TokenRequests with numbered tokens (stands in for the API in a unit test)."""

    def __init__(self, now):
        self.now, self.calls, self.fail = now, [], False

    def create_namespaced_service_account_token(self, name, namespace, body):
        if self.fail:
            raise RuntimeError("API away")
        self.calls.append((name, namespace, body["spec"]["expirationSeconds"]))
        expires = dt.datetime.fromtimestamp(self.now + body["spec"]["expirationSeconds"], dt.UTC)
        return SimpleNamespace(status=SimpleNamespace(token=f"jwt-{len(self.calls)}",
                                                      expiration_timestamp=expires))


def test_tokens_are_written_and_renewed_keeping_mode(tmp_path):
    core = FakeCore(now=1000.0)
    tokens = serviceaccount.PodTokens(core, POD)
    path = tmp_path / "token"
    tokens.write({"path": "token", "expirationSeconds": 600}, path, 0o640, None)
    assert path.read_text() == "jwt-1" and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert core.calls == [("lister", "team-a", 600)]
    assert tokens.refresh(1000.0 + 479) == 0 and path.read_text() == "jwt-1"
    core.now = 1000.0 + 481
    assert tokens.refresh(core.now) == 1
    assert path.read_text() == "jwt-2" and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token"]  # no partial files left


def test_a_failed_renewal_keeps_the_old_token_and_retries_later(tmp_path):
    core = FakeCore(now=0.0)
    tokens = serviceaccount.PodTokens(core, POD)
    path = tmp_path / "token"
    tokens.write({"path": "token", "expirationSeconds": 600}, path, 0o644, None)
    core.fail = True
    assert tokens.refresh(500.0) == 0 and path.read_text() == "jwt-1"
    core.fail = False
    assert tokens.refresh(505.0) == 0  # not before RETRY_SECONDS
    assert tokens.refresh(500.0 + serviceaccount.RETRY_SECONDS) == 1
    assert path.read_text() == "jwt-2"
