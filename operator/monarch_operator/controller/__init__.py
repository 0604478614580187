"""The MonarchJob operator: kopf handlers, reconcile loop, pure builders and the one API layer.

Data flow: kopf event (:mod:`.handlers`) -> :func:`.engine.reconcile.reconcile` -> pure builders
(:mod:`.builders`) give the desired children -> :mod:`.k8s` applies them -> :mod:`.state.status`
summarises -> one status patch. Only :mod:`.k8s` (and its Kueue part, :mod:`.kueue.client`)
talks to the API server.

Stage folders, lowest first, each importing only those before it (docs/development.md, "Layout";
tests/unit/test_controller_layers.py): spec, builders, state, k8s, release, judge, kueue, gate,
launch, engine; then handlers and ``__main__``.
"""
