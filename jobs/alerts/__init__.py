"""Alerts while a job runs: pure rules (rules.py), incidents (incidents.py), notifications (notify.py),
the opt-in idle-GPU policy (policy.py) and encrypted webhook secrets (secrets.py)."""
