"""Ship: production. ``make_certs`` makes the certificates for TLS between a front and its app
hosts; ``build_bundle`` + ``write_bundle`` turn a layout into the files a Debian/Ubuntu server
takes as they are (nginx site, uwsgi.ini and systemd unit in two slots, logrotate, INSTALL.md);
``install`` puts a bundle in place on the server and upgrades it without failing a request (dry
run first, foreign files refused, rolled back if ``nginx -t`` fails or warns about the site, a
manifest of what it wrote); ``uninstall`` removes exactly that, site first, app last.
``build_container_bundle`` + ``write_container_bundle`` (deploy/ship/container/) turn the same
layout into two images (uWSGI, an nginx sidecar) and Kubernetes manifests.

Other rooms (and bench/'s tune) import these names from ``deploy.ship``, never its modules.
"""

from uwsgi_layouts.deploy.ship.bundle import (
    BUNDLE_JSON,
    SLOTS,
    Bundle,
    BundleFile,
    build_bundle,
    bundle_files,
    host_bundles,
    relocate,
    site_link,
    system_paths,
)
from uwsgi_layouts.deploy.ship.certs import Made, make_certs
from uwsgi_layouts.deploy.ship.container import (
    TARGETS,
    ContainerBundle,
    build_container_bundle,
    write_container_bundle,
)
from uwsgi_layouts.deploy.ship.files import (
    check_bundle,
    check_host_bundles,
    generated_for,
    render_bundle,
    unit_directives,
    write_bundle,
    write_host_bundles,
)
from uwsgi_layouts.deploy.ship.installer import install
from uwsgi_layouts.deploy.ship.manifest import Manifest, read_manifest
from uwsgi_layouts.deploy.ship.steps import InstallResult
from uwsgi_layouts.deploy.ship.uninstaller import UninstallResult, uninstall

__all__ = [
    "BUNDLE_JSON", "SLOTS", "TARGETS", "Bundle", "BundleFile", "ContainerBundle", "InstallResult", "Made",
    "Manifest", "UninstallResult", "build_bundle", "build_container_bundle", "bundle_files", "check_bundle",
    "check_host_bundles", "generated_for", "host_bundles", "install", "make_certs", "read_manifest", "relocate",
    "render_bundle", "site_link", "system_paths", "uninstall", "unit_directives", "write_bundle",
    "write_container_bundle", "write_host_bundles",
]
