"""The versioned JSON formats the binaries exchange through the Kubernetes API (DESIGN §5).

Node inventory (device plugin → extender), pod allocation (extender → device plugin), the hand-off
confirmation (device plugin → extender) and the resolved request (webhook → everyone). Each has an
``encode`` and a strict ``decode`` that names the missing or malformed field.
"""
