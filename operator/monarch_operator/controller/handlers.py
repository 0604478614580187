"""Thin kopf handlers: each takes the kwargs it needs and makes one call to ``reconcile``."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import kopf

from monarch_operator import constants
from monarch_operator.controller import k8s, reconcile
from monarch_operator.controller import status as st
from monarch_operator.controller.settings import Settings
from monarch_operator.controller.spec import InvalidSpecError

SETTINGS = Settings.from_env()
logger = logging.getLogger("monarch_operator")
_RESOURCE = (constants.GROUP, constants.VERSION, constants.PLURAL)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Load API credentials; keep kopf's own bookkeeping quiet and off our status."""
    k8s.load_config()
    # Only warnings become Kubernetes Events; per-pass INFO logs would flood `kubectl describe`.
    settings.posting.level = logging.WARNING
    # kopf logs every timer run at INFO; reconcile logs what changed instead.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=f"{constants.GROUP}"
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=f"{constants.GROUP}", key="last-handled-configuration"
    )


@kopf.on.create(*_RESOURCE)
@kopf.on.resume(*_RESOURCE)
@kopf.on.update(*_RESOURCE, field="spec")
def on_change(body: kopf.Body, **_: Any) -> None:
    """Reconcile when the job appears, when the operator restarts, or when its spec changes."""
    _reconcile(body)


@kopf.timer(*_RESOURCE, interval=SETTINGS.resync_seconds, sharp=False)
def on_timer(body: kopf.Body, **_: Any) -> None:
    """Level-based resync: follows worker readiness, the launcher and the startup timeout."""
    _reconcile(body)


def _reconcile(body: kopf.Body) -> None:
    manifest = dict(body)
    try:
        events = reconcile.reconcile(manifest, SETTINGS, dt.datetime.now(dt.UTC))
    except InvalidSpecError as error:
        _fail_invalid(manifest, str(error))
        kopf.warn(body, reason=st.REASON_INVALID_SPEC, message=str(error))
        raise kopf.PermanentError(str(error)) from error
    except k8s.NotOwnedError as error:
        kopf.warn(body, reason=st.REASON_CHILD_NOT_OWNED, message=str(error))
        raise kopf.TemporaryError(str(error), delay=10) from error
    for event in events:
        logger.info("%s/%s %s: %s", body.metadata.namespace, body.metadata.name, event.reason,
                    event.message)
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def _fail_invalid(manifest: dict[str, Any], message: str) -> None:
    status = dict(manifest.get("status") or {})
    generation = int(manifest.get("metadata", {}).get("generation", 1))
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    new_status = st.set_condition(status, st.FAILED, True, st.REASON_INVALID_SPEC, message,
                                  generation, now)
    new_status["phase"] = st.summarize_phase(new_status)
    if new_status != status:
        metadata = manifest["metadata"]
        k8s.patch_job_status(metadata.get("namespace", "default"), metadata["name"], new_status)
