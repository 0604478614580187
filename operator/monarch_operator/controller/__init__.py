"""The MonarchJob operator: kopf handlers, reconcile loop, pure builders and the one API layer.

Data flow: kopf event (:mod:`.handlers`) -> :func:`.reconcile.reconcile` -> pure builders
(:mod:`.builders`) give the desired children -> :mod:`.k8s` applies them -> :mod:`.status`
summarises -> one status patch. Only :mod:`.k8s` imports the Kubernetes client.
"""
