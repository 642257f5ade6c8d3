"""The webhook's settings: listen address, TLS files, how to reach the API server.

Read from ``TF_WEBHOOK_*`` environment variables (what the Helm chart sets) and overridable by
command-line flags (what a developer or the end-to-end harness types); pydantic validates both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from scheduler_extender.webhook.tls import CHECK_INTERVAL_S
from scheduler_extender.webhook.tolerations import NVIDIA_TAINT, check
from vgpu.logfmt import LogFormat


class WebhookSettings(BaseSettings):
    """Settings of ``tf-webhook``."""

    model_config = SettingsConfigDict(env_prefix="TF_WEBHOOK_", env_ignore_empty=True, extra="forbid")

    host: str = "0.0.0.0"  # a pod's webhook must listen on its pod IP
    port: int = Field(default=9443, ge=1, le=65535)
    tls_cert_file: Path = Path("/etc/tensor-fusion/webhook-tls/tls.crt")
    tls_key_file: Path = Path("/etc/tensor-fusion/webhook-tls/tls.key")
    tls_reload_s: float = Field(default=CHECK_INTERVAL_S, gt=0, le=3600)
    # Empty: in-cluster service-account credentials.
    kubeconfig: Path | None = None
    # Per Kubernetes call; keep the sum of a request's calls (3-4) well inside the webhook's timeoutSeconds.
    kube_timeout_s: float = Field(default=2.0, gt=0, le=30)
    log_level: str = "info"
    log_format: LogFormat = LogFormat.TEXT
    # Added to every GPU pod that does not already tolerate them (JSON list in TF_WEBHOOK_GPU_TOLERATIONS).
    gpu_tolerations: list[dict[str, Any]] = Field(default_factory=lambda: [dict(t) for t in NVIDIA_TAINT])

    @field_validator("gpu_tolerations")
    @classmethod
    def _tolerations(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return check(value)
