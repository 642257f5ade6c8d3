"""Enforcement in the container: the Allocate answer's environment and mounts, and live limits on disk
(``limits.json`` and HAMi-core's shared region)."""
