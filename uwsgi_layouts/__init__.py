"""uwsgi-layouts: choose how to run a WSGI app behind nginx + uWSGI (or a peer) from
measurements, hand over configs to deploy, and watch the running service.

One package, so installing the tool puts one name into an environment (``uwsgi_layouts``),
never generic ones such as ``app``, ``deploy`` or ``bench`` that could shadow an app's own:

    deploy/   layouts -> configs -> processes -> production bundles (``uwsgi-layouts render``...)
    bench/    experiments: compare, tune, faults, openloop, doctor, and their reports
    app/      the demo app (imported by uWSGI as ``app.wsgi`` from this directory)
    templates/  nginx, uWSGI, peers and bundle templates

``uwsgi-layouts`` (``uwsgi_layouts.console``) is the command line.
"""
