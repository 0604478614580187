"""Leader election for running two or more operator replicas (issue 34; docs/ha.md).

One replica at a time holds a ``coordination.k8s.io/v1`` Lease in the operator's namespace
and runs kopf; the others stand by without watching or writing anything, and take the Lease
over when it is released or stops being renewed. Modules:

- :mod:`.settings`: the Lease's name, namespace, this replica's identity, the timings;
- :mod:`.lease`: the Lease calls, bounded, through an API client of their own;
- :mod:`.elector`: acquire, renew, lose, release (client-go's algorithm on a monotonic clock);
- :mod:`.fence`: refuses the operator's writes once leadership is in doubt;
- :mod:`.standby`: ``/healthz`` on a standby;
- :mod:`.run`: the process: campaign, run kopf while leading, exit on a loss.
"""
