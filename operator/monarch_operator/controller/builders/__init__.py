"""Pure builders, one module per child kind: ``build_*(job, settings, ...) -> dict``.

No I/O, no clock, no globals: the same inputs give the same manifest. The one exception is
:mod:`.sshkeys`, which makes the job's random key pairs; the gate makes them once, when the
key Secret is first created, and hands them to :func:`.secret.build_ssh_secret`.
"""
