"""The demo: teams, users and a simulated cluster whose metrics go into a real Prometheus, and the seed of
the GPU catalog and price book.

* `cluster`: the demo's people and jobs (`plan`, `register`, the simulated results up to now);
* `traces`: the small Kineto traces attached to the host-sync job and the seed runs;
* `loader`: `load` (simulate, backfill with promtool, register) and `finish` (ingest, attach traces,
  promote baselines, diagnose), run by ``manage.py load_demo``;
* `live`: the simulated dcgm-exporter endpoint the demo's Prometheus scrapes for the running jobs;
* `seed`: the GPU catalog and price book from `jobs.evaluation.catalog` (the data migration, the
  ``sync_catalog`` command and test fixtures use it; it is not demo data, but seeds the catalog in the
  same way).

Nothing is re-exported here: import the module that defines a name.
"""
