"""The current attempt's launcher: started once the gate passed, followed to its
outcome, its checkpoints and its progress reports.
"""
