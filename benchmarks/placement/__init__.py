"""Placement quality on the openb GPU-sharing trace (Alibaba 2023, the FGD paper's benchmark).

Run ``python -m benchmarks.placement --quick`` or ``--all``; see ``README.md`` beside this file.
"""
