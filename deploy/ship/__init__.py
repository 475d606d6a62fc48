"""Ship: production. ``make_certs`` makes the certificates for TLS between a front and its app
hosts; ``build_bundle`` + ``write_bundle`` turn a layout into the files a Debian/Ubuntu server
takes as they are (nginx site, uwsgi.ini, systemd unit, logrotate, INSTALL.md); ``install``
puts a bundle in place on the server (dry run first, foreign files refused, rolled back if
``nginx -t`` fails).

Other rooms (and bench/'s tune) import these names from ``deploy.ship``, never its modules.
"""

from deploy.ship.bundle import (
    BUNDLE_JSON,
    Bundle,
    BundleFile,
    build_bundle,
    bundle_files,
    host_bundles,
    site_link,
    system_paths,
)
from deploy.ship.certs import Made, make_certs
from deploy.ship.files import (
    check_bundle,
    check_host_bundles,
    generated_for,
    render_bundle,
    unit_directives,
    write_bundle,
    write_host_bundles,
)
from deploy.ship.installer import InstallResult, install, relocate

__all__ = [
    "BUNDLE_JSON", "Bundle", "BundleFile", "InstallResult", "Made", "build_bundle", "bundle_files", "check_bundle",
    "check_host_bundles", "generated_for", "host_bundles", "install", "make_certs", "relocate", "render_bundle",
    "site_link", "system_paths", "unit_directives", "write_bundle", "write_host_bundles",
]
