"""``/healthz`` while this replica is a standby (kopf, which serves it on the leader, does not
run yet): 200 with who leads, so that readiness is independent of leadership. A PodDisruption
Budget counts Ready pods only; a standby that is never Ready would block every drain of the
leader's node (docs/ha.md).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StandbyHealth:
    """An HTTP server on kopf's liveness address (``--liveness URL``) until :meth:`close`.

    ``describe()`` gives the JSON body of each answer (e.g. the Lease's holder). Raises
    ``OSError`` when the address cannot be bound, ``ValueError`` for a URL that is not http.
    """

    def __init__(self, url: str, describe: Callable[[], dict[str, Any]]) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http":
            raise ValueError(f"{url}: only http:// liveness endpoints are served on a standby")
        path = parts.path or "/"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                found = self.path.split("?", 1)[0] == path
                body = json.dumps(describe() if found else {"error": "not found"}).encode()
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:  # probes every few seconds: no log
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer((parts.hostname or "127.0.0.1", parts.port or 80),
                                           Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="standby-healthz")
        self._thread.start()

    def close(self) -> None:
        """Stop answering and free the address (kopf binds it next)."""
        self._server.shutdown()
        self._server.server_close()
