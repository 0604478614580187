"""How passes run: the reconcile checklist and one pass in a worker thread, when a job
wakes, the watches' health, the pace of status writes, and the operator's metrics.
"""
