"""What every uvicorn server of ours shares: how long an idle client connection is kept open.

The API server (admission webhooks, the aggregation layer) and kube-scheduler (extender calls) keep idle
connections to our servers for Go's default ``IdleConnTimeout``, 90 s (``k8s.io/apimachinery``'s
``SetTransportDefaults``), and reuse them. uvicorn closes an idle connection after 5 s by default, so a
request sent on a connection at the moment the server closes it meets EOF, and Go does not retry a POST:
a pod creation failed with "failed calling webhook ... EOF" (500) after the API server had been idle a
few seconds. Keeping idle connections open longer than the client does leaves the closing to the client.
"""

from __future__ import annotations

from typing import Final

KEEP_ALIVE_S: Final = 120  # above Go's 90 s IdleConnTimeout, the clients' side of the same connections
