"""What one reconcile pass knows and carries: the status and its conditions, the
attempts' records, readings of the observed children, the pass's own state, deadlines. Pure:
nothing here talks to the API.
"""
