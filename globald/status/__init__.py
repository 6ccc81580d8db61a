"""The status vocabulary: the status document (``document``), the status file through which snapshots, Spark
readers and the commands learn whether a live daemon owns a state_dir (``statusfile``), and the file-request
mechanism the operator's and the exact snapshot requests share (``file_requests``). Below snapshots, Spark and
operations, which all read or write it; above the engine, whose table view it summarises."""
