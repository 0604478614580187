"""A user's own Monarch program: a policy trained with a KL penalty against a frozen reference."""
