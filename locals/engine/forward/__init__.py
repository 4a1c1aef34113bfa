"""The forward pass: a ragged batch through the model (eager or compiled), its KV storage and step inputs."""
