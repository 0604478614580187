"""Judging an attempt: the verdict from what happened and when, hangs and stalls,
recreated workers' pre-flight failures, and how the attempt ends (Succeeded, or failed with a
class that the run policy restarts or fails).
"""
