"""The webhook's settings: listen address, TLS files, how to reach the API server.

Read from ``TF_WEBHOOK_*`` environment variables (what the Helm chart sets) and overridable by
command-line flags (what a developer or the end-to-end harness types), both through
:mod:`tf_shell.settings_cli`; pydantic validates both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tf_shell.logfmt import LogFormat, LogLevel
from tf_shell.tls import CHECK_INTERVAL_S
from tf_webhook.migration import ReplicaShare
from tf_webhook.tolerations import NVIDIA_TAINT, check
from vgpu.errors import DomainError
from vgpu.quantity import parse_bytes, parse_milli


class WebhookSettings(BaseSettings):
    """Settings of ``tf-webhook``."""

    model_config = SettingsConfigDict(env_prefix="TF_WEBHOOK_", env_ignore_empty=True, extra="forbid")

    host: str = Field("0.0.0.0", description="Address to listen on; a pod's webhook must listen on its pod IP.")
    port: int = Field(9443, ge=1, le=65535, description="HTTPS port.")
    tls_cert_file: Path = Field(Path("/etc/tensor-fusion/webhook-tls/tls.crt"), description="PEM certificate.")
    tls_key_file: Path = Field(Path("/etc/tensor-fusion/webhook-tls/tls.key"), description="PEM private key.")
    tls_reload_s: float = Field(
        CHECK_INTERVAL_S,
        gt=0,
        le=3600,
        description="Seconds between checks of the certificate and key for a renewal, served without a restart.",
    )
    kubeconfig: Path | None = Field(None, description="Path to a kubeconfig; unset means in-cluster credentials.")
    kube_timeout_s: float = Field(
        2.0,
        gt=0,
        le=30,
        description="Timeout of each Kubernetes API call in seconds; keep the sum of a request's calls (3-4) "
        "well inside the webhook's timeoutSeconds.",
    )
    log_level: LogLevel = Field("info", description="Log level of the webhook's own logs and uvicorn's.")
    log_format: LogFormat = Field(LogFormat.TEXT, description="text, or json: one object per line.")
    gpu_tolerations: list[dict[str, Any]] = Field(
        default_factory=lambda: [dict(t) for t in NVIDIA_TAINT],
        description="Tolerations added to every GPU pod that does not already tolerate them; [] adds none.",
    )
    migration_replica_tflops: str = Field(
        "",
        description="TFLOPS (a quantity) given per time-sliced replica to a pod migrated from nvidia.com/gpu (in a "
        "namespace labelled tensor-fusion.ai/migrate-nvidia-gpu=time-sliced) or nvidia.com/gpu.shared; empty: none.",
    )
    migration_replica_vram: str = Field(
        "", description="VRAM (a quantity such as 10Gi) given per time-sliced replica, as migration-replica-tflops."
    )

    @field_validator("gpu_tolerations")
    @classmethod
    def _tolerations(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return check(value)

    @field_validator("migration_replica_tflops", "migration_replica_vram")
    @classmethod
    def _quantity(cls, value: str) -> str:
        try:
            parse_milli(value or "0")  # the same syntax as parse_bytes: the unit only matters for rounding
        except DomainError as exc:
            raise ValueError(exc.errors[0].problem) from None
        return value

    @property
    def replica_share(self) -> ReplicaShare:
        """What one time-sliced replica of a migrated pod is given (tf_webhook/migration.py)."""
        tflops, vram = self.migration_replica_tflops, self.migration_replica_vram
        return ReplicaShare(parse_milli(tflops) if tflops else None, parse_bytes(vram) if vram else None)
