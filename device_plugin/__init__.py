"""The node side: the kubelet device plugin daemon (NVML discovery, virtual slices, Allocate)."""
