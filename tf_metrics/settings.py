"""tf-metrics' settings: where it listens and with which certificate, where the device plugins are, how often
to ask them. Read from ``TF_METRICS_*`` environment variables (the chart) and flags (people, the e2e
harness) through :mod:`tf_shell.settings_cli`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from tf_shell.logfmt import LogFormat, LogLevel
from tf_shell.tls import CHECK_INTERVAL_S
from vgpu.names import DEVICE_PLUGIN_METRICS_PORT_NAME, METRICS_API_PORT

TLS_DIR = Path("/etc/tensor-fusion/metrics-api-tls")


class MetricsSettings(BaseSettings):
    """Settings of ``tf-metrics``."""

    model_config = SettingsConfigDict(env_prefix="TF_METRICS_", env_ignore_empty=True, extra="ignore", frozen=True)

    host: str = Field("0.0.0.0", description="Address to listen on (the API server dials the pod's IP).")
    port: int = Field(METRICS_API_PORT, ge=1, le=65535, description="HTTPS port.")
    tls_cert_file: Path = Field(
        TLS_DIR / "tls.crt", description="PEM serving certificate (the APIService's caBundle signs it)."
    )
    tls_key_file: Path = Field(TLS_DIR / "tls.key", description="PEM private key.")
    tls_reload_s: float = Field(
        CHECK_INTERVAL_S,
        gt=0,
        le=3600,
        description="Seconds between checks of the certificate and key for a renewal, served without a restart.",
    )
    kubeconfig: str | None = Field(
        None, description="Path to a kubeconfig; unset means in-cluster config, then ~/.kube/config."
    )
    plugin_service: str = Field(
        "tensor-fusion-device-plugin-metrics",
        description="The device plugins' metrics Service: its EndpointSlices list every plugin (the chart's "
        "<release>-device-plugin-metrics).",
    )
    plugin_namespace: str | None = Field(
        None, description="Namespace of that Service; unset: tf-metrics' own (its service account's), else 'default'."
    )
    plugin_port_name: str = Field(
        DEVICE_PLUGIN_METRICS_PORT_NAME, description="Name of the Service's port on which the plugins serve GET /usage."
    )
    interval: float = Field(
        5.0,
        gt=0,
        le=300,
        description="Seconds between passes over the device plugins; at most their sampling interval, so that "
        "a pod's figures are served within two of its plugin's intervals.",
    )
    fetch_timeout: float = Field(2.0, gt=0, le=60, description="Seconds one plugin has to answer GET /usage.")
    fetch_workers: int = Field(32, ge=1, le=512, description="Plugins asked at once.")
    authorization_ttl: float = Field(
        10.0, ge=0, le=600, description="Seconds a SubjectAccessReview's verdict is reused for the same user and read."
    )
    log_level: LogLevel = Field("info", description="Log level of tf-metrics' own logs and uvicorn's.")
    log_format: LogFormat = Field(LogFormat.TEXT, description="text, or json: one object per line.")
