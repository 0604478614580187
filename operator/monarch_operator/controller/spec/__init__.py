"""Admission: the MonarchJob spec as typed values (the CRD's defaults applied), worker
groups and roles, the run policy, attach mode's meshes, and the operator's settings. Pure.
"""
