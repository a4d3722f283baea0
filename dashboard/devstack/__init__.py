"""Development stack: embedded PostgreSQL and Redis, child-process control and `manage.py up`."""
