"""The launcher's final line stays last: it shuts Monarch's client down itself, with a longer
limit than Monarch's own exit hook, whose 1 s TimeoutError under load printed a traceback after
it (seen in CI with parallel test workers)."""

import io
import sys
import types

import pytest

from monarch_operator.launcher import report


class _Future:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error
        self.waited: float | None = None

    def get(self, timeout: float) -> None:
        self.waited = timeout
        if self.error:
            raise self.error


def _fake_monarch(monkeypatch: pytest.MonkeyPatch, future: _Future) -> list[float | None]:
    calls: list[float | None] = []

    def shutdown_context(host_timeout: float | None = None) -> _Future:
        calls.append(host_timeout)
        return future

    monkeypatch.setitem(sys.modules, "monarch.actor",
                        types.SimpleNamespace(shutdown_context=shutdown_context))
    return calls


def test_the_client_is_shut_down_before_the_final_line(monkeypatch: pytest.MonkeyPatch) -> None:
    future = _Future(None)
    calls = _fake_monarch(monkeypatch, future)
    out, err = io.StringIO(), io.StringIO()
    code = report.Reporter(out=out, err=err).result(1, "rank 0 exited with code 1")
    assert code == 1 and len(calls) == 1
    assert future.waited == report.MONARCH_CLIENT_SHUTDOWN_S > 1.0
    # The flush cap: workers are gone by now, so each flush waits it out in full (0.7.0: two).
    assert calls == [report.MONARCH_FLUSH_S] and 0 < report.MONARCH_FLUSH_S <= 0.5
    assert err.getvalue().splitlines()[-1].endswith("failed: rank 0 exited with code 1")


def test_a_client_that_does_not_shut_down_is_named_and_the_outcome_stands(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_monarch(monkeypatch, _Future(TimeoutError()))
    out, err = io.StringIO(), io.StringIO()
    assert report.Reporter(out=out, err=err).result(0) == 0
    assert "did not shut down within 15s" in err.getvalue()
    assert out.getvalue().splitlines()[-1].endswith("succeeded")


def test_without_monarch_imported_nothing_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "monarch.actor", raising=False)
    out, err = io.StringIO(), io.StringIO()
    assert report.Reporter(out=out, err=err).result(2, "bad flag") == 2
    assert err.getvalue().strip().endswith("failed: bad flag")
