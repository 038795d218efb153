"""Who may do what: ownership claims on jobs, GPUs, selectors and baselines (`ownership`, the one place a
claim
is checked), team-scoped read/write permissions (`permissions`) and login throttling (`login_throttle`)."""
