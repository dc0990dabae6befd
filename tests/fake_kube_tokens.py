"""The fake API server's TokenRequest endpoint: distinct tokens of ServiceAccounts for the audiences asked
(the API server's own when none), expiries the test chooses, refusals (403 by RBAC, 404 for no
ServiceAccount, any status for an outage) as the API server sends them; and what a TokenReview for an
audience would say of a token (expired, revoked, or minted for other audiences: not valid)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

# The API server refuses TokenRequests for less than this many seconds.
MIN_SECONDS = 600
# The API server's own audience: what a TokenRequest without audiences gets, and what a TokenReview
# without audiences (the EPP's stock --metrics-endpoint-auth) checks.
API_SERVER = "https://kubernetes.default.svc.cluster.local"


@dataclass(frozen=True)
class Minted:
    namespace: str
    name: str
    token: str
    issued: float  # wall clock
    expires: float  # wall clock, whole seconds as expirationTimestamp carries it
    audiences: tuple[str, ...] = (API_SERVER,)


def _stamp(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class TokenIssuer:
    """POST /api/v1/namespaces/NS/serviceaccounts/NAME/token.

    `accounts`: the ServiceAccounts that exist; `lifetime`: when set, the seconds the answer's
    expirationTimestamp lies ahead (the API server may shorten or extend what was asked, and a test needs
    seconds, not minutes); `outage`: a status every request gets meanwhile (e.g. 503)."""

    accounts: set[tuple[str, str]] = field(default_factory=set)
    lifetime: float | None = None
    outage: int | None = None
    minted: list[Minted] = field(default_factory=list)
    asked: list[dict[str, Any]] = field(default_factory=list)  # the TokenRequest bodies received
    revoked: set[str] = field(default_factory=set)  # tokens no review accepts any more

    def valid(self, token: str, audience: str = API_SERVER, now: float | None = None) -> Minted | None:
        """The minted token `token` if a TokenReview for `audience` accepts it: minted for that audience,
        not expired, not revoked."""
        now = time.time() if now is None else now
        return next(
            (
                m
                for m in self.minted
                if m.token == token
                and now < m.expires
                and audience in m.audiences
                and token not in self.revoked
            ),
            None,
        )

    def route(self, app: web.Application, forbidden: Callable[..., web.Response | None]) -> None:
        async def create(request: web.Request) -> web.Response:
            from fake_kube import status

            namespace, name = request.match_info["namespace"], request.match_info["name"]
            denied = forbidden("create", "serviceaccounts/token", "", namespace)
            if denied is not None:
                return denied
            if self.outage is not None:
                return web.json_response(
                    status(self.outage, "ServiceUnavailable", "the server is currently unable to handle"),
                    status=self.outage,
                )
            body = await request.json()
            self.asked.append(body)
            if (namespace, name) not in self.accounts:
                message = f'serviceaccounts "{name}" not found'
                return web.json_response(status(404, "NotFound", message, "serviceaccounts"), status=404)
            seconds = (body.get("spec") or {}).get("expirationSeconds", 3600)
            audiences = tuple((body.get("spec") or {}).get("audiences") or (API_SERVER,))
            if body.get("kind") != "TokenRequest" or not isinstance(seconds, int) or seconds < MIN_SECONDS:
                message = (
                    f'TokenRequest.authentication.k8s.io "{name}" is invalid: spec.expirationSeconds:'
                    f" Invalid value: {seconds}: may not specify a duration less than 10 minutes"
                )
                return web.json_response(status(422, "Invalid", message), status=422)
            now = time.time()
            expires = float(int(now + (self.lifetime if self.lifetime is not None else seconds)))
            minted = Minted(namespace, name, f"minted-{uuid.uuid4().hex}", now, expires, audiences)
            self.minted.append(minted)
            answer = {
                "kind": "TokenRequest",
                "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"name": name, "namespace": namespace, "creationTimestamp": None},
                "spec": {
                    "audiences": list(audiences),
                    "expirationSeconds": seconds,
                    "boundObjectRef": None,
                },
                "status": {"token": minted.token, "expirationTimestamp": _stamp(expires)},
            }
            return web.json_response(answer, status=201)

        app.router.add_post("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", create)
