"""An unchanged torchrun script, packaged so that a MonarchJob can run it with ``-m``."""
