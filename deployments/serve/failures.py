"""A failure inside the graph (a replica gone, a broken stream channel, an exception raised in
another deployment) as the envelope the client gets."""

from __future__ import annotations

from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from deployments.api.errors import ApiError
from deployments.serve.channel import ChannelLost


def from_failure(exc: BaseException) -> ApiError:
    """An unexpected failure as an envelope: a replica that died or is gone (Ray restarts it)
    is 503 unavailable_error, anything else 500 server_error."""
    while len(getattr(exc, "exceptions", ())) == 1:  # an exception group of one (anyio)
        exc = exc.exceptions[0]
    if isinstance(exc, RayTaskError) and isinstance(exc.cause, BaseException):
        exc = exc.cause  # the exception raised in the other deployment, without Ray's traceback
    unavailable = (RayActorError, ActorUnavailableError, BackPressureError,
                   DeploymentUnavailableError, ChannelLost)
    if isinstance(exc, unavailable):
        return ApiError(f"the model replica is unavailable: {type(exc).__name__}",
                        "unavailable_error")
    return ApiError(f"got exception: {type(exc).__name__}: {exc}"[:500], "server_error")
