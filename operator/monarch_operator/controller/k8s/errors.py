"""What the API layer raises: a create refused as invalid or forbidden, a name taken by an object
the job does not own, the job deleted during its pass; and the API server's message.
"""

from __future__ import annotations

import json
import re

from kubernetes.client.rest import ApiException

# The API server's decoding errors name the kind twice before what is wrong ('StatefulSet in
# version "v1" cannot be handled as a StatefulSet: strict decoding error: unknown field ...').
_DECODING_PREFIX = re.compile(r'^\w+ in version "[^"]*" cannot be handled as an? \w+: ')


class RefusedError(RuntimeError):
    """The API server refused to create a child as invalid (HTTP 400/422), or the client could
    not even send it: the same object will never be accepted (field case C12). The message
    leaves out the decoding error's preamble, so that the field it names fits the job's
    MESSAGE column."""

    def __init__(self, kind: str, name: str, detail: str) -> None:
        super().__init__(f"the API server refused {kind} {name}: "
                         f"{_DECODING_PREFIX.sub('', detail)}")
        self.kind = kind


class ForbiddenError(RuntimeError):
    """The API server refused the operator itself (HTTP 403, not a quota): its RBAC lacks a
    verb, or an admission plugin refused what it may not do, such as
    ``OwnerReferencesPermissionEnforcement`` refusing ``blockOwnerDeletion`` to a user without
    ``update`` on ``monarchjobs/finalizers`` (field case C24; kubeflow/trainer#2349). Retrying
    cannot help until an administrator grants the permission."""

    def __init__(self, kind: str, name: str, detail: str) -> None:
        super().__init__(f"the API server refused to let the operator create {kind} {name}: "
                         f"{detail}")
        self.kind = kind


class NotOwnedError(RuntimeError):
    """A child's name is taken by an object that the job does not control (field case C6)."""


class JobGoneError(RuntimeError):
    """The job of the running pass was deleted (or is being deleted) meanwhile: the pass
    stops; it created nothing more (see :meth:`.cache.JobCache.job_deleted`)."""


def api_error_message(error: ApiException) -> str:
    """The API server's ``Status.message`` when the body is one, else the raw body."""
    try:
        return str(json.loads(error.body or "{}").get("message") or error.body)
    except (ValueError, AttributeError):
        return str(error.body)
