"""Letting go: stopping the launcher before the workers, pods stuck terminating,
a suspended job's children, a finished job's children as ``spec.cleanupPolicy`` says.
"""
