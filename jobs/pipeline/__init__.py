"""The one driver of a job's data path: load -> evaluate -> store -> archive the derived series -> diagnose ->
alert. Every trigger comes here: a poll and the poll cycle, a finalize (`poll`), and a re-evaluation after an
artifact is parsed, a baseline is promoted or retired, or a price changes (`refresh`). The floors below it
(jobs.metrics reads Prometheus and writes the archive, jobs.evaluation computes, jobs.pipeline.findings
diagnoses,
jobs.alerts opens incidents) never call up into it or into each other's drivers; tests/test_layers.py holds
that order."""
