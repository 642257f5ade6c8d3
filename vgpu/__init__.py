"""The pure domain every program shares: quantities, the GPU catalog, the request model, the contracts,
the autoscaling arithmetic and the scheduling core.

Pure Python with no I/O, so every program agrees on every decision and every wire format by
importing the same code.
"""
