"""Operations: what an operator sees of a running daemon (HTTP, metrics, sd_notify, hooks, progress) and the
operator requests it takes (``globald reset``)."""
