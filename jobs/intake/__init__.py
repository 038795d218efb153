"""What enters from outside besides metrics: jobs registered, updated and ended by schedulers (`registry`),
uploaded
profiling artifacts stored and parsed (`uploads`, `artifacts`, `artifact_review`), and the command-line client
that nodes run to send them (`client`, a single file importing nothing from the service)."""
