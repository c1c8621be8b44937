"""What a run records: the event log, anomaly detection, metric readout, progress and the summary table."""
