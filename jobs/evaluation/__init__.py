"""The evaluation spine: one reader, one pure computation, one writer for every number of a job.

    load_context(job, signals, client)  ->  EvaluationContext   (jobs.evaluation.load: the only DB reads)
    evaluate(context)                   ->  Evaluated            (jobs.evaluation.evaluate: pure, no Django)
    store(job, evaluated.evaluation)                             (jobs.evaluation.store: the only writer)

Poll, finalize, artifact parse, baseline and price changes all run these three steps through one driver,
jobs.pipeline (`steps.evaluate_and_store`); nothing in this package calls up into it. The stored
`Evaluation` (jobs.evaluation.schema) is typed and versioned; what code filters or sorts on is copied to
real columns of Job by `store`, and pages, the leaderboard, the weekly email, the API and /metrics read
those columns or the decoded Evaluation, never recompute.
"""
