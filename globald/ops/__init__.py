"""Operations: what an operator sees of a running daemon (the status document and file, HTTP, metrics, sd_notify,
hooks, progress) and the operator requests it takes (``globald reset``), over the file-request mechanism the exact
snapshot requests share (``file_requests``). Below snapshots and Spark, which read the status file to find a live
daemon."""
