"""Exports of verified snapshots to shared storage, and bootstraps of empty stores from them (issue 34).

A host exports its table's verified snapshots (``exporter``) to a pyarrow filesystem (``target``) under a versioned,
checksummed manifest written last (``manifest``); old exports go after a grace period (``retention``); a host whose
store is empty starts from the newest export it can show to be of the topic the broker holds now (``bootstrap``).
"""
