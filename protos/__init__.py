"""The kubelet's gRPC contracts (device plugin v1beta1, PodResources v1) and their generated code."""
