"""The randomized fault campaign against the real daemon: ``python -m tests.chaos`` (``make chaos``).

plan.py      the faults of a seed: kind, phase, parameters, a pure function of the seed
tools.py     libfiu (fiu-run, fiu-ctrl) and libfaketime, as the campaign wraps the daemon in them
entry.py     the daemon's entry point with phase hooks (freeze, or arm a failure point, at a given moment)
daemon.py    the harness's DaemonProcess under those tools, status over HTTP
campaign.py  one seed: topics, load, daemon; drive each fault to its phase, inject, heal, check
runner.py    seeds, probes, the table (build/chaos/report.md, report.json), the exit status
reach.py     whether an I/O fault met the daemon (status, log, caught errors, RocksDB LOG, a spent once-point)
reloads.py   reload events; exports.py export events (file:// and the S3 emulator, s3_faults.py); registry_faults.py
             Schema Registry events in a restore, steady state, a reload, a rebuild, an export and a bootstrap
"""
