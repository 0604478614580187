"""A forge-shaped GRPO loop on four named roles: generator, trainer, reference, reward."""
