"""The evaluation spine: one reader, one pure computation, one writer for every number of a job.

    load_context(job, signals, readings, now) -> EvaluationContext  (jobs.evaluation.load: the DB reads)
    evaluate(context)                         -> Evaluated          (jobs.evaluation.evaluate: pure)
    store(job, evaluated.evaluation)                                (jobs.evaluation.store: the only writer)

Poll, finalize, artifact parse, baseline and price changes all run these three steps through one driver,
jobs.pipeline (`steps.evaluate_and_store`), which first reads what they need from Prometheus, the archive
and the other jobs (`reads.read_inputs` -> `load.Readings`); nothing in this package calls up into it.
The stored `Evaluation` (jobs.evaluation.schema) is typed and versioned; what code filters or sorts on is
copied to real columns of Job by `store`, and pages, the leaderboard, the weekly email, the API and
/metrics read those columns or the decoded Evaluation, never recompute.
"""
