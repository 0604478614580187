"""Kueue integration: one MonarchJob is one Kueue Workload and one gang.

:mod:`.workload` (pure) builds the Workload and reads Kueue's verdict from it, :mod:`.client`
talks to the API about Kueue's objects, :mod:`.admission` is the step of a reconcile pass
(queued, admitted, evicted, finished), :mod:`.watch` wakes a job when its Workload changes.
"""
