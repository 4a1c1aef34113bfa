"""locals: a continuously batched MLX server, team runner and tool integrations for coding agents."""

__version__ = "0.1.0"
