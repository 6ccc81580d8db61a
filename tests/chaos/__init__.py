"""The randomized fault campaign against the real daemon: ``python -m tests.chaos`` (``make chaos``).

plan.py      the faults of a seed: kind, phase, parameters, a pure function of the seed
tools.py     libfiu (fiu-run, fiu-ctrl) and libfaketime, as the campaign wraps the daemon in them
entry.py     the daemon's entry point with phase hooks (freeze, or arm a failure point, at a given moment)
daemon.py    the harness's DaemonProcess under those tools, status over HTTP
campaign.py  one seed: topics, load, daemon; drive each fault to its phase, inject, heal, check
runner.py    seeds, probes, the table (build/chaos/report.md, report.json), the exit status
"""
