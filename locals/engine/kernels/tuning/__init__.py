"""Kernel tuning: verify candidates against the reference, time them, choose per chip and save the table."""
