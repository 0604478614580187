"""Settings of the leader election: the Lease's name and namespace, this replica's identity and
the three timings, checked as client-go checks them (``tools/leaderelection``: LeaseDuration >
RenewDeadline > 1.2 x RetryPeriod)."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

# controller-runtime's and client-go's defaults (seconds).
LEASE_DURATION = 15.0
RENEW_DEADLINE = 10.0
RETRY_PERIOD = 2.0
# client-go's JitterFactor: RenewDeadline must exceed this many retry periods.
JITTER_FACTOR = 1.2
LEASE_NAME = "monarch-operator"
# The pod's namespace as the kubelet mounts it with the ServiceAccount token.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
NAMESPACE_ENV = "POD_NAMESPACE"


@dataclass(frozen=True)
class ElectionSettings:
    """What the elector needs; times in seconds.

    ``lease_duration``: how long a candidate waits, after it last saw the Lease change, before
    it takes the Lease over; ``renew_deadline``: how long the leader keeps trying to renew
    before it gives up leading (and stops writing); ``retry_period``: the interval between
    tries, both of a candidate and of the leader.
    """

    namespace: str
    name: str = LEASE_NAME
    identity: str = ""
    lease_duration: float = LEASE_DURATION
    renew_deadline: float = RENEW_DEADLINE
    retry_period: float = RETRY_PERIOD

    def __post_init__(self) -> None:
        validate(self.lease_duration, self.renew_deadline, self.retry_period)
        if not self.namespace or not self.name:
            raise ValueError("the Lease needs a namespace and a name")
        if not self.identity:
            object.__setattr__(self, "identity", default_identity())

    @property
    def request_timeout(self) -> float:
        """Upper bound (seconds) of each Lease request: half the renew deadline, so that a hung
        request leaves the leader another try before its deadline."""
        return self.renew_deadline / 2

    @property
    def margin(self) -> float:
        """Seconds between the leader's renew deadline and the earliest moment a standby may
        take the Lease over (lease duration minus renew deadline, both counted from the start
        of the leader's last successful renewal)."""
        return self.lease_duration - self.renew_deadline


def validate(lease_duration: float, renew_deadline: float, retry_period: float) -> None:
    """Check the timings (seconds) as client-go does.

    Raises:
        ValueError: naming the rule broken: every value > 0, lease duration > renew deadline,
            renew deadline > 1.2 x retry period.
    """
    values = {"lease duration": lease_duration, "renew deadline": renew_deadline,
              "retry period": retry_period}
    for what, value in values.items():
        if not value > 0:
            raise ValueError(f"leader election: {what} must be > 0 seconds, not {value:g}")
    if not lease_duration > renew_deadline:
        raise ValueError(f"leader election: lease duration ({lease_duration:g}s) must exceed the "
                         f"renew deadline ({renew_deadline:g}s), or a standby could take the "
                         "Lease while the leader still acts")
    if not renew_deadline > JITTER_FACTOR * retry_period:
        raise ValueError(f"leader election: renew deadline ({renew_deadline:g}s) must exceed "
                         f"{JITTER_FACTOR:g} x the retry period ({retry_period:g}s), or the "
                         "leader has no second try before it gives up")


def default_identity() -> str:
    """``<hostname>_<8 hex>``: the pod's name plus a per-process suffix (as the MPI Operator's
    hostname + UUID), so that a restarted container never mistakes its predecessor's Lease for
    its own."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str | None:
    """The operator's own namespace: ``$POD_NAMESPACE``, else the ServiceAccount's namespace
    file; ``None`` when neither exists (outside a cluster: pass ``--leader-elect-namespace``)."""
    if os.environ.get(NAMESPACE_ENV):
        return os.environ[NAMESPACE_ENV]
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None
