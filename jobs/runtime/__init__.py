"""The service's own running state: heartbeat locks (`locks`), task enqueueing after commit (`enqueue`), the
poll
cycle's heartbeat (`service_health`) and the reachability checks behind /healthz (`health`)."""
