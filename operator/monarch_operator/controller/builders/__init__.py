"""Pure builders, one module per child kind: ``build_*(job, settings, ...) -> dict``.

No I/O, no clock, no globals: the same inputs give the same manifest.
"""
