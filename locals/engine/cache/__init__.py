"""Prompt caches: prefixes kept in memory, on disk across restarts, and shared by rows starting together."""
