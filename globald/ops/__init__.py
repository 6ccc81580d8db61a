"""Operations: the runtime of what an operator sees of a running daemon (HTTP, metrics, sd_notify, hooks,
progress, the decode process) and the operator requests it takes (``globald reset``). Right below the daemon
(``service``), which builds it; what it publishes is the status vocabulary below it (``globald.status``), which
snapshots, Spark readers and the commands read without importing operations."""
