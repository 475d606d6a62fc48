"""Load generation: what is sent to a running stack, and the figures the clients report.

- ``wrk``:       closed loop (each connection waits for its answer): ``WrkProcess``, ``run_wrks``,
                 the JSON line of ``lua/report.lua`` parsed into ``WrkRun``, generated wrk scripts;
- ``httperf``:   open loop (new connections at a fixed rate): the command, one bounded run, the
                 summary parsed;
- ``scenarios``: named request mixes (the article's, stalls, files, reuseport);
- ``files``:     request lists over a data set (``bench.dataset``) for wrk and httperf;
- ``lua/``:      wrk scripts (``report.lua``: the JSON ``done()`` hook; ``random_files.lua``).
"""
