"""The gate of an attempt: the job's children applied, then every worker Ready, or why not.
"""
