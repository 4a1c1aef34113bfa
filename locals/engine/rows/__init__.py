"""Per-row work: a sequence's state, sampling, prompt-lookup drafts, stop strings and guards."""
