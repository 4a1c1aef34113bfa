"""The served-traffic benchmark: locals and its peers (mlx_lm.server, llama.cpp's server) as
fresh server processes on the same weights, driven over HTTP by agent-shaped traffic.

workload (the conversations, from a seed) → servers (start, time, stop) → driver (stream,
record) → report (figures, medians, ratios, table); run ties them together. A client of
servers only: nothing here imports the engine or loads a model.
"""
