"""kopf's identity for this process does not need a passwd entry for the uid (OpenShift's
arbitrary uids; the chart's uid 65532 on the local cluster's agent): kopf's own asks
``getpass.getuser()``, which raises for an unknown uid."""

from __future__ import annotations

import getpass
import os
import socket

from monarch_operator.controller.__main__ import kopf_identity


def test_identity_is_host_and_pid_without_asking_for_the_user(monkeypatch):
    def no_user() -> str:
        raise KeyError("getpwuid(): uid not found: 65532")

    monkeypatch.setattr(getpass, "getuser", no_user)
    for variable in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(variable, raising=False)
    assert kopf_identity() == f"{socket.gethostname()}/{os.getpid()}"
