"""Containers: the layout as two images (uWSGI with the app, an nginx sidecar that keeps one
unix socket per worker) and, for Kubernetes, a Deployment, Service, PodDisruptionBudget,
HorizontalPodAutoscaler and a compose.yaml (``uwsgi-layouts bundle --target container|kubernetes``).
``build_container_bundle`` validates, ``write_container_bundle`` renders, checks and writes."""

from uwsgi_layouts.deploy.ship.container.files import (
    LIVE_PATH,
    READY_PATH,
    render_container_bundle,
    write_container_bundle,
)
from uwsgi_layouts.deploy.ship.container.spec import (
    APP_UID,
    NGINX_UID,
    SOCKET_GID,
    TARGETS,
    ContainerBundle,
    build_container_bundle,
)

__all__ = [
    "APP_UID", "LIVE_PATH", "NGINX_UID", "READY_PATH", "SOCKET_GID", "TARGETS", "ContainerBundle",
    "build_container_bundle", "render_container_bundle", "write_container_bundle",
]
