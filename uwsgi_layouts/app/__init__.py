"""The WSGI apps: the benchmark's (``wsgi``: requests that mix CPU work and waiting, with
``files``' data-set routes) and the fault experiments' (``faults``: GET sleeps, POST logs its id)."""
