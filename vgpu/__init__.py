"""The shared domain of both binaries: quantities, the GPU catalog, the request model and the contracts.

Pure Python with no I/O, so the scheduler extender, the device plugin and the webhook can agree on
every decision and every wire format by importing the same code.
"""
