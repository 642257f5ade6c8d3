"""``tf-device-plugin``: the node side, the kubelet device plugin daemon (GPU discovery, virtual slices, Allocate,
enforcement, the node's inventory and usage)."""
