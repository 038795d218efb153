"""REST API under /api/v1/ (Django REST framework)."""
